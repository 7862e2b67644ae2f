// Package backendtest is the conformance suite and benchmark set that every backend.Backend
// implementation runs from its own tests:
//
//	func TestConformance(t *testing.T) { backendtest.Run(t, newBackend) }
//	func BenchmarkBackend(b *testing.B) { backendtest.Bench(b, newBackend) }
//
// Every operation is checked against a float64 reference computed here, on seeded random inputs
// of odd sizes, for every weight dtype, with error bounds derived per dtype next to the checks.
// Outputs are prefilled with NaN so unwritten elements show, and guard tensors allocated around
// them must come back unchanged. A backend that cannot do a case returns an error wrapping
// backend.ErrUnsupported; the suite then skips that case and says so.
package backendtest

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// WeightDTypes are the weight types every backend is checked with.
var WeightDTypes = []tensor.DType{
	tensor.F32, tensor.F16, tensor.BF16,
	tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.Q8_0,
	tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K,
	tensor.IQ4_NL, tensor.IQ4_XS,
}

// Run runs the conformance suite, one subtest per operation. newBackend is called once per
// subtest group; the suite closes what it returns.
func Run(t *testing.T, newBackend func() (backend.Backend, error)) {
	groups := []struct {
		name string
		f    func(t *testing.T, b backend.Backend, newBackend func() (backend.Backend, error))
	}{
		{"Tensors", testTensors},
		{"Capabilities", testCapabilities},
		{"GetRows", testGetRows},
		{"MatMul", testMatMul},
		{"MatMulBatchInvariance", testMatMulBatch},
		{"MatMuls", testMatMuls},
		{"AddRows", testAddRows},
		{"RMSNorm", testRMSNorm},
		{"SwiGLU", testSwiGLU},
		{"Scale", testScale},
		{"GeGLU", testGeGLU},
		{"Rope", testRope},
		{"Attention", testAttention},
		{"Copy", testCopy},
		{"LayerNorm", testLayerNorm},
		{"GELU", testGELU},
		{"Unary", testUnary},
		{"GLU", testGLU},
		{"FuncErrors", testFuncErrors},
		{"Im2Col1D", testIm2Col1D},
		{"FullAttention", testFullAttention},
		{"Argmax", testArgmax},
		{"Choose", testChoose},
		{"Aliasing", testAliasing},
		{"PartialOverlap", testPartialOverlap},
		{"Errors", testErrors},
		{"EncoderErrors", testEncoderErrors},
		{"ArgChecks", testArgChecks},
		{"ZeroAllocs", testZeroAllocs},
		// Streaming codecs and flow-matching heads.
		{"Mul", testMul},
		{"Reshape", testReshape},
		{"CodecErrors", testCodecErrors},
		{"Im2Col2D", testIm2Col2D},
		{"DepthwiseConv2D", testDepthwiseConv2D},
		{"ConvErrors", testConvErrors},
		{"RelPosAttention", testRelPosAttention},
		{"RelPosErrors", testRelPosErrors},
		{"LSTMCell", testLSTMCell},
		{"LSTMErrors", testLSTMErrors},
		{"TransducerAllocs", testTransducerAllocs},
		{"GreedyDecoding", testGreedyDecoding},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			b := open(t, newBackend)
			g.f(t, b, newBackend)
		})
	}
}

// open starts a backend for t and closes it when t ends.
func open(t testing.TB, newBackend func() (backend.Backend, error)) backend.Backend {
	t.Helper()
	b, err := newBackend()
	if err != nil {
		t.Fatalf("starting backend: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing backend: %v", err)
		}
	})
	return b
}

// must fails t on err, or skips it when err wraps backend.ErrUnsupported.
func must(t testing.TB, err error, format string, args ...any) {
	t.Helper()
	if err == nil {
		return
	}
	what := fmt.Sprintf(format, args...)
	if errors.Is(err, backend.ErrUnsupported) {
		t.Skipf("%s: %v", what, err)
	}
	t.Fatalf("%s: %v", what, err)
}

// rng returns a generator seeded from name, so that every subtest sees its own fixed inputs.
func rng(name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	s := h.Sum64()
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}

// randVec returns n values drawn from N(0, scale²), with the magnitude varied by a random factor
// in [0.25, 4) per run of 32 elements so that quantisation blocks get different scales, and no
// exact zeros.
func randVec(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	f := 1.0
	for i := range v {
		if i%32 == 0 {
			f = math.Exp2(r.Float64()*4 - 2)
		}
		x := r.NormFloat64() * scale * f
		for math.Abs(x) < 1e-6 {
			x = r.NormFloat64() * scale * f
		}
		v[i] = float32(x)
	}
	return v
}

// alloc makes an F32 tensor holding vals ([rows, cols]) with Alloc and Write.
func alloc(t testing.TB, b backend.Backend, rows, cols int, vals []float32) backend.Tensor {
	t.Helper()
	x, err := b.Alloc(tensor.F32, rows, cols)
	must(t, err, "Alloc(F32, %d, %d)", rows, cols)
	t.Cleanup(func() { x.Close() })
	if vals != nil {
		must(t, b.Write(x, 0, vals), "Write [%d, %d]", rows, cols)
	}
	return x
}

// load makes a weight tensor of dt from data with Load.
func load(t testing.TB, b backend.Backend, dt tensor.DType, rows, cols int, data []byte) backend.Tensor {
	t.Helper()
	x, err := b.Load(dt, rows, cols, data)
	must(t, err, "Load(%v, %d, %d)", dt, rows, cols)
	t.Cleanup(func() { x.Close() })
	return x
}

