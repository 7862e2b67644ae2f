package backendtest

import (
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// LSTMCell: one step of LSTM cells after their gates' products.

// testLSTMCell checks LSTMCell against float64: with σ and tanh each within a few float32 ulp, the
// new c is within 8u of the sum of its two terms' magnitudes, and h within 8u of itself plus
// σ(o) times c's bound (tanh's slope is at most 1). Gates range over both saturations.
func testLSTMCell(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, c := range []struct{ n, p int }{{1, 640}, {7, 160}, {3, 37}, {64, 640}} {
		r := rng("lstm cell " + string(rune('a'+c.n)) + string(rune('a'+c.p%26)))
		gv := randVec(r, c.n*4*c.p, 3)
		cv := randVec(r, c.n*c.p, 2)
		sig := func(x float32) float64 { return 1 / (1 + math.Exp(-float64(x))) }
		wantC, tolC := make([]float64, c.n*c.p), make([]float64, c.n*c.p)
		wantH, tolH := make([]float64, c.n*c.p), make([]float64, c.n*c.p)
		for i := 0; i < c.n; i++ {
			g := gv[i*4*c.p:]
			for k := 0; k < c.p; k++ {
				a := sig(g[c.p+k]) * float64(cv[i*c.p+k])
				bb := sig(g[k]) * math.Tanh(float64(g[3*c.p+k]))
				o := i*c.p + k
				wantC[o], tolC[o] = a+bb, 8*u*(math.Abs(a)+math.Abs(bb))
				so := sig(g[2*c.p+k])
				wantH[o] = so * math.Tanh(wantC[o])
				tolH[o] = 8*u*math.Abs(wantH[o]) + so*tolC[o]
			}
		}
		gates := allocView(t, b, c.n, 4*c.p, gv)
		ct := allocView(t, b, c.n, c.p, cv)
		h, gd := output(t, b, c.n, c.p)
		must(t, b.LSTMCell(h, ct, gates), "LSTMCell n=%d P=%d", c.n, c.p)
		compare(t, "LSTMCell c", c.p, read(t, b, ct), wantC, func(i int) float64 { return tolC[i] })
		compare(t, "LSTMCell h", c.p, read(t, b, h), wantH, func(i int) float64 { return tolH[i] })
		gd.check(t)
	}
}

// testLSTMErrors checks LSTMCell's refusals.
func testLSTMErrors(t *testing.T, b backend.Backend, newBackend func() (backend.Backend, error)) {
	other := open(t, newBackend)
	const n, p = 3, 16
	r := rng("lstm errors")
	gates := alloc(t, b, n, 4*p, randVec(r, n*4*p, 1))
	c := alloc(t, b, n, p, randVec(r, n*p, 1))
	h := alloc(t, b, n, p, nil)
	must(t, b.LSTMCell(h, c, gates), "LSTMCell with good arguments")
	odd := alloc(t, b, n, 4*p+2, nil)
	runArgCases(t, []argCase{
		{"LSTMCell gates not four blocks", func() error { return b.LSTMCell(h, c, odd) }, func() error { return backend.CheckLSTMCell(h, c, odd) }},
		{"LSTMCell c rows", func() error { return b.LSTMCell(h, alloc(t, b, n+1, p, nil), gates) },
			func() error { return backend.CheckLSTMCell(h, alloc(t, b, n+1, p, nil), gates) }},
		{"LSTMCell h cols", func() error { return b.LSTMCell(alloc(t, b, n, p+1, nil), c, gates) },
			func() error { return backend.CheckLSTMCell(alloc(t, b, n, p+1, nil), c, gates) }},
	})
	wdata, _ := quantRows(t, tensor.F32, n, p, randVec(r, n*p, 1))
	loaded := load(t, b, tensor.F32, n, p, wdata)
	parent := alloc(t, b, 2*n, p, nil)
	v0, err := b.View(parent, 0, n)
	must(t, err, "View")
	defer v0.Close()
	v1, err := b.View(parent, 1, n)
	must(t, err, "View")
	defer v1.Close()
	closed := alloc(t, b, n, p, nil)
	closed.Close()
	for _, cs := range []struct {
		name string
		f    func() error
	}{
		{"h is c", func() error { return b.LSTMCell(c, c, gates) }},
		{"h overlaps c", func() error { return b.LSTMCell(v0, v1, gates) }},
		{"c in loaded memory", func() error { return b.LSTMCell(h, loaded, gates) }},
		{"h in loaded memory", func() error { return b.LSTMCell(loaded, c, gates) }},
		{"F16 gates", func() error { return b.LSTMCell(h, c, allocF16(t, b, n, 4*p, randVec(r, n*4*p, 1))) }},
		{"closed c", func() error { return b.LSTMCell(h, closed, gates) }},
		{"foreign h", func() error { return b.LSTMCell(alloc(t, other, n, p, nil), c, gates) }},
		{"nil gates", func() error { return b.LSTMCell(h, c, nil) }},
	} {
		mustFail(t, cs.name, cs.f)
	}
	must(t, b.LSTMCell(h, c, gates), "LSTMCell after the refusals")
}

// testTransducerAllocs checks that Im2Col2D, DepthwiseConv2D, RelPosAttention and LSTMCell
// allocate nothing once they have run on a shape.
func testTransducerAllocs(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	r := rng("transducer allocs")
	g := backend.ConvGeom{H: 40, W: 1, KH: 9, KW: 1, SH: 1, SW: 1, PH: 4}
	const c = 64
	x := alloc(t, b, 40, c, randVec(r, 40*c, 1))
	cols := alloc(t, b, 40, 9*c, nil)
	w, bias := alloc(t, b, c, 9, randVec(r, 9*c, 1)), alloc(t, b, 1, c, randVec(r, c, 1))
	dw := alloc(t, b, 40, c, nil)
	p := alloc(t, b, 79, c, randVec(r, 79*c, 1))
	att := alloc(t, b, 40, c, nil)
	gates := alloc(t, b, 8, 4*c, randVec(r, 8*4*c, 1))
	cs, hs := alloc(t, b, 8, c, nil), alloc(t, b, 8, c, nil)
	clips := []int32{15, 25}
	a := backend.RelPos{NHead: 4, HeadDim: 16, Scale: 0.25}
	out := make([]float32, 40*c)
	var err error
	keep := func(e error) {
		if e != nil && err == nil {
			err = e
		}
	}
	run := func() {
		keep(b.Im2Col2D(cols, x, g))
		keep(b.DepthwiseConv2D(dw, x, w, bias, g))
		keep(b.RelPosAttention(att, x, dw, x, p, bias, bias, a, clips))
		keep(b.LSTMCell(hs, cs, gates))
		keep(b.Read(att, 0, out))
	}
	run()
	must(t, err, "transducer operations")
	if n := testing.AllocsPerRun(10, run); n != 0 {
		t.Errorf("%v allocations per round of the four operations, want 0", n)
	}
}
