// Package cpu is the native CPU backend, registered as "cpu": backend.Backend on top of the C
// kernels of bindings/cpu (Parley's own scalar, AVX2 and AVX-512 kernels, chosen at run time for
// the processor, with OpenBLAS for float matrix products where AVX-512 is absent). Work is split
// among Options.Threads native threads (0: one per CPU).
//
// Weights given to Load are used in place, never copied (they are normally memory-mapped GGUF
// bytes), except F32 data that is not 4-byte aligned. Repack (backend.Repacker) rearranges a
// quantised matrix into the interleaved layout of the AVX-512 VNNI kernels (or AVX2 ones), about
// as large as its rows, which MatMul then reads instead (PARLEY_CPU_REPACK=0 turns this off: the matrices then
// stay shared, evictable pages of the file, at the row layout's speed). Activations and KV caches
// live in native memory owned by the backend. Operations are synchronous: each returns when its result is
// complete, and makes no Go allocation in steady state.
//
// In a build without cgo the backend is still registered, but New reports why it cannot run.
package cpu

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

func init() { backend.Register("cpu", 10, New) }

// Backend is the native CPU backend.
type Backend struct {
	ctx *cpu.Context

	ops backend.Operands[*Tensor, *KV] // also says whether the backend is closed (set under mu)

	mu     sync.Mutex // guards owned and the attention scratch below
	owned  map[*cpu.Buffer]struct{}
	seqs   []cpu.Seq // attention batch, flattened
	blocks []int32
	tok    []int32 // scratch of the attention checks: each token's sequence

	noRepack bool // PARLEY_CPU_REPACK=0: Repack leaves weights as loaded
}

// New starts a CPU backend computing with opts.Threads threads (0: one per CPU).
func New(opts backend.Options) (backend.Backend, error) {
	th := opts.Threads
	if th < 0 {
		return nil, fmt.Errorf("cpu: %d threads", th)
	}
	if th == 0 {
		th = runtime.NumCPU()
	}
	if th > 256 {
		th = 256
	}
	ctx, err := cpu.NewContext(th)
	if err != nil {
		return nil, err
	}
	caps := backend.Capabilities{
		Weights: backend.DTypes(func(dt tensor.DType) bool { return cpu.Supports(cpu.OpMatMul, dt) }),
		KV:      backend.DTypes(func(dt tensor.DType) bool { return cpu.Supports(cpu.OpKV, dt) }),
	}
	return &Backend{ctx: ctx, ops: backend.NewOperands[*Tensor, *KV]("cpu", caps), owned: map[*cpu.Buffer]struct{}{},
		noRepack: os.Getenv("PARLEY_CPU_REPACK") == "0"}, nil
}

// Capabilities says what the backend computes: the weight types of the native kernels (the
// quantised types of llama.cpp's CPU backend that Parley reads) and F32, F16 and BF16 caches.
func (b *Backend) Capabilities() backend.Capabilities { return b.ops.Capabilities() }

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// Threads is the number of threads the backend computes with.
func (b *Backend) Threads() int { return b.ctx.Threads() }

// Close frees the threads and every tensor and cache still open.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.ops.Close() {
		return nil
	}
	for buf := range b.owned {
		buf.Free()
	}
	b.owned = nil
	return b.ctx.Close()
}

// alloc returns zeroed native memory owned by the backend.
func (b *Backend) alloc(op string, n int) (*cpu.Buffer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ops.Closed() {
		return nil, fmt.Errorf("cpu: %s: backend closed", op)
	}
	buf, err := cpu.Alloc(n)
	if err != nil {
		return nil, err
	}
	b.owned[buf] = struct{}{}
	return buf, nil
}

func (b *Backend) free(buf *cpu.Buffer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.owned[buf]; ok {
		delete(b.owned, buf)
		buf.Free()
	}
}

// Tensor is a tensor of the CPU backend.
type Tensor struct {
	b          *Backend
	dt         tensor.DType
	rows, cols int
	data       []byte      // rows * dt.RowSize(cols) bytes
	f32        []float32   // data as float32s when dt is F32
	buf        *cpu.Buffer // native memory owned by this tensor
	packed     *cpu.Buffer // the interleaved layout MatMul reads (Repack), or nil
	root       *Tensor     // the tensor whose memory this one shares (itself unless a View)
	readOnly   bool        // loaded weights: never written
	res        backend.Residence
}

