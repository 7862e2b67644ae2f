package backend

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/parleyhq/parley/runtime/tensor"
)

// shape is a Tensor of no backend: a type and a shape for the checks to read.
type shape struct {
	dt         tensor.DType
	rows, cols int
}

func (s shape) DType() tensor.DType { return s.dt }
func (s shape) Rows() int           { return s.rows }
func (s shape) Cols() int           { return s.cols }
func (s shape) Close() error        { return nil }

func f32(rows, cols int) Tensor { return shape{tensor.F32, rows, cols} }

var (
	inf = float32(math.Inf(1))
	nan = float32(math.NaN())
)

// TestChecks runs each check on arguments that are valid but for at most one, and wants nil for
// the valid ones and an error naming the fault for the others.
func TestChecks(t *testing.T) {
	const n, d = 3, 8
	x, dst, row := f32(n, d), f32(n, d), f32(1, d)
	rope := RoPE{Mode: RoPENormal, HeadDim: 4, Dims: 4, Base: 10000, FreqScale: 1}
	withRoPE := func(f func(r *RoPE)) RoPE { r := rope; f(&r); return r }
	pos := &Batch{Pos: []int32{0, 1, 2}, Slot: []int32{0, 1, 2}}
	cfg := KVConfig{Layers: 2, Slots: 16, Width: 8, BlockSize: 4, DType: tensor.F16}
	withCfg := func(f func(c *KVConfig)) KVConfig { c := cfg; f(&c); return c }
	a := Attn{NHead: 4, NKVHead: 2, HeadDim: 4, Scale: 0.5}
	withAttn := func(f func(a *Attn)) Attn { c := a; f(&c); return c }
	q := f32(n, 16)
	// Two sequences, the second first in the batch: tokens 0 and 1 of sequence 1 at positions
	// 4 and 5, token 2 of sequence 0 at position 0.
	seqs := func(s0, s1 Seq) *Batch {
		return &Batch{Pos: []int32{4, 5, 0}, Slot: []int32{0, 1, 2}, Seqs: []Seq{s0, s1}}
	}
	s0 := Seq{Start: 2, Count: 1, CtxLen: 1, Blocks: []int32{3}}
	s1 := Seq{Start: 0, Count: 2, CtxLen: 6, Blocks: []int32{0, 2, 1}}
	with := func(s Seq, f func(s *Seq)) Seq { f(&s); return s }
	attention := func(a Attn, b *Batch) error { _, err := CheckAttention(q, q, cfg, a, b, nil); return err }

	cases := []struct {
		name string
		err  error
		want string // "" for nil
	}{
		{"span", CheckSpan("write", x, 1, 2*d), ""},
		{"span to the end", CheckSpan("write", x, n, 0), ""},
		{"span past the end", CheckSpan("write", x, 2, 2*d), "write: rows [2, 4) outside a tensor of 3 rows"},
		{"span of a partial row", CheckSpan("read", x, 0, d+1), "read: 9 elements is not a whole number of rows of 8"},
		{"span at row -1", CheckSpan("read", x, -1, d), "outside"},
		{"span of a [3, 0] tensor", CheckSpan("read", f32(n, 0), 3, 0), ""},
		{"span into a [3, 0] tensor", CheckSpan("read", f32(n, 0), 0, 1), "1 elements at row 0 of a [3, 0] tensor"},
		{"view", CheckView(x, 1, 2), ""},
		{"empty view at the end", CheckView(x, n, 0), ""},
		{"view past the end", CheckView(x, 2, 2), "view: rows [2, 2+2) outside a tensor of 3 rows"},
		{"view at -1", CheckView(x, -1, 1), "outside"},
		{"view of -1 rows", CheckView(x, 0, -1), "outside"},

		{"get rows", CheckGetRows(f32(2, d), shape{tensor.Q8_0, 5, d}, []int32{4, 0}), ""},
		{"get rows dst rows", CheckGetRows(f32(3, d), x, []int32{0, 1}), "get rows: dst is [3, 8], want [2, 8]"},
		{"get rows dst cols", CheckGetRows(f32(2, d+1), x, []int32{0, 1}), "dst is [2, 9], want [2, 8]"},
		{"get rows id = rows", CheckGetRows(f32(2, d), x, []int32{0, n}), "get rows: id 3 at 1 outside the table's 3 rows"},
		{"get rows id -1", CheckGetRows(f32(1, d), x, []int32{-1}), "id -1 at 0"},

		{"matmul", CheckMatMul(f32(n, 5), x, shape{tensor.Q4_K, 5, d}), ""},
		{"matmul k = 0", CheckMatMul(f32(n, 5), f32(n, 0), f32(5, 0)), ""},
		{"matmul cols", CheckMatMul(f32(n, 5), x, f32(5, d+1)), "matmul: x is [3, 8] but w is [5, 9]"},
		{"matmul dst", CheckMatMul(f32(n, 4), x, f32(5, d)), "matmul: dst is [3, 4], want [3, 5]"},

		{"add rows", CheckAddRows(dst, x, x), ""},
		{"add rows bias", CheckAddRows(dst, x, row), ""},
		{"add rows dst", CheckAddRows(f32(n+1, d), x, row), "add rows: dst is [4, 8], want [3, 8]"},
		{"add rows b rows", CheckAddRows(dst, x, f32(2, d)), "add rows: b is [2, 8], want [3, 8] or [1, 8]"},
		{"add rows b cols", CheckAddRows(dst, x, f32(1, d+1)), "b is [1, 9]"},

		{"rms norm", CheckRMSNorm(dst, x, row, 1e-6), ""},
		{"rms norm tiny eps", CheckRMSNorm(dst, x, row, math.SmallestNonzeroFloat32), ""},
		{"rms norm dst", CheckRMSNorm(f32(n, d-1), x, row, 1e-6), "rms norm: dst is [3, 7], want [3, 8]"},
		{"rms norm w", CheckRMSNorm(dst, x, x, 1e-6), "rms norm: w is [3, 8], want [1, 8]"},
		{"rms norm eps +Inf", CheckRMSNorm(dst, x, row, inf), "rms norm: eps +Inf, want a finite value above 0"},
		{"rms norm eps 0", CheckRMSNorm(dst, x, row, 0), "eps 0,"},
		{"rms norm eps -1", CheckRMSNorm(dst, x, row, -1), "eps -1,"},
		{"rms norm eps NaN", CheckRMSNorm(dst, x, row, nan), "eps NaN,"},
		{"layer norm eps 0", CheckLayerNorm(dst, x, row, row, 0), "layer norm: eps 0, want a finite value above 0"},
		{"layer norm eps +Inf", CheckLayerNorm(dst, x, row, row, inf), "eps +Inf"},
		{"layer norm", CheckLayerNorm(dst, x, row, row, 1e-5), ""},

		{"swiglu", CheckSwiGLU(dst, x, x), ""},
		{"swiglu up", CheckSwiGLU(dst, x, row), "swiglu: up is [1, 8], want [3, 8]"},
		{"swiglu dst", CheckSwiGLU(row, x, x), "swiglu: dst is [1, 8], want [3, 8]"},

		{"rope", CheckRope(x, 2, rope, pos), ""},
		{"rope of 2 of 4 dims", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.Dims = 2 }), pos), ""},
		{"rope NeoX", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.Mode = RoPENeoX }), pos), ""},
		{"rope nil batch", CheckRope(x, 2, rope, nil), "rope: nil batch"},
		{"rope mode", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.Mode = 2 }), pos), "rope: mode 2: " + ErrUnsupported.Error()},
		{"rope cols", CheckRope(x, 3, rope, pos), "rope: x has 8 columns, not 3 heads of 4"},
		{"rope no heads", CheckRope(f32(n, 0), 0, rope, pos), "not 0 heads of 4"},
		{"rope heads that overflow", CheckRope(x, math.MaxInt32, withRoPE(func(r *RoPE) { r.HeadDim = int(wide33) }), pos), fmt.Sprintf("heads of %d", int(wide33))},
		{"rope 0 dims", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.Dims = 0 }), pos), "rope: 0 rotated dimensions of a head of 4, want an even number from 2 to 4"},
		{"rope odd dims", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.Dims = 3 }), pos), "3 rotated dimensions"},
		{"rope dims > head dim", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.Dims = 6 }), pos), "6 rotated dimensions"},
		{"rope base 0", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.Base = 0 }), pos), "rope: base 0, want a finite value above 0"},
		{"rope base +Inf", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.Base = inf }), pos), "base +Inf"},
		{"rope base NaN", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.Base = nan }), pos), "base NaN"},
		{"rope frequency scale NaN", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.FreqScale = nan }), pos), "rope: frequency scale NaN, want a finite value above 0"},
		{"rope frequency scale 0", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.FreqScale = 0 }), pos), "frequency scale 0"},
		{"rope frequency scale -Inf", CheckRope(x, 2, withRoPE(func(r *RoPE) { r.FreqScale = -inf }), pos), "frequency scale -Inf"},
		{"rope positions", CheckRope(x, 2, rope, &Batch{Pos: []int32{0, 1}}), "rope: 2 positions for 3 tokens"},
		{"rope negative position", CheckRope(x, 2, rope, &Batch{Pos: []int32{0, -1, 2}}), "rope: token 1 at negative position -1"},

		{"new kv", CheckKVConfig(cfg), ""},
		{"new kv F32", CheckKVConfig(withCfg(func(c *KVConfig) { c.DType = tensor.F32 })), ""},
		{"new kv BF16", CheckKVConfig(withCfg(func(c *KVConfig) { c.DType = tensor.BF16 })), ""},
		{"new kv of MaxInt32 slots", CheckKVConfig(withCfg(func(c *KVConfig) { c.Slots = math.MaxInt32 })), ""},
		{"new kv Q8_0", CheckKVConfig(withCfg(func(c *KVConfig) { c.DType = tensor.Q8_0 })), "new kv: dtype Q8_0 (want F32, F16 or BF16): " + ErrUnsupported.Error()},
		{"new kv 0 layers", CheckKVConfig(withCfg(func(c *KVConfig) { c.Layers = 0 })), "new kv: bad config"},
		{"new kv 0 slots", CheckKVConfig(withCfg(func(c *KVConfig) { c.Slots = 0 })), "bad config"},
		{"new kv 0 width", CheckKVConfig(withCfg(func(c *KVConfig) { c.Width = 0 })), "bad config"},
		{"new kv block size 0", CheckKVConfig(withCfg(func(c *KVConfig) { c.BlockSize = 0 })), "bad config"},
		{"new kv more slots than int32", CheckKVConfig(withCfg(func(c *KVConfig) { c.Slots = int(wide31) })), "bad config"},
		{"layer", CheckLayer("store kv", cfg, 1), ""},
		{"layer = layers", CheckLayer("store kv", cfg, 2), "store kv: layer 2 outside the cache's 2"},
		{"layer -1", CheckLayer("attention", cfg, -1), "attention: layer -1 outside the cache's 2"},

		{"store kv", CheckStoreKV(cfg, x, x, pos), ""},
		{"store kv slot = slots - 1", CheckStoreKV(cfg, row, row, &Batch{Slot: []int32{15}}), ""},
		{"store kv nil batch", CheckStoreKV(cfg, x, x, nil), "store kv: nil batch"},
		{"store kv k rows", CheckStoreKV(cfg, row, x, pos), "store kv: k is [1, 8], want [3, 8]"},
		{"store kv v cols", CheckStoreKV(cfg, x, f32(n, d+1), pos), "store kv: v is [3, 9], want [3, 8]"},
		{"store kv slot = slots", CheckStoreKV(cfg, row, row, &Batch{Slot: []int32{16}}), "store kv: slot 16 of token 0 outside the cache's 16"},
		{"store kv slot -1", CheckStoreKV(cfg, x, x, &Batch{Slot: []int32{0, 1, -1}}), "slot -1 of token 2"},

		{"attention", attention(a, seqs(s0, s1)), ""},
		{"attention positions", attention(a, &Batch{}), "attention: 0 positions for 3 tokens"},
		{"attention with an empty sequence", attention(a, &Batch{Pos: pos.Pos, Seqs: []Seq{{Start: 3}, {Count: 3, CtxLen: 3, Blocks: []int32{1}}}}), ""},
		{"attention over the whole cache", attention(a, &Batch{Pos: pos.Pos, Seqs: []Seq{{Count: 3, CtxLen: 16, Blocks: []int32{3, 2, 1, 0, -1}}}}), ""},
		{"attention nil batch", attention(a, nil), "attention: nil batch"},
		{"attention heads", attention(withAttn(func(a *Attn) { a.NHead = 3 }), seqs(s0, s1)), "attention: 3 query heads over 2 kv heads of 4"},
		{"attention no kv heads", attention(withAttn(func(a *Attn) { a.NKVHead = 0 }), seqs(s0, s1)), "over 0 kv heads"},
		{"attention head dim 0", attention(withAttn(func(a *Attn) { a.HeadDim = 0 }), seqs(s0, s1)), "kv heads of 0"},
		{"attention width", attention(withAttn(func(a *Attn) { a.NKVHead = 1 }), seqs(s0, s1)), "attention: 1 kv heads of 4 do not make the cache's width 8"},
		{"attention scale NaN", attention(withAttn(func(a *Attn) { a.Scale = nan }), seqs(s0, s1)), "attention: scale NaN"},
		{"attention scale -Inf", attention(withAttn(func(a *Attn) { a.Scale = -inf }), seqs(s0, s1)), "scale -Inf"},
		{"attention q cols", func() error { _, err := CheckAttention(q, x, cfg, a, seqs(s0, s1), nil); return err }(), "attention: q has 8 columns, not 4 heads of 4"},
		{"attention dst", func() error { _, err := CheckAttention(f32(n, 8), q, cfg, a, seqs(s0, s1), nil); return err }(), "attention: dst is [3, 8], want [3, 16]"},
		{"attention block size", func() error {
			_, err := CheckAttention(q, q, withCfg(func(c *KVConfig) { c.BlockSize = 0 }), a, seqs(s0, s1), nil)
			return err
		}(), "attention: block size 0"},
		{"attention start -1", attention(a, seqs(with(s0, func(s *Seq) { s.Start = -1 }), s1)), "attention: sequence 0: tokens [-1, -1+1) outside the batch of 3"},
		{"attention past the batch", attention(a, seqs(with(s0, func(s *Seq) { s.Count = 2; s.CtxLen = 2 }), s1)), "sequence 0: tokens [2, 2+2) outside the batch of 3"},
		{"attention count -1", attention(a, seqs(s0, with(s1, func(s *Seq) { s.Count = -1 }))), "sequence 1: tokens [0, 0+-1)"},
		{"attention count > context", attention(a, seqs(s0, with(s1, func(s *Seq) { s.CtxLen = 1 }))), "attention: sequence 1: 2 tokens but context length 1"},
		{"attention context > slots", attention(a, seqs(s0, with(s1, func(s *Seq) { s.CtxLen = 17; s.Blocks = []int32{0, 1, 2, 3, 0} }))), "attention: sequence 1: context length 17 exceeds the cache's 16 slots"},
		{"attention of a table's last block", attention(a, seqs(s0, with(s1, func(s *Seq) { s.CtxLen = 12 }))), ""},
		{"attention short table", attention(a, seqs(s0, with(s1, func(s *Seq) { s.CtxLen = 13 }))), "attention: sequence 1: context 13 needs 4 blocks, table has 3"},
		{"attention short table by one", attention(a, seqs(s0, with(s1, func(s *Seq) { s.Blocks = s.Blocks[:1] }))), "attention: sequence 1: context 6 needs 2 blocks, table has 1"},
		{"attention block = blocks", attention(a, seqs(s0, with(s1, func(s *Seq) { s.Blocks = []int32{0, 4} }))), "attention: sequence 1: block 4 outside the cache's 4 blocks"},
		{"attention block -1", attention(a, seqs(with(s0, func(s *Seq) { s.Blocks = []int32{-1} }), s1)), "sequence 0: block -1 outside"},
		{"attention of a batch an empty sequence leaves short", attention(a, seqs(s0, with(s1, func(s *Seq) { s.Count = 0 }))), "token 0 is in no sequence"},
		{"attention bad block of an empty sequence", attention(a, &Batch{Pos: pos.Pos, Seqs: []Seq{{CtxLen: 1, Blocks: []int32{9}}, {Count: 3, CtxLen: 3, Blocks: []int32{1}}}}), "sequence 0: block 9 outside the cache's 4 blocks"},
		{"attention token in two sequences", attention(a, seqs(with(s0, func(s *Seq) { s.Start = 1 }), s1)), "attention: token 1 is in sequences 0 and 1"},
		{"attention token in no sequence", attention(a, seqs(s0, with(s1, func(s *Seq) { s.Count = 1; s.CtxLen = 5 }))), "attention: token 1 is in no sequence"},
	}
	for _, c := range cases {
		switch {
		case c.want == "" && c.err != nil:
			t.Errorf("%s: %v", c.name, c.err)
		case c.want != "" && c.err == nil:
			t.Errorf("%s: no error, want %q", c.name, c.want)
		case c.want != "" && !strings.Contains(c.err.Error(), c.want):
			t.Errorf("%s: %q does not say %q", c.name, c.err, c.want)
		}
	}
}

