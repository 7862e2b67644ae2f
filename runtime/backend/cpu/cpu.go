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
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

func init() {
	backend.Register("cpu", 10, New)
	backend.RegisterInfo("cpu", func() string {
		if !cpu.Available() {
			return "not in this build (it needs cgo)"
		}
		return "kernels " + cpu.BestISA().String() + " (the best this processor runs)"
	})
}

// Backend is the native CPU backend.
type Backend struct {
	ctx *cpu.Context

	mu     sync.Mutex // guards owned and the attention scratch below
	owned  map[*cpu.Buffer]struct{}
	closed atomic.Bool // set (under mu) by Close; tensors are unusable after
	seqs   []cpu.Seq   // attention batch, flattened
	blocks []int32
	tok    []int32 // scratch of backend.CheckAttention

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
	return &Backend{ctx: ctx, owned: map[*cpu.Buffer]struct{}{}, noRepack: os.Getenv("PARLEY_CPU_REPACK") == "0"}, nil
}

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// Threads is the number of threads the backend computes with.
func (b *Backend) Threads() int { return b.ctx.Threads() }

// Close frees the threads and every tensor and cache still open.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil
	}
	b.closed.Store(true)
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
	if b.closed.Load() {
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
	closed     bool
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
	if t.closed {
		return nil
	}
	t.closed = true
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

// size returns rows*dt.RowSize(cols) in bytes.
func size(op string, dt tensor.DType, rows, cols int) (int, error) {
	if rows < 0 || cols < 0 {
		return 0, fmt.Errorf("cpu: %s: negative shape %dx%d", op, rows, cols)
	}
	rs, err := dt.RowSize(int64(cols))
	if err != nil {
		return 0, fmt.Errorf("cpu: %s: %w", op, err)
	}
	if rs != 0 && int64(rows) > (math.MaxInt64/4)/rs {
		return 0, fmt.Errorf("cpu: %s: %dx%d %v is too large", op, rows, cols, dt)
	}
	return int(int64(rows) * rs), nil
}

// Load makes a tensor over data without copying it (F32 data that is not 4-byte aligned is
// copied into native memory). data must stay valid and unchanged while the tensor lives.
func (b *Backend) Load(dt tensor.DType, rows, cols int, data []byte) (backend.Tensor, error) {
	const op = "load"
	if !cpu.Supports(cpu.OpMatMul, dt) {
		return nil, fmt.Errorf("cpu: %s: dtype %v: %w", op, dt, backend.ErrUnsupported)
	}
	n, err := size(op, dt, rows, cols)
	if err != nil {
		return nil, err
	}
	if len(data) != n {
		return nil, fmt.Errorf("cpu: %s: %dx%d %v needs %d bytes, got %d", op, rows, cols, dt, n, len(data))
	}
	if b.closed.Load() {
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
	ct, err := b.tensorOf(op, "t", t)
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
	const op = "alloc"
	if dt != tensor.F32 && dt != tensor.F16 {
		return nil, fmt.Errorf("cpu: %s: dtype %v (want F32 or F16): %w", op, dt, backend.ErrUnsupported)
	}
	n, err := size(op, dt, rows, cols)
	if err != nil {
		return nil, err
	}
	buf, err := b.alloc(op, n)
	if err != nil {
		return nil, err
	}
	t := &Tensor{b: b, dt: dt, rows: rows, cols: cols, buf: buf, data: buf.Bytes()}
	t.root = t
	if dt == tensor.F32 {
		t.f32 = buf.Float32s()
	}
	return t, nil
}

var errForeign = errors.New("tensor was not made by this backend")

// tensorOf returns t as a live tensor of b.
func (b *Backend) tensorOf(op, what string, t backend.Tensor) (*Tensor, error) {
	ct, ok := t.(*Tensor)
	if !ok || ct == nil || ct.b != b {
		return nil, fmt.Errorf("cpu: %s: %s: %w", op, what, errForeign)
	}
	if ct.closed || ct.root.closed || b.closed.Load() {
		return nil, fmt.Errorf("cpu: %s: %s is closed", op, what)
	}
	return ct, nil
}

// f32Of returns t as a live F32 tensor of b, writable if write.
func (b *Backend) f32Of(op, what string, t backend.Tensor, write bool) (*Tensor, error) {
	ct, err := b.tensorOf(op, what, t)
	if err != nil {
		return nil, err
	}
	if ct.dt != tensor.F32 {
		return nil, fmt.Errorf("cpu: %s: %s is %v, want F32", op, what, ct.dt)
	}
	if write && ct.readOnly {
		return nil, fmt.Errorf("cpu: %s: %s is a loaded weight tensor (read-only)", op, what)
	}
	return ct, nil
}

// f32Of3 checks the writable F32 destination and two F32 operands of an elementwise op.
func (b *Backend) f32Of3(op string, dst backend.Tensor, n1 string, t1 backend.Tensor, n2 string, t2 backend.Tensor) (d, a, c *Tensor, err error) {
	if d, err = b.f32Of(op, "dst", dst, true); err != nil {
		return nil, nil, nil, err
	}
	if a, err = b.f32Of(op, n1, t1, false); err != nil {
		return nil, nil, nil, err
	}
	if c, err = b.f32Of(op, n2, t2, false); err != nil {
		return nil, nil, nil, err
	}
	return d, a, c, nil
}

// View returns a tensor of rows row0 .. row0+rows-1 of t, sharing its memory. Closing the view
// does not free t; t must outlive it.
func (b *Backend) View(t backend.Tensor, row0, rows int) (backend.Tensor, error) {
	const op = "view"
	p, err := b.tensorOf(op, "t", t)
	if err != nil {
		return nil, err
	}
	if err := backend.CheckView(p, row0, rows); err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
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
	return v, nil
}

// Write copies src into rows row0.. of an F32 tensor.
func (b *Backend) Write(dst backend.Tensor, row0 int, src []float32) error {
	const op = "write"
	t, err := b.f32Of(op, "dst", dst, true)
	if err != nil {
		return err
	}
	if err := backend.CheckSpan(op, t, row0, len(src)); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	copy(t.f32[row0*t.cols:], src)
	return nil
}

// Read copies rows row0.. of an F32 tensor into dst.
func (b *Backend) Read(src backend.Tensor, row0 int, dst []float32) error {
	const op = "read"
	t, err := b.f32Of(op, "src", src, false)
	if err != nil {
		return err
	}
	if err := backend.CheckSpan(op, t, row0, len(dst)); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	copy(dst, t.f32[row0*t.cols:])
	return nil
}

var _ backend.Argmaxer = (*Backend)(nil)

// Argmax writes into ids[i] the index of the largest value of row row0+i of an F32 tensor
// (backend.ArgmaxRows), without copying the rows out.
func (b *Backend) Argmax(logits backend.Tensor, row0 int, ids []int32) error {
	const op = "argmax"
	t, err := b.f32Of(op, "logits", logits, false)
	if err != nil {
		return err
	}
	if err := backend.CheckSpan(op, t, row0, len(ids)*t.cols); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	return backend.ArgmaxRows(t.f32[row0*t.cols:(row0+len(ids))*t.cols], t.cols, ids)
}

// GetRows: dst[i,:] = float32(table[ids[i],:]); dst [len(ids), cols] F32.
func (b *Backend) GetRows(dst, table backend.Tensor, ids []int32) error {
	const op = "get rows"
	d, err := b.f32Of(op, "dst", dst, true)
	if err != nil {
		return err
	}
	tb, err := b.tensorOf(op, "table", table)
	if err != nil {
		return err
	}
	if err := backend.CheckGetRows(d, tb, ids); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	if d == tb {
		return fmt.Errorf("cpu: %s: dst is the table", op)
	}
	return b.ctx.GetRows(d.f32, tb.data, tb.dt, tb.rows, tb.cols, ids)
}

// MatMul: dst[i,j] = sum_k x[i,k]*w[j,k]; x [n, k] F32, w [m, k], dst [n, m] F32.
func (b *Backend) MatMul(dst, x, w backend.Tensor) error {
	xt, err := b.f32Of("matmul", "x", x, false)
	if err != nil {
		return err
	}
	d, wt, err := b.product(dst, xt, w)
	if err != nil {
		return err
	}
	if xt.cols == 0 { // empty sums, which the kernels do not take
		clear(d.f32)
		return nil
	}
	if wt.packed != nil && cpu.PackedAvailable(wt.dt) { // else the ISA level was lowered: the rows serve
		return b.ctx.MatMulPacked(d.f32, xt.f32, xt.rows, xt.cols, wt.packed.Bytes(), wt.dt, wt.rows)
	}
	return b.ctx.MatMul(d.f32, xt.f32, xt.rows, xt.cols, wt.data, wt.dt, wt.rows)
}

// product checks the destination and weights of a matrix product of x.
func (b *Backend) product(dst backend.Tensor, xt *Tensor, w backend.Tensor) (d, wt *Tensor, err error) {
	const op = "matmul"
	if d, err = b.f32Of(op, "dst", dst, true); err != nil {
		return nil, nil, err
	}
	if wt, err = b.tensorOf(op, "w", w); err != nil {
		return nil, nil, err
	}
	if err := backend.CheckMatMul(d, xt, wt); err != nil {
		return nil, nil, fmt.Errorf("cpu: %w", err)
	}
	if d == xt || d == wt {
		return nil, nil, fmt.Errorf("cpu: %s: dst must not be an operand", op)
	}
	return d, wt, nil
}

// MatMuls computes dst[i] = x · w[i]ᵀ for every i (backend.MultiMatMuler): up to three packed
// matrices of one type in one native call, which converts x once and wakes the threads once;
// otherwise one MatMul each. Every result is bit for bit MatMul's.
func (b *Backend) MatMuls(dst []backend.Tensor, x backend.Tensor, w []backend.Tensor) error {
	const op = "matmul"
	if len(dst) != len(w) {
		return fmt.Errorf("cpu: %s: %d destinations for %d matrices", op, len(dst), len(w))
	}
	if n := len(w); n >= 2 && n <= cpu.MaxPackedProducts {
		xt, err := b.f32Of(op, "x", x, false)
		if err != nil {
			return err
		}
		var ps [cpu.MaxPackedProducts]cpu.PackedProduct
		var dt tensor.DType
		together := xt.cols > 0
		for i := range w {
			d, wt, err := b.product(dst[i], xt, w[i])
			if err != nil {
				return err
			}
			if i == 0 {
				dt = wt.dt
			}
			if wt.packed == nil || wt.dt != dt {
				together = false
				continue
			}
			ps[i] = cpu.PackedProduct{Dst: d.f32, W: wt.packed.Bytes(), M: wt.rows}
		}
		if together && cpu.PackedAvailable(dt) {
			return b.ctx.MatMulPackedN(xt.f32, xt.rows, xt.cols, dt, ps[:n])
		}
	}
	for i := range w {
		if err := b.MatMul(dst[i], x, w[i]); err != nil {
			return err
		}
	}
	return nil
}

// AddRows: dst[i,:] = a[i,:] + b[i,:], or bias[0,:] when it has one row. dst may be a.
func (b *Backend) AddRows(dst, a, bias backend.Tensor) error {
	const op = "add rows"
	d, at, bt, err := b.f32Of3(op, dst, "a", a, "b", bias)
	if err != nil {
		return err
	}
	if err := backend.CheckAddRows(d, at, bt); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	if d == bt && bt.rows != at.rows {
		return fmt.Errorf("cpu: %s: dst is the broadcast row", op)
	}
	return b.ctx.AddRows(d.f32, at.f32, bt.f32, at.rows, at.cols, bt.rows)
}

// RMSNorm: dst[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * w[0,:]; w [1, d] F32, or [1, g] with g
// dividing d for groups of g normalised apart (see backend.Backend). dst may be x.
func (b *Backend) RMSNorm(dst, x, w backend.Tensor, eps float32) error {
	const op = "rms norm"
	d, xt, wt, err := b.f32Of3(op, dst, "x", x, "w", w)
	if err != nil {
		return err
	}
	if err := backend.CheckRMSNorm(d, xt, wt, eps); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	if d == wt {
		return fmt.Errorf("cpu: %s: dst is the weight", op)
	}
	if xt.cols == 0 {
		return nil
	}
	// rows of x in groups of w's width: [n, h*g] as [n*h, g]
	return b.ctx.RMSNorm(d.f32, xt.f32, wt.f32, xt.rows*(xt.cols/wt.cols), wt.cols, eps)
}

// GeGLU: dst = gelu(gate) * up elementwise. dst may be gate or up.
func (b *Backend) GeGLU(dst, gate, up backend.Tensor) error {
	const op = "geglu"
	d, g, u, err := b.f32Of3(op, dst, "gate", gate, "up", up)
	if err != nil {
		return err
	}
	if err := backend.CheckGeGLU(d, g, u); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	return b.ctx.GeGLU(d.f32, g.f32, u.f32)
}

// Scale: dst = x * s elementwise. dst may be x.
func (b *Backend) Scale(dst, x backend.Tensor, s float32) error {
	const op = "scale"
	d, xt, _, err := b.f32Of3(op, dst, "x", x, "x", x)
	if err != nil {
		return err
	}
	if err := backend.CheckScale(d, xt, s); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	return b.ctx.Scale(d.f32, xt.f32, s)
}

// SwiGLU: dst = silu(gate) * up elementwise. dst may be gate (or up).
func (b *Backend) SwiGLU(dst, gate, up backend.Tensor) error {
	const op = "swiglu"
	d, g, u, err := b.f32Of3(op, dst, "gate", gate, "up", up)
	if err != nil {
		return err
	}
	if err := backend.CheckSwiGLU(d, g, u); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	return b.ctx.SwiGLU(d.f32, g.f32, u.f32)
}

// Rope rotates x [n, nHead*HeadDim] in place, token i at position bt.Pos[i].
func (b *Backend) Rope(x backend.Tensor, nHead int, r backend.RoPE, bt *backend.Batch) error {
	const op = "rope"
	xt, err := b.f32Of(op, "x", x, true)
	if err != nil {
		return err
	}
	if err := backend.CheckRope(xt, nHead, r, bt); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	return b.ctx.Rope(xt.f32, xt.rows, nHead, cpu.Rope{
		NeoX: r.Mode == backend.RoPENeoX, HeadDim: r.HeadDim, Dims: r.Dims, Base: r.Base, FreqScale: r.FreqScale,
		Factors: r.Factors, AttnFactor: r.AttnFactor, ExtFactor: r.ExtFactor, CorrDims: r.CorrDims,
	}, bt.Pos)
}

// KV is a key/value cache in native memory: per layer, keys and values [Slots, Width] of the
// configuration's type (F32, F16 or BF16).
type KV struct {
	b      *Backend
	cfg    backend.KVConfig
	k, v   []*cpu.Buffer
	closed bool
}

// Config returns the cache's configuration.
func (kv *KV) Config() backend.KVConfig { return kv.cfg }

// Close frees the cache. Closing twice is a no-op.
func (kv *KV) Close() error {
	if kv.closed {
		return nil
	}
	kv.closed = true
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
	if b.closed.Load() {
		return nil, fmt.Errorf("cpu: %s: backend closed", op)
	}
	if err := backend.CheckKVConfig(cfg); err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	n, err := size(op, cfg.DType, cfg.Slots, cfg.Width)
	if err != nil {
		return nil, err
	}
	if cfg.Layers > math.MaxInt32 || n > (math.MaxInt/4)/(2*cfg.Layers) {
		return nil, fmt.Errorf("cpu: %s: %d layers of %d bytes is too large", op, cfg.Layers, 2*n)
	}
	kv := &KV{b: b, cfg: cfg, k: make([]*cpu.Buffer, cfg.Layers), v: make([]*cpu.Buffer, cfg.Layers)}
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

func (b *Backend) kvOf(op string, kv backend.KV, layer int) (*KV, error) {
	c, ok := kv.(*KV)
	if !ok || c == nil || c.b != b {
		return nil, fmt.Errorf("cpu: %s: kv cache: %w", op, errForeign)
	}
	if c.closed || b.closed.Load() {
		return nil, fmt.Errorf("cpu: %s: kv cache is closed", op)
	}
	if err := backend.CheckLayer(op, c.cfg, layer); err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	return c, nil
}

// StoreKV writes k and v [n, Width] (F32) into layer's cache at slots bt.Slot.
func (b *Backend) StoreKV(kv backend.KV, layer int, k, v backend.Tensor, bt *backend.Batch) error {
	const op = "store kv"
	c, err := b.kvOf(op, kv, layer)
	if err != nil {
		return err
	}
	kt, err := b.f32Of(op, "k", k, false)
	if err != nil {
		return err
	}
	vt, err := b.f32Of(op, "v", v, false)
	if err != nil {
		return err
	}
	if err := backend.CheckStoreKV(c.cfg, kt, vt, bt); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	return b.ctx.StoreKV(c.k[layer].Bytes(), c.v[layer].Bytes(), c.cfg.DType, c.cfg.Slots, c.cfg.Width, kt.f32, vt.f32, len(bt.Slot), bt.Slot)
}

// Attention computes causal attention of q [n, NHead*HeadDim] over layer's cache for every
// sequence of bt into dst (same shape, not q).
func (b *Backend) Attention(dst, q backend.Tensor, kv backend.KV, layer int, a backend.Attn, bt *backend.Batch) error {
	const op = "attention"
	c, err := b.kvOf(op, kv, layer)
	if err != nil {
		return err
	}
	d, err := b.f32Of(op, "dst", dst, true)
	if err != nil {
		return err
	}
	qt, err := b.f32Of(op, "q", q, false)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tok, err = backend.CheckAttention(d, qt, c.cfg, a, bt, b.tok); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	if d == qt {
		return fmt.Errorf("cpu: %s: dst must not be q", op)
	}
	// The C batch holds int32s. The check leaves Start, Count and CtxLen non-negative and CtxLen
	// at most the cache's slots (an int32).
	b.seqs, b.blocks = b.seqs[:0], b.blocks[:0]
	for i, s := range bt.Seqs {
		if s.Start > math.MaxInt32 || s.Count > math.MaxInt32 || len(s.Blocks) > math.MaxInt32-len(b.blocks) {
			return fmt.Errorf("cpu: %s: sequence %d: bad range start=%d count=%d context=%d", op, i, s.Start, s.Count, s.CtxLen)
		}
		b.seqs = append(b.seqs, cpu.Seq{
			Start: int32(s.Start), Count: int32(s.Count), CtxLen: int32(s.CtxLen),
			BlocksOff: int32(len(b.blocks)), NBlocks: int32(len(s.Blocks)),
		})
		b.blocks = append(b.blocks, s.Blocks...)
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
