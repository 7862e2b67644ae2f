// Package cpu is the cgo binding to Parley's native CPU kernels (native/include/parley.h): a
// thin layer that checks every argument in Go (lengths, shapes, dtypes, index ranges) before it
// makes exactly one C call per operation, and turns C status codes into Go errors.
//
// It is the only Go package that imports "C" for the CPU. In a build without cgo (or with the
// nocgo tag) the same API exists and every call returns ErrNotBuilt.
//
// A Context owns native worker threads and scratch memory; its operations are synchronous and
// serialised (a Context may be shared between goroutines, but they take turns). Slices passed to
// it may be Go memory or memory from Alloc; the kernels never keep them after a call returns.
//
// The C sources live in native/ and are compiled here through one-line native_*.c files. The go
// command does not notice edits to files included from another directory, so after editing
// native/ run go generate ./bindings/cpu (it updates native_hash.go, which makes the go command
// rebuild the package); TestNativeSourcesHash fails until then.
package cpu

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/parleyhq/parley/runtime/tensor"
)

// ErrNotBuilt is returned by every call of a build without the native kernels.
var ErrNotBuilt = errors.New("cpu backend: not built (needs cgo; this is a nocgo build)")

// ISA is an instruction-set level of the native kernels.
type ISA int

// Levels, lowest first. AVX512 needs AVX-512 F, BW, VL, DQ and VNNI.
const (
	ISAScalar ISA = 0
	ISAAVX2   ISA = 1
	ISAAVX512 ISA = 2
)

func (i ISA) String() string {
	switch i {
	case ISAScalar:
		return "scalar"
	case ISAAVX2:
		return "avx2"
	case ISAAVX512:
		return "avx512"
	}
	return fmt.Sprintf("isa(%d)", int(i))
}

// Op names an operation for Supports.
type Op int

// Operations whose dtype support can be queried.
const (
	OpMatMul     Op = 1 // weight dtype
	OpGetRows    Op = 2 // table dtype
	OpKV         Op = 3 // KV-cache element dtype
	OpQuantize   Op = 4 // QuantizeRow target dtype
	OpDequantize Op = 5 // DequantizeRow source dtype
)

// opUnary asks pl_supports about a function of Unary and GLU (SupportsFunc).
const opUnary = 6

// Rope describes rotary embedding of heads of HeadDim elements, the first Dims rotated.
type Rope struct {
	NeoX      bool // pairs (i, i+Dims/2) instead of (2i, 2i+1)
	HeadDim   int
	Dims      int
	Base      float32
	FreqScale float32
	// Factors divide the angles of the Dims/2 pairs (llama.cpp's rope_freqs); nil for none.
	Factors []float32
	// AttnFactor multiplies the rotated pairs (LongRoPE's attention factor); 0 means 1.
	AttnFactor float32
	// ExtFactor and CorrDims are YaRN's (see pl_rope); ExtFactor 0 for none.
	ExtFactor float32
	CorrDims  [2]float32
}

// Attn describes attention heads (grouped-query when NKVHead < NHead).
type Attn struct {
	NHead, NKVHead, HeadDim int
	Scale                   float32
}

// Seq is one sequence of an attention batch, laid out as the C struct pl_seq (tensor.FlatSeq).
type Seq = tensor.FlatSeq

// maxElems bounds every shape product, so that sizes computed from shapes cannot overflow.
const maxElems = math.MaxInt / 16

// mul returns a*b for non-negative a, b, or -1 when the product exceeds maxElems.
func mul(a, b int) int {
	if a < 0 || b < 0 {
		return -1
	}
	if a != 0 && b > maxElems/a {
		return -1
	}
	return a * b
}

// rowBytes is dt.RowSize(cols) as an int, with a precise error.
func rowBytes(op string, dt tensor.DType, cols int) (int, error) {
	sz, err := dt.RowSize(int64(cols))
	if err != nil {
		return 0, fmt.Errorf("cpu: %s: %w", op, err)
	}
	if sz > maxElems {
		return 0, fmt.Errorf("cpu: %s: row of %d %v elements is too large", op, cols, dt)
	}
	return int(sz), nil
}

func unsupported(op string, dt tensor.DType) error {
	return fmt.Errorf("cpu: %s: dtype %v: %w", op, dt, tensor.ErrUnsupported)
}

// need checks that a slice of length have holds want elements.
func need(op, what string, have, want int) error {
	if want < 0 {
		return fmt.Errorf("cpu: %s: %s size overflows", op, what)
	}
	if have < want {
		return fmt.Errorf("cpu: %s: %s has %d elements, need %d", op, what, have, want)
	}
	return nil
}

