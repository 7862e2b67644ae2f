package backendtest

import (
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// RelPosAttention: self-attention with relative positions, several clips at once.

// relPosCase is a batch of clips of nh heads of hd, with window (0: whole clips) and a position
// table covering distances up to half (at least what the clips and the window need).
type relPosCase struct {
	clips      []int32
	nh, hd     int
	window     int
	half       int
	qScale     float64
	name       string
	largeInput bool
}

var relPosCases = []relPosCase{
	{clips: []int32{5, 17, 1, 40}, nh: 3, hd: 8, half: 39, qScale: 1, name: "four clips"},
	{clips: []int32{23, 9}, nh: 2, hd: 20, half: 30, qScale: 1, name: "a table longer than the clips"},
	{clips: []int32{31, 12}, nh: 4, hd: 16, window: 3, half: 3, qScale: 1, name: "window 3"},
	{clips: []int32{1}, nh: 1, hd: 4, half: 0, qScale: 1, name: "one row"},
	{clips: []int32{138}, nh: 4, hd: 64, half: 137, qScale: 0.5, name: "the small Parakeet's shape"},
	{clips: []int32{150, 25}, nh: 8, hd: 128, half: 149, qScale: 0.3, name: "Parakeet 0.6b's heads", largeInput: true},
}

// relPosRef computes the reference in float64 and each output's bound: each score's two dot
// products summed in float32 are within (HeadDim+2)·u of their absolute sums (scaled), and the
// softmax-weighted average then within the bound attendHead derives for F32 keys.
func relPosRef(c relPosCase, q, k, v, p, ub, vb []float32, scale float64) (want, tol []float64) {
	width := c.nh * c.hd
	n := len(q) / width
	want, tol = make([]float64, n*width), make([]float64, n*width)
	s0 := 0
	for _, cl := range c.clips {
		T := int(cl)
		for i := 0; i < T; i++ {
			lo, hi := 0, T-1
			if c.window > 0 {
				lo, hi = max(0, i-c.window), min(T-1, i+c.window)
			}
			m := hi - lo + 1
			for h := 0; h < c.nh; h++ {
				off := h * c.hd
				qrow := q[(s0+i)*width+off:]
				scores, errs := make([]float64, m), make([]float64, m)
				smax, emax, vmax := math.Inf(-1), 0.0, 0.0
				for x := 0; x < m; x++ {
					j := lo + x
					kr, pr := k[(s0+j)*width+off:], p[(c.half-i+j)*width+off:]
					dot, abs := 0.0, 0.0
					for d := 0; d < c.hd; d++ {
						qu := float64(float32(qrow[d] + ub[off+d]))
						qv := float64(float32(qrow[d] + vb[off+d]))
						dot += qu*float64(kr[d]) + qv*float64(pr[d])
						abs += math.Abs(qu*float64(kr[d])) + math.Abs(qv*float64(pr[d]))
					}
					scores[x] = scale * dot
					errs[x] = scale*abs*float64(c.hd+3)*u + math.Abs(scores[x])*2*u
					smax, emax = math.Max(smax, scores[x]), math.Max(emax, errs[x])
					for _, e := range v[(s0+j)*width+off : (s0+j)*width+off+c.hd] {
						vmax = math.Max(vmax, math.Abs(float64(e)))
					}
				}
				sum := 0.0
				for _, s := range scores {
					sum += math.Exp(s - smax)
				}
				o := (s0+i)*width + off
				for x, s := range scores {
					pj := math.Exp(s-smax) / sum
					vr := v[(s0+lo+x)*width+off:]
					for d := 0; d < c.hd; d++ {
						want[o+d] += pj * float64(vr[d])
					}
				}
				b := (math.Expm1(2*emax) + 2*float64(m-1+c.hd+8)*u + expRel) * vmax
				for d := 0; d < c.hd; d++ {
					tol[o+d] = b
				}
			}
		}
		s0 += T
	}
	return want, tol
}

// testRelPosAttention checks RelPosAttention against float64 on every case: q, k and v views of
// larger tensors, the output between guards.
func testRelPosAttention(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, c := range relPosCases {
		t.Run(c.name, func(t *testing.T) {
			if c.largeInput && testing.Short() {
				t.Skip("large case skipped in -short mode")
			}
			width := c.nh * c.hd
			n := 0
			for _, cl := range c.clips {
				n += int(cl)
			}
			r := rng("relpos " + c.name)
			q, k, v := randVec(r, n*width, c.qScale), randVec(r, n*width, 1), randVec(r, n*width, 1)
			p := randVec(r, (2*c.half+1)*width, c.qScale)
			ub, vb := randVec(r, width, 0.3), randVec(r, width, 0.3)
			scale := float32(1 / math.Sqrt(float64(c.hd)))
			want, tol := relPosRef(c, q, k, v, p, ub, vb, float64(scale))
			dst, g := output(t, b, n, width)
			a := backend.RelPos{NHead: c.nh, HeadDim: c.hd, Scale: scale, Window: c.window}
			must(t, b.RelPosAttention(dst, allocView(t, b, n, width, q), alloc(t, b, n, width, k), allocView(t, b, n, width, v),
				alloc(t, b, 2*c.half+1, width, p), alloc(t, b, 1, width, ub), allocView(t, b, 1, width, vb), a, c.clips), "RelPosAttention")
			compare(t, "RelPosAttention "+c.name, width, read(t, b, dst), want, func(i int) float64 { return tol[i] })
			g.check(t)
		})
	}
}

// testRelPosErrors checks RelPosAttention's refusals: the shared check's words for bad shapes,
// clips and parameters, and operands no backend takes.
func testRelPosErrors(t *testing.T, b backend.Backend, newBackend func() (backend.Backend, error)) {
	other := open(t, newBackend)
	const nh, hd, n = 2, 8, 7
	width := nh * hd
	r := rng("relpos errors")
	q, k, v := alloc(t, b, n, width, randVec(r, n*width, 1)), alloc(t, b, n, width, randVec(r, n*width, 1)), alloc(t, b, n, width, randVec(r, n*width, 1))
	p := alloc(t, b, 9, width, randVec(r, 9*width, 1)) // L = 5
	ub, vb := alloc(t, b, 1, width, randVec(r, width, 1)), alloc(t, b, 1, width, randVec(r, width, 1))
	dst := alloc(t, b, n, width, nil)
	a := backend.RelPos{NHead: nh, HeadDim: hd, Scale: 0.35}
	clips := []int32{3, 4}
	if err := b.RelPosAttention(dst, q, k, v, p, ub, vb, a, clips); err != nil {
		t.Fatalf("RelPosAttention with good arguments: %v", err)
	}
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	edit := func(f func(a *backend.RelPos)) backend.RelPos { c := a; f(&c); return c }
	wide, short := alloc(t, b, n, width+1, nil), alloc(t, b, n-1, width, nil)
	var cases []argCase
	for _, c := range []struct {
		name                  string
		dst, q, k, v, p, u, w backend.Tensor
		a                     backend.RelPos
		clips                 []int32
	}{
		{"no heads", dst, q, k, v, p, ub, vb, edit(func(a *backend.RelPos) { a.NHead = 0 }), clips},
		{"q cols != NHead*HeadDim", dst, q, k, v, p, ub, vb, edit(func(a *backend.RelPos) { a.HeadDim = 4 }), clips},
		{"scale NaN", dst, q, k, v, p, ub, vb, edit(func(a *backend.RelPos) { a.Scale = nan }), clips},
		{"scale +Inf", dst, q, k, v, p, ub, vb, edit(func(a *backend.RelPos) { a.Scale = inf }), clips},
		{"window -1", dst, q, k, v, p, ub, vb, edit(func(a *backend.RelPos) { a.Window = -1 }), clips},
		{"k rows", dst, q, short, v, p, ub, vb, a, clips},
		{"v cols", dst, q, k, wide, p, ub, vb, a, clips},
		{"dst shape", wide, q, k, v, p, ub, vb, a, clips},
		{"u rows", dst, q, k, v, p, q, vb, a, clips},
		{"bv cols", dst, q, k, v, p, ub, alloc(t, b, 1, width+1, nil), a, clips},
		{"p with an even number of rows", dst, q, k, v, alloc(t, b, 8, width, nil), ub, vb, a, clips},
		{"p too short for the longest clip", dst, q, k, v, alloc(t, b, 5, width, nil), ub, vb, a, clips},
		{"clips short of the rows", dst, q, k, v, p, ub, vb, a, []int32{3, 3}},
		{"clips past the rows", dst, q, k, v, p, ub, vb, a, []int32{3, 5}},
		{"a clip of 0 rows", dst, q, k, v, p, ub, vb, a, []int32{3, 0, 4}},
		{"a negative clip", dst, q, k, v, p, ub, vb, a, []int32{8, -1}},
		{"no clips", dst, q, k, v, p, ub, vb, a, nil},
	} {
		cases = append(cases, argCase{"RelPosAttention " + c.name,
			func() error { return b.RelPosAttention(c.dst, c.q, c.k, c.v, c.p, c.u, c.w, c.a, c.clips) },
			func() error { return backend.CheckRelPosAttention(c.dst, c.q, c.k, c.v, c.p, c.u, c.w, c.a, c.clips) }})
	}
	runArgCases(t, cases)
	// A window makes a short table enough: distances up to 1 need L = 2.
	p3 := alloc(t, b, 3, width, randVec(r, 3*width, 1))
	must(t, b.RelPosAttention(dst, q, k, v, p3, ub, vb, edit(func(a *backend.RelPos) { a.Window = 1 }), clips), "RelPosAttention window 1 with p of 3 rows")

	wdata, _ := quantRows(t, tensor.F32, n, width, randVec(r, n*width, 1))
	loaded := load(t, b, tensor.F32, n, width, wdata)
	closed := alloc(t, b, n, width, nil)
	closed.Close()
	h := allocF16(t, b, n, width, randVec(r, n*width, 1))
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"into loaded memory", func() error { return b.RelPosAttention(loaded, q, k, v, p, ub, vb, a, clips) }},
		{"dst is q", func() error { return b.RelPosAttention(q, q, k, v, p, ub, vb, a, clips) }},
		{"dst is v", func() error { return b.RelPosAttention(v, q, k, v, p, ub, vb, a, clips) }},
		{"F16 k", func() error { return b.RelPosAttention(dst, q, h, v, p, ub, vb, a, clips) }},
		{"closed p", func() error { return b.RelPosAttention(dst, q, k, v, closed, ub, vb, a, clips) }},
		{"foreign u", func() error { return b.RelPosAttention(dst, q, k, v, p, alloc(t, other, 1, width, nil), vb, a, clips) }},
		{"nil bv", func() error { return b.RelPosAttention(dst, q, k, v, p, ub, nil, a, clips) }},
	} {
		mustFail(t, "RelPosAttention "+c.name, c.f)
	}
	must(t, b.RelPosAttention(dst, q, k, v, p, ub, vb, a, clips), "RelPosAttention after the refusals")
	for i, x := range read(t, b, dst) {
		if x != x {
			t.Fatalf("RelPosAttention after the refusals: element %d is NaN", i)
		}
	}
}
