package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// elementwise sizes: one element, odd widths, and model widths.
var widths = []int{1, 7, 33, 256, 768}

func testTensors(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	t.Run("AllocZeroed", func(t *testing.T) {
		x := alloc(t, b, 5, 7, nil)
		if x.DType() != tensor.F32 || x.Rows() != 5 || x.Cols() != 7 {
			t.Fatalf("Alloc(F32, 5, 7) = %v [%d, %d]", x.DType(), x.Rows(), x.Cols())
		}
		for i, v := range read(t, b, x) {
			if v != 0 {
				t.Fatalf("element %d of a fresh tensor is %v, want 0", i, v)
			}
		}
	})
	t.Run("WriteReadRows", func(t *testing.T) {
		const rows, cols = 7, 5
		x := alloc(t, b, rows, cols, nil)
		r := rng("write rows")
		src := randVec(r, 3*cols, 1)
		must(t, b.Write(x, 2, src), "Write rows 2..4")
		got := read(t, b, x)
		for i, v := range got {
			want := float32(0)
			if row := i / cols; row >= 2 && row < 5 {
				want = src[i-2*cols]
			}
			if v != want {
				t.Fatalf("after Write of rows 2..4 of 7, element [%d, %d] = %v, want %v", i/cols, i%cols, v, want)
			}
		}
		part := make([]float32, 2*cols)
		must(t, b.Read(x, 3, part), "Read rows 3..4")
		for i, v := range part {
			if v != src[cols+i] {
				t.Fatalf("Read of rows 3..4: element %d = %v, want %v", i, v, src[cols+i])
			}
		}
	})
	t.Run("LoadF32", func(t *testing.T) {
		const rows, cols = 3, 9
		r := rng("load f32")
		data, want := quantRows(t, tensor.F32, rows, cols, randVec(r, rows*cols, 1))
		w := load(t, b, tensor.F32, rows, cols, data)
		if w.DType() != tensor.F32 || w.Rows() != rows || w.Cols() != cols {
			t.Fatalf("Load(F32, %d, %d) = %v [%d, %d]", rows, cols, w.DType(), w.Rows(), w.Cols())
		}
		dst := alloc(t, b, rows, cols, nil)
		must(t, b.GetRows(dst, w, []int32{0, 1, 2}), "GetRows")
		compare(t, "GetRows of every row of a loaded F32 tensor", cols, read(t, b, dst), want,
			func(int) float64 { return 0 })
	})
	t.Run("View", func(t *testing.T) {
		const rows, cols = 6, 5
		r := rng("view")
		vals := randVec(r, rows*cols, 1)
		parent := alloc(t, b, rows, cols, vals)
		v, err := b.View(parent, 2, 3)
		must(t, err, "View(parent, 2, 3)")
		if v.DType() != tensor.F32 || v.Rows() != 3 || v.Cols() != cols {
			t.Fatalf("View(parent [6, 5], 2, 3) = %v [%d, %d]", v.DType(), v.Rows(), v.Cols())
		}
		got := read(t, b, v)
		for i, x := range got {
			if x != vals[2*cols+i] {
				t.Fatalf("view element %d = %v, want parent's %v", i, x, vals[2*cols+i])
			}
		}
		row := randVec(r, cols, 1)
		must(t, b.Write(v, 1, row), "Write row 1 of the view")
		copy(vals[3*cols:], row)
		vv, err := b.View(v, 1, 2)
		must(t, err, "View of a view")
		if got := read(t, b, vv); got[0] != row[0] || got[cols] != vals[4*cols] {
			t.Fatalf("view of a view reads %v, %v; want %v, %v", got[0], got[cols], row[0], vals[4*cols])
		}
		if err := vv.Close(); err != nil {
			t.Fatalf("closing a view: %v", err)
		}
		if err := v.Close(); err != nil {
			t.Fatalf("closing a view: %v", err)
		}
		for i, x := range read(t, b, parent) {
			if x != vals[i] {
				t.Fatalf("after writing through and closing views, parent element %d = %v, want %v", i, x, vals[i])
			}
		}
	})
	t.Run("CloseTwice", func(t *testing.T) {
		x, err := b.Alloc(tensor.F32, 2, 2)
		must(t, err, "Alloc")
		if err := x.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := x.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

// testAddRows checks a full sum and a broadcast bias. float32 addition is correctly rounded, so
// the result is within one rounding (2^-24 relative) of the exact float64 sum.
func testAddRows(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, d := range widths {
		for _, n := range []int{1, 3, 17} {
			for _, brows := range []int{n, 1} {
				name := fmt.Sprintf("AddRows n=%d d=%d b_rows=%d", n, d, brows)
				r := rng(name)
				av, bv := randVec(r, n*d, 1), randVec(r, brows*d, 1)
				a, bt := alloc(t, b, n, d, av), allocView(t, b, brows, d, bv)
				dst, g := output(t, b, n, d)
				must(t, b.AddRows(dst, a, bt), "%s", name)
				want := make([]float64, n*d)
				for i := range want {
					want[i] = float64(av[i]) + float64(bv[(i/d%brows)*d+i%d])
				}
				compare(t, name, d, read(t, b, dst), want, func(i int) float64 { return math.Abs(want[i]) * u })
				g.check(t)
			}
		}
	}
}

// rmsRef is x / sqrt(mean(x²)+eps) * w for x [n, d], w [d].
func rmsRef(x, w []float32, n, d int, eps float32) []float64 {
	out := make([]float64, n*d)
	for i := 0; i < n; i++ {
		ss := 0.0
		for _, v := range x[i*d : (i+1)*d] {
			ss += float64(v) * float64(v)
		}
		s := 1 / math.Sqrt(ss/float64(d)+float64(eps))
		for j := 0; j < d; j++ {
			out[i*d+j] = float64(x[i*d+j]) * s * float64(w[j])
		}
	}
	return out
}

// testRMSNorm checks RMSNorm with a negligible and a dominant eps. The float32 sum of d squares
// has relative error at most (d+1)·2^-24; the square root halves it; the two multiplications add
// two roundings: (d/2+4)·2^-24 relative to each element.
func testRMSNorm(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, d := range append(widths, 4096) {
		for _, n := range []int{1, 3, 17} {
			for _, c := range []struct {
				eps   float32
				scale float64
			}{{1e-5, 1}, {1e-2, 0.05}} {
				name := fmt.Sprintf("RMSNorm n=%d d=%d eps=%g", n, d, c.eps)
				r := rng(name)
				xv, wv := randVec(r, n*d, c.scale), randVec(r, d, 1)
				x, w := alloc(t, b, n, d, xv), alloc(t, b, 1, d, wv)
				dst, g := output(t, b, n, d)
				must(t, b.RMSNorm(dst, x, w, c.eps), "%s", name)
				want := rmsRef(xv, wv, n, d, c.eps)
				rel := float64(d/2+4) * u
				compare(t, name, d, read(t, b, dst), want, func(i int) float64 { return math.Abs(want[i])*rel + 1e-30 })
				g.check(t)
			}
		}
	}
	// w narrower than x: each group of w's width normalised apart (per-head norms), the
	// reference being the plain norm of x as [n*h, g].
	for _, c := range []struct{ n, h, g int }{{1, 1, 7}, {3, 16, 128}, {17, 6, 48}, {5, 4, 33}} {
		name := fmt.Sprintf("RMSNorm grouped n=%d h=%d g=%d", c.n, c.h, c.g)
		r := rng(name)
		d := c.h * c.g
		xv, wv := randVec(r, c.n*d, 1), randVec(r, c.g, 1)
		x, w := alloc(t, b, c.n, d, xv), alloc(t, b, 1, c.g, wv)
		dst, g := output(t, b, c.n, d)
		must(t, b.RMSNorm(dst, x, w, 1e-6), "%s", name)
		want := rmsRef(xv, wv, c.n*c.h, c.g, 1e-6)
		rel := float64(c.g/2+4) * u
		compare(t, name, d, read(t, b, dst), want, func(i int) float64 { return math.Abs(want[i])*rel + 1e-30 })
		g.check(t)
		in := alloc(t, b, c.n, d, xv) // in place
		must(t, b.RMSNorm(in, in, w, 1e-6), "%s in place", name)
		compare(t, name+" in place", d, read(t, b, in), want, func(i int) float64 { return math.Abs(want[i])*rel + 1e-30 })
	}
	if x, w := alloc(t, b, 2, 12, nil), alloc(t, b, 1, 5, nil); b.RMSNorm(x, x, w, 1e-5) == nil {
		t.Errorf("RMSNorm with w of 5 columns over rows of 12: no error")
	}
}

// swigluRef is silu(g)*u in float64.
func swigluRef(g, up []float32) []float64 {
	out := make([]float64, len(g))
	for i := range g {
		gv := float64(g[i])
		out[i] = gv / (1 + math.Exp(-gv)) * float64(up[i])
	}
	return out
}

// testScale checks Scale: every product is one float32 multiplication, so exact.
func testScale(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, d := range widths {
		for _, n := range []int{1, 3, 17, 700} {
			for _, s := range []float32{0.22, -3, 78.38367, 0} {
				name := fmt.Sprintf("Scale n=%d d=%d s=%v", n, d, s)
				xv := randVec(rng(name), n*d, 4)
				xt := alloc(t, b, n, d, xv)
				dst, g := output(t, b, n, d)
				must(t, b.Scale(dst, xt, s), "%s", name)
				for i, v := range read(t, b, dst) {
					if want := xv[i] * s; v != want {
						t.Fatalf("%s: element %d = %v, want %v", name, i, v, want)
					}
				}
				g.check(t)
			}
		}
	}
}

// testSwiGLU checks SwiGLU, including gates far out in both tails, where exp(-g) overflows
// float32 and a careless formula gives NaN. Backends may use a float32 exp approximation: the
// bound allows 2^-18 relative error (ggml's vectorised expf is within a few ulp).
func testSwiGLU(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, d := range widths {
		for _, n := range []int{1, 3, 17} {
			name := fmt.Sprintf("SwiGLU n=%d d=%d", n, d)
			r := rng(name)
			gv, uv := randVec(r, n*d, 2), randVec(r, n*d, 1)
			tails := []float32{-100, -88.5, -30, 30, 88.5, 100}
			for i := 0; i < len(gv) && i < len(tails); i++ {
				gv[len(gv)-1-i] = tails[i]
			}
			gt, ut := alloc(t, b, n, d, gv), alloc(t, b, n, d, uv)
			dst, g := output(t, b, n, d)
			must(t, b.SwiGLU(dst, gt, ut), "%s", name)
			want := swigluRef(gv, uv)
			compare(t, name, d, read(t, b, dst), want, func(i int) float64 { return math.Abs(want[i])*0x1p-18 + 1e-37 })
			g.check(t)
		}
	}
}

// ropeRef rotates x [n, nHead*r.HeadDim] as backend.RoPE documents: pair i (i < Dims/2) of a
// token at position p is rotated by theta = p*FreqScale*Base^(-2i/Dims)/Factors[i] and multiplied
// by AttnFactor; pairs are (2i, 2i+1) in normal mode and (i, i+Dims/2) in NeoX mode; elements
// from Dims on are kept.
func ropeRef(x []float32, nHead int, r backend.RoPE, pos []int32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	width := nHead * r.HeadDim
	for t, p := range pos {
		for h := 0; h < nHead; h++ {
			base := t*width + h*r.HeadDim
			for i := 0; i < r.Dims/2; i++ {
				extrap := float64(p) * math.Pow(float64(r.Base), -2*float64(i)/float64(r.Dims))
				if r.Factors != nil {
					extrap /= float64(r.Factors[i])
				}
				theta := extrap * float64(r.FreqScale)
				if r.ExtFactor != 0 {
					y := (float64(i) - float64(r.CorrDims[0])) / math.Max(0.001, float64(r.CorrDims[1]-r.CorrDims[0]))
					mix := (1 - math.Min(1, math.Max(0, y))) * float64(r.ExtFactor)
					theta = theta*(1-mix) + extrap*mix
				}
				a, c := base+2*i, base+2*i+1
				if r.Mode == backend.RoPENeoX {
					a, c = base+i, base+i+r.Dims/2
				}
				x0, x1 := float64(x[a]), float64(x[c])
				sin, cos := math.Sincos(theta)
				if r.AttnFactor != 0 {
					sin, cos = sin*float64(r.AttnFactor), cos*float64(r.AttnFactor)
				}
				if r.ExtFactor != 0 {
					m := 1 + 0.1*math.Log(1/float64(r.FreqScale))
					sin, cos = sin*m, cos*m
				}
				out[a] = x0*cos - x1*sin
				out[c] = x0*sin + x1*cos
			}
		}
	}
	return out
}

// testRope checks both modes, frequency scaling and partial rotation. Backends compute angles in
// float32, commonly as p*FreqScale times a running product of Base^(-2/Dims): the angle itself is
// then off by up to about (Dims/2+2)·2^-24 relative, which at position p is an absolute error of
// p·FreqScale·(Dims/2+2)·2^-24 radians in the worst pair, times the pair's magnitude in the
// result; plus a few roundings of the rotation itself. Frequency factors (all at least 1 here, as
// Llama 3.1's are) only shrink angles, and add one rounding (the division).
func testRope(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	// llama3Factors are the frequency factors of Llama 3.1's rope scaling (factor 8, low and
	// high frequency factors 1 and 4, original context 8192), as llama.cpp's converter writes
	// them into rope_freqs, for dims rotated elements of base.
	llama3Factors := func(dims int, base float64) []float32 {
		f := make([]float32, dims/2)
		const factor, low, high, orig = 8.0, 1.0, 4.0, 8192.0
		for i := range f {
			freq := math.Pow(base, -2*float64(i)/float64(dims))
			wavelen := 2 * math.Pi / freq
			switch {
			case wavelen < orig/high:
				f[i] = 1
			case wavelen > orig/low:
				f[i] = factor
			default:
				smooth := (orig/wavelen - low) / (high - low)
				f[i] = float32(1 / ((1-smooth)/factor + smooth))
			}
		}
		return f
	}
	cases := []struct {
		name  string
		nHead int
		r     backend.RoPE
	}{
		{"Normal", 3, backend.RoPE{Mode: backend.RoPENormal, HeadDim: 16, Dims: 16, Base: 10000, FreqScale: 1}},
		{"NeoX", 2, backend.RoPE{Mode: backend.RoPENeoX, HeadDim: 64, Dims: 64, Base: 1e6, FreqScale: 1}},
		{"NormalScaled", 4, backend.RoPE{Mode: backend.RoPENormal, HeadDim: 64, Dims: 64, Base: 10000, FreqScale: 0.25}},
		{"NeoXScaled", 3, backend.RoPE{Mode: backend.RoPENeoX, HeadDim: 32, Dims: 32, Base: 500000, FreqScale: 0.5}},
		{"NormalPartial", 3, backend.RoPE{Mode: backend.RoPENormal, HeadDim: 16, Dims: 12, Base: 10000, FreqScale: 1}},
		{"NeoXPartial", 2, backend.RoPE{Mode: backend.RoPENeoX, HeadDim: 40, Dims: 16, Base: 10000, FreqScale: 0.5}},
		{"NormalFactors", 3, backend.RoPE{Mode: backend.RoPENormal, HeadDim: 64, Dims: 64, Base: 500000, FreqScale: 1, Factors: llama3Factors(64, 500000)}},
		{"NeoXFactors", 2, backend.RoPE{Mode: backend.RoPENeoX, HeadDim: 32, Dims: 32, Base: 10000, FreqScale: 0.5, Factors: llama3Factors(32, 10000)}},
		// LongRoPE as Phi-4-mini has it: part of the head rotated, factors, an attention factor.
		{"NeoXPartialAttnFactor", 3, backend.RoPE{Mode: backend.RoPENeoX, HeadDim: 32, Dims: 24, Base: 10000, FreqScale: 1, Factors: llama3Factors(24, 10000), AttnFactor: 1.19}},
		{"NormalAttnFactor", 2, backend.RoPE{Mode: backend.RoPENormal, HeadDim: 16, Dims: 16, Base: 10000, FreqScale: 1, AttnFactor: 0.75}},
		// YaRN as Qwen's long-context files have it (factor 4 over 32768 positions), and with
		// frequency factors, part of the head and a partial extrapolation.
		{"NeoXYaRN", 2, backend.RoPE{Mode: backend.RoPENeoX, HeadDim: 64, Dims: 64, Base: 1e6, FreqScale: 0.25, ExtFactor: 1,
			CorrDims: backend.YaRNCorrDims(64, 32768, 1e6, 32, 1)}},
		{"NormalYaRNPartial", 3, backend.RoPE{Mode: backend.RoPENormal, HeadDim: 32, Dims: 24, Base: 10000, FreqScale: 0.125, ExtFactor: 0.5,
			Factors: llama3Factors(24, 10000), AttnFactor: 1.1, CorrDims: backend.YaRNCorrDims(24, 2048, 10000, 32, 1)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rng("rope " + c.name)
			for _, n := range []int{1, 5, 19} {
				width := c.nHead * c.r.HeadDim
				pos := make([]int32, n)
				for i := range pos {
					pos[i] = int32(r.IntN(3000))
				}
				pos[0] = 0
				if n > 1 {
					pos[1] = 2999
				}
				xv := randVec(r, n*width, 1)
				x := alloc(t, b, n, width, xv)
				bt := &backend.Batch{Pos: pos, Slot: make([]int32, n), Seqs: []backend.Seq{{Start: 0, Count: n, CtxLen: 3000}}}
				for i := range bt.Slot {
					bt.Slot[i] = int32(i)
				}
				must(t, b.Rope(x, c.nHead, c.r, bt), "Rope %s n=%d", c.name, n)
				got := read(t, b, x)
				want := ropeRef(xv, c.nHead, c.r, pos)
				roundings := c.r.Dims/2 + 2
				if c.r.Factors != nil {
					roundings++
				}
				if c.r.AttnFactor != 0 {
					roundings++
				}
				if c.r.ExtFactor != 0 {
					roundings += 4 // the mix of two angles, and the magnitude's factor
				}
				fs := float64(c.r.FreqScale)
				if c.r.ExtFactor != 0 {
					fs = 1 // the fastest pairs keep their unscaled angle
				}
				angle := func(p int32) float64 {
					return float64(p)*fs*float64(roundings)*u + 8*u
				}
				compare(t, fmt.Sprintf("Rope %s n=%d", c.name, n), width, got, want, func(i int) float64 {
					tok, e := i/width, i%c.r.HeadDim
					if e >= c.r.Dims {
						return 0 // not rotated: must be kept exactly
					}
					h := i - e
					var mag float64
					if c.r.Mode == backend.RoPENeoX {
						j := e % (c.r.Dims / 2)
						mag = math.Hypot(float64(xv[h+j]), float64(xv[h+j+c.r.Dims/2]))
					} else {
						j := e &^ 1
						mag = math.Hypot(float64(xv[h+j]), float64(xv[h+j+1]))
					}
					return mag * angle(pos[tok])
				})
			}
		})
	}
}

// testAliasing checks the in-place forms the interface allows: AddRows with dst == a, RMSNorm
// and LayerNorm with dst == x, SwiGLU with dst == gate, GELU and Scale with dst == x. Results must equal
// the out-of-place ones exactly.
func testAliasing(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	const n, d = 5, 96
	r := rng("aliasing")
	av, bv, wv := randVec(r, n*d, 1), randVec(r, n*d, 1), randVec(r, d, 1)
	type op struct {
		name string
		run  func(dst, x backend.Tensor) error
	}
	bt, wt, lb := alloc(t, b, n, d, bv), alloc(t, b, 1, d, wv), alloc(t, b, 1, d, randVec(r, d, 0.5))
	for _, o := range []op{
		{"AddRows", func(dst, x backend.Tensor) error { return b.AddRows(dst, x, bt) }},
		{"AddRowsBias", func(dst, x backend.Tensor) error { return b.AddRows(dst, x, wt) }},
		{"RMSNorm", func(dst, x backend.Tensor) error { return b.RMSNorm(dst, x, wt, 1e-5) }},
		{"SwiGLU", func(dst, x backend.Tensor) error { return b.SwiGLU(dst, x, bt) }},
		{"Scale", func(dst, x backend.Tensor) error { return b.Scale(dst, x, 1.7) }},
		{"GeGLU", func(dst, x backend.Tensor) error { return b.GeGLU(dst, x, bt) }},
		{"LayerNorm", func(dst, x backend.Tensor) error { return b.LayerNorm(dst, x, wt, lb, 1e-5) }},
		{"GELU", func(dst, x backend.Tensor) error { return b.GELU(dst, x) }},
	} {
		t.Run(o.name, func(t *testing.T) {
			x := alloc(t, b, n, d, av)
			dst := alloc(t, b, n, d, nil)
			must(t, o.run(dst, x), "%s out of place", o.name)
			want := read(t, b, dst)
			must(t, o.run(x, x), "%s in place", o.name)
			got := read(t, b, x)
			for i := range got {
				if got[i] != want[i] && !(got[i] != got[i] && want[i] != want[i]) {
					t.Fatalf("%s in place: element [%d, %d] = %v, out of place %v", o.name, i/d, i%d, got[i], want[i])
				}
			}
		})
	}
}

// testPartialOverlap checks that every backend refuses, in the same way, an output that shares
// part of its memory with an input (two views of one tensor, a row apart), where the operation
// allows at most that the output be the input itself; and that the operations still compute
// after.
func testPartialOverlap(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	const n, d = 4, 32
	r := rng("partial overlap")
	parent := alloc(t, b, n+1, d, randVec(r, (n+1)*d, 1))
	view := func(row0 int) backend.Tensor {
		v, err := b.View(parent, row0, n)
		must(t, err, "View")
		t.Cleanup(func() { v.Close() })
		return v
	}
	x, dst := view(0), view(1)
	up, w, lb := alloc(t, b, n, d, randVec(r, n*d, 1)), alloc(t, b, 1, d, randVec(r, d, 1)), alloc(t, b, 1, d, randVec(r, d, 1))
	wdata, _ := quantRows(t, tensor.F32, d, d, randVec(r, d*d, 1))
	wm := load(t, b, tensor.F32, d, d, wdata)
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"AddRows", func() error { return b.AddRows(dst, x, up) }},
		{"RMSNorm", func() error { return b.RMSNorm(dst, x, w, 1e-5) }},
		{"Scale", func() error { return b.Scale(dst, x, 2) }},
		{"SwiGLU", func() error { return b.SwiGLU(dst, x, up) }},
		{"GeGLU", func() error { return b.GeGLU(dst, up, x) }},
		{"GELU", func() error { return b.GELU(dst, x) }},
		{"Unary", func() error { return b.Unary(dst, x, tensor.Tanh) }},
		{"GLU", func() error { return b.GLU(dst, up, x, tensor.Sigmoid) }},
		{"LayerNorm", func() error { return b.LayerNorm(dst, x, w, lb, 1e-5) }},
		{"Copy", func() error { return b.Copy(dst, x) }},
		{"MatMul", func() error { return b.MatMul(dst, x, wm) }},
		{"MatMulInPlace", func() error { return b.MatMul(x, x, wm) }},
	} {
		if err := c.run(); err == nil {
			t.Errorf("%s with dst one row past x in the same tensor: no error", c.name)
		}
	}
	must(t, b.Scale(x, x, 0.5), "Scale in place after the refusals")
}

// f16Round rounds v to F16 and back, as an F16 KV cache stores it.
func f16Round(v float32) float64 { return float64(quant.F16ToF32(quant.F32ToF16(v))) }

func bf16Round(v float32) float64 { return float64(quant.BF16ToF32(quant.F32ToBF16(v))) }