// overlap reports whether the byte ranges [a, a+an) and [b, b+bn) intersect.
func overlap(a unsafe.Pointer, an int, b unsafe.Pointer, bn int) bool {
	if an == 0 || bn == 0 {
		return false
	}
	pa, pb := uintptr(a), uintptr(b)
	return pa < pb+uintptr(bn) && pb < pa+uintptr(an)
}

// checkAttention validates an attention call's batch description against a cache of slots
// slots in blocks of blockSize; n is the number of tokens of the batch.
func checkAttention(n int, a Attn, slots, width, blockSize int, seqs []Seq, blocks []int32) error {
	if a.NHead <= 0 || a.NKVHead <= 0 || a.HeadDim <= 0 {
		return fmt.Errorf("cpu: attention: bad heads %d/%d of %d", a.NHead, a.NKVHead, a.HeadDim)
	}
	if a.NHead%a.NKVHead != 0 {
		return fmt.Errorf("cpu: attention: %d query heads do not group over %d kv heads", a.NHead, a.NKVHead)
	}
	if mul(a.NKVHead, a.HeadDim) != width {
		return fmt.Errorf("cpu: attention: %d kv heads of %d do not make cache width %d", a.NKVHead, a.HeadDim, width)
	}
	if math.IsNaN(float64(a.Scale)) || math.IsInf(float64(a.Scale), 0) {
		return fmt.Errorf("cpu: attention: scale %v", a.Scale)
	}
	if blockSize <= 0 {
		return fmt.Errorf("cpu: attention: block size %d", blockSize)
	}
	nblk := slots / blockSize
	for i, s := range seqs {
		if s.Start < 0 || s.Count < 0 || int(s.Start)+int(s.Count) > n {
			return fmt.Errorf("cpu: attention: sequence %d: tokens [%d, %d+%d) outside the batch of %d", i, s.Start, s.Start, s.Count, n)
		}
		if s.Count > s.CtxLen {
			return fmt.Errorf("cpu: attention: sequence %d: %d tokens but context length %d", i, s.Count, s.CtxLen)
		}
		if s.Count == 0 {
			continue
		}
		needBlocks := (int(s.CtxLen) + blockSize - 1) / blockSize
		if int(s.NBlocks) < needBlocks || s.BlocksOff < 0 || int(s.BlocksOff)+needBlocks > len(blocks) {
			return fmt.Errorf("cpu: attention: sequence %d: context %d needs %d blocks, table has %d", i, s.CtxLen, needBlocks, s.NBlocks)
		}
		for _, id := range blocks[s.BlocksOff : int(s.BlocksOff)+needBlocks] {
			if id < 0 || int(id) >= nblk {
				return fmt.Errorf("cpu: attention: sequence %d: block %d outside the cache's %d blocks", i, id, nblk)
			}
		}
	}
	return nil
}

// kvElemSize is the byte size of a KV-cache element (F32, F16 or BF16), 0 if kvt is not a
// cache type.
func kvElemSize(kvt tensor.DType) int {
	if kvt == tensor.BF16 {
		return 2
	}
	return floatElemSize(kvt)
}

// floatElemSize is the byte size of an F32 or F16 element (the types of Convert and of
// FullAttention's keys and values), 0 for other types.
func floatElemSize(dt tensor.DType) int {
	switch dt {
	case tensor.F32:
		return 4
	case tensor.F16:
		return 2
	}
	return 0
}

// Im2Col1DRows returns the output rows (t+2*pad-k)/stride+1 of a 1-D convolution of t steps
// with kernel k, or an error when k, stride or pad are out of range or give no output row.
func Im2Col1DRows(t, k, stride, pad int) (int, error) {
	switch {
	case t < 0:
		return 0, fmt.Errorf("cpu: im2col: %d steps", t)
	case k <= 0:
		return 0, fmt.Errorf("cpu: im2col: kernel size %d", k)
	case stride <= 0:
		return 0, fmt.Errorf("cpu: im2col: stride %d", stride)
	case pad < 0:
		return 0, fmt.Errorf("cpu: im2col: padding %d", pad)
	case pad > maxElems || t > maxElems:
		return 0, fmt.Errorf("cpu: im2col: %d steps padded by %d is too large", t, pad)
	case t+2*pad < k:
		return 0, fmt.Errorf("cpu: im2col: kernel %d is longer than %d steps padded by %d on each side", k, t, pad)
	}
	return (t+2*pad-k)/stride + 1, nil
}

// PackedProduct is one matrix of MatMulPackedN: Dst [n, M] = x · Wᵀ, W [M, k] as PackWeights
// wrote it.
type PackedProduct struct {
	Dst []float32
	W   []byte
	M   int
}

// MaxPackedProducts is the most matrices one MatMulPackedN call multiplies.
const MaxPackedProducts = 3
