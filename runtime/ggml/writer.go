package ggml

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Writer streams a model file: NewWriter writes the header, filters and vocabulary, each
// WriteTensor appends one tensor record, Flush writes out what is buffered. Everything is checked
// before it is written, so a file the Writer produces always parses. A Writer is not safe for
// concurrent use.
type Writer struct {
	w     *bufio.Writer
	names map[string]bool
	rules TensorRules
	err   error // the first write error; sticky
}

// NewRecordWriter writes header as it is to w and returns a Writer that appends tensor records
// admitted by r, for files that share the container but not Whisper's header (whisper.cpp's
// Parakeet files). The header is the caller's to get right.
func NewRecordWriter(w io.Writer, header []byte, r TensorRules) (*Writer, error) {
	wr := &Writer{w: bufio.NewWriterSize(w, 1<<16), names: map[string]bool{}, rules: r}
	if _, err := wr.w.Write(header); err != nil {
		wr.err = err
		return nil, err
	}
	return wr, nil
}

// NewWriter checks hp, filters and vocab and writes them to w.
func NewWriter(w io.Writer, hp HParams, filters Filters, vocab [][]byte) (*Writer, error) {
	if i, why := hp.check(); i >= 0 {
		return nil, fmt.Errorf("ggml: hyperparameter %s: %s", hparamNames[i], why)
	}
	if filters.NMel < 0 || filters.NFFT < 0 || filters.NMel > math.MaxInt32 || filters.NFFT > math.MaxInt32 {
		return nil, fmt.Errorf("ggml: mel filters: size %d x %d is out of range", filters.NMel, filters.NFFT)
	}
	if int64(len(filters.Data)) != int64(filters.NMel)*int64(filters.NFFT) {
		return nil, fmt.Errorf("ggml: mel filters: %d values, %d x %d needs %d",
			len(filters.Data), filters.NMel, filters.NFFT, int64(filters.NMel)*int64(filters.NFFT))
	}
	if len(vocab) > math.MaxInt32 {
		return nil, fmt.Errorf("ggml: %d tokens is too many", len(vocab))
	}
	for i, tok := range vocab {
		if uint64(len(tok)) > math.MaxUint32 {
			return nil, fmt.Errorf("ggml: token %d: %d bytes is too long", i, len(tok))
		}
	}

	wr := &Writer{w: bufio.NewWriterSize(w, 1<<16), names: map[string]bool{}}
	le := binary.LittleEndian
	h := make([]byte, 0, 56+4*len(filters.Data))
	h = le.AppendUint32(h, Magic)
	for _, p := range hp.fields() {
		h = le.AppendUint32(h, uint32(int32(*p)))
	}
	h = le.AppendUint32(h, uint32(filters.NMel))
	h = le.AppendUint32(h, uint32(filters.NFFT))
	for _, v := range filters.Data {
		h = le.AppendUint32(h, math.Float32bits(v))
	}
	h = le.AppendUint32(h, uint32(len(vocab)))
	for _, tok := range vocab {
		h = le.AppendUint32(h, uint32(len(tok)))
		h = append(h, tok...)
	}
	if _, err := wr.w.Write(h); err != nil {
		wr.err = err
		return nil, err
	}
	return wr, nil
}

// WriteTensor appends a tensor record. ne is in ggml order (1 to MaxDims entries, each in
// [0, MaxInt32]; none for a scalar where the Writer's rules admit scalars); dt must be one of the
// rules' types (for NewWriter F32, F16, Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0), and data must hold
// exactly dt's row size of ne[0] times the number of rows.
func (w *Writer) WriteTensor(name string, dt tensor.DType, ne []int, data []byte) error {
	if w.err != nil {
		return w.err
	}
	if len(name) == 0 || len(name) > MaxNameLen {
		return fmt.Errorf("ggml: tensor %q: name is %d bytes long, want 1 to %d", name, len(name), MaxNameLen)
	}
	if w.names[name] {
		return fmt.Errorf("ggml: tensor %q: written twice", name)
	}
	if !w.rules.accepts(dt) {
		return fmt.Errorf("ggml: tensor %q: type %v is not one whisper.cpp loads", name, dt)
	}
	if len(ne) < w.rules.minDims() || len(ne) > MaxDims {
		return fmt.Errorf("ggml: tensor %q: %d dimensions, want %d to %d", name, len(ne), w.rules.minDims(), MaxDims)
	}
	ne64 := make([]int64, len(ne))
	for j, n := range ne {
		if n < 0 || n > math.MaxInt32 {
			return fmt.Errorf("ggml: tensor %q: dimension %d (%d) is out of range", name, j, n)
		}
		ne64[j] = int64(n)
	}
	size, err := dataSize(dt, ne64)
	if err != nil {
		return fmt.Errorf("ggml: tensor %q: %v", name, err)
	}
	if int64(len(data)) != size {
		return fmt.Errorf("ggml: tensor %q: %d bytes of data, shape %v of %v needs %d", name, len(data), ne, dt, size)
	}
	le := binary.LittleEndian
	h := make([]byte, 0, tensorHeader+4*MaxDims+MaxNameLen)
	h = le.AppendUint32(h, uint32(len(ne)))
	h = le.AppendUint32(h, uint32(len(name)))
	h = le.AppendUint32(h, uint32(dt))
	for _, n := range ne {
		h = le.AppendUint32(h, uint32(n))
	}
	h = append(h, name...)
	if _, err := w.w.Write(h); err != nil {
		w.err = err
		return err
	}
	if _, err := w.w.Write(data); err != nil {
		w.err = err
		return err
	}
	w.names[name] = true
	return nil
}

// Flush writes out any buffered bytes.
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	if err := w.w.Flush(); err != nil {
		w.err = err
		return err
	}
	return nil
}

// Write writes a whole file: header, filters, vocabulary, then tensors in order (their Offset is
// ignored).
func Write(w io.Writer, hp HParams, filters Filters, vocab [][]byte, tensors []Tensor) error {
	wr, err := NewWriter(w, hp, filters, vocab)
	if err != nil {
		return err
	}
	for i := range tensors {
		t := &tensors[i]
		if err := wr.WriteTensor(t.Name, t.Type, t.Ne, t.Data); err != nil {
			return err
		}
	}
	return wr.Flush()
}