// DType is the tensor's element type.
func (t *Tensor) DType() tensor.DType { return t.dt }

// Rows is the number of rows.
func (t *Tensor) Rows() int { return t.rows }

// Cols is the number of elements a row.
func (t *Tensor) Cols() int { return t.cols }

// Close releases the tensor's native memory (loaded weights are the caller's; a View's memory is
// its parent's). Closing twice is a no-op.
func (t *Tensor) Close() error {
	if t.res.Closed {
		return nil
	}
	t.res.Closed = true
	if t.buf != nil {
		t.b.free(t.buf)
		t.buf = nil
	}
	if t.packed != nil {
		t.b.free(t.packed)
		t.packed = nil
	}
	t.data, t.f32 = nil, nil
	return nil
}

// Residence is what the shared operand checks read of t (backend.Operands).
func (t *Tensor) Residence() *backend.Residence { return &t.res }

// reside records t's memory, t.data, for the operand checks; view is the tensor t is a view of.
func (t *Tensor) reside(view *Tensor) {
	t.res = backend.Residence{Owner: t.b.ops.Owner, DType: t.dt, ReadOnly: t.readOnly, Bytes: len(t.data)}
	if len(t.data) > 0 {
		t.res.Addr = uintptr(unsafe.Pointer(&t.data[0]))
	}
	if view != nil {
		t.res.View = &view.res
	}
}

// Load makes a tensor over data without copying it (F32 data that is not 4-byte aligned is
// copied into native memory). data must stay valid and unchanged while the tensor lives.
func (b *Backend) Load(dt tensor.DType, rows, cols int, data []byte) (backend.Tensor, error) {
	const op = "load"
	n, _, err := b.ops.Load(dt, rows, cols, data)
	if err != nil {
		return nil, err
	}
	if b.ops.Closed() {
		return nil, fmt.Errorf("cpu: %s: backend closed", op)
	}
	t := &Tensor{b: b, dt: dt, rows: rows, cols: cols, data: data, readOnly: true}
	t.root = t
	if dt == tensor.F32 && n > 0 {
		if uintptr(unsafe.Pointer(&data[0]))%4 != 0 {
			buf, err := b.alloc(op, n)
			if err != nil {
				return nil, err
			}
			copy(buf.Bytes(), data)
			t.buf, t.data = buf, buf.Bytes()
		}
		t.f32 = unsafe.Slice((*float32)(unsafe.Pointer(&t.data[0])), n/4)
	}
	t.reside(nil)
	return t, nil
}

// Repack rearranges a loaded quantised weight matrix (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS), sixteen rows at a time, into the interleaved layout of the AVX-512 VNNI
// and AVX2 kernels (native memory the tensor owns, about as large as the rows), through which
// MatMul then multiplies it: a block's whole integer dot product lands in
// one lane, so a product of a few rows costs about a third of the row layout's operations. It
// reports false, doing nothing, for other tensors (Q2_K, Q3_K, IQ4_NL and IQ4_XS with AVX-512
// among them, whose interleaved kernels are AVX2 only: MatMul multiplies their rows), views, or
// processors without those kernels.
// The loaded data stays in use for GetRows, views, and instruction-set levels lowered later.
// Where the memory for the new layout cannot be had, or PARLEY_CPU_REPACK=0 was set when the
// backend started, the tensor stays as loaded. Repack must not run while t is in use.
func (b *Backend) Repack(t backend.Tensor) (bool, error) {
	const op = "repack"
	ct, err := b.ops.Tensor(op, "t", t)
	if err != nil {
		return false, err
	}
	if ct.root != ct || !ct.readOnly || ct.packed != nil || ct.rows == 0 {
		return ct.packed != nil, nil
	}
	n, ok := cpu.PackedSize(ct.dt, ct.rows, ct.cols)
	if !ok {
		return false, nil
	}
	if b.noRepack {
		return false, nil
	}
	buf, err := b.alloc(op, n)
	if err != nil { // no room for a second layout: the rows serve, as without repacking
		return false, nil
	}
	if err := b.ctx.PackWeights(buf.Bytes(), ct.data, ct.dt, ct.rows, ct.cols); err != nil {
		b.free(buf)
		return false, err
	}
	ct.packed = buf
	return true, nil
}

