//go:build cuda && cgo && !nocgo

package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/../../native/include
#cgo LDFLAGS: -L${SRCDIR}/../../build/cuda -lparley_cuda
#cgo LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/lib/x86_64-linux-gnu
#cgo LDFLAGS: -lcudart_static -lstdc++ -ldl -lrt -lpthread -lm
#include <stdlib.h>
#include "parley_cuda.h"
*/
import "C"

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Available reports whether the CUDA kernels are compiled into this binary (a GPU may still be
// absent: see Devices).
func Available() bool { return true }

// RuntimeVersion is the CUDA runtime version the kernels were built with (11080 for 11.8).
func RuntimeVersion() int {
	var v C.int32_t
	C.plc_runtime_version(&v)
	return int(v)
}

// Op names an operation for Supports.
type Op int

// Operations for Supports.
const (
	OpMatMul  Op = C.PLC_OP_MATMUL   // dtype: weight type
	OpGetRows Op = C.PLC_OP_GET_ROWS // dtype: table type
	OpKV      Op = C.PLC_OP_KV       // dtype: KV-cache (or full-attention key/value) type
	OpCopy    Op = C.PLC_OP_COPY     // dtype: source or destination of Copy
)

// SupportsFunc reports whether Unary and GLU compute the function f (the kernels' own answer).
func SupportsFunc(f tensor.Func) bool {
	return f.Known() && C.plc_supports(C.PLC_OP_UNARY, C.int(f)) == 1
}

// Supports reports whether operation op handles dtype dt.
func Supports(op Op, dt tensor.DType) bool {
	if !dt.Known() || uint32(dt) > math.MaxInt32 {
		return false
	}
	return C.plc_supports(C.int(op), C.int(dt)) == 1
}

var live atomic.Int64

// LiveBuffers is the number of device buffers allocated and not yet closed.
func LiveBuffers() int { return int(live.Load()) }

const errLen = 512

// runtimeDevices returns the CUDA runtime's view of the devices.
func runtimeDevices() ([]C.plc_device_props, error) {
	var buf [errLen]C.char
	var n C.int32_t
	switch st := C.plc_device_count(&n, &buf[0], errLen); st {
	case C.PLC_OK:
	case C.PLC_ERR_NO_DEVICE:
		return nil, fmt.Errorf("cuda: %w: %s", ErrNoDevice, C.GoString(&buf[0]))
	default:
		return nil, fmt.Errorf("cuda: %s", C.GoString(&buf[0]))
	}
	props := make([]C.plc_device_props, int(n))
	for i := range props {
		if st := C.plc_device_info(C.int32_t(i), &props[i], &buf[0], errLen); st != C.PLC_OK {
			return nil, fmt.Errorf("cuda: device %d: %s", i, C.GoString(&buf[0]))
		}
	}
	return props, nil
}

// Context is one device's stream, cuBLAS handle and scratch memory. Its methods may be called
// from any goroutine; they run one at a time.
type Context struct {
	mu     sync.Mutex
	c      *C.plc_ctx
	dev    int
	closed bool
	// Parameter structs handed to C by address: fields of the (heap) context, so that the calls
	// allocate nothing (the address of a local passed to C would escape to the heap).
	rope C.plc_rope_cfg
	attn C.plc_attn_cfg
	// the convolutions' geometry and relative-position attention's heads (transducer.go)
	geomArg   C.plc_conv_geom
	relPosArg C.plc_relpos_cfg
	// ff holds a copy of the RoPE frequency factors in C memory (a Go pointer inside rope would
	// break cgo's pointer rules); ffCap floats.
	ff    *C.float
	ffCap int
	// MatMuls' matrices: device addresses, held as integers (they are not Go pointers, and
	// cgo's checks then have no pointers to look into).
	mmD, mmW [4]uintptr
	mmM      [4]C.int64_t
	// the greedy transducer rule and the per-row encoder tables of a gather (tdt.go)
	tdtArg    C.plc_tdt_cfg
	tdtbArg   C.plc_tdtb_cfg // the beam search's (tdtbeam.go)
	tdtTables []uintptr
}

// NewContext starts a context on CUDA device dev, with TF32 allowed for F32 matrix products and,
// from compute capability 8.0, int8 tensor cores for batches against quantised weights (SetMMQ).
func NewContext(dev int) (*Context, error) {
	if dev < 0 || dev > math.MaxInt32 {
		return nil, fmt.Errorf("cuda: device %d out of range", dev)
	}
	var buf [errLen]C.char
	var c *C.plc_ctx
	switch st := C.plc_ctx_new(C.int32_t(dev), &c, &buf[0], errLen); st {
	case C.PLC_OK:
		return &Context{c: c, dev: dev}, nil
	case C.PLC_ERR_NO_DEVICE:
		return nil, fmt.Errorf("cuda: device %d: %w: %s", dev, ErrNoDevice, C.GoString(&buf[0]))
	case C.PLC_ERR_UNSUPPORTED:
		return nil, fmt.Errorf("cuda: device %d: %s: %w", dev, C.GoString(&buf[0]), tensor.ErrUnsupported)
	default:
		return nil, fmt.Errorf("cuda: device %d: %s (status %d)", dev, C.GoString(&buf[0]), int(st))
	}
}

// Device is the context's CUDA device ordinal.
func (c *Context) Device() int { return c.dev }

// Close waits for the context's work and frees it. Buffers made with it must be closed first.
// Closing twice is a no-op.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.c != nil {
		C.plc_ctx_free(c.c)
		c.c = nil
	}
	if c.ff != nil {
		C.free(unsafe.Pointer(c.ff))
		c.ff, c.ffCap = nil, 0
	}
	return nil
}

