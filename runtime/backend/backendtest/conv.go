package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The 2-D convolutions' operations: Im2Col2D and DepthwiseConv2D.

// convCases are the geometries both are checked with (C channels): Parakeet's subsampling (the
// first convolution on the log-mel image, a depthwise one after it) and its conformer's time
// convolution, then odd ones: uneven strides and paddings, a kernel as large as the padded
// image, a 1×1 kernel.
var convCases = []struct {
	g backend.ConvGeom
	c int
}{
	{backend.ConvGeom{H: 101, W: 128, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1}, 1},
	{backend.ConvGeom{H: 51, W: 64, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1}, 24},
	{backend.ConvGeom{H: 138, W: 1, KH: 9, KW: 1, SH: 1, SW: 1, PH: 4}, 67},
	{backend.ConvGeom{H: 7, W: 5, KH: 2, KW: 4, SH: 3, SW: 1, PH: 1, PW: 2}, 3},
	{backend.ConvGeom{H: 3, W: 4, KH: 5, KW: 6, SH: 1, SW: 2, PH: 1, PW: 1}, 5},
	{backend.ConvGeom{H: 9, W: 11, KH: 1, KW: 1, SH: 1, SW: 1}, 33},
	{backend.ConvGeom{H: 1, W: 1, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1}, 2},
}

func convName(g backend.ConvGeom, c int) string {
	return fmt.Sprintf("%dx%dx%d k%dx%d s%dx%d p%dx%d", g.H, g.W, c, g.KH, g.KW, g.SH, g.SW, g.PH, g.PW)
}

// convTap returns the input row of tap (kh, kw) of output pixel o, or -1 in the padding.
func convTap(g backend.ConvGeom, o, kh, kw int) int {
	_, wo := g.Out()
	ih, iw := o/wo*g.SH+kh-g.PH, o%wo*g.SW+kw-g.PW
	if ih < 0 || ih >= g.H || iw < 0 || iw >= g.W {
		return -1
	}
	return ih*g.W + iw
}

// testIm2Col2D checks the layout of receptive fields exactly.
func testIm2Col2D(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, c := range convCases {
		g, C := c.g, c.c
		name := convName(g, C)
		xv := randVec(rng("im2col 2d "+name), g.H*g.W*C, 1)
		ho, wo := g.Out()
		taps := g.KH * g.KW
		want := make([]float64, ho*wo*C*taps)
		for o := 0; o < ho*wo; o++ {
			for ch := 0; ch < C; ch++ {
				for kh := 0; kh < g.KH; kh++ {
					for kw := 0; kw < g.KW; kw++ {
						if r := convTap(g, o, kh, kw); r >= 0 {
							want[o*C*taps+ch*taps+kh*g.KW+kw] = float64(xv[r*C+ch])
						}
					}
				}
			}
		}
		x := allocView(t, b, g.H*g.W, C, xv)
		dst, gd := output(t, b, ho*wo, C*taps)
		must(t, b.Im2Col2D(dst, x, g), "Im2Col2D %s", name)
		compare(t, "Im2Col2D "+name, C*taps, read(t, b, dst), want, func(int) float64 { return 0 })
		gd.check(t)
	}
}