// TestCheckAttentionSequences checks the sequence of each token that CheckAttention reports, and
// that its scratch is reused.
func TestCheckAttentionSequences(t *testing.T) {
	cfg := KVConfig{Layers: 1, Slots: 16, Width: 8, BlockSize: 4, DType: tensor.F32}
	a := Attn{NHead: 2, NKVHead: 1, HeadDim: 8, Scale: 1}
	q := f32(4, 16)
	b := &Batch{Pos: make([]int32, 4), Seqs: []Seq{
		{Start: 3, Count: 1, CtxLen: 1, Blocks: []int32{0}},
		{Start: 0, Count: 2, CtxLen: 2, Blocks: []int32{1}},
		{Start: 2, Count: 1, CtxLen: 1, Blocks: []int32{2}},
	}}
	scratch := make([]int32, 1, 8)
	tok, err := CheckAttention(q, q, cfg, a, b, scratch)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int32{1, 1, 2, 0}; len(tok) != len(want) || tok[0] != want[0] || tok[1] != want[1] || tok[2] != want[2] || tok[3] != want[3] {
		t.Fatalf("sequences %v, want %v", tok, want)
	}
	if &tok[0] != &scratch[0] {
		t.Errorf("scratch of capacity %d reallocated for %d tokens", cap(scratch), len(tok))
	}
}

