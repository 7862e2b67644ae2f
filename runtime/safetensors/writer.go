package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/parleyhq/parley/internal/outfile"
)

// Writer builds a safetensors file: tensors in the order they were added, packed with no gaps,
// the header padded with spaces to a multiple of 8 bytes (as the reference writer does, so that
// the data section starts aligned).
type Writer struct {
	metadata map[string]string
	tensors  []Tensor
	data     [][]byte
	names    map[string]bool
	size     int64
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer { return &Writer{names: map[string]bool{}} }

// SetMetadata stores a "__metadata__" entry.
func (w *Writer) SetMetadata(key, value string) {
	if w.metadata == nil {
		w.metadata = map[string]string{}
	}
	w.metadata[key] = value
}

// Add appends a tensor. shape is outermost first; data must hold exactly the shape's elements
// of dt, little-endian, and is kept (not copied) until WriteTo.
func (w *Writer) Add(name string, dt DType, shape []int64, data []byte) error {
	if name == metadataKey {
		return fmt.Errorf("safetensors: %q is reserved", name)
	}
	if w.names[name] {
		return fmt.Errorf("safetensors: tensor %q added twice", name)
	}
	if !dt.Known() {
		return fmt.Errorf("safetensors: tensor %q: unknown dtype %q", name, dt)
	}
	if len(shape) > MaxDims {
		return fmt.Errorf("safetensors: tensor %q: %d dimensions, the limit is %d", name, len(shape), MaxDims)
	}
	size := int64(dt.Size())
	for _, d := range shape {
		if d < 0 || (d != 0 && size > math.MaxInt64/d) {
			return fmt.Errorf("safetensors: tensor %q: bad shape %v", name, shape)
		}
		size *= d
	}
	if int64(len(data)) != size {
		return fmt.Errorf("safetensors: tensor %q: %d bytes of data, shape %v of %s needs %d", name, len(data), shape, dt, size)
	}
	w.names[name] = true
	w.tensors = append(w.tensors, Tensor{Name: name, DType: dt, Shape: append([]int64(nil), shape...), Offset: w.size, Size: size})
	w.data = append(w.data, data)
	w.size += size
	return nil
}

// AddFloat32 appends an F32 tensor holding v.
func (w *Writer) AddFloat32(name string, shape []int64, v []float32) error {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return w.Add(name, F32, shape, b)
}

// AddInt64 appends an I64 tensor holding v.
func (w *Writer) AddInt64(name string, shape []int64, v []int64) error {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return w.Add(name, I64, shape, b)
}

// header returns the JSON header, padded with spaces to a multiple of 8 bytes.
func (w *Writer) header() ([]byte, error) {
	var sb strings.Builder
	sb.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			sb.WriteByte(',')
		}
		first = false
	}
	quote := func(s string) error {
		b, err := json.Marshal(s)
		if err != nil {
			return err
		}
		sb.Write(b)
		return nil
	}
	if w.metadata != nil {
		sep()
		b, err := json.Marshal(w.metadata) // keys sorted
		if err != nil {
			return nil, err
		}
		sb.WriteString(`"__metadata__":`)
		sb.Write(b)
	}
	for _, t := range w.tensors {
		sep()
		if err := quote(t.Name); err != nil {
			return nil, err
		}
		fmt.Fprintf(&sb, `:{"dtype":"%s","shape":[`, t.DType)
		for i, d := range t.Shape {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, "%d", d)
		}
		fmt.Fprintf(&sb, `],"data_offsets":[%d,%d]}`, t.Offset, t.Offset+t.Size)
	}
	sb.WriteByte('}')
	for sb.Len()%8 != 0 {
		sb.WriteByte(' ')
	}
	return []byte(sb.String()), nil
}

// WriteTo writes the file to out and returns the number of bytes written.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	h, err := w.header()
	if err != nil {
		return 0, fmt.Errorf("safetensors: %w", err)
	}
	if len(h) > MaxHeaderSize {
		return 0, fmt.Errorf("safetensors: the header would be %d bytes, the limit is %d", len(h), MaxHeaderSize)
	}
	bw := bufio.NewWriterSize(out, 1<<16)
	var n int64
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(h)))
	for _, b := range append([][]byte{lenBuf[:], h}, w.data...) {
		k, err := bw.Write(b)
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	return n, bw.Flush()
}

// WriteFile writes the file to path, replacing an existing file.
func (w *Writer) WriteFile(path string) error { return outfile.Write(path, w) }