// Alloc makes a zeroed F32 or F16 tensor in native memory.
func (b *Backend) Alloc(dt tensor.DType, rows, cols int) (backend.Tensor, error) {
	n, _, err := b.ops.Alloc(dt, rows, cols)
	if err != nil {
		return nil, err
	}
	buf, err := b.alloc("alloc", n)
	if err != nil {
		return nil, err
	}
	t := &Tensor{b: b, dt: dt, rows: rows, cols: cols, buf: buf, data: buf.Bytes()}
	t.root = t
	if dt == tensor.F32 {
		t.f32 = buf.Float32s()
	}
	t.reside(nil)
	return t, nil
}

// View returns a tensor of rows row0 .. row0+rows-1 of t, sharing its memory. Closing the view
// does not free t; t must outlive it.
func (b *Backend) View(t backend.Tensor, row0, rows int) (backend.Tensor, error) {
	p, err := b.ops.View(t, row0, rows)
	if err != nil {
		return nil, err
	}
	rb := 0
	if p.rows > 0 {
		rb = len(p.data) / p.rows
	}
	v := &Tensor{b: b, dt: p.dt, rows: rows, cols: p.cols, root: p.root, readOnly: p.readOnly,
		data: p.data[row0*rb : (row0+rows)*rb : (row0+rows)*rb]}
	if p.f32 != nil {
		v.f32 = p.f32[row0*p.cols : (row0+rows)*p.cols : (row0+rows)*p.cols]
	}
	v.reside(p.root)
	return v, nil
}

// Write copies src into rows row0.. of an F32 tensor.
func (b *Backend) Write(dst backend.Tensor, row0 int, src []float32) error {
	t, err := b.ops.Span("write", "dst", dst, row0, len(src), true)
	if err != nil {
		return err
	}
	copy(t.f32[row0*t.cols:], src)
	return nil
}

// Read copies rows row0.. of an F32 tensor into dst.
func (b *Backend) Read(src backend.Tensor, row0 int, dst []float32) error {
	t, err := b.ops.Span("read", "src", src, row0, len(dst), false)
	if err != nil {
		return err
	}
	copy(dst, t.f32[row0*t.cols:])
	return nil
}

var _ backend.Argmaxer = (*Backend)(nil)

// Argmax writes into ids[i] the index of the largest value of row row0+i of an F32 tensor
// (backend.ArgmaxRows), without copying the rows out.
func (b *Backend) Argmax(logits backend.Tensor, row0 int, ids []int32) error {
	t, err := b.ops.Logits("argmax", logits, row0, len(ids))
	if err != nil {
		return err
	}
	return backend.ArgmaxRows(t.f32[row0*t.cols:(row0+len(ids))*t.cols], t.cols, ids)
}

// GetRows: dst[i,:] = float32(table[ids[i],:]); dst [len(ids), cols] F32.
func (b *Backend) GetRows(dst, table backend.Tensor, ids []int32) error {
	d, tb, err := b.ops.GetRows(dst, table, ids)
	if err != nil {
		return err
	}
	return b.ctx.GetRows(d.f32, tb.data, tb.dt, tb.rows, tb.cols, ids)
}

// MatMul: dst[i,j] = sum_k x[i,k]*w[j,k]; x [n, k] F32, w [m, k], dst [n, m] F32.
func (b *Backend) MatMul(dst, x, w backend.Tensor) error {
	d, xt, wt, err := b.ops.MatMul(dst, x, w)
	if err != nil {
		return err
	}
	return b.matMul(d, xt, wt)
}

// matMul multiplies checked operands.
func (b *Backend) matMul(d, xt, wt *Tensor) error {
	if xt.cols == 0 { // empty sums, which the kernels do not take
		clear(d.f32)
		return nil
	}
	if wt.packed != nil && cpu.PackedAvailable(wt.dt) { // else the ISA level was lowered: the rows serve
		return b.ctx.MatMulPacked(d.f32, xt.f32, xt.rows, xt.cols, wt.packed.Bytes(), wt.dt, wt.rows)
	}
	return b.ctx.MatMul(d.f32, xt.f32, xt.rows, xt.cols, wt.data, wt.dt, wt.rows)
}

