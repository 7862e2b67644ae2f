package backendtest

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// argCase is an operation called with arguments of which exactly one is bad, and the shared
// check (package backend's Check functions) of the same arguments.
type argCase struct {
	name  string
	call  func() error
	check func() error
}

// testArgChecks calls every operation with one bad argument at a time, on tensors of the backend
// that are otherwise valid (each operation is first called with the good arguments), and wants
// the error of the shared check: every backend rejects the same arguments, and says so in the
// same words after its own name.
func testArgChecks(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	const n, d = 3, 32
	r := rng("argument checks")
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	x := alloc(t, b, n, d, randVec(r, n*d, 1))
	dst := alloc(t, b, n, d, nil)
	row := alloc(t, b, 1, d, randVec(r, d, 1))
	wide := alloc(t, b, n, d+1, nil)
	vec := make([]float32, (n+1)*d)
	wdata, _ := quantRows(t, tensor.F32, 5, d, randVec(r, 5*d, 1))
	w := load(t, b, tensor.F32, 5, d, wdata)
	mm := alloc(t, b, n, 5, nil)

	var cases []argCase
	add := func(name string, call, check func() error) {
		cases = append(cases, argCase{name, call, check})
	}
	good := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s with good arguments: %v", what, err)
		}
	}

	// Write, Read, View.
	good("Write", b.Write(x, 1, vec[:2*d]))
	good("Read", b.Read(x, 1, vec[:2*d]))
	for _, c := range []struct {
		name      string
		row0, len int
	}{{"past the last row", 2, 2 * d}, {"at row -1", -1, d}, {"of a partial row", 0, d + 1}, {"past the end by a row", n, d}} {
		add("Write "+c.name, func() error { return b.Write(x, c.row0, vec[:c.len]) },
			func() error { return backend.CheckSpan("write", x, c.row0, c.len) })
		add("Read "+c.name, func() error { return b.Read(x, c.row0, vec[:c.len]) },
			func() error { return backend.CheckSpan("read", x, c.row0, c.len) })
	}
	for _, c := range []struct {
		name       string
		row0, rows int
	}{{"at row -1", -1, 1}, {"past the last row", 1, n}, {"of -1 rows", 0, -1}, {"starting past the end", n + 1, 0}} {
		add("View "+c.name, func() error { _, err := b.View(x, c.row0, c.rows); return err },
			func() error { return backend.CheckView(x, c.row0, c.rows) })
	}

	// GetRows, MatMul, AddRows, RMSNorm, SwiGLU.
	g := alloc(t, b, 2, d, nil)
	good("GetRows", b.GetRows(g, w, []int32{4, 0}))
	for _, c := range []struct {
		name string
		dst  backend.Tensor
		ids  []int32
	}{{"id -1", g, []int32{0, -1}}, {"id = rows", g, []int32{5, 0}}, {"dst rows != len(ids)", g, []int32{0, 1, 2}}, {"dst cols", wide, []int32{0, 1, 2}}} {
		add("GetRows "+c.name, func() error { return b.GetRows(c.dst, w, c.ids) },
			func() error { return backend.CheckGetRows(c.dst, w, c.ids) })
	}
	good("MatMul", b.MatMul(mm, x, w))
	for _, c := range []struct {
		name      string
		dst, x, w backend.Tensor
	}{{"x cols != w cols", mm, wide, w}, {"dst rows", alloc(t, b, n+1, 5, nil), x, w}, {"dst cols", dst, x, w}} {
		add("MatMul "+c.name, func() error { return b.MatMul(c.dst, c.x, c.w) },
			func() error { return backend.CheckMatMul(c.dst, c.x, c.w) })
	}
	good("AddRows", b.AddRows(dst, x, x))
	good("AddRows with a bias row", b.AddRows(dst, x, row))
	for _, c := range []struct {
		name         string
		dst, a, bias backend.Tensor
	}{{"dst shape", wide, x, row}, {"b rows neither 1 nor a's", dst, x, alloc(t, b, 2, d, nil)}, {"b cols", dst, x, alloc(t, b, 1, d+1, nil)}} {
		add("AddRows "+c.name, func() error { return b.AddRows(c.dst, c.a, c.bias) },
			func() error { return backend.CheckAddRows(c.dst, c.a, c.bias) })
	}
	good("RMSNorm", b.RMSNorm(dst, x, row, 1e-5))
	for _, c := range []struct {
		name      string
		dst, x, w backend.Tensor
		eps       float32
	}{
		{"dst shape", wide, x, row, 1e-5}, {"w rows", dst, x, x, 1e-5}, {"w cols", dst, x, alloc(t, b, 1, d+1, nil), 1e-5},
		{"eps +Inf", dst, x, row, inf}, {"eps 0", dst, x, row, 0}, {"eps -1", dst, x, row, -1}, {"eps NaN", dst, x, row, nan},
	} {
		add("RMSNorm "+c.name, func() error { return b.RMSNorm(c.dst, c.x, c.w, c.eps) },
			func() error { return backend.CheckRMSNorm(c.dst, c.x, c.w, c.eps) })
	}
	lb := alloc(t, b, 1, d, randVec(r, d, 1))
	good("LayerNorm", b.LayerNorm(dst, x, row, lb, 1e-5))
	for _, eps := range []float32{inf, 0, -1, nan} {
		add(fmt.Sprintf("LayerNorm eps %v", eps), func() error { return b.LayerNorm(dst, x, row, lb, eps) },
			func() error { return backend.CheckLayerNorm(dst, x, row, lb, eps) })
	}
	good("SwiGLU", b.SwiGLU(dst, x, x))
	add("SwiGLU up shape", func() error { return b.SwiGLU(dst, x, wide) }, func() error { return backend.CheckSwiGLU(dst, x, wide) })
	add("SwiGLU dst shape", func() error { return b.SwiGLU(wide, x, x) }, func() error { return backend.CheckSwiGLU(wide, x, x) })
	good("GeGLU", b.GeGLU(dst, x, x))
	add("GeGLU up shape", func() error { return b.GeGLU(dst, x, wide) }, func() error { return backend.CheckGeGLU(dst, x, wide) })
	add("GeGLU dst shape", func() error { return b.GeGLU(wide, x, x) }, func() error { return backend.CheckGeGLU(wide, x, x) })
	good("Unary", b.Unary(dst, x, tensor.SiLU))
	add("Unary dst shape", func() error { return b.Unary(wide, x, tensor.SiLU) }, func() error { return backend.CheckUnary("unary", wide, x, tensor.SiLU) })
	add("Unary no function", func() error { return b.Unary(dst, x, 0) }, func() error { return backend.CheckUnary("unary", dst, x, 0) })
	good("GLU", b.GLU(dst, x, x, tensor.Sigmoid))
	add("GLU up shape", func() error { return b.GLU(dst, x, wide, tensor.Sigmoid) }, func() error { return backend.CheckGLU("glu", dst, x, wide, tensor.Sigmoid) })
	add("GLU dst shape", func() error { return b.GLU(wide, x, x, tensor.Sigmoid) }, func() error { return backend.CheckGLU("glu", wide, x, x, tensor.Sigmoid) })
	add("GLU function 99", func() error { return b.GLU(dst, x, x, 99) }, func() error { return backend.CheckGLU("glu", dst, x, x, 99) })
	good("Scale", b.Scale(dst, x, 2))
	add("Scale dst shape", func() error { return b.Scale(wide, x, 2) }, func() error { return backend.CheckScale(wide, x, 2) })
	for _, s := range []float32{inf, nan} {
		add(fmt.Sprintf("Scale by %v", s), func() error { return b.Scale(dst, x, s) }, func() error { return backend.CheckScale(dst, x, s) })
	}

	// Rope: x [3, 32] as 4 heads of 8.
	pos := &backend.Batch{Pos: []int32{0, 1, 7}, Slot: []int32{0, 1, 2}}
	rope := backend.RoPE{Mode: backend.RoPENeoX, HeadDim: 8, Dims: 8, Base: 10000, FreqScale: 1}
	good("Rope", b.Rope(x, 4, rope, pos))
	for _, c := range []struct {
		name  string
		nHead int
		edit  func(r *backend.RoPE)
		b     *backend.Batch
	}{
		{"nil batch", 4, nil, nil},
		{"unknown mode", 4, func(r *backend.RoPE) { r.Mode = 2 }, pos},
		{"cols != nHead*HeadDim", 3, nil, pos},
		{"no heads", 0, nil, pos},
		{"HeadDim 0", 4, func(r *backend.RoPE) { r.HeadDim = 0 }, pos},
		{"Dims 0", 4, func(r *backend.RoPE) { r.Dims = 0 }, pos},
		{"odd Dims", 4, func(r *backend.RoPE) { r.Dims = 5 }, pos},
		{"Dims > HeadDim", 2, func(r *backend.RoPE) { r.HeadDim, r.Dims = 16, 18 }, pos},
		{"base 0", 4, func(r *backend.RoPE) { r.Base = 0 }, pos},
		{"base -1", 4, func(r *backend.RoPE) { r.Base = -1 }, pos},
		{"base +Inf", 4, func(r *backend.RoPE) { r.Base = inf }, pos},
		{"base NaN", 4, func(r *backend.RoPE) { r.Base = nan }, pos},
		{"frequency scale NaN", 4, func(r *backend.RoPE) { r.FreqScale = nan }, pos},
		{"frequency scale +Inf", 4, func(r *backend.RoPE) { r.FreqScale = inf }, pos},
		{"frequency scale 0", 4, func(r *backend.RoPE) { r.FreqScale = 0 }, pos},
		{"too few frequency factors", 4, func(r *backend.RoPE) { r.Factors = []float32{1, 1, 1} }, pos},
		{"too many frequency factors", 4, func(r *backend.RoPE) { r.Factors = []float32{1, 1, 1, 1, 1} }, pos},
		{"frequency factor 0", 4, func(r *backend.RoPE) { r.Factors = []float32{1, 0, 1, 1} }, pos},
		{"frequency factor NaN", 4, func(r *backend.RoPE) { r.Factors = []float32{1, 1, nan, 1} }, pos},
		{"frequency factor +Inf", 4, func(r *backend.RoPE) { r.Factors = []float32{1, 1, 1, inf} }, pos},
		{"negative frequency factor", 4, func(r *backend.RoPE) { r.Factors = []float32{-1, 1, 1, 1} }, pos},
		{"negative attention factor", 4, func(r *backend.RoPE) { r.AttnFactor = -1 }, pos},
		{"attention factor NaN", 4, func(r *backend.RoPE) { r.AttnFactor = nan }, pos},
		{"attention factor +Inf", 4, func(r *backend.RoPE) { r.AttnFactor = inf }, pos},
		{"YaRN extrapolation above 1", 4, func(r *backend.RoPE) { r.ExtFactor = 1.5 }, pos},
		{"YaRN extrapolation NaN", 4, func(r *backend.RoPE) { r.ExtFactor = nan }, pos},
		{"YaRN bound +Inf", 4, func(r *backend.RoPE) { r.ExtFactor, r.CorrDims = 1, [2]float32{0, inf} }, pos},
		{"len(Pos) != rows", 4, nil, &backend.Batch{Pos: []int32{0, 1}}},
		{"negative position", 4, nil, &backend.Batch{Pos: []int32{0, -1, 2}}},
	} {
		rc := rope
		if c.edit != nil {
			c.edit(&rc)
		}
		add("Rope "+c.name, func() error { return b.Rope(x, c.nHead, rc, c.b) },
			func() error { return backend.CheckRope(x, c.nHead, rc, c.b) })
	}

	// NewKV.
	const hd, nkv, nh, bs, slots = 8, 2, 4, 4, 16
	cfg := backend.KVConfig{Layers: 2, Slots: slots, Width: nkv * hd, BlockSize: bs, DType: tensor.F16}
	for _, c := range []struct {
		name string
		edit func(c *backend.KVConfig)
	}{
		{"Q8_0", func(c *backend.KVConfig) { c.DType = tensor.Q8_0 }},
		{"0 layers", func(c *backend.KVConfig) { c.Layers = 0 }},
		{"-1 slots", func(c *backend.KVConfig) { c.Slots = -1 }},
		{"Width 0", func(c *backend.KVConfig) { c.Width = 0 }},
		{"BlockSize 0", func(c *backend.KVConfig) { c.BlockSize = 0 }},
		// Slots are int32 in a Batch. (The width makes the cache too large to allocate too.)
		{"more slots than int32", func(c *backend.KVConfig) { c.Slots, c.Width = int(slots31), int(width40) }},
	} {
		cc := cfg
		c.edit(&cc)
		add("NewKV "+c.name, func() error {
			kv, err := b.NewKV(cc)
			if err == nil {
				kv.Close()
			}
			return err
		}, func() error { return backend.CheckKVConfig(cc) })
	}

	// StoreKV and Attention: a batch of 3 tokens, two of sequence 1 (positions 4 and 5, in blocks
	// 0 and 2) and, first in the batch, one of sequence 0 (position 0, in block 3).
	kv, err := b.NewKV(cfg)
	must(t, err, "NewKV")
	defer kv.Close()
	kt := alloc(t, b, n, cfg.Width, randVec(r, n*cfg.Width, 1))
	vt := alloc(t, b, n, cfg.Width, randVec(r, n*cfg.Width, 1))
	s0 := backend.Seq{Start: 0, Count: 1, CtxLen: 1, Blocks: []int32{3}}
	s1 := backend.Seq{Start: 1, Count: 2, CtxLen: 6, Blocks: []int32{0, 2}}
	batch := func(s0, s1 backend.Seq) *backend.Batch {
		return &backend.Batch{Pos: []int32{0, 4, 5}, Slot: []int32{12, 8, 9}, Seqs: []backend.Seq{s0, s1}}
	}
	bt := batch(s0, s1)
	// The earlier positions of sequence 1 (slots 0..3 of block 0) are the cache's zeros.
	good("StoreKV", b.StoreKV(kv, 1, kt, vt, bt))
	for _, c := range []struct {
		name  string
		layer int
		k, v  backend.Tensor
		b     *backend.Batch
	}{
		{"nil batch", 0, kt, vt, nil},
		{"layer = Layers", 2, kt, vt, bt},
		{"layer -1", -1, kt, vt, bt},
		{"k cols != Width", 0, alloc(t, b, n, cfg.Width+1, nil), vt, bt},
		{"v rows != len(Slot)", 0, kt, alloc(t, b, n-1, cfg.Width, nil), bt},
		{"len(Slot) != rows", 0, kt, vt, &backend.Batch{Pos: bt.Pos, Slot: bt.Slot[:2], Seqs: bt.Seqs}},
		{"slot -1", 0, kt, vt, &backend.Batch{Pos: bt.Pos, Slot: []int32{12, -1, 9}, Seqs: bt.Seqs}},
		{"slot = Slots", 0, kt, vt, &backend.Batch{Pos: bt.Pos, Slot: []int32{12, 8, slots}, Seqs: bt.Seqs}},
	} {
		add("StoreKV "+c.name, func() error { return b.StoreKV(kv, c.layer, c.k, c.v, c.b) }, func() error {
			if err := backend.CheckLayer("store kv", cfg, c.layer); err != nil {
				return err
			}
			return backend.CheckStoreKV(cfg, c.k, c.v, c.b)
		})
	}

	a := backend.Attn{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.35}
	q := alloc(t, b, n, nh*hd, randVec(r, n*nh*hd, 1))
	out := alloc(t, b, n, nh*hd, nil)
	good("Attention", b.Attention(out, q, kv, 1, a, bt))
	with := func(s backend.Seq, f func(s *backend.Seq)) backend.Seq {
		s.Blocks = append([]int32(nil), s.Blocks...)
		f(&s)
		return s
	}
	attn := func(f func(a *backend.Attn)) backend.Attn { c := a; f(&c); return c }
	for _, c := range []struct {
		name   string
		layer  int
		dst, q backend.Tensor
		a      backend.Attn
		b      *backend.Batch
	}{
		{name: "nil batch", layer: 1, dst: out, q: q, a: a},
		{name: "layer = Layers", layer: 2, dst: out, q: q, a: a, b: bt},
		{name: "NHead not a multiple of NKVHead", layer: 1, dst: out, q: q, a: attn(func(a *backend.Attn) { a.NHead = 3 }), b: bt},
		{name: "NKVHead 0", layer: 1, dst: out, q: q, a: attn(func(a *backend.Attn) { a.NKVHead = 0 }), b: bt},
		{name: "HeadDim 0", layer: 1, dst: out, q: q, a: attn(func(a *backend.Attn) { a.HeadDim = 0 }), b: bt},
		{name: "NKVHead*HeadDim != Width", layer: 1, dst: out, q: q, a: attn(func(a *backend.Attn) { a.NKVHead = 1 }), b: bt},
		{name: "scale NaN", layer: 1, dst: out, q: q, a: attn(func(a *backend.Attn) { a.Scale = nan }), b: bt},
		{name: "scale +Inf", layer: 1, dst: out, q: q, a: attn(func(a *backend.Attn) { a.Scale = inf }), b: bt},
		{name: "q cols != NHead*HeadDim", layer: 1, dst: out, q: kt, a: a, b: bt},
		{name: "len(Pos) != rows", layer: 1, dst: out, q: q, a: a, b: &backend.Batch{Pos: bt.Pos[:2], Slot: bt.Slot, Seqs: bt.Seqs}},
		{name: "dst shape", layer: 1, dst: kt, q: q, a: a, b: bt},
		{name: "Start -1", layer: 1, dst: out, q: q, a: a, b: batch(with(s0, func(s *backend.Seq) { s.Start = -1 }), s1)},
		{name: "Start+Count > rows", layer: 1, dst: out, q: q, a: a, b: batch(s0, with(s1, func(s *backend.Seq) { s.Start = 2 }))},
		{name: "Count -1", layer: 1, dst: out, q: q, a: a, b: batch(with(s0, func(s *backend.Seq) { s.Count = -1 }), s1)},
		{name: "Count > CtxLen", layer: 1, dst: out, q: q, a: a, b: batch(s0, with(s1, func(s *backend.Seq) { s.CtxLen = 1 }))},
		{name: "CtxLen > Slots", layer: 1, dst: out, q: q, a: a, b: batch(s0, with(s1, func(s *backend.Seq) { s.CtxLen, s.Blocks = slots+1, []int32{0, 2, 1, 3, 0} }))},
		{name: "CtxLen beyond the block table", layer: 1, dst: out, q: q, a: a, b: batch(s0, with(s1, func(s *backend.Seq) { s.CtxLen = 2*bs + 1 }))},
		{name: "block id = Slots/BlockSize", layer: 1, dst: out, q: q, a: a, b: batch(s0, with(s1, func(s *backend.Seq) { s.Blocks[1] = slots / bs }))},
		{name: "block id -1", layer: 1, dst: out, q: q, a: a, b: batch(with(s0, func(s *backend.Seq) { s.Blocks[0] = -1 }), s1)},
		{name: "bad block of a sequence without tokens", layer: 1, dst: out, q: q, a: a,
			b: &backend.Batch{Pos: bt.Pos, Slot: bt.Slot, Seqs: []backend.Seq{s0, s1, {Start: n, CtxLen: 1, Blocks: []int32{-1}}}}},
		{name: "a token in two sequences", layer: 1, dst: out, q: q, a: a, b: batch(s0, with(s1, func(s *backend.Seq) { s.Start, s.Count, s.CtxLen = 0, 3, 7 }))},
		{name: "a token in no sequence", layer: 1, dst: out, q: q, a: a, b: batch(s0, with(s1, func(s *backend.Seq) { s.Count, s.CtxLen = 1, 5 }))},
	} {
		add("Attention "+c.name, func() error { return b.Attention(c.dst, c.q, kv, c.layer, c.a, c.b) }, func() error {
			if err := backend.CheckLayer("attention", cfg, c.layer); err != nil {
				return err
			}
			_, err := backend.CheckAttention(c.dst, c.q, cfg, c.a, c.b, nil)
			return err
		})
	}

	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			want := c.check()
			if want == nil {
				t.Fatal("the shared check accepts these arguments")
			}
			var got error
			func() {
				defer func() {
					if p := recover(); p != nil {
						got = fmt.Errorf("panic: %v", p)
					}
				}()
				got = c.call()
			}()
			switch {
			case got == nil:
				t.Fatalf("no error, want %q", want)
			case !strings.HasSuffix(got.Error(), ": "+want.Error()):
				t.Fatalf("error %q, want %q after the backend's name", got, want)
			case errors.Is(got, backend.ErrUnsupported) != errors.Is(want, backend.ErrUnsupported):
				t.Fatalf("error %q: errors.Is(err, ErrUnsupported) = %v, want %v", got, errors.Is(got, backend.ErrUnsupported), errors.Is(want, backend.ErrUnsupported))
			}
		})
	}

	// The backend still computes after all of that.
	good("Attention after the argument errors", b.Attention(out, q, kv, 1, a, bt))
	for i, v := range read(t, b, out) {
		if v != v {
			t.Fatalf("Attention after the argument errors: element %d is NaN", i)
		}
	}
}

// Sizes past int32 (slots31) and past any allocation (width40), variables so that a 32-bit
// build compiles their conversions to int (where they wrap, and the checks refuse them as
// negative or zero).
var slots31, width40 = int64(math.MaxInt32) + 1, int64(1) << 40
