package backendtest

import (
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The operations of encoder-decoder models: Copy, LayerNorm, GELU, Im2Col1D, FullAttention.

// f16Bytes returns vals as F16 (rounded to nearest even) in ggml's layout, and the values the
// bytes hold.
func f16Bytes(vals []float32) ([]byte, []float64) {
	data := make([]byte, 2*len(vals))
	held := make([]float64, len(vals))
	for i, v := range vals {
		h := quant.F32ToF16(v)
		binary.LittleEndian.PutUint16(data[2*i:], h)
		held[i] = float64(quant.F16ToF32(h))
	}
	return data, held
}

// allocF16 makes a writable F16 tensor [rows, cols] holding vals rounded to F16, written with
// Copy from an F32 tensor.
func allocF16(t testing.TB, b backend.Backend, rows, cols int, vals []float32) backend.Tensor {
	t.Helper()
	x, err := b.Alloc(tensor.F16, rows, cols)
	must(t, err, "Alloc(F16, %d, %d)", rows, cols)
	t.Cleanup(func() { x.Close() })
	if vals != nil {
		src := alloc(t, b, rows, cols, vals)
		must(t, b.Copy(x, src), "Copy F32 [%d, %d] into F16", rows, cols)
		src.Close()
	}
	return x
}

// readF16 returns the elements of an F16 tensor, converted by Copy into an F32 tensor.
func readF16(t testing.TB, b backend.Backend, x backend.Tensor) []float32 {
	t.Helper()
	tmp := alloc(t, b, x.Rows(), x.Cols(), nil)
	defer tmp.Close()
	must(t, b.Copy(tmp, x), "Copy F16 [%d, %d] into F32", x.Rows(), x.Cols())
	return read(t, b, tmp)
}

// sameBits fails t at the first element of got that is not exactly want (the sign of zero and
// infinities included).
func sameBits(t testing.TB, what string, cols int, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element [%d, %d] = %v (%#08x), want %v (%#08x)", what, i/cols, i%cols,
				got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// f16Specials are values whose conversion to F16 is easy to get wrong: exact ties between two
// F16 values (which round to the even one), the largest F16 and values just above it (65520 is
// the tie that rounds to infinity), infinities, signed zeros, subnormal F16 results and values
// below half the smallest subnormal (which round to zero).
func f16Specials() []float32 {
	var v []float32
	for _, h := range []uint16{0x3c00, 0x3c01, 0x0400, 0x0001, 0x0002, 0x03ff, 0x7bfe} {
		lo, hi := quant.F16ToF32(h), quant.F16ToF32(h+1)
		v = append(v, (lo+hi)/2, -(lo+hi)/2)
	}
	return append(v, 65504, 65519.996, 65520, 70000, -1e9, float32(math.Inf(1)), float32(math.Inf(-1)),
		0, float32(math.Copysign(0, -1)), 0x1p-24, 0x1p-25, 0x1.000002p-25, 0x1p-26, -0x1.8p-24, 1e-10)
}

// testCopy checks the four conversions Copy does, exactly: F32 to F16 must round to nearest
// even as quant.F32ToF16 does, F16 to F32 and same-type copies are exact. Destinations are
// views between guard rows.
func testCopy(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, c := range []struct{ n, d int }{{1, 1}, {3, 7}, {17, 33}, {64, 384}, {5, 4099}} {
		name := fmt.Sprintf("n=%d d=%d", c.n, c.d)
		t.Run(name, func(t *testing.T) {
			r := rng("copy " + name)
			vals := randVec(r, c.n*c.d, 4)
			sp := f16Specials()
			for i := 0; i < len(vals) && i < len(sp); i++ {
				vals[(i*7919)%len(vals)] = sp[i]
			}
			want16 := make([]float32, len(vals)) // vals rounded to F16
			for i, v := range vals {
				want16[i] = quant.F16ToF32(quant.F32ToF16(v))
			}
			src := allocView(t, b, c.n, c.d, vals)

			// F32 -> F32 into a view.
			dst, g := output(t, b, c.n, c.d)
			must(t, b.Copy(dst, src), "Copy F32 into F32")
			sameBits(t, "Copy F32 into F32", c.d, read(t, b, dst), vals)
			g.check(t)

			// F32 -> F16 into a view of an F16 tensor with guard rows, then F16 -> F32.
			parent := allocF16(t, b, c.n+2*guardRows, c.d, nil)
			guard := randVec(r, (c.n+2*guardRows)*c.d, 1)
			pg := alloc(t, b, c.n+2*guardRows, c.d, guard)
			must(t, b.Copy(parent, pg), "Copy F32 into F16 (guards)")
			h, err := b.View(parent, guardRows, c.n)
			must(t, err, "View of an F16 tensor")
			defer h.Close()
			must(t, b.Copy(h, src), "Copy F32 into F16")
			got := readF16(t, b, h)
			sameBits(t, "Copy F32 into F16 and back", c.d, got, want16)
			all := readF16(t, b, parent)
			for i, v := range all {
				row := i / c.d
				if row >= guardRows && row < guardRows+c.n {
					continue
				}
				if w := quant.F16ToF32(quant.F32ToF16(guard[i])); v != w {
					t.Fatalf("F16 guard row %d element %d changed from %v to %v: out-of-bounds write", row, i%c.d, w, v)
				}
			}

			// F16 (loaded) -> F32 and F16 -> F16.
			data, _ := f16Bytes(vals)
			lt := load(t, b, tensor.F16, c.n, c.d, data)
			dst2, g2 := output(t, b, c.n, c.d)
			must(t, b.Copy(dst2, lt), "Copy loaded F16 into F32")
			sameBits(t, "Copy loaded F16 into F32", c.d, read(t, b, dst2), want16)
			g2.check(t)
			h2 := allocF16(t, b, c.n, c.d, nil)
			must(t, b.Copy(h2, lt), "Copy F16 into F16")
			sameBits(t, "Copy F16 into F16", c.d, readF16(t, b, h2), want16)
		})
	}
}

// layerNormRef is (x - mean)/sqrt(var + eps)*w + b for x [n, d], w, b [d], in float64, with
// the normalised value z and the scale 1/sqrt(var+eps) of each element for the bounds.
func layerNormRef(x, w, bias []float32, n, d int, eps float32) (out, z []float64, rstd, absMean []float64) {
	out, z = make([]float64, n*d), make([]float64, n*d)
	rstd, absMean = make([]float64, n), make([]float64, n)
	for i := 0; i < n; i++ {
		row := x[i*d : (i+1)*d]
		mean, abs := 0.0, 0.0
		for _, v := range row {
			mean += float64(v)
			abs += math.Abs(float64(v))
		}
		mean /= float64(d)
		variance := 0.0
		for _, v := range row {
			variance += (float64(v) - mean) * (float64(v) - mean)
		}
		variance /= float64(d)
		rstd[i] = 1 / math.Sqrt(variance+float64(eps))
		absMean[i] = abs / float64(d)
		for j, v := range row {
			z[i*d+j] = (float64(v) - mean) * rstd[i]
			out[i*d+j] = z[i*d+j]*float64(w[j]) + float64(bias[j])
		}
	}
	return out, z, rstd, absMean
}

// testLayerNorm checks LayerNorm with a negligible and a dominant eps, and rows whose mean is
// large against their spread, where a one-pass variance (mean of squares minus square of the
// mean) in float32 loses every digit.
//
// The bound admits float32 sums taken in two passes. The mean of d elements summed in float32 is
// off by at most εμ = d·2^-24·mean|x|. The second pass sums squares of x - μ' for the computed
// μ': exactly Σ(x-μ)² + d·εμ², with float32 rounding of (d+2)·2^-24 relative; so 1/sqrt(var+eps)
// is within (d+2)·2^-25 + εμ²·rstd²/2 relative. Then z' = (x - μ')·rstd' is within
// |z|·((d+2)·2^-25 + εμ²·rstd²/2 + 3·2^-24) + εμ·rstd of z (two roundings and one of the
// subtraction), and out = z'·w + b adds |w| times that and two roundings of |out|.
func testLayerNorm(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, d := range append(widths, 1500) {
		for _, n := range []int{1, 3, 17} {
			for _, c := range []struct {
				eps          float32
				scale, shift float64
			}{{1e-5, 1, 0}, {1e-2, 0.05, 0}, {1e-5, 0.5, 30}} {
				name := fmt.Sprintf("LayerNorm n=%d d=%d eps=%g shift=%g", n, d, c.eps, c.shift)
				r := rng(name)
				xv, wv, bv := randVec(r, n*d, c.scale), randVec(r, d, 1), randVec(r, d, 0.5)
				for i := range xv {
					xv[i] += float32(c.shift)
				}
				x := alloc(t, b, n, d, xv)
				if n == 3 {
					x = allocView(t, b, n, d, xv)
				}
				w, bias := alloc(t, b, 1, d, wv), alloc(t, b, 1, d, bv)
				dst, g := output(t, b, n, d)
				must(t, b.LayerNorm(dst, x, w, bias, c.eps), "%s", name)
				want, z, rstd, absMean := layerNormRef(xv, wv, bv, n, d, c.eps)
				compare(t, name, d, read(t, b, dst), want, func(i int) float64 {
					row := i / d
					em := float64(d) * u * absMean[row]
					zerr := math.Abs(z[i])*(float64(d+2)*u/2+em*em*rstd[row]*rstd[row]/2+3*u) + em*rstd[row]
					return math.Abs(float64(wv[i%d]))*zerr + 2*u*math.Abs(want[i]) + 1e-30
				})
				g.check(t)
			}
		}
	}
}

// geluRef is 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))) in float64, written as
// x·σ(2y) for the y inside tanh, which has no cancellation for negative x; y is returned too.
func geluRef(x []float32) (out, y []float64) {
	out, y = make([]float64, len(x)), make([]float64, len(x))
	for i, v := range x {
		xv := float64(v)
		y[i] = math.Sqrt(2/math.Pi) * (xv + 0.044715*xv*xv*xv)
		out[i] = xv / (1 + math.Exp(-2*y[i]))
	}
	return out, y
}

// testGELU checks GELU on a spread of values and on tails where the exponential overflows or
// underflows in float32 (where a tanh written as a quotient of exponentials gives NaN).
//
// The bound covers both ways of computing it in float32. As x·σ(2y) = x/(1+exp(-2y)): y takes
// about five roundings (relative 5·2^-24), which moves exp(-2y) by a relative |2y|·5·2^-24, plus
// the exp approximation's 2^-18; that reaches the result scaled by σ(-2y) (the share of exp(-2y)
// in 1+exp(-2y)), and the sum, division and product add a few roundings: relative
// σ(-2y)·(10|y|·2^-24 + 2^-18) + 6·2^-24. As 0.5·x·(1+tanh(y)): tanh is off by about two ulp
// plus (1-tanh²)·|y|·5·2^-24 < 2.5·2^-24 from y's rounding, and 1+tanh cancels for negative x, so
// the absolute error is about 0.5·|x|·6·2^-24; the bound adds 4·2^-24·|x|.
func testGELU(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, d := range append(widths, 1536) {
		for _, n := range []int{1, 3, 17} {
			name := fmt.Sprintf("GELU n=%d d=%d", n, d)
			r := rng(name)
			xv := randVec(r, n*d, 3)
			tails := []float32{-1e20, -100, -30, -10.5, -5.25, 5.25, 10.5, 30, 100, 1e20}
			for i := 0; i < len(xv) && i < len(tails); i++ {
				xv[len(xv)-1-i] = tails[i]
			}
			x := alloc(t, b, n, d, xv)
			if n == 3 {
				x = allocView(t, b, n, d, xv)
			}
			dst, g := output(t, b, n, d)
			must(t, b.GELU(dst, x), "%s", name)
			want, y := geluRef(xv)
			compare(t, name, d, read(t, b, dst), want, func(i int) float64 {
				sig := 1 / (1 + math.Exp(2*y[i])) // σ(-2y)
				return math.Abs(want[i])*(sig*(10*math.Abs(y[i])*u+expRel)+6*u) + 4*u*math.Abs(float64(xv[i])) + 1e-38
			})
			g.check(t)
		}
	}
}

// testGeGLU checks GeGLU against GELU's float64 reference times up, with GELU's bound (scaled
// by |up|) plus one rounding of the product; tails included.
func testGeGLU(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, d := range widths {
		for _, n := range []int{1, 3, 17} {
			name := fmt.Sprintf("GeGLU n=%d d=%d", n, d)
			r := rng(name)
			gv, uv := randVec(r, n*d, 3), randVec(r, n*d, 2)
			tails := []float32{-1e20, -100, -30, -10.5, 10.5, 30, 100}
			for i := 0; i < len(gv) && i < len(tails); i++ {
				gv[len(gv)-1-i] = tails[i]
			}
			gt, ut := alloc(t, b, n, d, gv), alloc(t, b, n, d, uv)
			dst, g := output(t, b, n, d)
			must(t, b.GeGLU(dst, gt, ut), "%s", name)
			gl, y := geluRef(gv)
			want := make([]float64, len(gl))
			for i := range want {
				want[i] = gl[i] * float64(uv[i])
			}
			compare(t, name, d, read(t, b, dst), want, func(i int) float64 {
				sig := 1 / (1 + math.Exp(2*y[i]))
				gb := math.Abs(gl[i])*(sig*(10*math.Abs(y[i])*u+expRel)+6*u) + 4*u*math.Abs(float64(gv[i])) + 1e-38
				return gb*math.Abs(float64(uv[i])) + math.Abs(want[i])*u + 1e-38
			})
			g.check(t)
		}
	}
}

// im2colRef lays out x [T, C] as backend.Backend.Im2Col1D documents.
func im2colRef(x []float32, T, C, K, stride, pad int) (out []float64, tOut int) {
	tOut = (T+2*pad-K)/stride + 1
	out = make([]float64, tOut*C*K)
	for t := 0; t < tOut; t++ {
		for c := 0; c < C; c++ {
			for k := 0; k < K; k++ {
				if row := t*stride + k - pad; row >= 0 && row < T {
					out[t*C*K+c*K+k] = float64(x[row*C+c])
				}
			}
		}
	}
	return out, tOut
}

// testIm2Col1D checks the layout of receptive fields exactly: Whisper's two convolutions
// (kernel 3, padding 1, strides 1 and 2) and odd kernels (up to 20 taps), strides and
// paddings, including padding as wide as the kernel (rows that are all zero) and a kernel as
// long as the padded signal (one output row).
func testIm2Col1D(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, c := range []struct{ T, C, K, stride, pad int }{
		{3000, 80, 3, 1, 1}, {300, 384, 3, 2, 1}, {1, 1, 1, 1, 0}, {7, 5, 3, 1, 0}, {13, 3, 5, 3, 2},
		{9, 4, 2, 2, 2}, {10, 6, 4, 7, 3}, {5, 2, 9, 1, 2}, {33, 17, 1, 4, 0}, {40, 3, 20, 3, 4},
	} {
		name := fmt.Sprintf("T=%d C=%d K=%d stride=%d pad=%d", c.T, c.C, c.K, c.stride, c.pad)
		r := rng("im2col " + name)
		xv := randVec(r, c.T*c.C, 1)
		want, tOut := im2colRef(xv, c.T, c.C, c.K, c.stride, c.pad)
		x := allocView(t, b, c.T, c.C, xv)
		dst, g := output(t, b, tOut, c.C*c.K)
		must(t, b.Im2Col1D(dst, x, c.K, c.stride, c.pad), "Im2Col1D %s", name)
		compare(t, "Im2Col1D "+name, c.C*c.K, read(t, b, dst), want, func(int) float64 { return 0 })
		g.check(t)
	}
}

// fullCase is a FullAttention shape: n query rows, m keys and values.
type fullCase struct {
	n, m, nh, nkv, hd int
	qScale            float64
}

// fullRef computes FullAttention's reference in float64 over the keys and values as stored
// (k, v [m, nkv*hd]), with roundings rd, and the bound of each output element: attention over m
// positions as kvModel.attend derives it.
func fullRef(q []float32, k, v []float64, c fullCase, scale float32, rd rounding) (want, tol []float64) {
	qw, kw, group := c.nh*c.hd, c.nkv*c.hd, c.nh/c.nkv
	want, tol = make([]float64, c.n*qw), make([]float64, c.n*qw)
	for i := 0; i < c.n; i++ {
		for h := 0; h < c.nh; h++ {
			off := (h / group) * c.hd
			o := i*qw + h*c.hd
			attendHead(q[o:o+c.hd], c.m,
				func(j int) []float64 { return k[j*kw+off : j*kw+off+c.hd] },
				func(j int) []float64 { return v[j*kw+off : j*kw+off+c.hd] },
				float64(scale), rd, want[o:o+c.hd], tol[o:o+c.hd])
		}
	}
	return want, tol
}

// fullOperands makes FullAttention's keys and values [m, nkv*hd] of dt, in one of three ways
// chosen by way: F32 allocated tensors (F16: loaded bytes), views of larger tensors (F16:
// converted by Copy), or loaded bytes (F16: views of loaded bytes). It returns them with the
// values they hold.
func fullOperands(t *testing.T, b backend.Backend, dt tensor.DType, rows, cols int, kv, vv []float32, way int) (k, v backend.Tensor, k64, v64 []float64) {
	held := func(x []float32) []float64 {
		out := make([]float64, len(x))
		for i, e := range x {
			out[i] = float64(e)
			if dt == tensor.F16 {
				out[i] = f16Round(e)
			}
		}
		return out
	}
	k64, v64 = held(kv), held(vv)
	mk := func(x []float32) backend.Tensor {
		if dt == tensor.F32 {
			switch way % 3 {
			case 0:
				return alloc(t, b, rows, cols, x)
			case 1:
				return allocView(t, b, rows, cols, x)
			}
			data, _ := quantRows(t, tensor.F32, rows, cols, x)
			return load(t, b, tensor.F32, rows, cols, data)
		}
		switch way % 3 {
		case 0:
			data, _ := f16Bytes(x)
			return load(t, b, tensor.F16, rows, cols, data)
		case 1:
			return allocF16(t, b, rows, cols, x)
		}
		pad := make([]float32, (rows+2)*cols)
		copy(pad[cols:], x)
		data, _ := f16Bytes(pad)
		parent := load(t, b, tensor.F16, rows+2, cols, data)
		view, err := b.View(parent, 1, rows)
		must(t, err, "View of loaded F16 [%d, %d]", rows+2, cols)
		t.Cleanup(func() { view.Close() })
		return view
	}
	return mk(kv), mk(vv), k64, v64
}

// testFullAttention checks attention without a cache over keys and values of both types, against
// the same float64 reference and bounds as Attention (the F16 ones follow the rounding contract):
// Whisper's shapes (6 heads of 64 over 1500 positions, as the decoder's cross-attention reads
// the encoder's output, for a few queries and for tiles of many), few keys and many queries, odd head sizes, grouped-query attention with
// groups larger than a tile of rows, and queries large enough that unshifted exponentials would
// overflow.
func testFullAttention(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	cases := []fullCase{
		{0, 0, 2, 1, 8, 2}, // nothing to attend: a no-op on every backend
		{1, 1, 2, 1, 8, 2},
		{5, 1500, 6, 6, 64, 2},
		{33, 1500, 6, 6, 64, 2},
		{37, 29, 8, 2, 40, 2},
		{200, 300, 4, 2, 64, 2},
		{1500, 3, 2, 2, 24, 2},
		{19, 77, 3, 3, 72, 2},
		{17, 64, 16, 1, 16, 2},
		{3, 40, 32, 1, 8, 2},
		{9, 50, 2, 2, 32, 20},
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16} {
		for ci, c := range cases {
			name := fmt.Sprintf("%v/n%d/m%d/h%d-%d/hd%d/q%g", dt, c.n, c.m, c.nh, c.nkv, c.hd, c.qScale)
			t.Run(name, func(t *testing.T) {
				r := rng("full attention " + name)
				qw, kw := c.nh*c.hd, c.nkv*c.hd
				a := backend.Attn{NHead: c.nh, NKVHead: c.nkv, HeadDim: c.hd, Scale: float32(1.5 / math.Sqrt(float64(c.hd)))}
				qv := randVec(r, c.n*qw, c.qScale)
				kv, vv := randVec(r, c.m*kw, 1), randVec(r, c.m*kw, 1)
				k, v, k64, v64 := fullOperands(t, b, dt, c.m, kw, kv, vv, ci)
				q := alloc(t, b, c.n, qw, qv)
				if ci%2 == 1 {
					q = allocView(t, b, c.n, qw, qv)
				}
				dst, g := output(t, b, c.n, qw)
				must(t, b.FullAttention(dst, q, k, v, a), "FullAttention %s", name)
				f16 := dt == tensor.F16
				want, tol := fullRef(qv, k64, v64, c, a.Scale, rounding{q: f16, p: f16})
				compare(t, "FullAttention "+name, qw, read(t, b, dst), want, func(i int) float64 { return tol[i] })
				g.check(t)
			})
		}
	}
	t.Run("F16/Rounding", func(t *testing.T) { testFullAttentionRounding(t, b) })
}

// testFullAttentionRounding checks that FullAttention over F16 keys and values rounds both the
// query and the normalised weights to F16, as testAttentionRounding does for Attention (the
// reasoning is the same: 48 keys, scores of a few units): the backend's output must be within a
// tenth of the distance that separates the reference with both roundings from those that skip
// one or both.
func testFullAttentionRounding(t *testing.T, b backend.Backend) {
	c := fullCase{n: 32, m: 48, nh: 4, nkv: 2, hd: 64, qScale: 2}
	r := rng("full attention rounding")
	qw, kw := c.nh*c.hd, c.nkv*c.hd
	a := backend.Attn{NHead: c.nh, NKVHead: c.nkv, HeadDim: c.hd, Scale: float32(1.5 / math.Sqrt(float64(c.hd)))}
	qv := randVec(r, c.n*qw, c.qScale)
	k, v, k64, v64 := fullOperands(t, b, tensor.F16, c.m, kw, randVec(r, c.m*kw, 1), randVec(r, c.m*kw, 1), 0)
	dst, g := output(t, b, c.n, qw)
	must(t, b.FullAttention(dst, alloc(t, b, c.n, qw, qv), k, v, a), "FullAttention")
	got := read(t, b, dst)
	g.check(t)
	want, tol := fullRef(qv, k64, v64, c, a.Scale, rounding{q: true, p: true})
	dist := func(x []float64) float64 {
		s := 0.0
		for i, e := range x {
			s += math.Abs(e - want[i])
		}
		return s
	}
	got64 := make([]float64, len(got))
	for i, e := range got {
		got64[i] = float64(e)
	}
	dGot := dist(got64)
	for _, alt := range []struct {
		rd        rounding
		ref, diag string
	}{
		{rounding{q: false, p: true}, "rounds only the weights", "does not round the query to F16 before q·k"},
		{rounding{q: true, p: false}, "rounds only the query", "does not round the attention weights to F16 before p·v"},
		{rounding{}, "rounds neither", "rounds neither the query nor the attention weights to F16"},
	} {
		other, _ := fullRef(qv, k64, v64, c, a.Scale, alt.rd)
		dAlt := dist(other)
		t.Logf("summed distances from the reference with both roundings: the reference that %s %.3g, the backend %.3g", alt.ref, dAlt, dGot)
		if !(dGot <= dAlt/10) {
			t.Errorf("the backend's output is %.3g (summed) from the reference with both roundings, and the reference that %s is %.3g from it: the backend %s",
				dGot, alt.ref, dAlt, alt.diag)
		}
	}
	compare(t, "FullAttention with F16 keys and values", qw, got, want, func(i int) float64 { return tol[i] })
}

// testEncoderErrors checks that bad arguments to the encoder operations give errors, never
// panics, and leave the backend usable.
func testEncoderErrors(t *testing.T, b backend.Backend, newBackend func() (backend.Backend, error)) {
	other := open(t, newBackend)
	const n, d = 3, 32
	r := rng("encoder errors")
	x := alloc(t, b, n, d, randVec(r, n*d, 1))
	sq := alloc(t, b, n, d, nil)
	x4 := alloc(t, b, n+1, d, nil)
	xw := alloc(t, b, n, d+1, nil)
	h := allocF16(t, b, n, d, randVec(r, n*d, 1))
	row := alloc(t, b, 1, d, randVec(r, d, 1))
	wide := alloc(t, b, 1, d+1, nil)
	wdata, _ := quantRows(t, tensor.F32, n, d, randVec(r, n*d, 1))
	loaded := load(t, b, tensor.F32, n, d, wdata)
	qdata, _ := quantRows(t, tensor.Q8_0, n, d, randVec(r, n*d, 1))
	wq := load(t, b, tensor.Q8_0, n, d, qdata)
	foreign := alloc(t, other, n, d, nil)
	closed := alloc(t, b, n, d, nil)
	closed.Close()
	fake := fakeTensor{tensor.F32, n, d}

	t.Run("Copy", func(t *testing.T) {
		mustFail(t, "Copy rows differ", func() error { return b.Copy(x4, x) })
		mustFail(t, "Copy cols differ", func() error { return b.Copy(xw, x) })
		mustFail(t, "Copy F16 cols differ", func() error { return b.Copy(allocF16(t, b, n, d+1, nil), x) })
		mustFail(t, "Copy into loaded memory", func() error { return b.Copy(loaded, x) })
		mustFail(t, "Copy from Q8_0", func() error { return b.Copy(sq, wq) })
		mustFail(t, "Copy into Q8_0", func() error { return b.Copy(wq, x) })
		mustFail(t, "Copy from a foreign tensor", func() error { return b.Copy(sq, foreign) })
		mustFail(t, "Copy into a closed tensor", func() error { return b.Copy(closed, x) })
		mustFail(t, "Copy from a fake tensor", func() error { return b.Copy(sq, fake) })
		mustFail(t, "Copy from nil", func() error { return b.Copy(sq, nil) })
		mustFail(t, "Copy into nil", func() error { return b.Copy(nil, h) })
	})
	t.Run("LayerNorm", func(t *testing.T) {
		mustFail(t, "LayerNorm w cols != x cols", func() error { return b.LayerNorm(sq, x, wide, row, 1e-5) })
		mustFail(t, "LayerNorm b cols != x cols", func() error { return b.LayerNorm(sq, x, row, wide, 1e-5) })
		mustFail(t, "LayerNorm w rows != 1", func() error { return b.LayerNorm(sq, x, x, row, 1e-5) })
		mustFail(t, "LayerNorm b rows != 1", func() error { return b.LayerNorm(sq, x, row, x, 1e-5) })
		mustFail(t, "LayerNorm dst rows", func() error { return b.LayerNorm(x4, x, row, row, 1e-5) })
		mustFail(t, "LayerNorm dst cols", func() error { return b.LayerNorm(xw, x, row, row, 1e-5) })
		mustFail(t, "LayerNorm F16 x", func() error { return b.LayerNorm(sq, h, row, row, 1e-5) })
		mustFail(t, "LayerNorm F16 dst", func() error { return b.LayerNorm(h, x, row, row, 1e-5) })
		mustFail(t, "LayerNorm quantised w", func() error { return b.LayerNorm(sq, x, wq, row, 1e-5) })
		mustFail(t, "LayerNorm into loaded memory", func() error { return b.LayerNorm(loaded, x, row, row, 1e-5) })
		mustFail(t, "LayerNorm negative eps", func() error { return b.LayerNorm(sq, x, row, row, -1) })
		mustFail(t, "LayerNorm NaN eps", func() error { return b.LayerNorm(sq, x, row, row, float32(math.NaN())) })
		mustFail(t, "LayerNorm foreign b", func() error { return b.LayerNorm(sq, x, row, alloc(t, other, 1, d, nil), 1e-5) })
		mustFail(t, "LayerNorm closed x", func() error { return b.LayerNorm(sq, closed, row, row, 1e-5) })
		mustFail(t, "LayerNorm nil w", func() error { return b.LayerNorm(sq, x, nil, row, 1e-5) })
	})
	t.Run("GELU", func(t *testing.T) {
		mustFail(t, "GELU dst rows", func() error { return b.GELU(x4, x) })
		mustFail(t, "GELU dst cols", func() error { return b.GELU(xw, x) })
		mustFail(t, "GELU F16 x", func() error { return b.GELU(sq, h) })
		mustFail(t, "GELU F16 dst", func() error { return b.GELU(h, x) })
		mustFail(t, "GELU quantised x", func() error { return b.GELU(sq, wq) })
		mustFail(t, "GELU into loaded memory", func() error { return b.GELU(loaded, x) })
		mustFail(t, "GELU fake x", func() error { return b.GELU(sq, fake) })
		mustFail(t, "GELU foreign dst", func() error { return b.GELU(foreign, x) })
	})
	t.Run("Im2Col1D", func(t *testing.T) {
		// x [3, 32], kernel 3, stride 1, pad 1: dst [3, 96].
		ok := alloc(t, b, n, 3*d, nil)
		must(t, b.Im2Col1D(ok, x, 3, 1, 1), "Im2Col1D")
		mustFail(t, "Im2Col1D kernel 0", func() error { return b.Im2Col1D(ok, x, 0, 1, 1) })
		mustFail(t, "Im2Col1D negative kernel", func() error { return b.Im2Col1D(ok, x, -3, 1, 1) })
		mustFail(t, "Im2Col1D stride 0", func() error { return b.Im2Col1D(ok, x, 3, 0, 1) })
		mustFail(t, "Im2Col1D negative stride", func() error { return b.Im2Col1D(ok, x, 3, -1, 1) })
		mustFail(t, "Im2Col1D negative padding", func() error { return b.Im2Col1D(alloc(t, b, 1, 3*d, nil), x, 3, 1, -1) })
		mustFail(t, "Im2Col1D kernel longer than the padded signal", func() error { return b.Im2Col1D(alloc(t, b, 1, 6*d, nil), x, 6, 1, 1) })
		mustFail(t, "Im2Col1D dst one row short", func() error { return b.Im2Col1D(alloc(t, b, n-1, 3*d, nil), x, 3, 1, 1) })
		mustFail(t, "Im2Col1D dst one row long", func() error { return b.Im2Col1D(alloc(t, b, n+1, 3*d, nil), x, 3, 1, 1) })
		mustFail(t, "Im2Col1D dst cols", func() error { return b.Im2Col1D(alloc(t, b, n, 3*d-1, nil), x, 3, 1, 1) })
		mustFail(t, "Im2Col1D dst is x", func() error { return b.Im2Col1D(x, x, 1, 1, 0) })
		mustFail(t, "Im2Col1D F16 x", func() error { return b.Im2Col1D(ok, h, 3, 1, 1) })
		mustFail(t, "Im2Col1D quantised x", func() error { return b.Im2Col1D(ok, wq, 3, 1, 1) })
		mustFail(t, "Im2Col1D F16 dst", func() error { return b.Im2Col1D(allocF16(t, b, n, 3*d, nil), x, 3, 1, 1) })
		mustFail(t, "Im2Col1D into loaded memory", func() error { return b.Im2Col1D(loaded, x, 1, 1, 0) })
		mustFail(t, "Im2Col1D padding that overflows", func() error { return b.Im2Col1D(ok, x, 3, 1, math.MaxInt/2) })
		mustFail(t, "Im2Col1D kernel that overflows", func() error { return b.Im2Col1D(ok, x, math.MaxInt/4, 1, math.MaxInt/8) })
		mustFail(t, "Im2Col1D closed x", func() error { return b.Im2Col1D(ok, closed, 3, 1, 1) })
	})
	t.Run("FullAttention", func(t *testing.T) {
		const nh, nkv, hd, m = 4, 2, 8, 5
		a := backend.Attn{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.35}
		q := alloc(t, b, n, nh*hd, randVec(r, n*nh*hd, 1))
		out := alloc(t, b, n, nh*hd, nil)
		k := alloc(t, b, m, nkv*hd, randVec(r, m*nkv*hd, 1))
		v := alloc(t, b, m, nkv*hd, randVec(r, m*nkv*hd, 1))
		k16, v16 := allocF16(t, b, m, nkv*hd, randVec(r, m*nkv*hd, 1)), allocF16(t, b, m, nkv*hd, randVec(r, m*nkv*hd, 1))
		must(t, b.FullAttention(out, q, k, v, a), "FullAttention")
		must(t, b.FullAttention(out, q, k16, v16, a), "FullAttention F16")
		with := func(f func(a *backend.Attn)) backend.Attn { c := a; f(&c); return c }
		mustFail(t, "FullAttention NHead not a multiple of NKVHead", func() error {
			return b.FullAttention(alloc(t, b, n, 3*hd, nil), alloc(t, b, n, 3*hd, nil), k, v, with(func(a *backend.Attn) { a.NHead = 3 }))
		})
		mustFail(t, "FullAttention HeadDim 0", func() error {
			return b.FullAttention(out, q, k, v, with(func(a *backend.Attn) { a.HeadDim = 0 }))
		})
		mustFail(t, "FullAttention NKVHead 0", func() error {
			return b.FullAttention(out, q, k, v, with(func(a *backend.Attn) { a.NKVHead = 0 }))
		})
		mustFail(t, "FullAttention NaN scale", func() error {
			return b.FullAttention(out, q, k, v, with(func(a *backend.Attn) { a.Scale = float32(math.NaN()) }))
		})
		mustFail(t, "FullAttention q cols != NHead*HeadDim", func() error { return b.FullAttention(out, k, k, v, a) })
		mustFail(t, "FullAttention k cols != NKVHead*HeadDim", func() error { return b.FullAttention(out, q, q, q, a) })
		mustFail(t, "FullAttention v rows != k rows", func() error {
			return b.FullAttention(out, q, k, alloc(t, b, m+1, nkv*hd, nil), a)
		})
		mustFail(t, "FullAttention v cols != k cols", func() error {
			return b.FullAttention(out, q, k, alloc(t, b, m, nkv*hd+1, nil), a)
		})
		mustFail(t, "FullAttention F32 k with F16 v", func() error { return b.FullAttention(out, q, k, v16, a) })
		mustFail(t, "FullAttention F16 k with F32 v", func() error { return b.FullAttention(out, q, k16, v, a) })
		mustFail(t, "FullAttention Q8_0 k and v", func() error {
			kq, _ := quantRows(t, tensor.Q8_0, m, 32, randVec(r, m*32, 1))
			w := load(t, b, tensor.Q8_0, m, 32, kq)
			return b.FullAttention(alloc(t, b, n, 64, nil), alloc(t, b, n, 64, nil), w, w, backend.Attn{NHead: 2, NKVHead: 1, HeadDim: 32, Scale: 1})
		})
		mustFail(t, "FullAttention F16 q", func() error {
			return b.FullAttention(out, allocF16(t, b, n, nh*hd, nil), k, v, a)
		})
		mustFail(t, "FullAttention dst rows", func() error { return b.FullAttention(alloc(t, b, n+1, nh*hd, nil), q, k, v, a) })
		mustFail(t, "FullAttention dst cols", func() error { return b.FullAttention(alloc(t, b, n, nh*hd+1, nil), q, k, v, a) })
		mustFail(t, "FullAttention dst is q", func() error { return b.FullAttention(q, q, k, v, a) })
		mustFail(t, "FullAttention dst is k", func() error {
			kk := alloc(t, b, n, nh*hd, nil)
			return b.FullAttention(kk, q, kk, kk, backend.Attn{NHead: nh, NKVHead: nh, HeadDim: hd, Scale: 1})
		})
		mustFail(t, "FullAttention F16 dst", func() error { return b.FullAttention(allocF16(t, b, n, nh*hd, nil), q, k, v, a) })
		mustFail(t, "FullAttention into loaded memory", func() error {
			ld, _ := quantRows(t, tensor.F32, n, nh*hd, randVec(r, n*nh*hd, 1))
			return b.FullAttention(load(t, b, tensor.F32, n, nh*hd, ld), q, k, v, a)
		})
		mustFail(t, "FullAttention with no keys", func() error {
			return b.FullAttention(out, q, alloc(t, b, 0, nkv*hd, nil), alloc(t, b, 0, nkv*hd, nil), a)
		})
		mustFail(t, "FullAttention foreign k", func() error { return b.FullAttention(out, q, alloc(t, other, m, nkv*hd, nil), v, a) })
		mustFail(t, "FullAttention closed v", func() error {
			c := alloc(t, b, m, nkv*hd, nil)
			c.Close()
			return b.FullAttention(out, q, k, c, a)
		})
		mustFail(t, "FullAttention nil q", func() error { return b.FullAttention(out, nil, k, v, a) })
	})

	// The backend still computes after all of that.
	must(t, b.GELU(sq, x), "GELU after the argument errors")
	for i, e := range read(t, b, sq) {
		if e != e {
			t.Fatalf("GELU after the argument errors: element %d is NaN", i)
		}
	}
}
