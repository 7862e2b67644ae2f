//go:build !cgo || nocgo

package cpu

import "github.com/parleyhq/parley/runtime/tensor"

// Available reports whether the native kernels are compiled into this binary.
func Available() bool { return false }

// CurrentISA is the instruction-set level the kernels use now.
func CurrentISA() ISA { return ISAScalar }

// BestISA is the best level this processor supports.
func BestISA() ISA { return ISAScalar }

// SetISA makes the kernels use level isa.
func SetISA(isa ISA) error { return ErrNotBuilt }

// Supports reports whether operation op handles dtype dt.
func Supports(op Op, dt tensor.DType) bool { return false }

// QuantizeRow converts src to dt into dst.
func QuantizeRow(dt tensor.DType, src []float32, dst []byte) error { return ErrNotBuilt }

// DequantizeRow converts elements of dt in src to float32.
func DequantizeRow(dt tensor.DType, src []byte, dst []float32) error { return ErrNotBuilt }

// Buffer is native memory.
type Buffer struct{}

// Alloc allocates n bytes.
func Alloc(n int) (*Buffer, error) { return nil, ErrNotBuilt }

// Bytes is the buffer's memory.
func (b *Buffer) Bytes() []byte { return nil }

// Float32s is the buffer's memory as float32s.
func (b *Buffer) Float32s() []float32 { return nil }

// Len is the buffer's size in bytes.
func (b *Buffer) Len() int { return 0 }

// Free releases the memory.
func (b *Buffer) Free() {}

// Context runs operations on a pool of native threads.
type Context struct{}

// NewContext starts a context computing with threads threads.
func NewContext(threads int) (*Context, error) { return nil, ErrNotBuilt }

// Threads is the number of threads the context computes with.
func (c *Context) Threads() int { return 0 }

// Close stops the threads.
func (c *Context) Close() error { return nil }

// MatMul multiplies x by the transpose of w.
func (c *Context) MatMul(dst, x []float32, n, k int, w []byte, wt tensor.DType, m int) error {
	return ErrNotBuilt
}

// PackedSize reports no packed layout without the native kernels.
func PackedSize(wt tensor.DType, m, k int) (int, bool) { return 0, false }

// PackedAvailable reports false without the native kernels.
func PackedAvailable(wt tensor.DType) bool { return false }

// PackWeights is not available without the native kernels.
func (c *Context) PackWeights(dst, w []byte, wt tensor.DType, m, k int) error { return ErrNotBuilt }

// MatMulPacked is not available without the native kernels.
func (c *Context) MatMulPacked(dst, x []float32, n, k int, wp []byte, wt tensor.DType, m int) error {
	return ErrNotBuilt
}

// MatMulPackedN is not available without the native kernels.
func (c *Context) MatMulPackedN(x []float32, n, k int, wt tensor.DType, ps []PackedProduct) error {
	return ErrNotBuilt
}

// GetRows gathers and converts rows of a table.
func (c *Context) GetRows(dst []float32, table []byte, dt tensor.DType, rows, cols int, ids []int32) error {
	return ErrNotBuilt
}

// AddRows adds rows.
func (c *Context) AddRows(dst, a, b []float32, n, d, bRows int) error { return ErrNotBuilt }

// RMSNorm normalises rows.
func (c *Context) RMSNorm(dst, x, w []float32, n, d int, eps float32) error { return ErrNotBuilt }

// SupportsFunc reports whether Unary and GLU compute f: in this build, none.
func SupportsFunc(f tensor.Func) bool { return false }

// Unary applies f elementwise.
func (c *Context) Unary(dst, x []float32, f tensor.Func) error { return ErrNotBuilt }

// GLU applies f(gate)*up.
func (c *Context) GLU(dst, gate, up []float32, f tensor.Func) error { return ErrNotBuilt }

// Scale multiplies by s.
func (c *Context) Scale(dst, x []float32, s float32) error { return ErrNotBuilt }

// Rope rotates heads in place.
func (c *Context) Rope(x []float32, n, nHead int, r Rope, pos []int32) error { return ErrNotBuilt }

// StoreKV writes keys and values into caches.
func (c *Context) StoreKV(kc, vc []byte, kvt tensor.DType, slots, width int, k, v []float32, n int, slot []int32) error {
	return ErrNotBuilt
}

// Attention computes causal attention over the caches.
func (c *Context) Attention(dst, q []float32, n int, kc, vc []byte, kvt tensor.DType, slots, width, blockSize int, a Attn, seqs []Seq, blocks []int32) error {
	return ErrNotBuilt
}

// Convert converts elements between F32 and F16, or copies them.
func (c *Context) Convert(dst []byte, dt tensor.DType, src []byte, st tensor.DType, n int) error {
	return ErrNotBuilt
}

// LayerNorm normalises rows to zero mean and unit variance, then scales and shifts them.
func (c *Context) LayerNorm(dst, x, w, b []float32, n, d int, eps float32) error { return ErrNotBuilt }

// Im2Col1D lays out the receptive fields of a 1-D convolution.
func (c *Context) Im2Col1D(dst, x []float32, t, ch, k, stride, pad int) error { return ErrNotBuilt }

// FullAttention computes attention without a cache or a mask.
func (c *Context) FullAttention(dst, q []float32, n int, k, v []byte, kvt tensor.DType, m int, a Attn) error {
	return ErrNotBuilt
}