// read returns all of x's elements.
func read(t testing.TB, b backend.Backend, x backend.Tensor) []float32 {
	t.Helper()
	out := make([]float32, x.Rows()*x.Cols())
	must(t, b.Read(x, 0, out), "Read [%d, %d]", x.Rows(), x.Cols())
	return out
}

// rowSize returns dt.RowSize(cols) or fails t.
func rowSize(t testing.TB, dt tensor.DType, cols int) int {
	t.Helper()
	sz, err := dt.RowSize(int64(cols))
	if err != nil {
		t.Fatalf("row size: %v", err)
	}
	return int(sz)
}

// quantRows stores vals ([rows, cols]) as dt a row at a time with quant.Quantize and returns the
// bytes with the values they decode to (quant.Dequantize) as float64: the exact weights a
// backend multiplies with.
func quantRows(t testing.TB, dt tensor.DType, rows, cols int, vals []float32) ([]byte, []float64) {
	t.Helper()
	rs := rowSize(t, dt, cols)
	data := make([]byte, rows*rs)
	deq := make([]float64, rows*cols)
	tmp := make([]float32, cols)
	for i := 0; i < rows; i++ {
		if err := quant.Quantize(dt, vals[i*cols:(i+1)*cols], data[i*rs:(i+1)*rs]); err != nil {
			t.Fatalf("quant.Quantize(%v): %v", dt, err)
		}
		if err := quant.Dequantize(dt, data[i*rs:(i+1)*rs], tmp); err != nil {
			t.Fatalf("quant.Dequantize(%v): %v", dt, err)
		}
		for j, v := range tmp {
			deq[i*cols+j] = float64(v)
		}
	}
	return data, deq
}

// guards are the memory around an output: rows of its parent tensor before and after it (the
// output is a View), and whole tensors allocated just before and after the parent, all filled
// with a known pattern. A backend that writes past its output's ends changes them.
type guards struct {
	b      backend.Backend
	ts     []backend.Tensor
	values [][]float32
}

// guardRows is the number of guard rows on each side of an output inside its parent.
const guardRows = 2

// output returns an F32 output [rows, cols] prefilled with NaN: a View of rows guardRows.. of a
// parent tensor with guard rows around it, between two guard tensors.
func output(t testing.TB, b backend.Backend, rows, cols int) (backend.Tensor, *guards) {
	t.Helper()
	g := &guards{b: b}
	g.add(t, rows+1, cols, nil)
	parent := g.add(t, rows+2*guardRows, cols, func(i int) bool { return i/cols >= guardRows && i/cols < guardRows+rows })
	g.add(t, rows+1, cols, nil)
	dst, err := b.View(parent, guardRows, rows)
	must(t, err, "View(parent [%d, %d], %d, %d)", parent.Rows(), cols, guardRows, rows)
	t.Cleanup(func() { dst.Close() })
	return dst, g
}

// add allocates a guard tensor; elements for which nan is true are NaN and not checked.
func (g *guards) add(t testing.TB, rows, cols int, nan func(i int) bool) backend.Tensor {
	t.Helper()
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = float32(i%251) + 0.5
		if nan != nil && nan(i) {
			v[i] = float32(math.NaN())
		}
	}
	x := alloc(t, g.b, rows, cols, v)
	g.ts = append(g.ts, x)
	g.values = append(g.values, v)
	return x
}

// check fails t if any guard changed.
func (g *guards) check(t testing.TB) {
	t.Helper()
	for k, x := range g.ts {
		got := read(t, g.b, x)
		for i, v := range got {
			w := g.values[k][i]
			if v != w && w == w {
				t.Fatalf("guard tensor %d [%d, %d] element [%d, %d] changed from %v to %v: out-of-bounds write",
					k, x.Rows(), x.Cols(), i/x.Cols(), i%x.Cols(), w, v)
			}
		}
	}
}

// allocView returns an F32 tensor holding vals ([rows, cols]) that is a View of rows 1.. of a
// larger tensor, so that operations read inputs at a row offset.
func allocView(t testing.TB, b backend.Backend, rows, cols int, vals []float32) backend.Tensor {
	t.Helper()
	parent := alloc(t, b, rows+3, cols, randVec(rng("allocView"), (rows+3)*cols, 1))
	x, err := b.View(parent, 1, rows)
	must(t, err, "View(parent [%d, %d], 1, %d)", rows+3, cols, rows)
	t.Cleanup(func() { x.Close() })
	must(t, b.Write(x, 0, vals), "Write to a view [%d, %d]", rows, cols)
	return x
}

// compare fails t at the first element where |got-want| > tol(i), naming the row and column.
// NaN and Inf in got always fail.
func compare(t testing.TB, what string, cols int, got []float32, want []float64, tol func(i int) float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	bad, worst, worstI := 0, 0.0, -1
	for i, g := range got {
		d := math.Abs(float64(g) - want[i])
		lim := tol(i)
		if math.IsNaN(float64(g)) || math.IsInf(float64(g), 0) || !(d <= lim) {
			bad++
			if r := d / lim; worstI < 0 || r > worst || math.IsNaN(r) {
				worst, worstI = r, i
			}
		}
	}
	if bad > 0 {
		i := worstI
		t.Fatalf("%s: %d of %d values out of tolerance; worst [%d, %d] = %v, want %v ± %.3g",
			what, bad, len(got), i/cols, i%cols, got[i], want[i], tol(i))
	}
}

// u is float32's unit roundoff.
const u = 0x1p-24

// fakeTensor is a Tensor no backend made.
type fakeTensor struct {
	dt         tensor.DType
	rows, cols int
}

func (f fakeTensor) DType() tensor.DType { return f.dt }
func (f fakeTensor) Rows() int           { return f.rows }
func (f fakeTensor) Cols() int           { return f.cols }
func (f fakeTensor) Close() error        { return nil }