// testDepthwiseConv2D checks each channel's convolution against float64: the bias and the taps
// inside the image, summed in float32 in any order, are within (taps+2)·u of the sum of their
// magnitudes.
func testDepthwiseConv2D(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, c := range convCases {
		g, C := c.g, c.c
		name := convName(g, C)
		r := rng("depthwise conv 2d " + name)
		taps := g.KH * g.KW
		xv, wv, bv := randVec(r, g.H*g.W*C, 1), randVec(r, C*taps, 0.5), randVec(r, C, 0.3)
		ho, wo := g.Out()
		want, tol := make([]float64, ho*wo*C), make([]float64, ho*wo*C)
		for o := 0; o < ho*wo; o++ {
			for ch := 0; ch < C; ch++ {
				s, abs := float64(bv[ch]), math.Abs(float64(bv[ch]))
				for kh := 0; kh < g.KH; kh++ {
					for kw := 0; kw < g.KW; kw++ {
						if in := convTap(g, o, kh, kw); in >= 0 {
							p := float64(wv[ch*taps+kh*g.KW+kw]) * float64(xv[in*C+ch])
							s += p
							abs += math.Abs(p)
						}
					}
				}
				want[o*C+ch], tol[o*C+ch] = s, float64(taps+2)*u*abs
			}
		}
		x := allocView(t, b, g.H*g.W, C, xv)
		w := alloc(t, b, C, taps, wv)
		bias := allocView(t, b, 1, C, bv)
		dst, gd := output(t, b, ho*wo, C)
		must(t, b.DepthwiseConv2D(dst, x, w, bias, g), "DepthwiseConv2D %s", name)
		compare(t, "DepthwiseConv2D "+name, C, read(t, b, dst), want, func(i int) float64 { return tol[i] })
		gd.check(t)
	}
}

