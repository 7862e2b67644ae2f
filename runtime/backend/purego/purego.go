// Package purego is the pure-Go backend, registered as "purego" (and still found as "go", its
// former name, by backend.New and $PARLEY_BACKEND): it computes on the host without
// cgo, so it is built everywhere, including nocgo builds. Weights are used in place (Load keeps
// the caller's bytes), activations are float32 slices (F16 ones, for Copy and FullAttention,
// bytes), and the heavy operations (MatMul, GetRows, Attention, FullAttention and the row-wise
// operations of large batches) are split across a persistent pool of worker goroutines sized by
// Options.Threads, without allocating per operation.
//
// Products with weights use the dot-product kernels of package quant: each row of activations is
// converted once to the weight type's dot-product type (quant.KernelFor), then dotted with every
// weight row, four activation rows per weight row while it is in cache. Attention walks each
// sequence's block table: over F32 caches with a running (online) softmax; over F16 caches in
// two passes, scores and then values weighted by normalised weights rounded to F16 (the query is
// rounded to F16 too, as llama.cpp's F16 products do). FullAttention (encoder self-attention,
// cross-attention) takes tiles of query rows against blocks of keys and values, in two passes
// with the same roundings for F16 keys and values. The inner loops of both, and GELU, are
// assembly on amd64 CPUs with AVX2, FMA and F16C (build tag noasm turns that off) and Go
// elsewhere.
//
// Operations run synchronously; a Backend may be used from several goroutines (its operations
// are serialised).
package purego

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

func init() {
	backend.Register("purego", 1, New)
	backend.Alias("go", "purego")
}

// littleEndian reports whether float32 slices can be viewed as the little-endian bytes that
// quant's kernels read.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// maxElems bounds the elements of one tensor so that byte sizes (at most 4 bytes an element)
// fit an int.
const maxElems = math.MaxInt / 8

// Backend is the pure-Go backend. Its zero value is not usable; call New.
type Backend struct {
	ops  backend.Operands[*Tensor, *KV] // also says whether the backend is closed (set under mu)
	mu   sync.Mutex
	pool *pool

	mm   matmulJob
	cv   convertJob
	gr   getRowsJob
	at   attnJob
	fa   fullAttnJob
	rows rowJob
	fn   funcJob
	xq   []byte // converted activations [n, VecType row]
	// xqFrom and xqType say which activations xq holds, converted to which type, so that the
	// products of one input with several matrices (q, k, v; gate, up) convert it once. Every
	// operation that writes activations forgets them.
	xqFrom []float32
	xqType tensor.DType
	tok    []int32   // [n] sequence index of each token of an attention batch
	rope   []float64 // [Dims] cos and sin of each pair's angle for one token
	inv    []float64 // [Dims/2] Base^(-2i/Dims) for ropeBase, ropeDims
	// ropeBase and ropeDims say which RoPE inv was computed for.
	ropeBase float32
	ropeDims int
}

// New starts a backend with opts.Threads workers (0: one per CPU).
func New(opts backend.Options) (backend.Backend, error) {
	n := opts.Threads
	if n < 0 {
		return nil, fmt.Errorf("purego: %d threads", n)
	}
	if n == 0 {
		n = runtime.NumCPU()
	}
	caps := backend.Capabilities{
		Weights: backend.DTypes(func(dt tensor.DType) bool { _, err := quant.KernelFor(dt); return dt.Supported() && err == nil }),
		KV:      backend.SetOf(tensor.F32, tensor.F16, tensor.BF16),
		Funcs:   funcs,
	}
	return &Backend{ops: backend.NewOperands[*Tensor, *KV]("purego", caps), pool: newPool(n)}, nil
}

// Capabilities says what the backend computes: every weight type package quant has a dot
// product for, F32, F16 and BF16 caches, and the functions of applyFunc.
func (be *Backend) Capabilities() backend.Capabilities { return be.ops.Capabilities() }

// Name returns "purego".
func (be *Backend) Name() string { return "purego" }

// Close stops the workers. Tensors made by be must not be used afterwards.
func (be *Backend) Close() error {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.ops.Close() {
		be.pool.stop()
	}
	return nil
}

// Tensor is a tensor of this backend. F32 tensors hold their elements in f32 (a view of the
// caller's bytes for loaded ones where the platform allows); every tensor that can be a weight
// holds its rows in data, rowBytes each.
type Tensor struct {
	be         *Backend
	dt         tensor.DType
	rows, cols int
	rowBytes   int
	data       []byte    // [rows*rowBytes]; nil for F32 tensors on big-endian platforms
	f32        []float32 // [rows*cols] for F32 tensors
	readOnly   bool      // loaded: the memory is the caller's
	root       *Tensor   // for views: the tensor whose memory this shares; nil for others
	res        backend.Residence

	kern    quant.Kernel // dot product with weights of dt; kernErr when there is none
	kernErr error
	vecRow  int // bytes of one activation row converted to kern.VecType
}

// DType is the tensor's element type.
func (t *Tensor) DType() tensor.DType { return t.dt }

// Rows is the number of rows.
func (t *Tensor) Rows() int { return t.rows }

// Cols is the number of elements a row.
func (t *Tensor) Cols() int { return t.cols }

// Close releases the tensor (a view releases nothing of its parent). Closing twice is a no-op.
func (t *Tensor) Close() error {
	t.be.mu.Lock()
	defer t.be.mu.Unlock()
	t.res.Closed = true
	t.data, t.f32 = nil, nil
	return nil
}

