//go:build cgo && !nocgo

package cpu

/*
#cgo CFLAGS: -O3 -std=c11 -D_GNU_SOURCE -Werror=implicit-function-declaration -I${SRCDIR}/../../native/include
#cgo LDFLAGS: -lopenblas -lm -lpthread
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "parley.h"

// Buffers of at least this many bytes are anonymous mappings: zero pages the system provides on
// first touch, so a large KV cache costs memory only as it fills.
#define PLGO_MAP_MIN (1 << 20)

static void *plgo_alloc(size_t n) {
	if (n >= PLGO_MAP_MIN) {
		void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		return p == MAP_FAILED ? NULL : p;
	}
	void *p = NULL;
	if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
	memset(p, 0, n);
	return p;
}

static void plgo_free(void *p, size_t n) {
	if (n >= PLGO_MAP_MIN) {
		munmap(p, n);
	} else {
		free(p);
	}
}
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

// Available reports whether the native kernels are compiled into this binary.
func Available() bool { return true }

// CurrentISA is the instruction-set level the kernels use now.
func CurrentISA() ISA { return ISA(C.pl_cpu_isa()) }

// BestISA is the best level this processor supports.
func BestISA() ISA { return ISA(C.pl_cpu_best_isa()) }

// SetISA makes the kernels use level isa (at most BestISA). It affects every Context and must
// not be called while any operation runs; it exists to test the lower levels.
func SetISA(isa ISA) error {
	if st := C.pl_cpu_set_isa(C.int(isa)); st != C.PL_OK {
		return fmt.Errorf("cpu: set ISA %v: this processor supports up to %v", isa, BestISA())
	}
	refreshPacked()
	return nil
}

// Supports reports whether operation op handles dtype dt.
func Supports(op Op, dt tensor.DType) bool {
	if !dt.Known() {
		return false
	}
	return C.pl_supports(C.int(op), C.int(dt)) == 1
}

// SupportsFunc reports whether Unary and GLU compute the function f (the native kernels' own
// answer).
func SupportsFunc(f tensor.Func) bool {
	return f.Known() && C.pl_supports(C.int(opUnary), C.int(f)) == 1
}

func statusErr(op string, st C.int) error {
	switch st {
	case C.PL_ERR_ARG:
		return fmt.Errorf("cpu: %s: invalid argument", op)
	case C.PL_ERR_UNSUPPORTED:
		return fmt.Errorf("cpu: %s: %w", op, tensor.ErrUnsupported)
	case C.PL_ERR_NOMEM:
		return fmt.Errorf("cpu: %s: out of memory", op)
	case C.PL_ERR_THREAD:
		return fmt.Errorf("cpu: %s: cannot start a thread", op)
	}
	return fmt.Errorf("cpu: %s: status %d", op, int(st))
}

func f32p(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&s[0]))
}

func bytep(s []byte) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func i32p(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

// QuantizeRow converts src to dt (F16, BF16, Q8_0, Q8_1 or Q8_K) into dst, exactly as
// llama.cpp's x86 CPU backend converts activations. len(dst) must be dt.RowSize(len(src)).
func QuantizeRow(dt tensor.DType, src []float32, dst []byte) error {
	if !Supports(OpQuantize, dt) {
		return unsupported("quantize", dt)
	}
	sz, err := rowBytes("quantize", dt, len(src))
	if err != nil {
		return err
	}
	if len(dst) != sz {
		return fmt.Errorf("cpu: quantize %v: %d elements need %d bytes, got %d", dt, len(src), sz, len(dst))
	}
	if len(src) == 0 {
		return nil
	}
	if st := C.pl_quantize_row(C.int(dt), f32p(src), bytep(dst), C.int64_t(len(src))); st != C.PL_OK {
		return statusErr("quantize", st)
	}
	return nil
}

// DequantizeRow converts len(dst) elements of dt in src (exactly dt.RowSize(len(dst)) bytes)
// to float32.
func DequantizeRow(dt tensor.DType, src []byte, dst []float32) error {
	if !Supports(OpDequantize, dt) {
		return unsupported("dequantize", dt)
	}
	sz, err := rowBytes("dequantize", dt, len(dst))
	if err != nil {
		return err
	}
	if len(src) != sz {
		return fmt.Errorf("cpu: dequantize %v: %d elements need %d bytes, got %d", dt, len(dst), sz, len(src))
	}
	if len(dst) == 0 {
		return nil
	}
	if st := C.pl_dequantize_row(C.int(dt), bytep(src), f32p(dst), C.int64_t(len(dst))); st != C.PL_OK {
		return statusErr("dequantize", st)
	}
	return nil
}

// Buffer is native memory, 64-byte aligned and zeroed when allocated, for tensors the kernels
// read and write at full speed. Buffers of 1 MiB or more are anonymous mappings, backed by memory
// only where written. It is not managed by the Go collector: Free releases it.
type Buffer struct {
	p unsafe.Pointer
	n int
}

// Alloc allocates n bytes.
func Alloc(n int) (*Buffer, error) {
	if n < 0 || n > maxElems {
		return nil, fmt.Errorf("cpu: alloc: bad size %d", n)
	}
	p := C.plgo_alloc(C.size_t(n))
	if p == nil {
		return nil, fmt.Errorf("cpu: alloc: cannot allocate %d bytes", n)
	}
	return &Buffer{p: p, n: n}, nil
}

// Bytes is the buffer's memory, nil after Free.
func (b *Buffer) Bytes() []byte {
	if b == nil || b.p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(b.p), b.n)
}

// Float32s is the buffer's memory as float32s (len Len()/4), nil after Free.
func (b *Buffer) Float32s() []float32 {
	if b == nil || b.p == nil {
		return nil
	}
	return unsafe.Slice((*float32)(b.p), b.n/4)
}

// Len is the buffer's size in bytes.
func (b *Buffer) Len() int { return b.n }

// Free releases the memory; later calls do nothing. Slices obtained before must not be used.
func (b *Buffer) Free() {
	if b == nil || b.p == nil {
		return
	}
	C.plgo_free(b.p, C.size_t(b.n))
	b.p = nil
}

// Context runs operations on a pool of native threads.
type Context struct {
	mu      sync.Mutex
	c       *C.pl_ctx
	threads int
	// Argument structs live here, not on the stack: a pointer to a local passed to C would make
	// the local escape, an allocation per call.
	rope C.pl_rope_cfg
	attn C.pl_attn_cfg
	// ff holds a copy of the RoPE frequency factors in C memory (a Go pointer inside rope
	// would break cgo's pointer rules); ffCap floats.
	ff    *C.float
	ffCap int
}

// NewContext starts a context computing with threads threads (1..256), the calling one
// included.
func NewContext(threads int) (*Context, error) {
	if threads < 1 || threads > 256 {
		return nil, fmt.Errorf("cpu: %d threads, want 1..256", threads)
	}
	var c *C.pl_ctx
	if st := C.pl_ctx_new(C.int(threads), &c); st != C.PL_OK {
		return nil, statusErr("new context", st)
	}
	return &Context{c: c, threads: threads}, nil
}

// Threads is the number of threads the context computes with.
func (c *Context) Threads() int { return c.threads }

// Close stops the threads and frees the scratch memory. Closing twice is a no-op.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		C.pl_ctx_free(c.c)
		c.c = nil
	}
	if c.ff != nil {
		C.free(unsafe.Pointer(c.ff))
		c.ff, c.ffCap = nil, 0
	}
	return nil
}

// lock takes the context for one operation.
func (c *Context) lock(op string) error {
	c.mu.Lock()
	if c.c == nil {
		c.mu.Unlock()
		return fmt.Errorf("cpu: %s: context closed", op)
	}
	return nil
}

// MatMul: dst[i,j] = sum_l x[i,l]*w[j,l] for x [n, k] F32, w [m, k] of wt, dst [n, m] F32.
// Quantised and half-precision weights see each row of x converted to their dot type first.
// dst must not overlap x or w.
func (c *Context) MatMul(dst, x []float32, n, k int, w []byte, wt tensor.DType, m int) error {
	const op = "matmul"
	if !Supports(OpMatMul, wt) {
		return unsupported(op, wt)
	}
	if n < 0 || k <= 0 || m < 0 {
		return fmt.Errorf("cpu: %s: bad shape n=%d k=%d m=%d", op, n, k, m)
	}
	rb, err := rowBytes(op, wt, k)
	if err != nil {
		return err
	}
	if err := need(op, "x", len(x), mul(n, k)); err != nil {
		return err
	}
	if err := need(op, "dst", len(dst), mul(n, m)); err != nil {
		return err
	}
	if err := need(op, "w bytes", len(w), mul(m, rb)); err != nil {
		return err
	}
	if n == 0 || m == 0 {
		return nil
	}
	dp, dn := unsafe.Pointer(&dst[0]), n*m*4
	if overlap(dp, dn, unsafe.Pointer(&x[0]), n*k*4) || overlap(dp, dn, unsafe.Pointer(&w[0]), m*rb) {
		return fmt.Errorf("cpu: %s: dst overlaps an operand", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	st := C.pl_matmul(c.c, f32p(dst), f32p(x), C.int64_t(n), C.int64_t(k), bytep(w), C.int(wt), C.int64_t(m))
	if st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// PackedSize returns the bytes PackWeights writes for m rows of k elements of wt, and whether the
// interleaved layout serves wt at the current instruction-set level (the quantised weight types
// but Q2_K, Q3_K, IQ4_NL and IQ4_XS, with AVX-512 VNNI or AVX2). The layout takes as many bytes
// as the rows (Q4_K and Q5_K: 4 more a row every 256 elements), up to a last group padded to
// sixteen rows.
// Shapes whose rows are not whole blocks of wt report false too.
func PackedSize(wt tensor.DType, m, k int) (int, bool) {
	if m < 0 || k <= 0 || !PackedAvailable(wt) {
		return 0, false
	}
	n := C.pl_packed_size(C.int(wt), C.int64_t(m), C.int64_t(k))
	if n < 0 || int64(n) > math.MaxInt {
		return 0, false
	}
	return int(n), true
}

// PackedAvailable reports whether the current instruction-set level runs MatMulPacked for wt.
func PackedAvailable(wt tensor.DType) bool {
	return int(wt) >= 0 && int(wt) < len(packedOK) && packedOK[wt].Load()
}

// packedOK caches pl_packed_available for each type id at the current level: MatMul asks for
// every product, and SetISA, which alone changes the level, refreshes it.
var packedOK [32]atomic.Bool

func refreshPacked() {
	for i := range packedOK {
		packedOK[i].Store(C.pl_packed_available(C.int(i)) != 0)
	}
}

func init() { refreshPacked() }

// packedCheck returns the size of the packed form of m rows of k elements of wt, or the error
// an operation op on it gets: a shape error for rows that are not whole blocks, one wrapping
// tensor.ErrUnsupported for a type or instruction-set level without the layout.
func packedCheck(op string, wt tensor.DType, m, k int) (int, error) {
	if m < 0 || k <= 0 {
		return 0, fmt.Errorf("cpu: %s: bad shape m=%d k=%d", op, m, k)
	}
	if _, err := rowBytes(op, wt, k); err != nil {
		return 0, err
	}
	n, ok := PackedSize(wt, m, k)
	if !ok {
		return 0, unsupported(op, wt)
	}
	return n, nil
}

// PackWeights rearranges w (m rows of k elements of wt, ggml's layout) into dst, which must hold
// PackedSize(wt, m, k) bytes, for MatMulPacked.
func (c *Context) PackWeights(dst, w []byte, wt tensor.DType, m, k int) error {
	const op = "pack weights"
	size, err := packedCheck(op, wt, m, k)
	if err != nil {
		return err
	}
	rb, err := rowBytes(op, wt, k)
	if err != nil {
		return err
	}
	if err := need(op, "w bytes", len(w), mul(m, rb)); err != nil {
		return err
	}
	if err := need(op, "dst bytes", len(dst), size); err != nil {
		return err
	}
	if m == 0 {
		return nil
	}
	if overlap(unsafe.Pointer(&dst[0]), size, unsafe.Pointer(&w[0]), m*rb) {
		return fmt.Errorf("cpu: %s: dst overlaps w", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_pack_weights(c.c, C.int(wt), bytep(w), C.int64_t(m), C.int64_t(k), bytep(dst)); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// MatMulPacked is MatMul with w given as PackWeights wrote it. It fails with an error wrapping
// tensor.ErrUnsupported when the current instruction-set level has no kernel for the layout
// (after SetISA lowered it), in which case the caller multiplies the rows themselves.
func (c *Context) MatMulPacked(dst, x []float32, n, k int, wp []byte, wt tensor.DType, m int) error {
	return c.MatMulPackedN(x, n, k, wt, []PackedProduct{{dst, wp, m}})
}

// MatMulPackedN is MatMulPacked for one to MaxPackedProducts matrices of one type and width
// against one x (a layer's query, key and value products), each result bit for bit what
// MatMulPacked gives it: x is converted once and the threads woken once for all of them. No Dst
// may overlap x, a W or another Dst.
func (c *Context) MatMulPackedN(x []float32, n, k int, wt tensor.DType, ps []PackedProduct) error {
	const op = "matmul"
	if len(ps) == 0 || len(ps) > MaxPackedProducts {
		return fmt.Errorf("cpu: %s: %d matrices, want 1 to %d", op, len(ps), MaxPackedProducts)
	}
	if n < 0 {
		return fmt.Errorf("cpu: %s: bad shape n=%d k=%d", op, n, k)
	}
	if err := need(op, "x", len(x), mul(n, k)); err != nil {
		return err
	}
	var sizes [MaxPackedProducts]int
	for i, p := range ps {
		size, err := packedCheck(op, wt, p.M, k)
		if err != nil {
			return err
		}
		if err := need(op, "dst", len(p.Dst), mul(n, p.M)); err != nil {
			return err
		}
		if err := need(op, "packed w bytes", len(p.W), size); err != nil {
			return err
		}
		sizes[i] = size
	}
	var d [MaxPackedProducts]*C.float
	var w [MaxPackedProducts]unsafe.Pointer
	var m [MaxPackedProducts]C.int64_t
	for i, p := range ps {
		if n == 0 || p.M == 0 {
			continue
		}
		dp, dn := unsafe.Pointer(&p.Dst[0]), n*p.M*4
		if overlap(dp, dn, unsafe.Pointer(&x[0]), n*k*4) {
			return fmt.Errorf("cpu: %s: dst overlaps an operand", op)
		}
		for j, q := range ps {
			if (sizes[j] > 0 && overlap(dp, dn, unsafe.Pointer(&q.W[0]), sizes[j])) ||
				(j != i && n > 0 && q.M > 0 && overlap(dp, dn, unsafe.Pointer(&q.Dst[0]), n*q.M*4)) {
				return fmt.Errorf("cpu: %s: dst overlaps an operand", op)
			}
		}
		d[i], w[i], m[i] = f32p(p.Dst), bytep(p.W), C.int64_t(p.M)
	}
	if n == 0 {
		return nil
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	st := C.pl_matmul_packed3(c.c, f32p(x), C.int64_t(n), C.int64_t(k), C.int(wt), d[0], w[0], m[0], d[1], w[1], m[1], d[2], w[2], m[2])
	if st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// GetRows: dst[i,:] = float32(table[ids[i],:]) for table [rows, cols] of dt, dst [len(ids), cols].
func (c *Context) GetRows(dst []float32, table []byte, dt tensor.DType, rows, cols int, ids []int32) error {
	const op = "get rows"
	if !Supports(OpGetRows, dt) {
		return unsupported(op, dt)
	}
	if rows < 0 || cols < 0 {
		return fmt.Errorf("cpu: %s: bad shape %dx%d", op, rows, cols)
	}
	rb, err := rowBytes(op, dt, cols)
	if err != nil {
		return err
	}
	if err := need(op, "table bytes", len(table), mul(rows, rb)); err != nil {
		return err
	}
	if err := need(op, "dst", len(dst), mul(len(ids), cols)); err != nil {
		return err
	}
	for i, id := range ids {
		if id < 0 || int(id) >= rows {
			return fmt.Errorf("cpu: %s: id %d at %d outside the table's %d rows", op, id, i, rows)
		}
	}
	if len(ids) == 0 || cols == 0 {
		return nil
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	st := C.pl_get_rows(c.c, f32p(dst), bytep(table), C.int(dt), C.int64_t(rows), C.int64_t(cols), i32p(ids), C.int64_t(len(ids)))
	if st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// AddRows: dst[i,:] = a[i,:] + b[i,:] (bRows == n) or b[0,:] (bRows == 1); [n, d]. dst may be a.
func (c *Context) AddRows(dst, a, b []float32, n, d, bRows int) error {
	const op = "add rows"
	if n < 0 || d < 0 || (bRows != 1 && bRows != n) {
		return fmt.Errorf("cpu: %s: bad shape n=%d d=%d b rows=%d", op, n, d, bRows)
	}
	if err := need(op, "a", len(a), mul(n, d)); err != nil {
		return err
	}
	if err := need(op, "dst", len(dst), mul(n, d)); err != nil {
		return err
	}
	if err := need(op, "b", len(b), mul(bRows, d)); err != nil {
		return err
	}
	if n == 0 || d == 0 {
		return nil
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_add_rows(c.c, f32p(dst), f32p(a), f32p(b), C.int64_t(n), C.int64_t(d), C.int64_t(bRows)); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// RMSNorm: dst[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * w for x, dst [n, d], w [d].
// dst may be x.
func (c *Context) RMSNorm(dst, x, w []float32, n, d int, eps float32) error {
	const op = "rms norm"
	if n < 0 || d < 0 || !(eps >= 0) {
		return fmt.Errorf("cpu: %s: bad arguments n=%d d=%d eps=%v", op, n, d, eps)
	}
	if err := need(op, "x", len(x), mul(n, d)); err != nil {
		return err
	}
	if err := need(op, "dst", len(dst), mul(n, d)); err != nil {
		return err
	}
	if err := need(op, "w", len(w), d); err != nil {
		return err
	}
	if n == 0 || d == 0 {
		return nil
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_rms_norm(c.c, f32p(dst), f32p(x), f32p(w), C.int64_t(n), C.int64_t(d), C.float(eps)); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// Unary: dst[i] = f(x[i]) over len(dst) elements, f a function the native kernels know
// (tensor.Func, passed to pl_unary as it is; another is refused with tensor.ErrUnsupported).
// dst may be x, or apart from it.
func (c *Context) Unary(dst, x []float32, f tensor.Func) error {
	const op = "unary"
	if !f.Known() {
		return fmt.Errorf("cpu: %s: function %v: %w", op, f, tensor.ErrUnsupported)
	}
	if len(x) < len(dst) {
		return fmt.Errorf("cpu: %s: x %d shorter than dst %d", op, len(x), len(dst))
	}
	if len(dst) == 0 {
		return nil
	}
	if n := len(dst) * 4; unsafe.Pointer(&dst[0]) != unsafe.Pointer(&x[0]) && overlap(unsafe.Pointer(&dst[0]), n, unsafe.Pointer(&x[0]), n) {
		return fmt.Errorf("cpu: %s: dst overlaps x without being x", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_unary(c.c, C.int(f), f32p(dst), f32p(x), C.int64_t(len(dst))); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// GLU: dst[i] = f(gate[i]) * up[i] over len(dst) elements, f as Unary's (tensor.SiLU: SwiGLU,
// tensor.GELU: GeGLU). dst may be gate or up, or apart from them.
func (c *Context) GLU(dst, gate, up []float32, f tensor.Func) error {
	const op = "glu"
	if !f.Known() {
		return fmt.Errorf("cpu: %s: function %v: %w", op, f, tensor.ErrUnsupported)
	}
	if len(gate) < len(dst) || len(up) < len(dst) {
		return fmt.Errorf("cpu: %s: gate %d / up %d shorter than dst %d", op, len(gate), len(up), len(dst))
	}
	if len(dst) == 0 {
		return nil
	}
	n := len(dst) * 4
	for _, in := range [2][]float32{gate, up} {
		if unsafe.Pointer(&dst[0]) != unsafe.Pointer(&in[0]) && overlap(unsafe.Pointer(&dst[0]), n, unsafe.Pointer(&in[0]), n) {
			return fmt.Errorf("cpu: %s: dst partly overlaps gate or up", op)
		}
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_glu(c.c, C.int(f), f32p(dst), f32p(gate), f32p(up), C.int64_t(len(dst))); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// Scale: dst[i] = x[i] * s over len(dst) elements. dst may be x.
func (c *Context) Scale(dst, x []float32, s float32) error {
	const op = "scale"
	if len(x) < len(dst) {
		return fmt.Errorf("cpu: %s: x %d shorter than dst %d", op, len(x), len(dst))
	}
	if len(dst) == 0 {
		return nil
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_scale(c.c, f32p(dst), f32p(x), C.float(s), C.int64_t(len(dst))); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// Rope rotates x [n, nHead*r.HeadDim] in place, token i at position pos[i] >= 0.
func (c *Context) Rope(x []float32, n, nHead int, r Rope, pos []int32) error {
	const op = "rope"
	if n < 0 || nHead < 0 || r.HeadDim <= 0 || r.Dims <= 0 || r.Dims > r.HeadDim || r.Dims%2 != 0 {
		return fmt.Errorf("cpu: %s: bad shape n=%d heads=%d head dim=%d dims=%d", op, n, nHead, r.HeadDim, r.Dims)
	}
	if !(r.Base > 0) || r.FreqScale != r.FreqScale || r.FreqScale-r.FreqScale != 0 {
		return fmt.Errorf("cpu: %s: bad base %v or frequency scale %v", op, r.Base, r.FreqScale)
	}
	if r.AttnFactor < 0 || r.AttnFactor != r.AttnFactor || r.AttnFactor-r.AttnFactor != 0 {
		return fmt.Errorf("cpu: %s: attention factor %v, want 0 (1) or a finite value above 0", op, r.AttnFactor)
	}
	if !(r.ExtFactor >= 0 && r.ExtFactor <= 1) || r.CorrDims[0]-r.CorrDims[0] != 0 || r.CorrDims[1]-r.CorrDims[1] != 0 {
		return fmt.Errorf("cpu: %s: YaRN extrapolation %v over pairs %v, want 0 to 1 over finite bounds", op, r.ExtFactor, r.CorrDims)
	}
	if err := need(op, "x", len(x), mul(n, mul(nHead, r.HeadDim))); err != nil {
		return err
	}
	if err := need(op, "positions", len(pos), n); err != nil {
		return err
	}
	if r.Factors != nil {
		if len(r.Factors) != r.Dims/2 {
			return fmt.Errorf("cpu: %s: %d frequency factors for %d pairs", op, len(r.Factors), r.Dims/2)
		}
		for i, f := range r.Factors {
			if !(f > 0) || f-f != 0 {
				return fmt.Errorf("cpu: %s: frequency factor %d is %v, want a finite value above 0", op, i, f)
			}
		}
	}
	for i, p := range pos[:n] {
		if p < 0 {
			return fmt.Errorf("cpu: %s: negative position %d of token %d", op, p, i)
		}
	}
	if n == 0 || nHead == 0 {
		return nil
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.rope = C.pl_rope_cfg{mode: C.PL_ROPE_NORMAL, head_dim: C.int32_t(r.HeadDim), dims: C.int32_t(r.Dims), base: C.float(r.Base), freq_scale: C.float(r.FreqScale), mscale: C.float(r.AttnFactor),
		ext_factor: C.float(r.ExtFactor), corr_dims: [2]C.float{C.float(r.CorrDims[0]), C.float(r.CorrDims[1])}}
	if r.NeoX {
		c.rope.mode = C.PL_ROPE_NEOX
	}
	if len(r.Factors) > 0 {
		if c.ffCap < len(r.Factors) {
			p := (*C.float)(C.realloc(unsafe.Pointer(c.ff), C.size_t(len(r.Factors))*4))
			if p == nil {
				return fmt.Errorf("cpu: %s: out of memory", op)
			}
			c.ff, c.ffCap = p, len(r.Factors)
		}
		copy(unsafe.Slice((*float32)(unsafe.Pointer(c.ff)), len(r.Factors)), r.Factors)
		c.rope.freq_factors = c.ff
	}
	if st := C.pl_rope(c.c, f32p(x), C.int64_t(n), C.int64_t(nHead), &c.rope, i32p(pos)); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// StoreKV writes k and v [n, width] into rows slot[i] of the caches kc and vc, each
// [slots, width] of kvt (F32, F16 or BF16; F16 and BF16 rounded to nearest even).
func (c *Context) StoreKV(kc, vc []byte, kvt tensor.DType, slots, width int, k, v []float32, n int, slot []int32) error {
	const op = "store kv"
	es := kvElemSize(kvt)
	if es == 0 {
		return unsupported(op, kvt)
	}
	if slots < 0 || width < 0 || n < 0 {
		return fmt.Errorf("cpu: %s: bad shape slots=%d width=%d n=%d", op, slots, width, n)
	}
	cb := mul(mul(slots, width), es)
	if err := need(op, "k cache bytes", len(kc), cb); err != nil {
		return err
	}
	if err := need(op, "v cache bytes", len(vc), cb); err != nil {
		return err
	}
	if err := need(op, "k", len(k), mul(n, width)); err != nil {
		return err
	}
	if err := need(op, "v", len(v), mul(n, width)); err != nil {
		return err
	}
	if err := need(op, "slots", len(slot), n); err != nil {
		return err
	}
	for i, s := range slot[:n] {
		if s < 0 || int(s) >= slots {
			return fmt.Errorf("cpu: %s: slot %d of token %d outside the cache's %d", op, s, i, slots)
		}
	}
	if n == 0 || width == 0 {
		return nil
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	st := C.pl_store_kv(c.c, bytep(kc), bytep(vc), C.int(kvt), C.int64_t(slots), C.int64_t(width), f32p(k), f32p(v), C.int64_t(n), i32p(slot))
	if st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// Attention computes causal attention for the n tokens of a batch over the caches kc, vc
// ([slots, width] of kvt, in blocks of blockSize slots): for each sequence of seqs and each of
// its tokens, each query head attends to the cache positions up to its own. q, dst
// [n, NHead*HeadDim]; dst must not overlap q. Tokens in no sequence are left as they are. kvt is
// F32, F16 or BF16; over F16 and BF16 caches q and the normalised weights are rounded to the
// cache's type (backend.Backend.Attention).
func (c *Context) Attention(dst, q []float32, n int, kc, vc []byte, kvt tensor.DType, slots, width, blockSize int, a Attn, seqs []Seq, blocks []int32) error {
	const op = "attention"
	es := kvElemSize(kvt)
	if es == 0 {
		return unsupported(op, kvt)
	}
	if n < 0 || slots < 0 || width < 0 {
		return fmt.Errorf("cpu: %s: bad shape n=%d slots=%d width=%d", op, n, slots, width)
	}
	if err := checkAttention(n, a, slots, width, blockSize, seqs, blocks); err != nil {
		return err
	}
	cb := mul(mul(slots, width), es)
	if err := need(op, "k cache bytes", len(kc), cb); err != nil {
		return err
	}
	if err := need(op, "v cache bytes", len(vc), cb); err != nil {
		return err
	}
	qn := mul(n, mul(a.NHead, a.HeadDim))
	if err := need(op, "q", len(q), qn); err != nil {
		return err
	}
	if err := need(op, "dst", len(dst), qn); err != nil {
		return err
	}
	if n == 0 || len(seqs) == 0 {
		return nil
	}
	if overlap(unsafe.Pointer(&dst[0]), qn*4, unsafe.Pointer(&q[0]), qn*4) {
		return fmt.Errorf("cpu: %s: dst overlaps q", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.attn = C.pl_attn_cfg{n_head: C.int32_t(a.NHead), n_kv_head: C.int32_t(a.NKVHead), head_dim: C.int32_t(a.HeadDim), scale: C.float(a.Scale)}
	st := C.pl_attention(c.c, f32p(dst), f32p(q), C.int64_t(n), bytep(kc), bytep(vc), C.int(kvt),
		C.int64_t(slots), C.int64_t(width), C.int64_t(blockSize), &c.attn,
		(*C.pl_seq)(unsafe.Pointer(&seqs[0])), C.int64_t(len(seqs)), i32p(blocks), C.int64_t(len(blocks)))
	if st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// Convert converts n elements of src, of type st, into dst, of type dt: F32 to F16 (rounded to
// nearest even), F16 to F32, or a copy between equal types (F32 or F16), for which dst and src
// may overlap.
func (c *Context) Convert(dst []byte, dt tensor.DType, src []byte, st tensor.DType, n int) error {
	const op = "convert"
	ds, ss := floatElemSize(dt), floatElemSize(st)
	if ds == 0 {
		return unsupported(op, dt)
	}
	if ss == 0 {
		return unsupported(op, st)
	}
	if n < 0 {
		return fmt.Errorf("cpu: %s: %d elements", op, n)
	}
	if err := need(op, "dst bytes", len(dst), mul(n, ds)); err != nil {
		return err
	}
	if err := need(op, "src bytes", len(src), mul(n, ss)); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if dt != st && overlap(unsafe.Pointer(&dst[0]), n*ds, unsafe.Pointer(&src[0]), n*ss) {
		return fmt.Errorf("cpu: %s: dst overlaps src", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_convert(c.c, bytep(dst), C.int(dt), bytep(src), C.int(st), C.int64_t(n)); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// LayerNorm: dst[i,:] = (x[i,:] - mean) / sqrt(var + eps) * w + b for x, dst [n, d], w, b [d],
// with each row's mean and biased variance summed in double. dst may be x.
func (c *Context) LayerNorm(dst, x, w, b []float32, n, d int, eps float32) error {
	const op = "layer norm"
	if n < 0 || d < 0 || !(eps >= 0) || math.IsInf(float64(eps), 0) {
		return fmt.Errorf("cpu: %s: bad arguments n=%d d=%d eps=%v", op, n, d, eps)
	}
	if err := need(op, "x", len(x), mul(n, d)); err != nil {
		return err
	}
	if err := need(op, "dst", len(dst), mul(n, d)); err != nil {
		return err
	}
	if err := need(op, "w", len(w), d); err != nil {
		return err
	}
	if err := need(op, "b", len(b), d); err != nil {
		return err
	}
	if n == 0 || d == 0 {
		return nil
	}
	dp, dn := unsafe.Pointer(&dst[0]), n*d*4
	if overlap(dp, dn, unsafe.Pointer(&w[0]), d*4) || overlap(dp, dn, unsafe.Pointer(&b[0]), d*4) {
		return fmt.Errorf("cpu: %s: dst overlaps w or b", op)
	}
	if dp != unsafe.Pointer(&x[0]) && overlap(dp, dn, unsafe.Pointer(&x[0]), n*d*4) {
		return fmt.Errorf("cpu: %s: dst overlaps x without being x", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_layer_norm(c.c, f32p(dst), f32p(x), f32p(w), f32p(b), C.int64_t(n), C.int64_t(d), C.float(eps)); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// Im2Col1D lays out the receptive fields of a 1-D convolution of x [t, ch] with kernel k,
// stride and padding pad: dst[o, c*k+j] = x[o*stride+j-pad, c], 0 outside x, for
// dst [Im2Col1DRows(t, k, stride, pad), ch*k], which must not overlap x.
func (c *Context) Im2Col1D(dst, x []float32, t, ch, k, stride, pad int) error {
	const op = "im2col"
	tOut, err := Im2Col1DRows(t, k, stride, pad)
	if err != nil {
		return err
	}
	if ch < 0 {
		return fmt.Errorf("cpu: %s: %d channels", op, ch)
	}
	cols := mul(ch, k)
	if err := need(op, "x", len(x), mul(t, ch)); err != nil {
		return err
	}
	if err := need(op, "dst", len(dst), mul(tOut, cols)); err != nil {
		return err
	}
	if ch == 0 {
		return nil
	}
	if t > 0 && overlap(unsafe.Pointer(&dst[0]), tOut*cols*4, unsafe.Pointer(&x[0]), t*ch*4) {
		return fmt.Errorf("cpu: %s: dst overlaps x", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	st := C.pl_im2col_1d(c.c, f32p(dst), f32p(x), C.int64_t(t), C.int64_t(ch), C.int64_t(k), C.int64_t(stride), C.int64_t(pad))
	if st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// FullAttention computes attention without a cache or a mask: for each row i < n of q and each
// query head h, dst[i,h] = softmax_j(Scale*q[i,h]·k[j,h'])·v[j,h'] over the m rows of k and v
// ([m, NKVHead*HeadDim] of kvt, F32 or F16), h' = h/(NHead/NKVHead). q, dst
// [n, NHead*HeadDim]; dst must not overlap q, k or v. F16 keys and values follow the rounding of
// Attention over an F16 cache.
func (c *Context) FullAttention(dst, q []float32, n int, k, v []byte, kvt tensor.DType, m int, a Attn) error {
	const op = "full attention"
	es := floatElemSize(kvt)
	if es == 0 {
		return unsupported(op, kvt)
	}
	if n < 0 || m < 0 {
		return fmt.Errorf("cpu: %s: bad shape n=%d m=%d", op, n, m)
	}
	if a.NHead <= 0 || a.NKVHead <= 0 || a.HeadDim <= 0 || a.NHead%a.NKVHead != 0 {
		return fmt.Errorf("cpu: %s: %d query heads over %d kv heads of %d", op, a.NHead, a.NKVHead, a.HeadDim)
	}
	if math.IsNaN(float64(a.Scale)) || math.IsInf(float64(a.Scale), 0) {
		return fmt.Errorf("cpu: %s: scale %v", op, a.Scale)
	}
	if n > math.MaxInt32/2 || m > math.MaxInt32/2 {
		return fmt.Errorf("cpu: %s: %d queries over %d keys is too large", op, n, m)
	}
	qn := mul(n, mul(a.NHead, a.HeadDim))
	kb := mul(mul(m, mul(a.NKVHead, a.HeadDim)), es)
	if err := need(op, "q", len(q), qn); err != nil {
		return err
	}
	if err := need(op, "dst", len(dst), qn); err != nil {
		return err
	}
	if err := need(op, "k bytes", len(k), kb); err != nil {
		return err
	}
	if err := need(op, "v bytes", len(v), kb); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if m == 0 {
		return fmt.Errorf("cpu: %s: no keys", op)
	}
	dp := unsafe.Pointer(&dst[0])
	if overlap(dp, qn*4, unsafe.Pointer(&q[0]), qn*4) || overlap(dp, qn*4, unsafe.Pointer(&k[0]), kb) ||
		overlap(dp, qn*4, unsafe.Pointer(&v[0]), kb) {
		return fmt.Errorf("cpu: %s: dst overlaps q, k or v", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.attn = C.pl_attn_cfg{n_head: C.int32_t(a.NHead), n_kv_head: C.int32_t(a.NKVHead), head_dim: C.int32_t(a.HeadDim), scale: C.float(a.Scale)}
	st := C.pl_full_attention(c.c, f32p(dst), f32p(q), C.int64_t(n), bytep(k), bytep(v), C.int(kvt), C.int64_t(m), &c.attn)
	if st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// The Go Seq must match C's pl_seq field for field.
var _ = [1]struct{}{}[unsafe.Sizeof(Seq{})-uintptr(C.sizeof_pl_seq)]