// lock takes the context for one call; it fails on a closed context.
func (c *Context) lock(op string) error {
	if c == nil {
		return fmt.Errorf("cuda: %s: nil context", op)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("cuda: %s: context closed", op)
	}
	return nil
}

// status turns a C status into an error, with the context's message. Call with c.mu held.
func (c *Context) status(op string, st C.int) error {
	if st == C.PLC_OK {
		return nil
	}
	msg := ""
	if c.c != nil {
		msg = C.GoString(C.plc_ctx_error(c.c))
	}
	switch st {
	case C.PLC_ERR_ARG:
		return fmt.Errorf("cuda: %s: invalid argument: %s", op, msg)
	case C.PLC_ERR_UNSUPPORTED:
		return fmt.Errorf("cuda: %s: %w", op, tensor.ErrUnsupported)
	case C.PLC_ERR_NOMEM:
		return fmt.Errorf("cuda: %s: out of memory: %s", op, msg)
	case C.PLC_ERR_NO_DEVICE:
		return fmt.Errorf("cuda: %s: %w: %s", op, ErrNoDevice, msg)
	}
	return fmt.Errorf("cuda: %s: %s (status %d)", op, msg, int(st))
}

// SetTF32 lets F32 matrix products use TF32 tensor cores (on), or keeps them in full F32.
func (c *Context) SetTF32(on bool) error {
	return c.setSwitch("set tf32", on, func(v C.int32_t) C.int { return C.plc_ctx_set_tf32(c.c, v) })
}

// SetFlashMMA computes attention over F16 keys and values on tensor cores (on; compute
// capability 8.0 and later, else tensor.ErrUnsupported) or on the CUDA cores (off, the default).
func (c *Context) SetFlashMMA(on bool) error {
	return c.setSwitch("set flash", on, func(v C.int32_t) C.int { return C.plc_ctx_set_flash(c.c, v) })
}

// SetMMQ multiplies more than eight activation rows by quantised weights on int8 tensor cores,
// with the activations quantised as for fewer rows (on, the default from compute capability
// 8.0; before it tensor.ErrUnsupported), or expands the weights to F16 for cuBLAS and rounds
// the activations to F16 (off).
func (c *Context) SetMMQ(on bool) error {
	return c.setSwitch("set mmq", on, func(v C.int32_t) C.int { return C.plc_ctx_set_mmq(c.c, v) })
}

// setSwitch calls set, one of the context's on/off setters, with 1 or 0 while holding the
// context.
func (c *Context) setSwitch(op string, on bool, set func(C.int32_t) C.int) error {
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	v := C.int32_t(0)
	if on {
		v = 1
	}
	return c.status(op, set(v))
}

// Sync waits for all queued work.
func (c *Context) Sync() error {
	if err := c.lock("sync"); err != nil {
		return err
	}
	defer c.mu.Unlock()
	return c.status("sync", C.plc_sync(c.c))
}

// GraphBegin starts recording the context's operations as a CUDA graph: until GraphEnd or
// GraphAbort they are recorded, not run, and calls that wait for the device (Sync, Download,
// Close of a buffer, the sampling calls), Upload, and calls that need more scratch memory than
// the context holds fail (see parley_cuda.h). Nothing else may use the context meanwhile.
func (c *Context) GraphBegin() error {
	if err := c.lock("graph begin"); err != nil {
		return err
	}
	defer c.mu.Unlock()
	return c.status("graph begin", C.plc_graph_begin(c.c))
}

// GraphEnd stops recording and runs what was recorded as one graph. On error nothing recorded
// has run and the context is no longer recording.
func (c *Context) GraphEnd() error {
	if err := c.lock("graph end"); err != nil {
		return err
	}
	defer c.mu.Unlock()
	return c.status("graph end", C.plc_graph_end(c.c))
}

// GraphAbort stops recording and drops what was recorded; a no-op when not recording.
func (c *Context) GraphAbort() {
	if c.lock("graph abort") != nil {
		return
	}
	defer c.mu.Unlock()
	C.plc_graph_abort(c.c)
}

// GraphStats are a context's graph counters.
type GraphStats struct {
	Runs           int64 // recordings run as graphs
	Updates        int64 // runs that updated the graph kept from the run before
	Instantiations int64 // runs that instantiated a new graph
}

// GraphStats returns the context's graph counters.
func (c *Context) GraphStats() (GraphStats, error) {
	if err := c.lock("graph stats"); err != nil {
		return GraphStats{}, err
	}
	defer c.mu.Unlock()
	var r, u, i C.int64_t
	if err := c.status("graph stats", C.plc_graph_stats(c.c, &r, &u, &i)); err != nil {
		return GraphStats{}, err
	}
	return GraphStats{Runs: int64(r), Updates: int64(u), Instantiations: int64(i)}, nil
}