// MatMuls computes dst[i] = x · w[i]ᵀ for every i (backend.MultiMatMuler): up to three packed
// matrices of one type in one native call, which converts x once and wakes the threads once;
// otherwise one MatMul each. Every result is bit for bit MatMul's.
func (b *Backend) MatMuls(dst []backend.Tensor, x backend.Tensor, w []backend.Tensor) error {
	n := len(w)
	if n < 2 || n > cpu.MaxPackedProducts || len(dst) != n {
		if len(dst) != n {
			return fmt.Errorf("cpu: matmul: %d destinations for %d matrices", len(dst), n)
		}
		for i := range w {
			if err := b.MatMul(dst[i], x, w[i]); err != nil {
				return err
			}
		}
		return nil
	}
	var ds, ws [cpu.MaxPackedProducts]*Tensor
	xt, err := b.ops.MatMuls(dst, x, w, ds[:n], ws[:n])
	if err != nil {
		return err
	}
	together := xt.cols > 0
	var ps [cpu.MaxPackedProducts]cpu.PackedProduct
	for i := range n {
		together = together && ws[i].packed != nil && ws[i].dt == ws[0].dt
		ps[i] = cpu.PackedProduct{Dst: ds[i].f32, M: ws[i].rows}
		if ws[i].packed != nil {
			ps[i].W = ws[i].packed.Bytes()
		}
	}
	if together && cpu.PackedAvailable(ws[0].dt) {
		return b.ctx.MatMulPackedN(xt.f32, xt.rows, xt.cols, ws[0].dt, ps[:n])
	}
	for i := range n {
		if err := b.matMul(ds[i], xt, ws[i]); err != nil {
			return err
		}
	}
	return nil
}

// AddRows: dst[i,:] = a[i,:] + b[i,:], or bias[0,:] when it has one row. dst may be a.
func (b *Backend) AddRows(dst, a, bias backend.Tensor) error {
	d, at, bt, err := b.ops.AddRows(dst, a, bias)
	if err != nil {
		return err
	}
	return b.ctx.AddRows(d.f32, at.f32, bt.f32, at.rows, at.cols, bt.rows)
}

// RMSNorm: dst[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * w[0,:]; w [1, d] F32, or [1, g] with g
// dividing d for groups of g normalised apart (see backend.Backend). dst may be x.
func (b *Backend) RMSNorm(dst, x, w backend.Tensor, eps float32) error {
	d, xt, wt, err := b.ops.RMSNorm(dst, x, w, eps)
	if err != nil {
		return err
	}
	if xt.cols == 0 {
		return nil
	}
	// rows of x in groups of w's width: [n, h*g] as [n*h, g]
	return b.ctx.RMSNorm(d.f32, xt.f32, wt.f32, xt.rows*(xt.cols/wt.cols), wt.cols, eps)
}

// GeGLU: dst = gelu(gate) * up elementwise. dst may be gate or up.
func (b *Backend) GeGLU(dst, gate, up backend.Tensor) error {
	d, g, u, err := b.ops.GLU("geglu", dst, gate, up)
	if err != nil {
		return err
	}
	return b.ctx.GeGLU(d.f32, g.f32, u.f32)
}

// Scale: dst = x * s elementwise. dst may be x.
func (b *Backend) Scale(dst, x backend.Tensor, s float32) error {
	d, xt, err := b.ops.Scale(dst, x, s)
	if err != nil {
		return err
	}
	return b.ctx.Scale(d.f32, xt.f32, s)
}

// SwiGLU: dst = silu(gate) * up elementwise. dst may be gate (or up).
func (b *Backend) SwiGLU(dst, gate, up backend.Tensor) error {
	d, g, u, err := b.ops.GLU("swiglu", dst, gate, up)
	if err != nil {
		return err
	}
	return b.ctx.SwiGLU(d.f32, g.f32, u.f32)
}

// Rope rotates x [n, nHead*HeadDim] in place, token i at position bt.Pos[i].
func (b *Backend) Rope(x backend.Tensor, nHead int, r backend.RoPE, bt *backend.Batch) error {
	xt, err := b.ops.Rope(x, nHead, r, bt)
	if err != nil {
		return err
	}
	return b.ctx.Rope(xt.f32, xt.rows, nHead, cpu.Rope{
		NeoX: r.Mode == backend.RoPENeoX, HeadDim: r.HeadDim, Dims: r.Dims, Base: r.Base, FreqScale: r.FreqScale,
		Factors: r.Factors, AttnFactor: r.AttnFactor, ExtFactor: r.ExtFactor, CorrDims: r.CorrDims,
	}, bt.Pos)
}