func (t *Tensor) String() string { return fmt.Sprintf("%v [%d, %d]", t.dt, t.rows, t.cols) }

var errClosed = errors.New("purego: backend closed")

// Residence is what the shared operand checks read of t (backend.Operands).
func (t *Tensor) Residence() *backend.Residence { return &t.res }

// reside records t's memory for the operand checks.
func (t *Tensor) reside() {
	t.res = backend.Residence{Owner: t.be.ops.Owner, DType: t.dt, ReadOnly: t.readOnly}
	switch {
	case len(t.f32) > 0:
		t.res.Addr, t.res.Bytes = uintptr(unsafe.Pointer(&t.f32[0])), 4*len(t.f32)
	case len(t.data) > 0:
		t.res.Addr, t.res.Bytes = uintptr(unsafe.Pointer(&t.data[0])), len(t.data)
	}
	if t.root != nil {
		t.res.View = &t.root.res
	}
}

// f32View returns the float32 elements stored little-endian in b, without copying where the
// platform allows (little-endian, 4-byte aligned), else decoded into a new slice.
func f32View(b []byte) []float32 {
	n := len(b) / 4
	if n == 0 {
		return []float32{}
	}
	if littleEndian && uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
	}
	f := make([]float32, n)
	_ = quant.Dequantize(tensor.F32, b[:4*n], f)
	return f
}

// u16View returns the uint16s (F16 bits) stored little-endian in b, without copying where the
// platform allows (little-endian, 2-byte aligned), else decoded into a new slice.
func u16View(b []byte) []uint16 {
	n := len(b) / 2
	if n == 0 {
		return []uint16{}
	}
	if littleEndian && uintptr(unsafe.Pointer(&b[0]))%2 == 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), n)
	}
	h := make([]uint16, n)
	for i := range h {
		h[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
	}
	return h
}

// byteView returns the bytes of f on little-endian platforms, nil elsewhere.
func byteView(f []float32) []byte {
	if !littleEndian {
		return nil
	}
	if len(f) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

// setKernel resolves t's dot-product kernel.
func (t *Tensor) setKernel() {
	t.kern, t.kernErr = quant.KernelFor(t.dt)
	if t.kernErr == nil {
		vr, err := t.kern.VecType.RowSize(int64(t.cols))
		t.vecRow, t.kernErr = int(vr), err
	}
}

// Load makes a tensor of data, which it keeps and never writes.
func (be *Backend) Load(dt tensor.DType, rows, cols int, data []byte) (backend.Tensor, error) {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.ops.Closed() {
		return nil, errClosed
	}
	_, rs, err := be.ops.Load(dt, rows, cols, data)
	if err != nil {
		return nil, err
	}
	t := &Tensor{be: be, dt: dt, rows: rows, cols: cols, rowBytes: rs, data: data, readOnly: true}
	if dt == tensor.F32 {
		t.f32 = f32View(data)
	}
	t.setKernel()
	t.reside()
	return t, nil
}

// Alloc makes a zeroed F32 or F16 tensor.
func (be *Backend) Alloc(dt tensor.DType, rows, cols int) (backend.Tensor, error) {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.ops.Closed() {
		return nil, errClosed
	}
	_, rs, err := be.ops.Alloc(dt, rows, cols)
	if err != nil {
		return nil, err
	}
	t := &Tensor{be: be, dt: dt, rows: rows, cols: cols, rowBytes: rs}
	if dt == tensor.F32 {
		t.f32 = make([]float32, rows*cols)
		t.data = byteView(t.f32)
	} else {
		t.data = make([]byte, rows*rs)
	}
	t.setKernel()
	t.reside()
	return t, nil
}

// View returns rows row0..row0+rows-1 of x, sharing its memory.
func (be *Backend) View(x backend.Tensor, row0, rows int) (backend.Tensor, error) {
	be.mu.Lock()
	defer be.mu.Unlock()
	t, err := be.ops.View(x, row0, rows)
	if err != nil {
		return nil, err
	}
	v := &Tensor{be: be, dt: t.dt, rows: rows, cols: t.cols, rowBytes: t.rowBytes, readOnly: t.readOnly, root: t,
		kern: t.kern, kernErr: t.kernErr, vecRow: t.vecRow}
	if t.root != nil {
		v.root = t.root
	}
	if t.data != nil {
		v.data = t.data[row0*t.rowBytes : (row0+rows)*t.rowBytes]
	}
	if t.f32 != nil {
		v.f32 = t.f32[row0*t.cols : (row0+rows)*t.cols]
	}
	v.reside()
	return v, nil
}

// Write copies src into rows row0.. of an F32 tensor.
func (be *Backend) Write(dst backend.Tensor, row0 int, src []float32) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	t, err := be.ops.Span("write", "dst", dst, row0, len(src), true)
	if err != nil {
		return err
	}
	be.xqFrom = nil
	copy(t.f32[row0*t.cols:], src)
	return nil
}

// Read copies rows row0.. of an F32 tensor into dst.
func (be *Backend) Read(src backend.Tensor, row0 int, dst []float32) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	t, err := be.ops.Span("read", "src", src, row0, len(dst), false)
	if err != nil {
		return err
	}
	copy(dst, t.f32[row0*t.cols:])
	return nil
}

// overlap reports whether a and b share memory.
func overlap(a, b []float32) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+4*uintptr(len(b)) && b0 < a0+4*uintptr(len(a))
}

// same reports whether a and b are the same elements.
func same(a, b []float32) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// grow returns b with length n, reallocating only when its capacity is short.
func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n, n+n/4)
	}
	return b[:n]
}