// MemInfo returns the device's free and total memory in bytes.
func (c *Context) MemInfo() (free, total int64, err error) {
	if err := c.lock("memory info"); err != nil {
		return 0, 0, err
	}
	defer c.mu.Unlock()
	var f, t C.int64_t
	if err := c.status("memory info", C.plc_mem_info(c.c, &f, &t)); err != nil {
		return 0, 0, err
	}
	return int64(f), int64(t), nil
}

// Buffer is device memory of one context.
type Buffer struct {
	ctx  *Context
	p    unsafe.Pointer // device address; never dereferenced by Go
	n    int
	done bool
}

// Alloc allocates n zeroed bytes of device memory (a buffer of 0 bytes still holds an
// allocation).
func (c *Context) Alloc(n int) (*Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("cuda: alloc: negative size %d", n)
	}
	if err := c.lock("alloc"); err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	var p unsafe.Pointer
	if err := c.status("alloc", C.plc_alloc(c.c, C.size_t(max(n, 1)), &p)); err != nil {
		return nil, fmt.Errorf("%w (%d bytes)", err, n)
	}
	live.Add(1)
	return &Buffer{ctx: c, p: p, n: n}, nil
}

// Len is the buffer's size in bytes.
func (b *Buffer) Len() int { return b.n }

// Addr is the buffer's device address (never dereferenced by Go), by which overlapping
// operands are told apart.
func (b *Buffer) Addr() uintptr { return uintptr(b.p) }

// Close frees the buffer after the work queued before it. Closing twice is a no-op.
func (b *Buffer) Close() error {
	if b == nil {
		return nil
	}
	c := b.ctx
	if err := c.lock("free"); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if b.done {
		return nil
	}
	st := C.plc_free(c.c, b.p)
	if st == C.PLC_OK {
		b.done = true
		live.Add(-1)
	}
	return c.status("free", st)
}

// Ref is device memory at byte Off of Buf.
type Ref struct {
	Buf *Buffer
	Off int
}

// at returns the device address of r, checking that need bytes from it lie inside a live
// buffer of c.
func (r Ref) at(c *Context, op, what string, need int) (unsafe.Pointer, error) {
	b := r.Buf
	if b == nil {
		return nil, fmt.Errorf("cuda: %s: %s: no buffer", op, what)
	}
	if b.done {
		return nil, fmt.Errorf("cuda: %s: %s: buffer closed", op, what)
	}
	if b.ctx != c {
		return nil, fmt.Errorf("cuda: %s: %s: buffer of another context", op, what)
	}
	if need < 0 || r.Off < 0 || r.Off > b.n || need > b.n-r.Off {
		return nil, fmt.Errorf("cuda: %s: %s: %d bytes at offset %d outside a buffer of %d", op, what, need, r.Off, b.n)
	}
	return unsafe.Add(b.p, r.Off), nil
}

// mul returns the product of non-negative sizes, or -1 when one is negative or it overflows
// int (which at() then rejects).
func mul(xs ...int) int {
	p := 1
	for _, x := range xs {
		if x < 0 || (x != 0 && p > math.MaxInt/x) {
			return -1
		}
		p *= x
	}
	return p
}

// elemSize returns the bytes of n elements of a float type, -1 if it is not one.
func elemSize(dt tensor.DType, n int) int {
	switch dt {
	case tensor.F32:
		return mul(n, 4)
	case tensor.F16, tensor.BF16:
		return mul(n, 2)
	}
	return -1
}

func rowBytes(dt tensor.DType, cols int) int {
	rs, err := dt.RowSize(int64(cols))
	if err != nil || rs > math.MaxInt32*int64(1<<16) {
		return -1
	}
	return int(rs)
}

func i32p(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

func f32p(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&s[0]))
}

func fp(p unsafe.Pointer) *C.float { return (*C.float)(p) }

func i32(op, what string, v int) (C.int32_t, error) {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, fmt.Errorf("cuda: %s: %s %d out of range", op, what, v)
	}
	return C.int32_t(v), nil
}

// Upload copies src to device memory at dst. It returns once src may be reused.
func (c *Context) Upload(dst Ref, src []byte) error {
	const op = "upload"
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	d, err := dst.at(c, op, "dst", len(src))
	if err != nil || len(src) == 0 {
		return err
	}
	return c.status(op, C.plc_upload(c.c, d, unsafe.Pointer(&src[0]), C.size_t(len(src))))
}

// UploadF32 copies src to device memory at dst.
func (c *Context) UploadF32(dst Ref, src []float32) error {
	if len(src) == 0 {
		return c.Upload(dst, nil)
	}
	return c.Upload(dst, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src)))
}

// Download waits for all queued work, then copies device memory at src into dst.
func (c *Context) Download(dst []byte, src Ref) error {
	const op = "download"
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	s, err := src.at(c, op, "src", len(dst))
	if err != nil {
		return err
	}
	var hp unsafe.Pointer
	if len(dst) > 0 {
		hp = unsafe.Pointer(&dst[0])
	}
	return c.status(op, C.plc_download(c.c, hp, s, C.size_t(len(dst))))
}

// DownloadF32 waits, then copies device memory at src into dst.
func (c *Context) DownloadF32(dst []float32, src Ref) error {
	if len(dst) == 0 {
		return c.Download(nil, src)
	}
	return c.Download(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), src)
}

