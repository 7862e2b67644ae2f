// Package tensor names the element types (dtypes) that Parley's model files and backends use,
// with the block geometry of each: how many elements one block holds and how many bytes it takes.
// It also holds the plain values that cross between the backends (runtime/backend) and their
// native bindings (bindings/cpu, bindings/cuda), which import no other runtime package: the error
// for a case a backend does not implement (ErrUnsupported), the elementwise functions (Func), and
// the per-row decoding instructions whose layouts the CUDA library shares (Draw, Choice, Chosen).
//
// The numeric values are ggml's type ids (ggml.h, enum ggml_type), so a DType read from a GGUF
// tensor-info record is used as is. Types Parley recognises but cannot compute with are still
// named and sized here, so that a reader can lay out a file that contains them and report a
// precise "unsupported dtype" error instead of a parse failure.
package tensor

import (
	"fmt"
	"math"
)

// DType is a ggml element type.
type DType uint32

// ggml type ids. Gaps are ids ggml has retired.
const (
	F32     DType = 0
	F16     DType = 1
	Q4_0    DType = 2
	Q4_1    DType = 3
	Q5_0    DType = 6
	Q5_1    DType = 7
	Q8_0    DType = 8
	Q8_1    DType = 9
	Q2_K    DType = 10
	Q3_K    DType = 11
	Q4_K    DType = 12
	Q5_K    DType = 13
	Q6_K    DType = 14
	Q8_K    DType = 15
	IQ2_XXS DType = 16
	IQ2_XS  DType = 17
	IQ3_XXS DType = 18
	IQ1_S   DType = 19
	IQ4_NL  DType = 20
	IQ3_S   DType = 21
	IQ2_S   DType = 22
	IQ4_XS  DType = 23
	I8      DType = 24
	I16     DType = 25
	I32     DType = 26
	I64     DType = 27
	F64     DType = 28
	IQ1_M   DType = 29
	BF16    DType = 30
	TQ1_0   DType = 34
	TQ2_0   DType = 35
	MXFP4   DType = 39
)

type info struct {
	name      string
	blockSize int // elements per block
	typeSize  int // bytes per block
	compute   bool
}

var infos = map[DType]info{
	F32:     {"F32", 1, 4, true},
	F16:     {"F16", 1, 2, true},
	Q4_0:    {"Q4_0", 32, 18, true},
	Q4_1:    {"Q4_1", 32, 20, true},
	Q5_0:    {"Q5_0", 32, 22, true},
	Q5_1:    {"Q5_1", 32, 24, true},
	Q8_0:    {"Q8_0", 32, 34, true},
	Q8_1:    {"Q8_1", 32, 36, false},
	Q2_K:    {"Q2_K", 256, 84, true},
	Q3_K:    {"Q3_K", 256, 110, true},
	Q4_K:    {"Q4_K", 256, 144, true},
	Q5_K:    {"Q5_K", 256, 176, true},
	Q6_K:    {"Q6_K", 256, 210, true},
	Q8_K:    {"Q8_K", 256, 292, false},
	IQ2_XXS: {"IQ2_XXS", 256, 66, false},
	IQ2_XS:  {"IQ2_XS", 256, 74, false},
	IQ3_XXS: {"IQ3_XXS", 256, 98, false},
	IQ1_S:   {"IQ1_S", 256, 50, false},
	IQ4_NL:  {"IQ4_NL", 32, 18, true},
	IQ3_S:   {"IQ3_S", 256, 110, false},
	IQ2_S:   {"IQ2_S", 256, 82, false},
	IQ4_XS:  {"IQ4_XS", 256, 136, true},
	I8:      {"I8", 1, 1, false},
	I16:     {"I16", 1, 2, false},
	I32:     {"I32", 1, 4, false},
	I64:     {"I64", 1, 8, false},
	F64:     {"F64", 1, 8, false},
	IQ1_M:   {"IQ1_M", 256, 56, false},
	BF16:    {"BF16", 1, 2, true},
	TQ1_0:   {"TQ1_0", 256, 54, false},
	TQ2_0:   {"TQ2_0", 256, 66, false},
	MXFP4:   {"MXFP4", 32, 17, false},
}

// Known reports whether d is a ggml type id that Parley can lay out (size and block geometry).
func (d DType) Known() bool { _, ok := infos[d]; return ok }

// Supported reports whether Parley's backends can compute with weights of type d.
func (d DType) Supported() bool { return infos[d].compute }

// String returns ggml's name for d, or "dtype(N)" for an unknown id.
func (d DType) String() string {
	if in, ok := infos[d]; ok {
		return in.name
	}
	return fmt.Sprintf("dtype(%d)", uint32(d))
}

// BlockSize is the number of elements in one block of d (1 for plain types); 0 if unknown.
func (d DType) BlockSize() int { return infos[d].blockSize }

// TypeSize is the number of bytes in one block of d; 0 if unknown.
func (d DType) TypeSize() int { return infos[d].typeSize }

// Quantized reports whether d stores elements in blocks of more than one.
func (d DType) Quantized() bool { return infos[d].blockSize > 1 }

// RowSize returns the bytes taken by n consecutive elements of type d. It fails if d is unknown,
// n is negative, n is not a multiple of the block size, or the size would overflow.
func (d DType) RowSize(n int64) (int64, error) {
	in, ok := infos[d]
	if !ok {
		return 0, fmt.Errorf("unknown dtype %d", uint32(d))
	}
	if n < 0 {
		return 0, fmt.Errorf("%v: negative element count %d", d, n)
	}
	if n%int64(in.blockSize) != 0 {
		return 0, fmt.Errorf("%v: %d elements is not a multiple of the block size %d", d, n, in.blockSize)
	}
	blocks := n / int64(in.blockSize)
	if blocks > math.MaxInt64/int64(in.typeSize) {
		return 0, fmt.Errorf("%v: size of %d elements overflows", d, n)
	}
	return blocks * int64(in.typeSize), nil
}

// ParseDType returns the dtype whose ggml name (case-insensitive) is s.
func ParseDType(s string) (DType, error) {
	for d, in := range infos {
		if equalFold(in.name, s) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown dtype %q", s)
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		ca, cb := a[i], b[i]
		if 'A' <= ca && ca <= 'Z' {
			ca += 'a' - 'A'
		}
		if 'A' <= cb && cb <= 'Z' {
			cb += 'a' - 'A'
		}
		if ca != cb {
			return false
		}
	}
	return true
}
