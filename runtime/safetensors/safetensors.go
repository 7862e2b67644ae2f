// Package safetensors reads and writes safetensors files: an 8-byte little-endian header length,
// a JSON header naming each tensor's dtype, shape and byte range, then the tensors' bytes.
//
// Open memory-maps a file read-only (mapfile, as the GGUF reader does) and validates the whole
// layout before returning; tensor data is never copied, Data returns slices of the mapping. Parse
// does the same over bytes already in memory. The checks are those of the reference
// implementation (huggingface/safetensors) and a few more: the header is at most MaxHeaderSize
// bytes of UTF-8 JSON, an object whose keys appear once; every tensor has exactly dtype, shape and
// data_offsets; the dtype is known; the shape's element count times the dtype's size equals the
// byte range's length; the byte ranges, sorted, tile the data section from its first byte to the
// file's last with no gap and no overlap. Every malformed input yields an error wrapping
// ErrFormat.
//
// Shapes are in PyTorch's order, outermost first ([rows, columns] for a matrix), the reverse of
// GGUF's. Multi-byte values are little-endian.
package safetensors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/parleyhq/parley/internal/mapfile"
)

// MaxHeaderSize is the largest JSON header accepted, in bytes (the reference implementation's
// limit).
const MaxHeaderSize = 100_000_000

// MaxDims is the most dimensions a tensor may have here.
const MaxDims = 16

// ErrFormat is wrapped by every error that reports a malformed file.
var ErrFormat = errors.New("safetensors: malformed file")

// FormatError reports a malformed file.
type FormatError struct{ Msg string }

func (e *FormatError) Error() string { return "safetensors: " + e.Msg }

// Unwrap returns ErrFormat.
func (e *FormatError) Unwrap() error { return ErrFormat }

func formatErr(format string, args ...any) *FormatError {
	return &FormatError{Msg: fmt.Sprintf(format, args...)}
}

// DType is a safetensors element type, by its name in the header ("F32", "BF16", ...).
type DType string

// The element types the format defines.
const (
	Bool    DType = "BOOL"
	U8      DType = "U8"
	I8      DType = "I8"
	F8E5M2  DType = "F8_E5M2"
	F8E4M3  DType = "F8_E4M3"
	I16     DType = "I16"
	U16     DType = "U16"
	F16     DType = "F16"
	BF16    DType = "BF16"
	I32     DType = "I32"
	U32     DType = "U32"
	F32     DType = "F32"
	F64     DType = "F64"
	I64     DType = "I64"
	U64     DType = "U64"
	unknown DType = ""
)

var dtypeSizes = map[DType]int{
	Bool: 1, U8: 1, I8: 1, F8E5M2: 1, F8E4M3: 1,
	I16: 2, U16: 2, F16: 2, BF16: 2,
	I32: 4, U32: 4, F32: 4,
	F64: 8, I64: 8, U64: 8,
}

// Size returns the bytes of one element of d, or 0 if d is not a known type.
func (d DType) Size() int { return dtypeSizes[d] }

// Known reports whether d is a type the format defines.
func (d DType) Known() bool { return dtypeSizes[d] != 0 }

// Tensor describes one tensor of a file.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64 // outermost first; empty for a scalar
	// Offset and Size locate the tensor's bytes from the start of the data section (the byte
	// after the header).
	Offset, Size int64
}

