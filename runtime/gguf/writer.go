package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/parleyhq/parley/internal/outfile"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Writer builds a GGUF file in memory order: metadata in the order keys were first set, tensors
// in the order they were added, each tensor's data at the next multiple of the alignment. Its
// output depends only on what was set and added. The alignment is DefaultAlignment unless a
// general.alignment uint32 entry is set.
type Writer struct {
	version uint32
	kvs     []KV
	kvIndex map[string]int
	tensors []wtensor
	names   map[string]bool
}

type wtensor struct {
	info TensorInfo
	data []byte
}

// NewWriter returns an empty Writer for version 3 with alignment 32.
func NewWriter() *Writer {
	return &Writer{version: 3, kvIndex: map[string]int{}, names: map[string]bool{}}
}

// SetVersion selects the file version, 2 or 3 (the layouts are identical little-endian); other
// values make WriteTo fail.
func (w *Writer) SetVersion(v uint32) { w.version = v }

// Set stores v under key, replacing an existing value in place. A value whose V does not match
// its Type/Elem makes WriteTo fail.
func (w *Writer) Set(key string, v Value) {
	if i, ok := w.kvIndex[key]; ok {
		w.kvs[i].Value = v
		return
	}
	w.kvIndex[key] = len(w.kvs)
	w.kvs = append(w.kvs, KV{Key: key, Value: v})
}

// SetString stores a string.
func (w *Writer) SetString(key, v string) { w.Set(key, Value{Type: String, V: v}) }

// SetUint32 stores a uint32.
func (w *Writer) SetUint32(key string, v uint32) { w.Set(key, Value{Type: Uint32, V: v}) }

// SetInt32 stores an int32.
func (w *Writer) SetInt32(key string, v int32) { w.Set(key, Value{Type: Int32, V: v}) }

// SetFloat32 stores a float32.
func (w *Writer) SetFloat32(key string, v float32) { w.Set(key, Value{Type: Float32, V: v}) }

// SetBool stores a bool.
func (w *Writer) SetBool(key string, v bool) { w.Set(key, Value{Type: Bool, V: v}) }

// SetStrings stores an array of strings (the slice is kept, not copied).
func (w *Writer) SetStrings(key string, v []string) {
	w.Set(key, Value{Type: Array, Elem: String, V: v})
}

// SetFloats stores an array of float32 (the slice is kept, not copied).
func (w *Writer) SetFloats(key string, v []float32) {
	w.Set(key, Value{Type: Array, Elem: Float32, V: v})
}

// SetInt32s stores an array of int32 (the slice is kept, not copied).
func (w *Writer) SetInt32s(key string, v []int32) {
	w.Set(key, Value{Type: Array, Elem: Int32, V: v})
}

// AddTensor appends a tensor. shape is in ggml order (shape[0] elements per row, 1 to 4
// dimensions, each >= 0) and data must hold exactly dt.RowSize(shape[0]) * rows bytes. data is
// kept, not copied, until WriteTo.
func (w *Writer) AddTensor(name string, dt tensor.DType, shape []int64, data []byte) error {
	if len(name) > MaxNameLen {
		return fmt.Errorf("gguf: tensor %q: name is %d bytes long, the limit is %d", name, len(name), MaxNameLen)
	}
	if w.names[name] {
		return fmt.Errorf("gguf: tensor %q: added twice", name)
	}
	if !dt.Known() {
		return fmt.Errorf("gguf: tensor %q: unknown dtype %v", name, dt)
	}
	if len(shape) == 0 || len(shape) > MaxDims {
		return fmt.Errorf("gguf: tensor %q: %d dimensions, want 1 to %d", name, len(shape), MaxDims)
	}
	rows := int64(1)
	for j, n := range shape {
		if n < 0 {
			return fmt.Errorf("gguf: tensor %q: dimension %d is negative (%d)", name, j, n)
		}
		if j > 0 {
			if n != 0 && rows > math.MaxInt64/n {
				return fmt.Errorf("gguf: tensor %q: element count of shape %v overflows", name, shape)
			}
			rows *= n
		}
	}
	rowSize, err := dt.RowSize(shape[0])
	if err != nil {
		return fmt.Errorf("gguf: tensor %q: %v", name, err)
	}
	if rows != 0 && rowSize > math.MaxInt64/rows {
		return fmt.Errorf("gguf: tensor %q: byte size of shape %v overflows", name, shape)
	}
	size := rowSize * rows
	if int64(len(data)) != size {
		return fmt.Errorf("gguf: tensor %q: %d bytes of data, shape %v of %v needs %d", name, len(data), shape, dt, size)
	}
	w.names[name] = true
	w.tensors = append(w.tensors, wtensor{
		info: TensorInfo{Name: name, DType: dt, Shape: append([]int64(nil), shape...), Size: size},
		data: data,
	})
	return nil
}