// Zero zeroes n bytes at dst.
func (c *Context) Zero(dst Ref, n int) error {
	const op = "zero"
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	d, err := dst.at(c, op, "dst", n)
	if err != nil {
		return err
	}
	return c.status(op, C.plc_memset0(c.c, d, C.size_t(n)))
}

// MatMul: dst[i,j] = sum_l x[i,l]*w[j,l]; x [n, k] F32, w [m, k] of wt, dst [n, m] F32.
func (c *Context) MatMul(dst, x Ref, n, k int, w Ref, wt tensor.DType, m int) error {
	const op = "matmul"
	if !Supports(OpMatMul, wt) {
		return fmt.Errorf("cuda: %s: weights of %v: %w", op, wt, tensor.ErrUnsupported)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	d, err := dst.at(c, op, "dst", mul(n, m, 4))
	if err != nil {
		return err
	}
	xp, err := x.at(c, op, "x", mul(n, k, 4))
	if err != nil {
		return err
	}
	rb := rowBytes(wt, k)
	if rb < 0 {
		return fmt.Errorf("cuda: %s: %d columns of %v", op, k, wt)
	}
	wp, err := w.at(c, op, "w", mul(m, rb))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_matmul(c.c, fp(d), fp(xp), C.int64_t(n), C.int64_t(k), wp, C.int32_t(wt), C.int64_t(m)))
}