// TestChecksAllocateNothing: the checks of a decode step allocate nothing once CheckAttention's
// scratch is large enough.
func TestChecksAllocateNothing(t *testing.T) {
	x, row, q, out := f32(1, 8), f32(1, 8), f32(1, 16), f32(1, 32)
	var w Tensor = shape{tensor.Q8_0, 32, 8}
	cfg := KVConfig{Layers: 1, Slots: 16, Width: 8, BlockSize: 4, DType: tensor.F16}
	r := RoPE{Mode: RoPENeoX, HeadDim: 4, Dims: 4, Base: 10000, FreqScale: 1}
	a := Attn{NHead: 4, NKVHead: 2, HeadDim: 4, Scale: 0.5}
	b := &Batch{Pos: []int32{5}, Slot: []int32{9}, Seqs: []Seq{{Start: 0, Count: 1, CtxLen: 6, Blocks: []int32{3, 2}}}}
	var tok []int32
	var err error
	run := func() {
		var e error
		if tok, e = CheckAttention(q, q, cfg, a, b, tok); e != nil && err == nil {
			err = e
		}
		for _, e := range []error{
			CheckSpan("write", x, 0, 8), CheckView(x, 0, 1), CheckGetRows(x, w, []int32{31}), CheckMatMul(out, x, w),
			CheckAddRows(x, x, row), CheckRMSNorm(x, x, row, 1e-5), CheckSwiGLU(x, x, x), CheckRope(x, 2, r, b),
			CheckLayer("attention", cfg, 0), CheckStoreKV(cfg, x, x, b),
		} {
			if e != nil && err == nil {
				err = e
			}
		}
	}
	run()
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Errorf("%v allocations per decode step's checks, want 0", n)
	}
}

// wide31 and wide33 are 2^31 and 2^33: variables, so that 32-bit builds compile the tests that
// use them (the int conversion wraps there; those cases are about 64-bit sizes).
var wide31, wide33 = int64(math.MaxInt32) + 1, int64(1) << 33
