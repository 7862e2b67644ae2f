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
	"os"
	"runtime"
	"slices"
	"sync"
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
		Funcs:   backend.SetOf(slices.DeleteFunc(tensor.Funcs(), func(f tensor.Func) bool { return !cpu.SupportsFunc(f) })...),
	}
	return &Backend{ctx: ctx, ops: backend.NewOperands[*Tensor, *KV]("cpu", caps), owned: map[*cpu.Buffer]struct{}{},
		noRepack: os.Getenv("PARLEY_CPU_REPACK") == "0"}, nil
}

// Capabilities says what the backend computes: the weight types of the native kernels (the
// quantised types of llama.cpp's CPU backend that Parley reads), F32, F16 and BF16 caches, and
// the elementwise functions the kernels have.
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

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Tensor  = (*Tensor)(nil)
	_ backend.KV      = (*KV)(nil)
)