// KV is a key/value cache in native memory: per layer, keys and values [Slots, Width] of the
// configuration's type (F32, F16 or BF16).
type KV struct {
	b    *Backend
	cfg  backend.KVConfig
	k, v []*cpu.Buffer
	res  backend.Residence
}

// Config returns the cache's configuration.
func (kv *KV) Config() backend.KVConfig { return kv.cfg }

// Close frees the cache. Closing twice is a no-op.
func (kv *KV) Close() error {
	if kv.res.Closed {
		return nil
	}
	kv.res.Closed = true
	for i := range kv.k {
		kv.b.free(kv.k[i])
		kv.b.free(kv.v[i])
	}
	kv.k, kv.v = nil, nil
	return nil
}

// NewKV makes a zeroed cache of F32, F16 or BF16 elements.
func (b *Backend) NewKV(cfg backend.KVConfig) (backend.KV, error) {
	const op = "new kv"
	if b.ops.Closed() {
		return nil, fmt.Errorf("cpu: %s: backend closed", op)
	}
	if err := b.ops.NewKV(cfg); err != nil {
		return nil, err
	}
	n, _, err := b.ops.Size(op, cfg.DType, cfg.Slots, cfg.Width)
	if err != nil {
		return nil, err
	}
	if cfg.Layers > math.MaxInt32 || n > (math.MaxInt/4)/(2*cfg.Layers) {
		return nil, fmt.Errorf("cpu: %s: %d layers of %d bytes is too large", op, cfg.Layers, 2*n)
	}
	kv := &KV{b: b, cfg: cfg, k: make([]*cpu.Buffer, cfg.Layers), v: make([]*cpu.Buffer, cfg.Layers),
		res: backend.Residence{Owner: b.ops.Owner}}
	for l := 0; l < cfg.Layers; l++ {
		if kv.k[l], err = b.alloc(op, n); err == nil {
			kv.v[l], err = b.alloc(op, n)
		}
		if err != nil {
			for i := 0; i <= l; i++ {
				b.free(kv.k[i])
				b.free(kv.v[i])
			}
			return nil, err
		}
	}
	return kv, nil
}

// Residence is what the shared operand checks read of kv (backend.Operands).
func (kv *KV) Residence() *backend.Residence { return &kv.res }

// StoreKV writes k and v [n, Width] (F32) into layer's cache at slots bt.Slot.
func (b *Backend) StoreKV(kv backend.KV, layer int, k, v backend.Tensor, bt *backend.Batch) error {
	c, kt, vt, err := b.ops.StoreKV(kv, layer, k, v, bt)
	if err != nil {
		return err
	}
	return b.ctx.StoreKV(c.k[layer].Bytes(), c.v[layer].Bytes(), c.cfg.DType, c.cfg.Slots, c.cfg.Width, kt.f32, vt.f32, len(bt.Slot), bt.Slot)
}

// Attention computes causal attention of q [n, NHead*HeadDim] over layer's cache for every
// sequence of bt into dst (same shape, not q).
func (b *Backend) Attention(dst, q backend.Tensor, kv backend.KV, layer int, a backend.Attn, bt *backend.Batch) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, d, qt, err := b.ops.Attention(dst, q, kv, layer, a, bt, &b.tok)
	if err != nil {
		return err
	}
	if err := b.ops.Flatten(bt, &b.seqs, &b.blocks); err != nil {
		return err
	}
	return b.ctx.Attention(d.f32, qt.f32, qt.rows, c.k[layer].Bytes(), c.v[layer].Bytes(), c.cfg.DType,
		c.cfg.Slots, c.cfg.Width, c.cfg.BlockSize, cpu.Attn{NHead: a.NHead, NKVHead: a.NKVHead, HeadDim: a.HeadDim, Scale: a.Scale},
		b.seqs, b.blocks)
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Tensor  = (*Tensor)(nil)
	_ backend.KV      = (*KV)(nil)
)
