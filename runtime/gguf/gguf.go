// Package gguf reads and writes GGUF files (versions 2 and 3, little-endian): the metadata
// key/value table, the tensor-info table and the tensor data section.
//
// Open memory-maps a file read-only and validates its whole layout before returning; tensor data
// is never copied, TensorData returns slices of the mapping. Parse does the same over bytes already
// in memory. Every malformed input yields an error wrapping ErrFormat (a *FormatError carrying the
// byte offset where the problem was found); no header value is trusted to size an allocation
// before it has been checked against the bytes that remain.
//
// Metadata strings are kept byte for byte (they need not be valid UTF-8). Tensor dtypes must be
// ones tensor.DType knows how to lay out; whether a backend can compute with them is not checked
// here.
package gguf

import (
	"errors"
	"fmt"
	"math"

	"github.com/parleyhq/parley/internal/mapfile"
	"github.com/parleyhq/parley/runtime/tensor"
)

// ValueType is a GGUF metadata value type.
type ValueType uint32

// GGUF metadata value types (gguf.md, enum gguf_metadata_value_type).
const (
	Uint8   ValueType = 0
	Int8    ValueType = 1
	Uint16  ValueType = 2
	Int16   ValueType = 3
	Uint32  ValueType = 4
	Int32   ValueType = 5
	Float32 ValueType = 6
	Bool    ValueType = 7
	String  ValueType = 8
	Array   ValueType = 9
	Uint64  ValueType = 10
	Int64   ValueType = 11
	Float64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
	"bool", "string", "array", "uint64", "int64", "float64"}

// String returns the GGUF name of t ("uint32", "string", ...), or "type(N)" if t is not defined.
func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// Valid reports whether t is a defined GGUF value type.
func (t ValueType) Valid() bool { return t <= Float64 }

// minSize is the smallest encoding of one value of type t: fixed-size scalars take their size, a
// string its 8-byte length, an array its 4-byte element type and 8-byte count.
func (t ValueType) minSize() int {
	switch t {
	case Uint8, Int8, Bool:
		return 1
	case Uint16, Int16:
		return 2
	case Uint32, Int32, Float32:
		return 4
	case Uint64, Int64, Float64, String:
		return 8
	case Array:
		return 12
	}
	return 0
}

// Value is one metadata value. Scalars hold the Go value in V (uint8, int8, uint16, int16, uint32,
// int32, float32, bool, string, uint64, int64, float64); arrays hold a typed slice ([]uint8 ...
// []string, or []Value for arrays of arrays, each element itself an Array Value) with
// Type == Array and Elem the element type. Elem is meaningless for scalars.
type Value struct {
	Type, Elem ValueType
	V          any
}

// KV is one metadata entry.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name  string
	DType tensor.DType
	// Shape is in ggml order: Shape[0] is the number of elements in a row (ne0). It has 1 to 4
	// entries, each >= 0; a record with zero dimensions (a scalar to ggml) reads as [1].
	Shape  []int64
	Offset int64 // from the start of the data section; a multiple of the file's alignment
	Size   int64 // bytes
	part   int   // 0: the file's own; i: in parts[i-1], the split model's file i+1
}

// Elements returns the number of elements of t (the product of its shape).
func (t *TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Rows returns the number of rows of t: the product of Shape[1:].
func (t *TensorInfo) Rows() int64 {
	n := int64(1)
	for i := 1; i < len(t.Shape); i++ {
		n *= t.Shape[i]
	}
	return n
}

// DefaultAlignment is the data alignment of a file without a general.alignment key.
const DefaultAlignment = 32

// MaxDims is the most dimensions a tensor may have (GGML_MAX_DIMS).
const MaxDims = 4

// MaxNameLen is the longest tensor name ggml accepts, in bytes (GGML_MAX_NAME - 1).
const MaxNameLen = 63

// maxNesting bounds arrays of arrays so that a hostile file cannot drive the reader into deep
// recursion.
const maxNesting = 8

// ErrFormat is wrapped by every error that reports a malformed file.
var ErrFormat = errors.New("gguf: malformed file")

// FormatError reports a malformed file: what is wrong and the byte offset (from the start of the
// file) where it was found.
type FormatError struct {
	Offset int64
	Msg    string
}

func (e *FormatError) Error() string { return "gguf: " + e.Msg }

// Unwrap returns ErrFormat.
func (e *FormatError) Unwrap() error { return ErrFormat }

// File is a parsed GGUF file. Its metadata and tensor table are plain Go values that stay valid
// after Close; slices returned by TensorData alias the file's bytes and must not be used after
// Close.
type File struct {
	Version   uint32
	Alignment int64
	KVs       []KV         // in file order
	Tensors   []TensorInfo // in file order

	data       []byte        // the whole file
	dataOffset int64         // start of the data section within data
	mapped     *mapfile.File // the mapping to release on Close, if any
	parts      []split       // a split model's further files (split.go)
	kvIndex    map[string]int
	tensorIdx  map[string]int
}

// DataOffset returns the byte offset of the data section from the start of the file; a tensor's
// bytes start at DataOffset() + Offset (a split model's tensors of its first file only).
func (f *File) DataOffset() int64 { return f.dataOffset }

// Tensor returns the tensor named name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tensorIdx[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorData returns the bytes of t (len == t.Size) as a read-only slice of the file. It returns
// nil if the file is closed or t does not lie within the data section. Writing to the slice of an
// opened file faults: the mapping is read-only.
func (f *File) TensorData(t *TensorInfo) []byte {
	if f.data == nil || t == nil || t.Offset < 0 || t.Size < 0 {
		return nil
	}
	data, off := f.data, f.dataOffset
	if t.part > 0 {
		if t.part > len(f.parts) {
			return nil
		}
		data, off = f.parts[t.part-1].data, f.parts[t.part-1].dataOffset
	}
	avail := int64(len(data)) - off
	if t.Offset > avail || t.Size > avail-t.Offset {
		return nil
	}
	start := off + t.Offset
	return data[start : start+t.Size : start+t.Size]
}

// Release tells the system that b, tensor data of f that the caller has copied, need not stay
// resident (see mapfile.File.Release); the bytes stay readable. A no-op for parsed buffers.
func (f *File) Release(b []byte) {
	if f.mapped != nil {
		f.mapped.Release(b)
	}
	for _, p := range f.parts {
		p.mapped.Release(b) // a no-op outside its mapping
	}
}

// Value returns the value stored under key.
func (f *File) Value(key string) (Value, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return Value{}, false
	}
	return f.KVs[i].Value, true
}

