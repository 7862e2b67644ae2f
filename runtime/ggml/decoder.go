package ggml

import (
	"encoding/binary"
	"math"
)

// Decoder reads a ggml container held in memory field by field, for files that share the
// container (magic, little-endian fields, tensor records to the end) but not Whisper's header:
// whisper.cpp's Parakeet files. Every method checks the bytes left before it reads, allocates
// nothing a count in the file asks for before the bytes confirm it, and reports a malformed input
// as a *FormatError carrying the offset.
type Decoder struct{ d decoder }

// NewDecoder returns a Decoder at the start of b.
func NewDecoder(b []byte) *Decoder { return &Decoder{d: decoder{b: b}} }

// Offset is the offset of the next field.
func (d *Decoder) Offset() int { return d.d.off }

// Left is the number of bytes after Offset.
func (d *Decoder) Left() int { return d.d.left() }

// err turns a nil *FormatError into a nil error.
func err(e *FormatError) error {
	if e == nil {
		return nil
	}
	return e
}

// Magic reads the magic and checks it.
func (d *Decoder) Magic() error {
	b := d.d.b
	m, ok := d.d.i32()
	if !ok {
		return d.d.truncated(4, "magic")
	}
	switch uint32(m) {
	case Magic:
		return nil
	case 0x6c6d6767:
		return errAt(0, "magic %q is byte-swapped: big-endian files are not supported", b[:4])
	}
	return errAt(0, "bad magic %q (0x%08x), want 0x%08x (\"lmgg\" on disk)", b[:4], uint32(m), Magic)
}

// Int32 reads an int32; what names it in an error.
func (d *Decoder) Int32(what string) (int32, error) {
	v, ok := d.d.i32()
	if !ok {
		return 0, d.d.truncated(4, what)
	}
	return v, nil
}

// Uint32s reads n uint32s.
func (d *Decoder) Uint32s(n int, what string) ([]uint32, error) {
	if n < 0 || n > d.d.left()/4 {
		return nil, d.d.truncated(4*max(n, 0), what)
	}
	out := make([]uint32, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(d.d.b[d.d.off+4*i:])
	}
	d.d.off += 4 * n
	return out, nil
}

// Float32Array reads an int32 count n, then n float32s.
func (d *Decoder) Float32Array(what string) ([]float32, error) {
	n, e := d.d.count(what+" length", 4)
	if e != nil {
		return nil, e
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(d.d.b[d.d.off+4*i:]))
	}
	d.d.off += 4 * n
	return out, nil
}

// Filters reads a mel filter bank: int32 n_mel, int32 n_fft (bins per filter), n_mel*n_fft
// float32s.
func (d *Decoder) Filters() (Filters, error) {
	var fl Filters
	return fl, err(d.d.filters(&fl))
}

// Vocab reads int32 n, then n tokens of uint32 length and bytes; the tokens share one buffer.
func (d *Decoder) Vocab() ([][]byte, error) {
	v, e := d.d.vocab()
	return v, err(e)
}

// Tensors reads tensor records admitted by r until the end of the bytes and returns them in file
// order with an index by name; names are unique. Tensor data aliases the decoder's bytes.
func (d *Decoder) Tensors(r TensorRules) ([]Tensor, map[string]int, error) {
	ts, index, e := d.d.tensors(r)
	return ts, index, err(e)
}
