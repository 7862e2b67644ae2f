package ggml

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Parse parses a model file held in memory. Tensor data is not copied: Tensor.Data aliases data.
func Parse(data []byte) (*File, error) {
	f, e := parse(data)
	if e != nil {
		return nil, e // keep a nil *FormatError from becoming a non-nil error
	}
	return f, nil
}

// decoder reads little-endian fields from b.
type decoder struct {
	b   []byte
	off int
}

func (d *decoder) left() int { return len(d.b) - d.off }

func errAt(off int, format string, args ...any) *FormatError {
	return &FormatError{Offset: int64(off), Msg: fmt.Sprintf(format, args...)}
}

// truncated reports that need bytes were wanted at the current offset for what.
func (d *decoder) truncated(need int, what string) *FormatError {
	return errAt(d.off, "truncated at offset %d reading %s: need %d bytes, %d left", d.off, what, need, d.left())
}

// i32 reads an int32; ok is false if fewer than 4 bytes are left.
func (d *decoder) i32() (int32, bool) {
	if d.left() < 4 {
		return 0, false
	}
	v := int32(binary.LittleEndian.Uint32(d.b[d.off:]))
	d.off += 4
	return v, true
}

// count reads an int32 that counts items of at least minSize bytes each and checks it against
// the bytes left after it.
func (d *decoder) count(what string, minSize int) (int, *FormatError) {
	at := d.off
	n, ok := d.i32()
	if !ok {
		return 0, d.truncated(4, what)
	}
	if n < 0 {
		return 0, errAt(at, "%s at offset %d is negative (%d)", what, at, n)
	}
	if int(n) > d.left()/minSize {
		return 0, errAt(at, "%s %d at offset %d: the %d bytes left hold at most %d",
			what, n, at, d.left(), d.left()/minSize)
	}
	return int(n), nil
}

const tensorHeader = 12 // n_dims, name length, type

func parse(b []byte) (*File, *FormatError) {
	d := &decoder{b: b}
	magic, ok := d.i32()
	if !ok {
		return nil, d.truncated(4, "magic")
	}
	switch uint32(magic) {
	case Magic:
	case 0x6c6d6767:
		return nil, errAt(0, "magic %q is byte-swapped: big-endian files are not supported", b[:4])
	default:
		return nil, errAt(0, "bad magic %q (0x%08x), want 0x%08x (\"lmgg\" on disk)", b[:4], uint32(magic), Magic)
	}

	f := &File{}
	hpOff := d.off
	for i, p := range f.HParams.fields() {
		v, ok := d.i32()
		if !ok {
			return nil, d.truncated(4, "hyperparameter "+hparamNames[i])
		}
		*p = int(v)
	}
	if i, why := f.HParams.check(); i >= 0 {
		return nil, errAt(hpOff+4*i, "hyperparameter %s at offset %d: %s", hparamNames[i], hpOff+4*i, why)
	}

	if e := d.filters(&f.Filters); e != nil {
		return nil, e
	}
	var e *FormatError
	if f.Vocab, e = d.vocab(); e != nil {
		return nil, e
	}

	if f.Tensors, f.index, e = d.tensors(TensorRules{}); e != nil {
		return nil, e
	}
	return f, nil
}

// tensors reads tensor records under r until the end of the bytes, and indexes them by name.
func (d *decoder) tensors(r TensorRules) ([]Tensor, map[string]int, *FormatError) {
	var ts []Tensor
	index := map[string]int{}
	for d.left() > 0 {
		rec := d.off
		t, e := d.tensor(len(ts), r)
		if e != nil {
			return nil, nil, e
		}
		if j, dup := index[t.Name]; dup {
			return nil, nil, errAt(rec, "tensor %d %q at offset %d: duplicate name (first is tensor %d)",
				len(ts), t.Name, rec, j)
		}
		index[t.Name] = len(ts)
		ts = append(ts, t)
	}
	return ts, index, nil
}

// filters reads the mel filter bank: int32 n_mel, int32 n_fft, n_mel*n_fft float32.
func (d *decoder) filters(fl *Filters) *FormatError {
	at := d.off
	nMel, ok := d.i32()
	if !ok {
		return d.truncated(4, "mel filter count")
	}
	nFFT, ok := d.i32()
	if !ok {
		return d.truncated(4, "mel filter length")
	}
	if nMel < 0 || nFFT < 0 {
		return errAt(at, "mel filters at offset %d: negative size %d x %d", at, nMel, nFFT)
	}
	n := int64(nMel) * int64(nFFT)
	if n > int64(d.left()/4) {
		return errAt(at, "mel filters at offset %d: %d x %d float32 need %d bytes, %d left",
			at, nMel, nFFT, 4*n, d.left())
	}
	fl.NMel, fl.NFFT = int(nMel), int(nFFT)
	fl.Data = make([]float32, n)
	for i := range fl.Data {
		fl.Data[i] = math.Float32frombits(binary.LittleEndian.Uint32(d.b[d.off+4*i:]))
	}
	d.off += 4 * int(n)
	return nil
}

