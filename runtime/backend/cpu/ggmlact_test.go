package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestActivationsLikeGGML: with F16 or Q8_0 weights the activations are converted as ggml's CPU
// backend converts them before its dot products (vec_dot_type): rounded to F16, or quantised to
// Q8_0 blocks of 32 (scale max|x|/127 stored as F16, quants round(x·127/max|x|)); each product
// then matches that emulation to float32 rounding, whatever the number of rows and whether the
// weights are repacked. Kept-F32 activations would miss it by about 1e-4 (F16) and 1e-2 (Q8_0)
// of the terms' magnitude; the transducer references (reference/asr-transducer) of F16 and Q8_0
// models depend on this conversion.
func TestActivationsLikeGGML(t *testing.T) {
	if !cpu.Available() {
		t.Skip(cpu.ErrNotBuilt)
	}
	best := cpu.BestISA()
	defer cpu.SetISA(best)
	for isa := shortISA(cpu.ISAAVX2, best); isa <= best; isa++ {
		if err := cpu.SetISA(isa); err != nil {
			t.Fatal(err)
		}
		b, err := New(backend.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		activationsLikeGGML(t, b)
		b.Close()
	}
}

func activationsLikeGGML(t *testing.T, b backend.Backend) {
	const m, k = 48, 256
	r := rand.New(rand.NewPCG(7, 8))
	src := make([]float32, m*k)
	for i := range src {
		src[i] = float32(r.NormFloat64()) / 16
	}
	var err error
	for _, dt := range []tensor.DType{tensor.F16, tensor.Q8_0} {
		var wb []byte
		if dt == tensor.F16 {
			wb = make([]byte, 2*m*k)
			for i, v := range src {
				binary.LittleEndian.PutUint16(wb[2*i:], quant.F32ToF16(v))
			}
		} else if wb, err = quant.QuantizeRows(dt, src, k); err != nil {
			t.Fatal(err)
		}
		wf := make([]float32, m*k) // the weights' values
		if err := quant.Dequantize(dt, wb, wf); err != nil {
			t.Fatal(err)
		}
		for _, repack := range []bool{false, true} {
			if repack && dt != tensor.Q8_0 {
				continue
			}
			w, err := b.Load(dt, m, k, wb)
			if err != nil {
				t.Fatal(err)
			}
			if repack {
				if ok, err := backend.Repack(b, w); err != nil || !ok {
					t.Fatalf("%s: repack: %v %v", dt, ok, err)
				}
			}
			for _, n := range []int{1, 3, 8, 16, 70} {
				x := make([]float32, n*k)
				for i := range x {
					x[i] = float32(r.NormFloat64())
				}
				got := matmul(t, b, x, n, k, w, m)
				for i := range n {
					want, mag := ggmlRow(dt, x[i*k:(i+1)*k], wf, m, k)
					for j := range m {
						if d := math.Abs(float64(got[i*m+j]) - want[j]); d > 4e-6*mag[j] {
							t.Fatalf("ISA %v, %s (repacked %v), %d rows: out[%d,%d] = %g, ggml's conversion gives %g (|Δ| %.3g of Σ|terms| %.3g)",
								cpu.CurrentISA(), dt, repack, n, i, j, got[i*m+j], want[j], d, mag[j])
						}
					}
				}
			}
			w.Close()
		}
	}
}

// ggmlRow is x·wᵀ (w [m, k] as values) in float64 after x is converted to dt's dot type as ggml
// converts it, and each output's Σ|terms|.
func ggmlRow(dt tensor.DType, x, w []float32, m, k int) (out, mag []float64) {
	xc := make([]float64, k)
	switch dt {
	case tensor.F16:
		for i, v := range x {
			xc[i] = float64(quant.F16ToF32(quant.F32ToF16(v)))
		}
	case tensor.Q8_0:
		for b := 0; b < k; b += 32 {
			amax := float32(0)
			for _, v := range x[b : b+32] {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			d := float64(quant.F16ToF32(quant.F32ToF16(amax / 127)))
			id := float32(0)
			if amax != 0 {
				id = 127 / amax
			}
			for i, v := range x[b : b+32] {
				xc[b+i] = d * math.RoundToEven(float64(v*id))
			}
		}
	}
	out, mag = make([]float64, m), make([]float64, m)
	for j := range m {
		for i := range k {
			p := float64(w[j*k+i]) * xc[i]
			out[j] += p
			mag[j] += math.Abs(p)
		}
	}
	return out, mag
}

func matmul(t *testing.T, b backend.Backend, x []float32, n, k int, w backend.Tensor, m int) []float32 {
	t.Helper()
	xt, err := b.Alloc(tensor.F32, n, k)
	if err != nil {
		t.Fatal(err)
	}
	defer xt.Close()
	dt, err := b.Alloc(tensor.F32, n, m)
	if err != nil {
		t.Fatal(err)
	}
	defer dt.Close()
	if err := b.Write(xt, 0, x); err != nil {
		t.Fatal(err)
	}
	if err := b.MatMul(dt, xt, w); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, n*m)
	if err := b.Read(dt, 0, out); err != nil {
		t.Fatal(err)
	}
	return out
}