// MatMuls: dst[i] = x · w[i]ᵀ for up to four matrices w[i] [m[i], k] of one type wt, each bit
// for bit what MatMul gives it, in one launch where they take the matrix-vector kernels (n <= 8,
// weights other than F32).
func (c *Context) MatMuls(dst []Ref, x Ref, n, k int, w []Ref, wt tensor.DType, m []int) error {
	const op = "matmuls"
	if len(dst) == 0 || len(dst) > len(c.mmD) || len(w) != len(dst) || len(m) != len(dst) {
		return fmt.Errorf("cuda: %s: %d destinations, %d matrices and %d row counts (1 to %d)", op, len(dst), len(w), len(m), len(c.mmD))
	}
	if !Supports(OpMatMul, wt) {
		return fmt.Errorf("cuda: %s: weights of %v: %w", op, wt, tensor.ErrUnsupported)
	}
	rb := rowBytes(wt, k)
	if rb < 0 {
		return fmt.Errorf("cuda: %s: %d columns of %v", op, k, wt)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	xp, err := x.at(c, op, "x", mul(n, k, 4))
	if err != nil {
		return err
	}
	for i := range dst {
		d, err := dst[i].at(c, op, "dst", mul(n, m[i], 4))
		if err != nil {
			return err
		}
		wp, err := w[i].at(c, op, "w", mul(m[i], rb))
		if err != nil {
			return err
		}
		c.mmD[i], c.mmW[i], c.mmM[i] = uintptr(d), uintptr(wp), C.int64_t(m[i])
	}
	return c.status(op, C.plc_matmuls(c.c, C.int32_t(len(dst)), (**C.float)(unsafe.Pointer(&c.mmD[0])), fp(xp), C.int64_t(n),
		C.int64_t(k), (*unsafe.Pointer)(unsafe.Pointer(&c.mmW[0])), C.int32_t(wt), &c.mmM[0]))
}

// GetRows: dst[i,:] = float32(table[ids[i],:]); table [rows, cols] of dt, dst [len(ids), cols].
func (c *Context) GetRows(dst, table Ref, dt tensor.DType, rows, cols int, ids []int32) error {
	const op = "get rows"
	if !Supports(OpGetRows, dt) {
		return fmt.Errorf("cuda: %s: table of %v: %w", op, dt, tensor.ErrUnsupported)
	}
	for i, id := range ids {
		if id < 0 || int(id) >= rows {
			return fmt.Errorf("cuda: %s: id %d (index %d) outside a table of %d rows", op, id, i, rows)
		}
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	d, err := dst.at(c, op, "dst", mul(len(ids), cols, 4))
	if err != nil {
		return err
	}
	rb := rowBytes(dt, cols)
	if rb < 0 {
		return fmt.Errorf("cuda: %s: %d columns of %v", op, cols, dt)
	}
	tp, err := table.at(c, op, "table", mul(rows, rb))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_get_rows(c.c, fp(d), tp, C.int32_t(dt), C.int64_t(rows), C.int64_t(cols), i32p(ids), C.int64_t(len(ids))))
}

// AddRows: dst[i,:] = a[i,:] + b[i % bRows,:] for [n, d] F32, bRows 1 or n. dst may be a.
func (c *Context) AddRows(dst, a, b Ref, n, d, bRows int) error {
	return c.rowPair("add rows", dst, a, b, n, d, bRows, func(dp, ap, bp unsafe.Pointer) C.int {
		return C.plc_add_rows(c.c, fp(dp), fp(ap), fp(bp), C.int64_t(n), C.int64_t(d), C.int64_t(bRows))
	})
}

// rowPair checks the operands of an elementwise operation op of rows a [n, d] and b [bRows, d]
// into dst [n, d] (bRows 1 or n) and makes its call with their device addresses.
func (c *Context) rowPair(op string, dst, a, b Ref, n, d, bRows int, call func(dp, ap, bp unsafe.Pointer) C.int) error {
	if bRows != 1 && bRows != n {
		return fmt.Errorf("cuda: %s: b has %d rows, want 1 or %d", op, bRows, n)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(n, d, 4))
	if err != nil {
		return err
	}
	ap, err := a.at(c, op, "a", mul(n, d, 4))
	if err != nil {
		return err
	}
	bp, err := b.at(c, op, "b", mul(bRows, d, 4))
	if err != nil {
		return err
	}
	return c.status(op, call(dp, ap, bp))
}

// RMSNorm: dst[i,:] = x[i,:]/sqrt(mean(x[i,:]^2)+eps)*w for x, dst [n, d], w [d]. dst may be x.
func (c *Context) RMSNorm(dst, x, w Ref, n, d int, eps float32) error {
	const op = "rms norm"
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(n, d, 4))
	if err != nil {
		return err
	}
	xp, err := x.at(c, op, "x", mul(n, d, 4))
	if err != nil {
		return err
	}
	wp, err := w.at(c, op, "w", mul(d, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_rms_norm(c.c, fp(dp), fp(xp), fp(wp), C.int64_t(n), C.int64_t(d), C.float(eps)))
}

// LayerNorm: dst[i,:] = (x[i,:]-mean)/sqrt(var+eps)*w + b for x, dst [n, d], w, b [d]. dst may
// be x.
func (c *Context) LayerNorm(dst, x, w, b Ref, n, d int, eps float32) error {
	const op = "layer norm"
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(n, d, 4))
	if err != nil {
		return err
	}
	xp, err := x.at(c, op, "x", mul(n, d, 4))
	if err != nil {
		return err
	}
	wp, err := w.at(c, op, "w", mul(d, 4))
	if err != nil {
		return err
	}
	bp, err := b.at(c, op, "b", mul(d, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_layer_norm(c.c, fp(dp), fp(xp), fp(wp), fp(bp), C.int64_t(n), C.int64_t(d), C.float(eps)))
}

// Unary: dst = f(x) over n F32 elements, f a function the kernels know (tensor.Func, passed to
// plc_unary as it is; another is refused with tensor.ErrUnsupported). dst may be x.
func (c *Context) Unary(dst, x Ref, n int, f tensor.Func) error {
	return c.fn("unary", dst, x, Ref{}, n, f)
}

// GLU: dst = f(gate)*up over n F32 elements, f as Unary's (tensor.SiLU: SwiGLU, tensor.GELU:
// GeGLU). dst may be gate or up.
func (c *Context) GLU(dst, gate, up Ref, n int, f tensor.Func) error {
	return c.fn("glu", dst, gate, up, n, f)
}

// fn runs plc_unary, or plc_glu when up has a buffer.
func (c *Context) fn(op string, dst, x, up Ref, n int, f tensor.Func) error {
	if !f.Known() {
		return fmt.Errorf("cuda: %s: function %v: %w", op, f, tensor.ErrUnsupported)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(n, 4))
	if err != nil {
		return err
	}
	xp, err := x.at(c, op, "x", mul(n, 4))
	if err != nil {
		return err
	}
	if up.Buf == nil {
		return c.status(op, C.plc_unary(c.c, C.int(f), fp(dp), fp(xp), C.int64_t(n)))
	}
	upp, err := up.at(c, op, "up", mul(n, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_glu(c.c, C.int(f), fp(dp), fp(xp), fp(upp), C.int64_t(n)))
}

// Scale: dst = x*s over n F32 elements. dst may be x.
func (c *Context) Scale(dst, x Ref, s float32, n int) error {
	const op = "scale"
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(n, 4))
	if err != nil {
		return err
	}
	xp, err := x.at(c, op, "x", mul(n, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_scale(c.c, fp(dp), fp(xp), C.float(s), C.int64_t(n)))
}

// Copy converts n elements of srcType at src to dstType at dst: F32 to F16 (nearest even), F16
// to F32, or a copy between buffers of one float type.
func (c *Context) Copy(dst Ref, dstType tensor.DType, src Ref, srcType tensor.DType, n int) error {
	const op = "copy"
	if !Supports(OpCopy, dstType) || !Supports(OpCopy, srcType) {
		return fmt.Errorf("cuda: %s: %v to %v: %w", op, srcType, dstType, tensor.ErrUnsupported)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", elemSize(dstType, n))
	if err != nil {
		return err
	}
	sp, err := src.at(c, op, "src", elemSize(srcType, n))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_copy(c.c, dp, C.int32_t(dstType), sp, C.int32_t(srcType), C.int64_t(n)))
}

// Im2Col1D: for x [tIn, ch] F32, dst [tOut, ch*kernel] with dst[t, ci*kernel+kk] =
// x[t*stride+kk-pad, ci] (0 outside the signal), tOut = (tIn+2*pad-kernel)/stride+1.
func (c *Context) Im2Col1D(dst, x Ref, tIn, ch, kernel, stride, pad, tOut int) error {
	const op = "im2col"
	kk, err := i32(op, "kernel", kernel)
	if err != nil {
		return err
	}
	st, err := i32(op, "stride", stride)
	if err != nil {
		return err
	}
	pd, err := i32(op, "pad", pad)
	if err != nil {
		return err
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(tOut, ch, kernel, 4))
	if err != nil {
		return err
	}
	xp, err := x.at(c, op, "x", mul(tIn, ch, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_im2col_1d(c.c, fp(dp), fp(xp), C.int64_t(tIn), C.int64_t(ch), kk, st, pd, C.int64_t(tOut)))
}

// Rope rotates x [n, nHead*r.HeadDim] F32 in place, token i at position pos[i].
func (c *Context) Rope(x Ref, n, nHead int, r RoPE, pos []int32) error {
	const op = "rope"
	if len(pos) != n {
		return fmt.Errorf("cuda: %s: %d positions for %d tokens", op, len(pos), n)
	}
	nh, err := i32(op, "head count", nHead)
	if err != nil {
		return err
	}
	hd, err := i32(op, "head dim", r.HeadDim)
	if err != nil {
		return err
	}
	dims, err := i32(op, "rotated dims", r.Dims)
	if err != nil {
		return err
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	xp, err := x.at(c, op, "x", mul(n, nHead, r.HeadDim, 4))
	if err != nil {
		return err
	}
	if r.AttnFactor < 0 || r.AttnFactor != r.AttnFactor || r.AttnFactor-r.AttnFactor != 0 {
		return fmt.Errorf("cuda: %s: attention factor %v, want 0 (1) or a finite value above 0", op, r.AttnFactor)
	}
	if !(r.ExtFactor >= 0 && r.ExtFactor <= 1) || r.CorrDims[0]-r.CorrDims[0] != 0 || r.CorrDims[1]-r.CorrDims[1] != 0 {
		return fmt.Errorf("cuda: %s: YaRN extrapolation %v over pairs %v, want 0 to 1 over finite bounds", op, r.ExtFactor, r.CorrDims)
	}
	c.rope = C.plc_rope_cfg{mode: C.PLC_ROPE_NORMAL, head_dim: hd, dims: dims, base: C.float(r.Base), freq_scale: C.float(r.FreqScale), mscale: C.float(r.AttnFactor),
		ext_factor: C.float(r.ExtFactor), corr_dims: [2]C.float{C.float(r.CorrDims[0]), C.float(r.CorrDims[1])}}
	if r.NeoX {
		c.rope.mode = C.PLC_ROPE_NEOX
	}
	if r.Factors != nil {
		if len(r.Factors) != r.Dims/2 {
			return fmt.Errorf("cuda: %s: %d frequency factors for %d pairs", op, len(r.Factors), r.Dims/2)
		}
		if c.ffCap < len(r.Factors) {
			p := (*C.float)(C.realloc(unsafe.Pointer(c.ff), C.size_t(len(r.Factors))*4))
			if p == nil {
				return fmt.Errorf("cuda: %s: out of memory", op)
			}
			c.ff, c.ffCap = p, len(r.Factors)
		}
		copy(unsafe.Slice((*float32)(unsafe.Pointer(c.ff)), len(r.Factors)), r.Factors)
		c.rope.freq_factors = c.ff
	}
	return c.status(op, C.plc_rope(c.c, fp(xp), C.int64_t(n), nh, &c.rope, i32p(pos)))
}

// StoreKV writes k and v [n, width] F32 into rows slot[i] of the caches kc and vc [slots,
// width] of kvType (F32 or F16).
func (c *Context) StoreKV(kc, vc Ref, kvType tensor.DType, slots, width int, k, v Ref, n int, slot []int32) error {
	const op = "store kv"
	if !Supports(OpKV, kvType) {
		return fmt.Errorf("cuda: %s: cache of %v: %w", op, kvType, tensor.ErrUnsupported)
	}
	if len(slot) != n {
		return fmt.Errorf("cuda: %s: %d slots for %d tokens", op, len(slot), n)
	}
	for i, s := range slot {
		if s < 0 || int(s) >= slots {
			return fmt.Errorf("cuda: %s: slot %d (token %d) outside a cache of %d", op, s, i, slots)
		}
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	cache := elemSize(kvType, mul(slots, width))
	kcp, err := kc.at(c, op, "key cache", cache)
	if err != nil {
		return err
	}
	vcp, err := vc.at(c, op, "value cache", cache)
	if err != nil {
		return err
	}
	kp, err := k.at(c, op, "k", mul(n, width, 4))
	if err != nil {
		return err
	}
	vp, err := v.at(c, op, "v", mul(n, width, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_store_kv(c.c, kcp, vcp, C.int32_t(kvType), C.int64_t(slots), C.int64_t(width), fp(kp), fp(vp), C.int64_t(n), i32p(slot)))
}

func (a Attn) cfg(op string) (C.plc_attn_cfg, error) {
	if a.NHead <= 0 || a.NKVHead <= 0 || a.HeadDim <= 0 || a.NHead > math.MaxInt32 || a.NKVHead > math.MaxInt32 ||
		a.HeadDim > math.MaxInt32 || a.NHead%a.NKVHead != 0 {
		return C.plc_attn_cfg{}, fmt.Errorf("cuda: %s: bad heads %+v", op, a)
	}
	return C.plc_attn_cfg{n_head: C.int32_t(a.NHead), n_kv_head: C.int32_t(a.NKVHead), head_dim: C.int32_t(a.HeadDim), scale: C.float(a.Scale)}, nil
}

// Attention computes causal attention of q [n, NHead*HeadDim] over the block caches kc, vc
// [slots, width] of kvType for the sequences seqs, whose block tables are in blocks, into dst
// (same shape as q, not q).
func (c *Context) Attention(dst, q Ref, n int, kc, vc Ref, kvType tensor.DType, slots, width, blockSize int, a Attn, seqs []Seq, blocks []int32) error {
	const op = "attention"
	if !Supports(OpKV, kvType) {
		return fmt.Errorf("cuda: %s: cache of %v: %w", op, kvType, tensor.ErrUnsupported)
	}
	cfg, err := a.cfg(op)
	if err != nil {
		return err
	}
	if blockSize <= 0 {
		return fmt.Errorf("cuda: %s: block size %d", op, blockSize)
	}
	for i, s := range seqs {
		if s.Start < 0 || s.Count < 0 || s.CtxLen < s.Count || int(s.Start)+int(s.Count) > n || s.BlocksOff < 0 || s.NBlocks < 0 ||
			int(s.BlocksOff)+int(s.NBlocks) > len(blocks) || (int(s.CtxLen)+blockSize-1)/blockSize > int(s.NBlocks) {
			return fmt.Errorf("cuda: %s: sequence %d %+v out of range (%d tokens, %d table entries)", op, i, s, n, len(blocks))
		}
		for _, id := range blocks[s.BlocksOff : int(s.BlocksOff)+(int(s.CtxLen)+blockSize-1)/blockSize] {
			if id < 0 || int(id) >= slots/blockSize {
				return fmt.Errorf("cuda: %s: sequence %d: block %d outside a cache of %d blocks", op, i, id, slots/blockSize)
			}
		}
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	qw := mul(n, a.NHead, a.HeadDim, 4)
	dp, err := dst.at(c, op, "dst", qw)
	if err != nil {
		return err
	}
	qp, err := q.at(c, op, "q", qw)
	if err != nil {
		return err
	}
	cache := elemSize(kvType, mul(slots, width))
	kcp, err := kc.at(c, op, "key cache", cache)
	if err != nil {
		return err
	}
	vcp, err := vc.at(c, op, "value cache", cache)
	if err != nil {
		return err
	}
	var sp *C.plc_seq
	if len(seqs) > 0 {
		sp = (*C.plc_seq)(unsafe.Pointer(&seqs[0]))
	}
	c.attn = cfg
	return c.status(op, C.plc_attention(c.c, fp(dp), fp(qp), C.int64_t(n), kcp, vcp, C.int32_t(kvType), C.int64_t(slots), C.int64_t(width),
		C.int64_t(blockSize), &c.attn, sp, C.int64_t(len(seqs)), i32p(blocks), C.int64_t(len(blocks))))
}

// FullAttention computes unmasked attention of q [n, NHead*HeadDim] over k, v [m,
// NKVHead*HeadDim] of kvType (F32 or F16) into dst.
func (c *Context) FullAttention(dst, q Ref, n int, k, v Ref, kvType tensor.DType, m int, a Attn) error {
	const op = "full attention"
	if !Supports(OpKV, kvType) {
		return fmt.Errorf("cuda: %s: keys and values of %v: %w", op, kvType, tensor.ErrUnsupported)
	}
	cfg, err := a.cfg(op)
	if err != nil {
		return err
	}
	if m < 1 {
		return fmt.Errorf("cuda: %s: %d keys", op, m)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	qw := mul(n, a.NHead, a.HeadDim, 4)
	dp, err := dst.at(c, op, "dst", qw)
	if err != nil {
		return err
	}
	qp, err := q.at(c, op, "q", qw)
	if err != nil {
		return err
	}
	kvb := elemSize(kvType, mul(m, a.NKVHead, a.HeadDim))
	kp, err := k.at(c, op, "k", kvb)
	if err != nil {
		return err
	}
	vp, err := v.at(c, op, "v", kvb)
	if err != nil {
		return err
	}
	c.attn = cfg
	return c.status(op, C.plc_full_attention(c.c, fp(dp), fp(qp), C.int64_t(n), kp, vp, C.int32_t(kvType), C.int64_t(m), &c.attn))
}

// Argmax waits, then writes into ids (len n) the index of the largest element of each row of
// logits [n, vocab] F32 (the lowest among equal maxima; -1 for a row with a NaN or +Inf or
// nothing above -Inf).
func (c *Context) Argmax(logits Ref, n, vocab int, ids []int32) error {
	const op = "argmax"
	if len(ids) != n || vocab <= 0 {
		return fmt.Errorf("cuda: %s: %d ids for %d rows of %d", op, len(ids), n, vocab)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	lp, err := logits.at(c, op, "logits", mul(n, vocab, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_argmax(c.c, fp(lp), C.int64_t(n), C.int64_t(vocab), i32p(ids)))
}

// Draw writes ids (len n) for the rows of logits [n, vocab] F32 as draws says (tensor.Draw,
// which has plc_draw_row's layout). Waits.
func (c *Context) Draw(logits Ref, n, vocab int, draws []tensor.Draw, ids []int32) error {
	const op = "draw"
	if len(ids) != n || len(draws) != n || vocab <= 0 {
		return fmt.Errorf("cuda: %s: %d ids and %d draws for %d rows of %d", op, len(ids), len(draws), n, vocab)
	}
	if err := tensor.CheckDraws(draws); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	lp, err := logits.at(c, op, "logits", mul(n, vocab, 4))
	if err != nil {
		return err
	}
	var dp *C.plc_draw_row
	if n > 0 {
		dp = (*C.plc_draw_row)(unsafe.Pointer(&draws[0]))
	}
	return c.status(op, C.plc_draw(c.c, fp(lp), C.int64_t(n), C.int64_t(vocab), dp, i32p(ids)))
}

// BeamStep runs one step of beam search over logits [len(scores), vocab] F32: candidate (b, t)
// scores scores[b] + log_softmax(logits[b])[t], and the k = len(beam) best over all beams and
// tokens (ties: lower beam, then lower token) are written best first: their beam, token, new
// running score, and that score divided by length^penalty. Waits.
func (c *Context) BeamStep(logits Ref, vocab int, scores []float32, length int, penalty float32, beam, token []int32, score, norm []float32) error {
	const op = "beam step"
	k := len(beam)
	if len(token) != k || len(score) != k || len(norm) != k {
		return fmt.Errorf("cuda: %s: output lengths %d, %d, %d, %d differ", op, len(beam), len(token), len(score), len(norm))
	}
	if len(scores) == 0 || k == 0 || vocab <= 0 || k > vocab || length < 1 || length > math.MaxInt32 || len(scores) > math.MaxInt32 {
		return fmt.Errorf("cuda: %s: %d beams, k=%d, vocab %d, length %d", op, len(scores), k, vocab, length)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	lp, err := logits.at(c, op, "logits", mul(len(scores), vocab, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_beam_step(c.c, fp(lp), C.int32_t(len(scores)), C.int64_t(vocab), f32p(scores), C.int32_t(length), C.float(penalty),
		C.int32_t(k), i32p(beam), i32p(token), f32p(score), f32p(norm)))
}

// MaxChooseVocab is the largest vocabulary Choose takes (the CUDA library's
// PLC_CHOOSE_MAX_VOCAB); wider rows are refused with tensor.ErrUnsupported.
const MaxChooseVocab = 40 * 1024 * 8

// Choose filters the rows of logits [len(choices), vocab] F32 as choices says (tensor.Choice,
// which has plc_choice's layout; drop: the ids their Drop ranges index) and writes each row's k
// most probable tokens after filtering to ids and logp ([len(choices)*k]) and the rest of what
// was found to rows (tensor.Chosen, plc_chosen's layout). Waits.
func (c *Context) Choose(logits Ref, vocab int, choices []tensor.Choice, drop []int32, k int, rows []tensor.Chosen, ids []int32, logp []float32) error {
	const op = "choose"
	n := len(choices)
	if len(rows) != n || len(ids) != n*k || len(logp) != n*k {
		return fmt.Errorf("cuda: %s: %d row reports, %d ids and %d log-probabilities for %d rows of %d tokens", op, len(rows), len(ids), len(logp), n, k)
	}
	if err := tensor.CheckChoices(choices, drop, vocab, k); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	if vocab > MaxChooseVocab || len(drop) > math.MaxInt32 || n > math.MaxInt32 {
		return fmt.Errorf("cuda: %s: rows of %d: %w", op, vocab, tensor.ErrUnsupported)
	}
	if n == 0 {
		return nil
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	lp, err := logits.at(c, op, "logits", mul(n, vocab, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_choose(c.c, fp(lp), C.int64_t(n), C.int64_t(vocab), (*C.plc_choice)(unsafe.Pointer(&choices[0])),
		i32p(drop), C.int32_t(len(drop)), C.int32_t(k), (*C.plc_chosen)(unsafe.Pointer(&rows[0])), i32p(ids), f32p(logp)))
}

// tensor.Choice and tensor.Chosen are passed to C as plc_choice and plc_chosen: the build
// fails if their sizes or the offsets of their later fields ever differ.
var _ = [1]struct{}{}[unsafe.Sizeof(tensor.Choice{})-uintptr(C.sizeof_plc_choice)]
var _ = [1]struct{}{}[unsafe.Offsetof(tensor.Choice{}.Probe)-unsafe.Offsetof(C.plc_choice{}.probe)]
var _ = [1]struct{}{}[unsafe.Offsetof(tensor.Choice{}.Random)-unsafe.Offsetof(C.plc_choice{}.random)]
var _ = [1]struct{}{}[unsafe.Sizeof(tensor.Chosen{})-uintptr(C.sizeof_plc_chosen)]
var _ = [1]struct{}{}[unsafe.Offsetof(tensor.Chosen{}.Probe)-unsafe.Offsetof(C.plc_chosen{}.probe)]

// tensor.Draw is passed to C as plc_draw_row: the build fails if their sizes or the offset of
// the last field ever differ.
var _ = [1]struct{}{}[unsafe.Sizeof(tensor.Draw{})-uintptr(C.sizeof_plc_draw_row)]
var _ = [1]struct{}{}[unsafe.Offsetof(tensor.Draw{}.Random)-unsafe.Offsetof(C.plc_draw_row{}.random)]

// Seq is passed to C as plc_seq: the build fails if their sizes ever differ.
var _ = [1]struct{}{}[unsafe.Sizeof(Seq{})-uintptr(C.sizeof_plc_seq)]