// String returns the string stored under key.
func (f *File) String(key string) (string, bool) {
	v, ok := f.Value(key)
	if !ok || v.Type != String {
		return "", false
	}
	s, ok := v.V.(string)
	return s, ok
}

// Int returns the integer stored under key, of any integer type; a uint64 above math.MaxInt64
// is reported as absent.
func (f *File) Int(key string) (int64, bool) {
	v, ok := f.Value(key)
	if !ok {
		return 0, false
	}
	return scalarInt(v.V)
}

func scalarInt(x any) (int64, bool) {
	switch x := x.(type) {
	case uint8:
		return int64(x), true
	case int8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case int16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case int32:
		return int64(x), true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}

// Float returns the number stored under key: a float32 or float64, or an integer converted.
func (f *File) Float(key string) (float64, bool) {
	v, ok := f.Value(key)
	if !ok {
		return 0, false
	}
	switch x := v.V.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	case uint64:
		return float64(x), true
	}
	n, ok := scalarInt(v.V)
	return float64(n), ok
}

// Bool returns the bool stored under key.
func (f *File) Bool(key string) (bool, bool) {
	v, ok := f.Value(key)
	if !ok {
		return false, false
	}
	b, ok := v.V.(bool)
	return b, ok
}

// Strings returns the array of strings stored under key. The slice is the file's own: callers
// must not modify it.
func (f *File) Strings(key string) ([]string, bool) {
	v, ok := f.Value(key)
	if !ok {
		return nil, false
	}
	s, ok := v.V.([]string)
	return s, ok
}

// Ints returns the array of integers (of any integer type) stored under key, as a new slice. An
// array holding a uint64 above math.MaxInt64 is reported as absent.
func (f *File) Ints(key string) ([]int64, bool) {
	v, ok := f.Value(key)
	if !ok {
		return nil, false
	}
	switch x := v.V.(type) {
	case []uint8:
		return convertInts(x), true
	case []int8:
		return convertInts(x), true
	case []uint16:
		return convertInts(x), true
	case []int16:
		return convertInts(x), true
	case []uint32:
		return convertInts(x), true
	case []int32:
		return convertInts(x), true
	case []int64:
		return append([]int64(nil), x...), true
	case []uint64:
		out := make([]int64, len(x))
		for i, e := range x {
			if e > math.MaxInt64 {
				return nil, false
			}
			out[i] = int64(e)
		}
		return out, true
	}
	return nil, false
}

func convertInts[T uint8 | int8 | uint16 | int16 | uint32 | int32](s []T) []int64 {
	out := make([]int64, len(s))
	for i, e := range s {
		out[i] = int64(e)
	}
	return out
}

// Floats returns the array of float32 (or float64, converted) stored under key. A float32 array
// is returned as the file's own slice: callers must not modify it.
func (f *File) Floats(key string) ([]float32, bool) {
	v, ok := f.Value(key)
	if !ok {
		return nil, false
	}
	switch x := v.V.(type) {
	case []float32:
		return x, true
	case []float64:
		out := make([]float32, len(x))
		for i, e := range x {
			out[i] = float32(e)
		}
		return out, true
	}
	return nil, false
}

// Architecture returns the value of "general.architecture", or "".
func (f *File) Architecture() string {
	s, _ := f.String("general.architecture")
	return s
}
