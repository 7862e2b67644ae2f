package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// fakeKV is a KV cache no backend made.
type fakeKV struct{ cfg backend.KVConfig }

func (f fakeKV) Config() backend.KVConfig { return f.cfg }
func (f fakeKV) Close() error             { return nil }

// mustFail fails t unless f returns an error without panicking.
func mustFail(t *testing.T, what string, f func() error) {
	t.Helper()
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
				t.Errorf("%s: panicked: %v", what, r)
			}
		}()
		return f()
	}()
	if err == nil {
		t.Errorf("%s: no error", what)
	}
}

// testErrors checks that bad arguments give errors, never panics, and leave the backend usable.
func testErrors(t *testing.T, b backend.Backend, newBackend func() (backend.Backend, error)) {
	other := open(t, newBackend)
	const k, m, n = 32, 4, 2
	r := rng("errors")
	wdata, _ := quantRows(t, tensor.F32, m, k, randVec(r, m*k, 1))
	qdata, _ := quantRows(t, tensor.Q8_0, m, k, randVec(r, m*k, 1))
	w := load(t, b, tensor.F32, m, k, wdata)
	wq := load(t, b, tensor.Q8_0, m, k, qdata)
	x := alloc(t, b, n, k, randVec(r, n*k, 1))
	dst := alloc(t, b, n, m, nil)
	sq := alloc(t, b, n, k, nil)
	foreign := load(t, other, tensor.F32, m, k, wdata)
	foreignX := alloc(t, other, n, k, randVec(r, n*k, 1))
	closed := load(t, b, tensor.F32, m, k, wdata)
	closed.Close()
	closedX := alloc(t, b, n, k, nil)
	closedX.Close()
	fake := fakeTensor{tensor.F32, n, k}
	norm := alloc(t, b, 1, k, randVec(r, k, 1))
	vec := make([]float32, n*k)

	t.Run("Load", func(t *testing.T) {
		mustFail(t, "Load F32 with too few bytes", func() error { _, err := b.Load(tensor.F32, m, k, wdata[:len(wdata)-1]); return err })
		mustFail(t, "Load F32 with too many bytes", func() error { _, err := b.Load(tensor.F32, m, k, append(wdata[:len(wdata):len(wdata)], 0)); return err })
		mustFail(t, "Load Q8_0 with cols not a multiple of 32", func() error { _, err := b.Load(tensor.Q8_0, 1, 33, make([]byte, 68)); return err })
		mustFail(t, "Load negative rows", func() error { _, err := b.Load(tensor.F32, -1, k, nil); return err })
		mustFail(t, "Load negative cols", func() error { _, err := b.Load(tensor.F32, 1, -4, nil); return err })
		mustFail(t, "Load IQ2_XXS (unsupported)", func() error { _, err := b.Load(tensor.IQ2_XXS, 1, 256, make([]byte, 66)); return err })
		mustFail(t, "Load unknown dtype", func() error { _, err := b.Load(tensor.DType(99), 1, 1, make([]byte, 4)); return err })
		mustFail(t, "Load with a size that overflows", func() error { _, err := b.Load(tensor.F32, math.MaxInt/2, 16, nil); return err })
	})
	t.Run("Alloc", func(t *testing.T) {
		mustFail(t, "Alloc negative rows", func() error { _, err := b.Alloc(tensor.F32, -1, 4); return err })
		mustFail(t, "Alloc with a size that overflows", func() error { _, err := b.Alloc(tensor.F32, math.MaxInt/2, 16); return err })
		mustFail(t, "Alloc Q4_0", func() error { _, err := b.Alloc(tensor.Q4_0, 1, 32); return err })
	})
	t.Run("WriteRead", func(t *testing.T) {
		mustFail(t, "Write past the last row", func() error { return b.Write(x, 1, vec) })
		mustFail(t, "Write at row -1", func() error { return b.Write(x, -1, vec[:k]) })
		mustFail(t, "Write a partial row", func() error { return b.Write(x, 0, vec[:k-1]) })
		mustFail(t, "Write to a quantised tensor", func() error { return b.Write(wq, 0, vec[:k]) })
		mustFail(t, "Write to a closed tensor", func() error { return b.Write(closedX, 0, vec[:k]) })
		mustFail(t, "Write to a foreign tensor", func() error { return b.Write(foreignX, 0, vec[:k]) })
		mustFail(t, "Write to a fake tensor", func() error { return b.Write(fake, 0, vec[:k]) })
		mustFail(t, "Write to nil", func() error { return b.Write(nil, 0, vec[:k]) })
		mustFail(t, "Read past the last row", func() error { return b.Read(x, 1, vec) })
		mustFail(t, "Read at row -1", func() error { return b.Read(x, -1, vec[:k]) })
		mustFail(t, "Read a partial row", func() error { return b.Read(x, 0, vec[:k+1]) })
		mustFail(t, "Read a closed tensor", func() error { return b.Read(closedX, 0, vec[:k]) })
		mustFail(t, "Read a foreign tensor", func() error { return b.Read(foreignX, 0, vec[:k]) })
	})
	t.Run("View", func(t *testing.T) {
		mustFail(t, "View row0 -1", func() error { _, err := b.View(x, -1, 1); return err })
		mustFail(t, "View past the last row", func() error { _, err := b.View(x, 1, n); return err })
		mustFail(t, "View negative rows", func() error { _, err := b.View(x, 0, -1); return err })
		mustFail(t, "View of a closed tensor", func() error { _, err := b.View(closedX, 0, 1); return err })
		mustFail(t, "View of a foreign tensor", func() error { _, err := b.View(foreignX, 0, 1); return err })
		mustFail(t, "View of a fake tensor", func() error { _, err := b.View(fake, 0, 1); return err })
	})
	t.Run("GetRows", func(t *testing.T) {
		g := alloc(t, b, 2, k, nil)
		mustFail(t, "GetRows id -1", func() error { return b.GetRows(g, w, []int32{0, -1}) })
		mustFail(t, "GetRows id = rows", func() error { return b.GetRows(g, wq, []int32{m, 0}) })
		mustFail(t, "GetRows dst rows != len(ids)", func() error { return b.GetRows(g, w, []int32{0, 1, 2}) })
		mustFail(t, "GetRows dst cols != table cols", func() error { return b.GetRows(dst, w, []int32{0, 1}) })
		mustFail(t, "GetRows into a quantised tensor", func() error { return b.GetRows(wq, w, []int32{0, 1, 2, 3}) })
		mustFail(t, "GetRows from a foreign table", func() error { return b.GetRows(g, foreign, []int32{0, 1}) })
		mustFail(t, "GetRows from a closed table", func() error { return b.GetRows(g, closed, []int32{0, 1}) })
		mustFail(t, "GetRows from a fake table", func() error { return b.GetRows(g, fakeTensor{tensor.F32, m, k}, []int32{0, 1}) })
	})
	t.Run("MatMul", func(t *testing.T) {
		x2 := alloc(t, b, n, 2*k, nil)
		d3 := alloc(t, b, n+1, m, nil)
		d5 := alloc(t, b, n, m+1, nil)
		mustFail(t, "MatMul x cols != w cols", func() error { return b.MatMul(dst, x2, w) })
		mustFail(t, "MatMul dst rows != x rows", func() error { return b.MatMul(d3, x, w) })
		mustFail(t, "MatMul dst cols != w rows", func() error { return b.MatMul(d5, x, wq) })
		mustFail(t, "MatMul quantised x", func() error { return b.MatMul(alloc(t, b, m, m, nil), wq, w) })
		mustFail(t, "MatMul quantised dst", func() error { return b.MatMul(wq, x, w) })
		mustFail(t, "MatMul foreign w", func() error { return b.MatMul(dst, x, foreign) })
		mustFail(t, "MatMul foreign x", func() error { return b.MatMul(dst, foreignX, w) })
		mustFail(t, "MatMul closed w", func() error { return b.MatMul(dst, x, closed) })
		mustFail(t, "MatMul closed x", func() error { return b.MatMul(dst, closedX, w) })
		mustFail(t, "MatMul fake dst", func() error { return b.MatMul(fakeTensor{tensor.F32, n, m}, x, w) })
		mustFail(t, "MatMul nil w", func() error { return b.MatMul(dst, x, nil) })
	})
	t.Run("Elementwise", func(t *testing.T) {
		x3 := alloc(t, b, 3, k, nil)
		xw := alloc(t, b, n, k+1, nil)
		mustFail(t, "AddRows b rows neither 1 nor a rows", func() error { return b.AddRows(x3, x3, x) })
		mustFail(t, "AddRows cols differ", func() error { return b.AddRows(sq, x, xw) })
		mustFail(t, "AddRows dst shape", func() error { return b.AddRows(x3, x, x) })
		mustFail(t, "AddRows closed b", func() error { return b.AddRows(sq, x, closedX) })
		mustFail(t, "AddRows foreign a", func() error { return b.AddRows(sq, foreignX, x) })
		mustFail(t, "RMSNorm w cols != x cols", func() error { return b.RMSNorm(sq, x, alloc(t, b, 1, k+1, nil), 1e-5) })
		mustFail(t, "RMSNorm w rows != 1", func() error { return b.RMSNorm(sq, x, x, 1e-5) })
		mustFail(t, "RMSNorm dst shape", func() error { return b.RMSNorm(x3, x, norm, 1e-5) })
		mustFail(t, "RMSNorm quantised w", func() error { return b.RMSNorm(sq, x, wq, 1e-5) })
		mustFail(t, "SwiGLU up shape", func() error { return b.SwiGLU(sq, x, x3) })
		mustFail(t, "SwiGLU dst shape", func() error { return b.SwiGLU(xw, x, x) })
		mustFail(t, "SwiGLU fake gate", func() error { return b.SwiGLU(sq, fake, x) })
	})
	t.Run("Rope", func(t *testing.T) {
		pos := &backend.Batch{Pos: []int32{0, 1}, Slot: []int32{0, 1}, Seqs: []backend.Seq{{Start: 0, Count: 2, CtxLen: 2}}}
		ok := backend.RoPE{Mode: backend.RoPENormal, HeadDim: 8, Dims: 8, Base: 10000, FreqScale: 1}
		bad := func(f func(r *backend.RoPE)) backend.RoPE { r := ok; f(&r); return r }
		mustFail(t, "Rope cols != nHead*HeadDim", func() error { return b.Rope(x, 3, ok, pos) })
		mustFail(t, "Rope Dims > HeadDim", func() error { return b.Rope(x, 2, bad(func(r *backend.RoPE) { r.HeadDim, r.Dims = 16, 18 }), pos) })
		mustFail(t, "Rope odd Dims", func() error { return b.Rope(x, 4, bad(func(r *backend.RoPE) { r.Dims = 7 }), pos) })
		mustFail(t, "Rope HeadDim 0", func() error { return b.Rope(x, 4, bad(func(r *backend.RoPE) { r.HeadDim, r.Dims = 0, 0 }), pos) })
		mustFail(t, "Rope len(Pos) != rows", func() error {
			return b.Rope(x, 4, ok, &backend.Batch{Pos: []int32{0}, Slot: []int32{0}, Seqs: []backend.Seq{{Count: 1, CtxLen: 1}}})
		})
		mustFail(t, "Rope nil batch", func() error { return b.Rope(x, 4, ok, nil) })
		mustFail(t, "Rope quantised x", func() error { return b.Rope(wq, 4, ok, pos) })
	})
	t.Run("KV", func(t *testing.T) {
		const hd, nkv, bs, slots = 8, 2, 4, 16
		cfg := backend.KVConfig{Layers: 2, Slots: slots, Width: nkv * hd, BlockSize: bs, DType: tensor.F32}
		bad := func(f func(c *backend.KVConfig)) backend.KVConfig { c := cfg; f(&c); return c }
		mustFail(t, "NewKV Q8_0", func() error { _, err := b.NewKV(bad(func(c *backend.KVConfig) { c.DType = tensor.Q8_0 })); return err })
		mustFail(t, "NewKV Width 0", func() error { _, err := b.NewKV(bad(func(c *backend.KVConfig) { c.Width = 0 })); return err })
		mustFail(t, "NewKV BlockSize 0", func() error { _, err := b.NewKV(bad(func(c *backend.KVConfig) { c.BlockSize = 0 })); return err })
		mustFail(t, "NewKV negative Layers", func() error { _, err := b.NewKV(bad(func(c *backend.KVConfig) { c.Layers = -1 })); return err })
		mustFail(t, "NewKV with a size that overflows", func() error {
			_, err := b.NewKV(bad(func(c *backend.KVConfig) { c.Layers, c.Slots, c.Width = 1<<20, 1<<30, 1<<30 }))
			return err
		})
		kv, err := b.NewKV(cfg)
		must(t, err, "NewKV")
		defer kv.Close()
		otherKV, err := other.NewKV(cfg)
		must(t, err, "NewKV")
		defer otherKV.Close()
		closedKV, err := b.NewKV(cfg)
		must(t, err, "NewKV")
		closedKV.Close()

		kt := alloc(t, b, 2, nkv*hd, randVec(r, 2*nkv*hd, 1))
		vt := alloc(t, b, 2, nkv*hd, randVec(r, 2*nkv*hd, 1))
		wide := alloc(t, b, 2, nkv*hd+1, nil)
		good := &backend.Batch{Pos: []int32{0, 1}, Slot: []int32{8, 9}, Seqs: []backend.Seq{{Start: 0, Count: 2, CtxLen: 2, Blocks: []int32{2}}}}
		slots2 := func(a, c int32) *backend.Batch {
			return &backend.Batch{Pos: []int32{0, 1}, Slot: []int32{a, c}, Seqs: good.Seqs}
		}
		mustFail(t, "StoreKV slot -1", func() error { return b.StoreKV(kv, 0, kt, vt, slots2(0, -1)) })
		mustFail(t, "StoreKV slot = Slots", func() error { return b.StoreKV(kv, 0, kt, vt, slots2(slots, 0)) })
		mustFail(t, "StoreKV layer = Layers", func() error { return b.StoreKV(kv, 2, kt, vt, good) })
		mustFail(t, "StoreKV layer -1", func() error { return b.StoreKV(kv, -1, kt, vt, good) })
		mustFail(t, "StoreKV k cols != Width", func() error { return b.StoreKV(kv, 0, wide, vt, good) })
		mustFail(t, "StoreKV v cols != Width", func() error { return b.StoreKV(kv, 0, kt, wide, good) })
		mustFail(t, "StoreKV len(Slot) != rows", func() error {
			return b.StoreKV(kv, 0, kt, vt, &backend.Batch{Pos: []int32{0}, Slot: []int32{0}, Seqs: []backend.Seq{{Count: 1, CtxLen: 1, Blocks: []int32{0}}}})
		})
		mustFail(t, "StoreKV foreign KV", func() error { return b.StoreKV(otherKV, 0, kt, vt, good) })
		mustFail(t, "StoreKV fake KV", func() error { return b.StoreKV(fakeKV{cfg}, 0, kt, vt, good) })
		mustFail(t, "StoreKV closed KV", func() error { return b.StoreKV(closedKV, 0, kt, vt, good) })
		mustFail(t, "StoreKV nil batch", func() error { return b.StoreKV(kv, 0, kt, vt, nil) })
		must(t, b.StoreKV(kv, 0, kt, vt, good), "StoreKV")

		const nh = 4
		a := backend.Attn{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.35}
		q := alloc(t, b, 2, nh*hd, randVec(r, 2*nh*hd, 1))
		out := alloc(t, b, 2, nh*hd, nil)
		must(t, b.Attention(out, q, kv, 0, a, good), "Attention")
		seqs := func(s backend.Seq) *backend.Batch {
			return &backend.Batch{Pos: good.Pos, Slot: good.Slot, Seqs: []backend.Seq{s}}
		}
		mustFail(t, "Attention block id = Slots/BlockSize", func() error {
			return b.Attention(out, q, kv, 0, a, seqs(backend.Seq{Start: 0, Count: 2, CtxLen: 2, Blocks: []int32{slots / bs}}))
		})
		mustFail(t, "Attention block id -1", func() error {
			return b.Attention(out, q, kv, 0, a, seqs(backend.Seq{Start: 0, Count: 2, CtxLen: 2, Blocks: []int32{-1}}))
		})
		mustFail(t, "Attention CtxLen beyond the block table", func() error {
			return b.Attention(out, q, kv, 0, a, seqs(backend.Seq{Start: 0, Count: 2, CtxLen: bs + 1, Blocks: []int32{2}}))
		})
		mustFail(t, "Attention Count > CtxLen", func() error {
			return b.Attention(out, q, kv, 0, a, seqs(backend.Seq{Start: 0, Count: 2, CtxLen: 1, Blocks: []int32{2}}))
		})
		mustFail(t, "Attention Start+Count > rows", func() error {
			return b.Attention(out, q, kv, 0, a, seqs(backend.Seq{Start: 1, Count: 2, CtxLen: 2, Blocks: []int32{2}}))
		})
		mustFail(t, "Attention negative Start", func() error {
			return b.Attention(out, q, kv, 0, a, seqs(backend.Seq{Start: -1, Count: 1, CtxLen: 2, Blocks: []int32{2}}))
		})
		mustFail(t, "Attention layer = Layers", func() error { return b.Attention(out, q, kv, 2, a, good) })
		mustFail(t, "Attention NHead not a multiple of NKVHead", func() error {
			return b.Attention(alloc(t, b, 2, 3*hd, nil), alloc(t, b, 2, 3*hd, nil), kv, 0, backend.Attn{NHead: 3, NKVHead: 2, HeadDim: hd, Scale: 1}, good)
		})
		mustFail(t, "Attention NKVHead*HeadDim != Width", func() error {
			return b.Attention(out, q, kv, 0, backend.Attn{NHead: nh, NKVHead: 1, HeadDim: hd, Scale: 1}, good)
		})
		mustFail(t, "Attention q cols != NHead*HeadDim", func() error { return b.Attention(out, kt, kv, 0, a, good) })
		mustFail(t, "Attention dst shape", func() error { return b.Attention(kt, q, kv, 0, a, good) })
		mustFail(t, "Attention len(Pos) != rows", func() error {
			return b.Attention(out, q, kv, 0, a, &backend.Batch{Pos: []int32{0}, Slot: []int32{8}, Seqs: []backend.Seq{{Start: 0, Count: 1, CtxLen: 1, Blocks: []int32{2}}}})
		})
		mustFail(t, "Attention foreign KV", func() error { return b.Attention(out, q, otherKV, 0, a, good) })
		mustFail(t, "Attention closed KV", func() error { return b.Attention(out, q, closedKV, 0, a, good) })
		mustFail(t, "Attention nil batch", func() error { return b.Attention(out, q, kv, 0, a, nil) })
	})

	// The backend still computes after all of that.
	must(t, b.MatMul(dst, x, w), "MatMul after the argument errors")
	for i, v := range read(t, b, dst) {
		if v != v {
			t.Fatalf("MatMul after the argument errors: element %d is NaN", i)
		}
	}
}