// testConvErrors checks the refusals of both operations: the shared checks' words for bad
// shapes and geometries (ArgChecks' way), and operands no backend takes.
func testConvErrors(t *testing.T, b backend.Backend, newBackend func() (backend.Backend, error)) {
	other := open(t, newBackend)
	r := rng("conv errors")
	g := backend.ConvGeom{H: 4, W: 6, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1} // out 2×3
	const C = 5
	x := alloc(t, b, 24, C, randVec(r, 24*C, 1))
	cols := alloc(t, b, 6, C*9, nil)
	dw := alloc(t, b, 6, C, nil)
	w := alloc(t, b, C, 9, randVec(r, C*9, 1))
	bias := alloc(t, b, 1, C, randVec(r, C, 1))
	wdata, _ := quantRows(t, tensor.F32, C, 9, randVec(r, C*9, 1))
	loaded := load(t, b, tensor.F32, C, 9, wdata)
	closed := alloc(t, b, 24, C, nil)
	closed.Close()
	foreign := alloc(t, other, 24, C, nil)
	h := allocF16(t, b, 24, C, randVec(r, 24*C, 1))
	parent := alloc(t, b, 30, C, nil)
	view := func(row0, rows int) backend.Tensor {
		v, err := b.View(parent, row0, rows)
		must(t, err, "View")
		t.Cleanup(func() { v.Close() })
		return v
	}
	if err := b.Im2Col2D(cols, x, g); err != nil {
		t.Fatalf("Im2Col2D with good arguments: %v", err)
	}
	if err := b.DepthwiseConv2D(dw, x, w, bias, g); err != nil {
		t.Fatalf("DepthwiseConv2D with good arguments: %v", err)
	}
	edit := func(f func(g *backend.ConvGeom)) backend.ConvGeom { c := g; f(&c); return c }
	var cases []argCase
	for _, c := range []struct {
		name string
		g    backend.ConvGeom
	}{
		{"H 0", edit(func(g *backend.ConvGeom) { g.H = 0 })},
		{"KW 0", edit(func(g *backend.ConvGeom) { g.KW = 0 })},
		{"stride -1", edit(func(g *backend.ConvGeom) { g.SH = -1 })},
		{"padding -1", edit(func(g *backend.ConvGeom) { g.PW = -1 })},
		{"kernel larger than the padded image", edit(func(g *backend.ConvGeom) { g.KH = 7 })},
		{"a size past 2^24", edit(func(g *backend.ConvGeom) { g.H, g.W = 1<<25, 1 })},
		{"a padding past 2^24", edit(func(g *backend.ConvGeom) { g.PH = 1 << 25 })},
		{"x rows not H*W", edit(func(g *backend.ConvGeom) { g.H, g.W = 5, 5 })},
	} {
		cases = append(cases,
			argCase{"Im2Col2D " + c.name, func() error { return b.Im2Col2D(cols, x, c.g) }, func() error { return backend.CheckIm2Col2D(cols, x, c.g) }},
			argCase{"DepthwiseConv2D " + c.name, func() error { return b.DepthwiseConv2D(dw, x, w, bias, c.g) },
				func() error { return backend.CheckDepthwiseConv2D(dw, x, w, bias, c.g) }})
	}
	wide := alloc(t, b, 6, C*9+1, nil)
	cases = append(cases,
		argCase{"Im2Col2D dst cols", func() error { return b.Im2Col2D(wide, x, g) }, func() error { return backend.CheckIm2Col2D(wide, x, g) }},
		argCase{"Im2Col2D dst rows", func() error { return b.Im2Col2D(x, x, g) }, func() error { return backend.CheckIm2Col2D(x, x, g) }},
		argCase{"DepthwiseConv2D w taps", func() error { return b.DepthwiseConv2D(dw, x, cols, bias, g) },
			func() error { return backend.CheckDepthwiseConv2D(dw, x, cols, bias, g) }},
		argCase{"DepthwiseConv2D b rows", func() error { return b.DepthwiseConv2D(dw, x, w, dw, g) },
			func() error { return backend.CheckDepthwiseConv2D(dw, x, w, dw, g) }},
		argCase{"DepthwiseConv2D dst shape", func() error { return b.DepthwiseConv2D(cols, x, w, bias, g) },
			func() error { return backend.CheckDepthwiseConv2D(cols, x, w, bias, g) }},
	)
	runArgCases(t, cases)

	same := backend.ConvGeom{H: 2, W: 3, KH: 1, KW: 1, SH: 1, SW: 1} // dst shaped like x [6, C]
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"Im2Col2D F16 x", func() error { return b.Im2Col2D(cols, h, g) }},
		{"Im2Col2D into loaded memory", func() error {
			return b.Im2Col2D(loaded, alloc(t, b, 5, 1, nil), backend.ConvGeom{H: 5, W: 1, KH: 9, KW: 1, SH: 1, SW: 1, PH: 4})
		}},
		{"Im2Col2D closed x", func() error { return b.Im2Col2D(cols, closed, g) }},
		{"Im2Col2D foreign x", func() error { return b.Im2Col2D(cols, foreign, g) }},
		{"Im2Col2D nil x", func() error { return b.Im2Col2D(cols, nil, g) }},
		{"Im2Col2D dst is x", func() error { return b.Im2Col2D(view(0, 6), view(0, 6), same) }},
		{"Im2Col2D dst overlaps x", func() error { return b.Im2Col2D(view(1, 6), view(0, 6), same) }},
		{"DepthwiseConv2D F16 x", func() error { return b.DepthwiseConv2D(dw, h, w, bias, g) }},
		{"DepthwiseConv2D closed w", func() error { return b.DepthwiseConv2D(dw, x, closed, bias, g) }},
		{"DepthwiseConv2D foreign b", func() error { return b.DepthwiseConv2D(dw, x, w, foreign, g) }},
		{"DepthwiseConv2D into loaded memory", func() error {
			return b.DepthwiseConv2D(loaded, alloc(t, b, 5, 9, nil), alloc(t, b, 9, 3, nil), alloc(t, b, 1, 9, nil), backend.ConvGeom{H: 5, W: 1, KH: 3, KW: 1, SH: 1, SW: 1, PH: 1})
		}},
		{"DepthwiseConv2D dst is x", func() error {
			return b.DepthwiseConv2D(view(0, 6), view(0, 6), w, bias, backend.ConvGeom{H: 2, W: 3, KH: 3, KW: 3, SH: 1, SW: 1, PH: 1, PW: 1})
		}},
		{"DepthwiseConv2D dst is b", func() error {
			return b.DepthwiseConv2D(view(0, 1), view(1, 6), w, view(0, 1), backend.ConvGeom{H: 6, W: 1, KH: 3, KW: 3, SH: 6, SW: 1, PH: 1, PW: 1})
		}},
	} {
		mustFail(t, c.name, c.f)
	}
	// Both still compute.
	must(t, b.Im2Col2D(cols, x, g), "Im2Col2D after the refusals")
	must(t, b.DepthwiseConv2D(dw, x, w, bias, g), "DepthwiseConv2D after the refusals")
}