// alignment returns the alignment the file will declare.
func (w *Writer) alignment() (int64, error) {
	i, ok := w.kvIndex["general.alignment"]
	if !ok {
		return DefaultAlignment, nil
	}
	v := w.kvs[i].Value
	a, isU32 := v.V.(uint32)
	if v.Type != Uint32 || !isU32 {
		return 0, fmt.Errorf("gguf: general.alignment must be a uint32, not %v", v.Type)
	}
	if a == 0 || a&(a-1) != 0 {
		return 0, fmt.Errorf("gguf: general.alignment %d is not a power of two", a)
	}
	return int64(a), nil
}

// WriteTo writes the file to out and returns the number of bytes written.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	if w.version != 2 && w.version != 3 {
		return 0, fmt.Errorf("gguf: cannot write version %d (supported: 2, 3)", w.version)
	}
	align, err := w.alignment()
	if err != nil {
		return 0, err
	}
	le := binary.LittleEndian
	h := []byte("GGUF")
	h = le.AppendUint32(h, w.version)
	h = le.AppendUint64(h, uint64(len(w.tensors)))
	h = le.AppendUint64(h, uint64(len(w.kvs)))
	for _, kv := range w.kvs {
		if kv.Key == "" {
			return 0, errors.New("gguf: empty metadata key")
		}
		h = appendString(h, kv.Key)
		h = le.AppendUint32(h, uint32(kv.Value.Type))
		if h, err = appendValue(h, kv.Value, 0); err != nil {
			return 0, fmt.Errorf("gguf: metadata %q: %w", kv.Key, err)
		}
	}
	var off int64
	for _, t := range w.tensors {
		h = appendString(h, t.info.Name)
		h = le.AppendUint32(h, uint32(len(t.info.Shape)))
		for _, n := range t.info.Shape {
			h = le.AppendUint64(h, uint64(n))
		}
		h = le.AppendUint32(h, uint32(t.info.DType))
		h = le.AppendUint64(h, uint64(off))
		off += alignUp(t.info.Size, align)
	}
	h = append(h, make([]byte, alignUp(int64(len(h)), align)-int64(len(h)))...)

	bw := bufio.NewWriterSize(out, 1<<16)
	total, err := bw.Write(h)
	n := int64(total)
	if err != nil {
		return n, err
	}
	pad := make([]byte, align)
	for _, t := range w.tensors {
		k, err := bw.Write(t.data)
		n += int64(k)
		if err != nil {
			return n, err
		}
		k, err = bw.Write(pad[:alignUp(t.info.Size, align)-t.info.Size])
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	return n, bw.Flush()
}

// WriteFile writes the file to path, replacing an existing file.
func (w *Writer) WriteFile(path string) error { return outfile.Write(path, w) }

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// appendValue appends the encoding of v without its type field (which a metadata entry carries
// and an element of an array of arrays does not).
func appendValue(b []byte, v Value, depth int) ([]byte, error) {
	switch v.Type {
	case Uint8:
		return appendScalar(b, v, putUint8)
	case Int8:
		return appendScalar(b, v, putInt8)
	case Bool:
		return appendScalar(b, v, putBool)
	case Uint16:
		return appendScalar(b, v, binary.LittleEndian.AppendUint16)
	case Int16:
		return appendScalar(b, v, putInt16)
	case Uint32:
		return appendScalar(b, v, binary.LittleEndian.AppendUint32)
	case Int32:
		return appendScalar(b, v, putInt32)
	case Float32:
		return appendScalar(b, v, putFloat32)
	case Uint64:
		return appendScalar(b, v, binary.LittleEndian.AppendUint64)
	case Int64:
		return appendScalar(b, v, putInt64)
	case Float64:
		return appendScalar(b, v, putFloat64)
	case String:
		return appendScalar(b, v, appendString)
	case Array:
		return appendArray(b, v, depth)
	}
	return b, fmt.Errorf("invalid value type %d", uint32(v.Type))
}