// Elements returns the number of elements of t (the product of its shape; 1 for a scalar).
func (t *Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is a parsed safetensors file. Its header values stay valid after Close; slices returned by
// Data alias the file's bytes and must not be used after Close.
type File struct {
	// Metadata is the header's "__metadata__" object (string to string), or nil.
	Metadata map[string]string
	// Tensors are in the order of their bytes in the file.
	Tensors []Tensor

	data       []byte // the whole file
	dataOffset int64  // 8 + header length
	index      map[string]int
	mapped     *mapfile.File
}

// Open memory-maps the file at path read-only (reads it where there is no mapping) and parses it.
// The file must not be truncated while it is open.
func Open(path string) (*File, error) {
	f, m, err := mapfile.OpenParsed(path, "safetensors", Parse)
	if err != nil {
		return nil, err
	}
	f.mapped = m
	return f, nil
}

// Close releases the file's mapping. Closing twice is a no-op.
func (f *File) Close() error {
	m := f.mapped
	f.mapped, f.data = nil, nil
	if m == nil {
		return nil
	}
	return m.Close()
}

// Release tells the system that b, tensor data of f that the caller has copied, need not stay
// resident (see mapfile.File.Release). A no-op for parsed buffers.
func (f *File) Release(b []byte) {
	if f.mapped != nil {
		f.mapped.Release(b)
	}
}

// DataOffset returns the byte offset of the data section from the start of the file.
func (f *File) DataOffset() int64 { return f.dataOffset }

// Tensor returns the tensor named name.
func (f *File) Tensor(name string) (*Tensor, bool) {
	i, ok := f.index[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// Data returns the bytes of t (len == t.Size) as a read-only slice of the file, or nil if the
// file is closed or t does not lie within it. Writing to the slice of an opened file faults.
func (f *File) Data(t *Tensor) []byte {
	if f.data == nil || t == nil || t.Offset < 0 || t.Size < 0 {
		return nil
	}
	avail := int64(len(f.data)) - f.dataOffset
	if t.Offset > avail || t.Size > avail-t.Offset {
		return nil
	}
	s := f.dataOffset + t.Offset
	return f.data[s : s+t.Size : s+t.Size]
}

// Float32s returns t's values converted to float32 in a new slice: F32, F16 and BF16 exactly, F64
// rounded to nearest.
func (f *File) Float32s(t *Tensor) ([]float32, error) {
	b := f.Data(t)
	if b == nil && t.Size > 0 {
		return nil, fmt.Errorf("safetensors: tensor %q: no data (file closed?)", t.Name)
	}
	if t.Elements() > math.MaxInt32*8 {
		return nil, fmt.Errorf("safetensors: tensor %q: %d elements is too many to convert", t.Name, t.Elements())
	}
	out := make([]float32, t.Elements())
	le := binary.LittleEndian
	switch t.DType {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
	case F16:
		for i := range out {
			out[i] = HalfToFloat32(le.Uint16(b[2*i:]))
		}
	case BF16:
		for i := range out {
			out[i] = math.Float32frombits(uint32(le.Uint16(b[2*i:])) << 16)
		}
	case F64:
		for i := range out {
			out[i] = float32(math.Float64frombits(le.Uint64(b[8*i:])))
		}
	default:
		return nil, fmt.Errorf("safetensors: tensor %q is %s, not a floating-point type", t.Name, t.DType)
	}
	return out, nil
}

// Int64s returns t's values as int64 in a new slice: any signed or unsigned integer type (a U64
// above math.MaxInt64 is an error).
func (f *File) Int64s(t *Tensor) ([]int64, error) {
	b := f.Data(t)
	if b == nil && t.Size > 0 {
		return nil, fmt.Errorf("safetensors: tensor %q: no data (file closed?)", t.Name)
	}
	n := t.Elements()
	if n > math.MaxInt32*8 {
		return nil, fmt.Errorf("safetensors: tensor %q: %d elements is too many to convert", t.Name, n)
	}
	out := make([]int64, n)
	le := binary.LittleEndian
	for i := range out {
		switch t.DType {
		case I64:
			out[i] = int64(le.Uint64(b[8*i:]))
		case U64:
			v := le.Uint64(b[8*i:])
			if v > math.MaxInt64 {
				return nil, fmt.Errorf("safetensors: tensor %q: element %d (%d) overflows int64", t.Name, i, v)
			}
			out[i] = int64(v)
		case I32:
			out[i] = int64(int32(le.Uint32(b[4*i:])))
		case U32:
			out[i] = int64(le.Uint32(b[4*i:]))
		case I16:
			out[i] = int64(int16(le.Uint16(b[2*i:])))
		case U16:
			out[i] = int64(le.Uint16(b[2*i:]))
		case I8:
			out[i] = int64(int8(b[i]))
		case U8, Bool:
			out[i] = int64(b[i])
		default:
			return nil, fmt.Errorf("safetensors: tensor %q is %s, not an integer type", t.Name, t.DType)
		}
	}
	return out, nil
}

// HalfToFloat32 converts an IEEE 754 binary16 value to float32 exactly.
func HalfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// subnormal: mant·2^-24
	f := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		f = -f
	}
	return f
}

// Parse parses a whole safetensors file held in b. The returned File aliases b.
func Parse(b []byte) (*File, error) {
	if len(b) < 8 {
		return nil, formatErr("%d bytes is too short for the 8-byte header length", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > MaxHeaderSize {
		return nil, formatErr("header length %d exceeds the limit of %d bytes", n, MaxHeaderSize)
	}
	if n > uint64(len(b)-8) {
		return nil, formatErr("header length %d runs past the end of the %d-byte file", n, len(b))
	}
	h, err := parseHeader(b[8 : 8+n])
	if err != nil {
		return nil, err
	}
	f := &File{Metadata: h.metadata, Tensors: h.tensors, data: b, dataOffset: int64(8 + n), index: make(map[string]int, len(h.tensors))}
	slices.SortStableFunc(f.Tensors, func(x, y Tensor) int {
		switch {
		case x.Offset < y.Offset:
			return -1
		case x.Offset > y.Offset:
			return 1
		case x.Size < y.Size: // empty tensors first at a shared offset
			return -1
		case x.Size > y.Size:
			return 1
		}
		return 0
	})
	avail := int64(len(b)) - f.dataOffset
	var end int64
	for i, t := range f.Tensors {
		if t.Offset != end {
			if t.Offset < end {
				return nil, formatErr("tensor %q: bytes [%d, %d) overlap the previous tensor's, which end at %d", t.Name, t.Offset, t.Offset+t.Size, end)
			}
			return nil, formatErr("tensor %q: bytes start at %d, leaving a gap after the previous tensor's end at %d", t.Name, t.Offset, end)
		}
		end = t.Offset + t.Size
		if end > avail {
			return nil, formatErr("tensor %q: bytes [%d, %d) run past the %d-byte data section", t.Name, t.Offset, end, avail)
		}
		f.index[t.Name] = i
	}
	if end != avail {
		return nil, formatErr("the tensors cover %d bytes of the %d-byte data section", end, avail)
	}
	return f, nil
}