// vocab reads int32 n, then n tokens of uint32 length and bytes. A first pass checks every
// length against the bytes left; the second copies all token bytes into one buffer that the
// tokens share.
func (d *decoder) vocab() ([][]byte, *FormatError) {
	n, e := d.count("vocabulary size", 4)
	if e != nil {
		return nil, e
	}
	off, total := d.off, 0
	for i := 0; i < n; i++ {
		if len(d.b)-off < 4 {
			d.off = off
			return nil, d.truncated(4, fmt.Sprintf("length of token %d", i))
		}
		l := binary.LittleEndian.Uint32(d.b[off:])
		if uint64(l) > uint64(len(d.b)-off-4) {
			return nil, errAt(off, "token %d at offset %d: length %d exceeds the %d bytes left",
				i, off, l, len(d.b)-off-4)
		}
		off += 4 + int(l)
		total += int(l)
	}
	buf := make([]byte, total)
	out := make([][]byte, n)
	pos := 0
	for i := range out {
		l := int(binary.LittleEndian.Uint32(d.b[d.off:]))
		d.off += 4
		copy(buf[pos:], d.b[d.off:d.off+l])
		out[i] = buf[pos : pos+l : pos+l]
		d.off += l
		pos += l
	}
	return out, nil
}

// tensor reads the i-th tensor record under r: int32 n_dims, int32 name length, int32 type,
// n_dims int32 ne, the name, then the data.
func (d *decoder) tensor(i int, r TensorRules) (Tensor, *FormatError) {
	var t Tensor
	rec := d.off
	if d.left() < tensorHeader {
		return t, d.truncated(tensorHeader, fmt.Sprintf("header of tensor %d", i))
	}
	nDims, _ := d.i32()
	nameLen, _ := d.i32()
	typ, _ := d.i32()
	if int(nDims) < r.minDims() || nDims > MaxDims {
		return t, errAt(rec, "tensor %d at offset %d: %d dimensions, want %d to %d", i, rec, nDims, r.minDims(), MaxDims)
	}
	if nameLen < 1 || nameLen > MaxNameLen {
		return t, errAt(rec+4, "tensor %d at offset %d: name length %d, want 1 to %d", i, rec, nameLen, MaxNameLen)
	}
	t.Type = tensor.DType(typ)
	if typ < 0 || !r.accepts(t.Type) {
		return t, errAt(rec+8, "tensor %d at offset %d: unknown or unsupported type id %d (want %s)",
			i, rec, typ, r.typeList())
	}
	if need := 4*int(nDims) + int(nameLen); d.left() < need {
		return t, d.truncated(need, fmt.Sprintf("shape and name of tensor %d", i))
	}
	var ne [MaxDims]int64
	for j := 0; j < int(nDims); j++ {
		v, _ := d.i32()
		if v < 0 {
			return t, errAt(d.off-4, "tensor %d at offset %d: dimension %d is negative (%d)", i, rec, j, v)
		}
		ne[j] = int64(v)
	}
	t.Name = string(d.b[d.off : d.off+int(nameLen)])
	d.off += int(nameLen)
	t.Ne = make([]int, nDims)
	for j := range t.Ne {
		t.Ne[j] = int(ne[j])
	}

	size, err := dataSize(t.Type, ne[:nDims])
	if err != nil {
		return t, errAt(rec, "tensor %d %q at offset %d: %v", i, t.Name, rec, err)
	}
	if size > int64(d.left()) {
		return t, errAt(d.off, "tensor %d %q at offset %d: shape %v of %v needs %d bytes of data at offset %d, %d left",
			i, t.Name, rec, t.Ne, t.Type, size, d.off, d.left())
	}
	t.Offset = int64(d.off)
	t.Data = d.b[d.off : d.off+int(size) : d.off+int(size)]
	d.off += int(size)
	return t, nil
}

// dataSize returns the bytes a tensor of type dt and shape ne (ggml order) takes. No dimensions
// is one element.
func dataSize(dt tensor.DType, ne []int64) (int64, error) {
	if len(ne) == 0 {
		ne = []int64{1}
	}
	rows := int64(1)
	for _, n := range ne[1:] {
		if n != 0 && rows > math.MaxInt64/n {
			return 0, fmt.Errorf("element count of shape %v overflows", ne)
		}
		rows *= n
	}
	rowSize, err := dt.RowSize(ne[0])
	if err != nil {
		return 0, err
	}
	if rows != 0 && rowSize > math.MaxInt64/rows {
		return 0, fmt.Errorf("byte size of shape %v overflows", ne)
	}
	return rowSize * rows, nil
}