// The little-endian encodings of GGUF's fixed-size types, shared by single values and arrays.
func putUint8(b []byte, x uint8) []byte { return append(b, x) }
func putInt8(b []byte, x int8) []byte   { return append(b, byte(x)) }
func putInt16(b []byte, x int16) []byte { return binary.LittleEndian.AppendUint16(b, uint16(x)) }
func putInt32(b []byte, x int32) []byte { return binary.LittleEndian.AppendUint32(b, uint32(x)) }
func putInt64(b []byte, x int64) []byte { return binary.LittleEndian.AppendUint64(b, uint64(x)) }

func putFloat32(b []byte, x float32) []byte {
	return binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
}

func putFloat64(b []byte, x float64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
}

func putBool(b []byte, x bool) []byte {
	if x {
		return append(b, 1)
	}
	return append(b, 0)
}

// appendScalar appends v.V encoded by put, or fails if v.V is not a T.
func appendScalar[T any](b []byte, v Value, put func([]byte, T) []byte) ([]byte, error) {
	x, ok := v.V.(T)
	if !ok {
		return b, fmt.Errorf("%v value holds %T", v.Type, v.V)
	}
	return put(b, x), nil
}

// appendElems appends the count and the elements of v, a []T, each encoded by put; it reports
// false if v is not a []T.
func appendElems[T any](b []byte, v any, put func([]byte, T) []byte) ([]byte, bool) {
	s, ok := v.([]T)
	if !ok {
		return b, false
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
	for _, x := range s {
		b = put(b, x)
	}
	return b, true
}

func appendArray(b []byte, v Value, depth int) ([]byte, error) {
	le := binary.LittleEndian
	b = le.AppendUint32(b, uint32(v.Elem))
	var ok bool
	switch v.Elem {
	case Uint8:
		var s []uint8
		if s, ok = v.V.([]uint8); ok {
			b = le.AppendUint64(b, uint64(len(s)))
			b = append(b, s...)
		}
	case Int8:
		b, ok = appendElems(b, v.V, putInt8)
	case Bool:
		b, ok = appendElems(b, v.V, putBool)
	case Uint16:
		b, ok = appendElems(b, v.V, le.AppendUint16)
	case Int16:
		b, ok = appendElems(b, v.V, putInt16)
	case Uint32:
		b, ok = appendElems(b, v.V, le.AppendUint32)
	case Int32:
		b, ok = appendElems(b, v.V, putInt32)
	case Float32:
		b, ok = appendElems(b, v.V, putFloat32)
	case Uint64:
		b, ok = appendElems(b, v.V, le.AppendUint64)
	case Int64:
		b, ok = appendElems(b, v.V, putInt64)
	case Float64:
		b, ok = appendElems(b, v.V, putFloat64)
	case String:
		b, ok = appendElems(b, v.V, appendString)
	case Array:
		if depth+1 >= maxNesting {
			return b, fmt.Errorf("arrays nested more than %d deep", maxNesting)
		}
		var s []Value
		if s, ok = v.V.([]Value); ok {
			b = le.AppendUint64(b, uint64(len(s)))
			for i, x := range s {
				if x.Type != Array {
					return b, fmt.Errorf("element %d of an array of arrays is a %v", i, x.Type)
				}
				var err error
				if b, err = appendArray(b, x, depth+1); err != nil {
					return b, fmt.Errorf("element %d: %w", i, err)
				}
			}
		}
	default:
		return b, fmt.Errorf("invalid array element type %d", uint32(v.Elem))
	}
	if !ok {
		return b, fmt.Errorf("array of %v holds %T", v.Elem, v.V)
	}
	return b, nil
}
