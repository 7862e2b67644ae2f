package parakeet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/parleyhq/parley/internal/mapfile"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/gguf"
)

// File is a Parakeet model file, read from either form. Everything but tensor data is copied
// into Go memory and stays valid after Close.
type File struct {
	HParams   HParams
	Filters   []float32 // [NMels, NFFT/2+1] mel filter bank: row m holds filter m's weight of each bin
	Window    []float32 // analysis window of at most NFFT samples; empty: a periodic Hann of NFFT
	Durations []int     // frames each duration output advances; empty in an RNN-T file
	Vocab     *Vocab
	// Tensors are in file order; empty in a file without weights (whisper.cpp loads such a file
	// for its tests). Their Data alias the file and must not be used after Close.
	Tensors []ggml.Tensor
	Weights *Weights // the tensors by role; nil when the file has none

	index    map[string]int
	close    func() error
	release  func([]byte)
	readInto func(dst, b []byte) bool
}

// Tensor returns the tensor named name.
func (f *File) Tensor(name string) (*ggml.Tensor, bool) {
	i, ok := f.index[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// Close releases the file's mapping; tensor data must not be used afterwards. Closing twice is
// a no-op.
func (f *File) Close() error {
	c := f.close
	f.close, f.release, f.readInto = nil, nil, nil
	for i := range f.Tensors {
		f.Tensors[i].Data = nil
	}
	if c == nil {
		return nil
	}
	return c()
}

// ReadInto fills dst with b, tensor data of f, read from the file rather than through its
// mapping, and reports whether it could (not for a parsed buffer, nor a GGUF file: the caller
// then copies b).
func (f *File) ReadInto(dst, b []byte) bool {
	return f.readInto != nil && f.readInto(dst, b)
}

// Release tells the system that b, tensor data of f that the caller has copied, need not stay
// resident. A no-op for a parsed buffer.
func (f *File) Release(b []byte) {
	if f.release != nil {
		f.release(b)
	}
}

// maxDuration bounds a TDT duration (frames a duration output advances).
const maxDuration = 1 << 16

// fileRules are the tensor records whisper.cpp's Parakeet loader reads: zero to four dimensions
// (num_batches_tracked is a scalar), the types parakeet-quantize writes.
var fileRules = ggml.TensorRules{Scalars: true, Types: fileTypes}

// ParseGGML parses whisper.cpp's ggml Parakeet file held in memory, as parakeet_model_load reads
// it (parakeet.cpp:1011-1517): magic, the fifteen hyper-parameters, the mel filter bank (int32
// n_mel, int32 n_bins, float32 data), the window (int32 n, float32 data), NTDTDurations uint32
// durations, the vocabulary (int32 n, then per piece uint32 length and bytes), then tensor records
// to the end. Everything is validated against the hyper-parameters; tensor data is not copied.
func ParseGGML(b []byte) (*File, error) {
	d := ggml.NewDecoder(b)
	if err := d.Magic(); err != nil {
		return nil, &FormatError{Msg: "not a ggml file", Err: err}
	}
	f := &File{}
	for i, p := range f.HParams.fields() {
		v, err := d.Int32("hyperparameter " + hparamNames[i])
		if err != nil {
			return nil, &FormatError{Msg: "header", Err: err}
		}
		*p = int(v)
	}
	if i, why := f.HParams.check(); i >= 0 {
		return nil, formatErr("hyperparameter %s at offset %d: %s", hparamNames[i], 4+4*i, why)
	}
	h := f.HParams

	at := d.Offset()
	fl, err := d.Filters()
	if err != nil {
		return nil, &FormatError{Msg: "mel filter bank", Err: err}
	}
	if fl.NMel != h.NMels || fl.NFFT != h.NFFT/2+1 {
		return nil, formatErr("mel filter bank at offset %d is %d × %d, want n_mels × (n_fft/2 + 1) = %d × %d", at, fl.NMel, fl.NFFT, h.NMels, h.NFFT/2+1)
	}
	if err := finite("mel filter bank", fl.Data); err != nil {
		return nil, err
	}
	f.Filters = fl.Data

	at = d.Offset()
	if f.Window, err = d.Float32Array("window"); err != nil {
		return nil, &FormatError{Msg: "window", Err: err}
	}
	if len(f.Window) > h.NFFT {
		return nil, formatErr("window at offset %d has %d samples, more than n_fft = %d", at, len(f.Window), h.NFFT)
	}
	if err := finite("window", f.Window); err != nil {
		return nil, err
	}

	at = d.Offset()
	durs, err := d.Uint32s(h.NTDTDurations, "TDT durations")
	if err != nil {
		return nil, &FormatError{Msg: "TDT durations", Err: err}
	}
	if f.Durations, err = durations(durs); err != nil {
		return nil, formatErr("TDT durations at offset %d: %v", at, err)
	}

	at = d.Offset()
	pieces, err := d.Vocab()
	if err != nil {
		return nil, &FormatError{Msg: "vocabulary", Err: err}
	}
	if len(pieces) != h.NVocab {
		return nil, formatErr("vocabulary at offset %d has %d pieces, n_vocab = %d (the blank's id is the piece count, and the joint's rows follow n_vocab)", at, len(pieces), h.NVocab)
	}
	f.Vocab = NewVocab(pieces)

	if f.Tensors, f.index, err = d.Tensors(fileRules); err != nil {
		return nil, &FormatError{Msg: "tensors", Err: err}
	}
	if len(f.Tensors) > 0 {
		if f.Weights, err = bindWeights(h, f.Tensors, f.index); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// durations converts and bounds the file's durations.
func durations(d []uint32) ([]int, error) {
	out := make([]int, len(d))
	for i, v := range d {
		if v > maxDuration {
			return nil, fmt.Errorf("duration %d is %d, more than %d frames", i, v, maxDuration)
		}
		out[i] = int(v)
	}
	return out, nil
}

// finite checks that every value of a front-end table is a number.
func finite(what string, v []float32) error {
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return formatErr("%s value %d is %v", what, i, x)
		}
	}
	return nil
}

// Open reads the model file at path, whisper.cpp's ggml form or the GGUF form, memory-mapping it
// read-only; tensor data is not copied. The file must not be truncated while it is open.
func Open(path string) (*File, error) {
	magic, ok, err := mapfile.Magic(path)
	if err != nil {
		return nil, fmt.Errorf("parakeet: %w", err)
	}
	switch {
	case ok && string(magic[:]) == "GGUF":
		g, err := gguf.Open(path)
		if err != nil {
			return nil, &FormatError{Msg: path, Err: err}
		}
		f, err := ReadGGUF(g)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		f.close, f.release = g.Close, g.Release
		return f, nil
	case ok && binary.LittleEndian.Uint32(magic[:]) == ggml.Magic:
		m, err := mapfile.Open(path)
		if err != nil {
			return nil, fmt.Errorf("parakeet: %w", err)
		}
		f, err := ParseGGML(m.Data)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		f.close, f.release, f.readInto = m.Close, m.Release, m.ReadInto
		// Parsing touched a page of every tensor's record (and the pages around it): none need
		// stay resident, as the weights are read again when they are loaded.
		m.Release(m.Data)
		return f, nil
	}
	return nil, formatErr("%s is neither a ggml nor a GGUF file", path)
}

// headerBytes is the part of a ggml file IsModelFile reads: magic, hyper-parameters and the
// filter bank's size.
const headerBytes = 4 + 4*15 + 8

// IsModelFile reports whether path is a Parakeet model: a ggml file whose header is Parakeet's
// (valid hyper-parameters followed by a filter bank of n_mels × (n_fft/2 + 1)), or a GGUF file
// whose architecture is parakeet. Whisper's ggml files share the magic but not the header.
func IsModelFile(path string) (bool, error) {
	fd, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer fd.Close()
	var b [headerBytes]byte
	if _, err := io.ReadFull(fd, b[:]); err != nil {
		return false, nil
	}
	if string(b[:4]) == "GGUF" {
		g, err := gguf.Open(path)
		if err != nil {
			return false, nil
		}
		defer g.Close()
		return g.Architecture() == Architecture, nil
	}
	if binary.LittleEndian.Uint32(b[:]) != ggml.Magic {
		return false, nil
	}
	var h HParams
	for i, p := range h.fields() {
		*p = int(int32(binary.LittleEndian.Uint32(b[4+4*i:])))
	}
	if i, _ := h.check(); i >= 0 {
		return false, nil
	}
	nMel := int32(binary.LittleEndian.Uint32(b[64:]))
	nBins := int32(binary.LittleEndian.Uint32(b[68:]))
	return int(nMel) == h.NMels && int(nBins) == h.NFFT/2+1, nil
}

// WriteGGML writes f in whisper.cpp's ggml form: the header from f's hyper-parameters, filters,
// window, durations and vocabulary, then f's tensors in order.
func WriteGGML(w io.Writer, f *File) error {
	h := f.HParams
	if err := h.Validate(); err != nil {
		return err
	}
	if f.Vocab == nil || f.Vocab.Size() != h.NVocab {
		return errors.New("parakeet: the vocabulary's size is not n_vocab")
	}
	if len(f.Filters) != h.NMels*(h.NFFT/2+1) || len(f.Window) > h.NFFT || len(f.Durations) != h.NTDTDurations {
		return errors.New("parakeet: the filter bank, window or durations do not fit the hyper-parameters")
	}
	le := binary.LittleEndian
	b := le.AppendUint32(nil, ggml.Magic)
	for _, p := range h.fields() {
		b = le.AppendUint32(b, uint32(int32(*p)))
	}
	b = le.AppendUint32(b, uint32(h.NMels))
	b = le.AppendUint32(b, uint32(h.NFFT/2+1))
	for _, v := range f.Filters {
		b = le.AppendUint32(b, math.Float32bits(v))
	}
	b = le.AppendUint32(b, uint32(len(f.Window)))
	for _, v := range f.Window {
		b = le.AppendUint32(b, math.Float32bits(v))
	}
	for _, v := range f.Durations {
		if v < 0 || v > maxDuration {
			return fmt.Errorf("parakeet: TDT duration %d is out of range", v)
		}
		b = le.AppendUint32(b, uint32(v))
	}
	b = le.AppendUint32(b, uint32(f.Vocab.Size()))
	for i := 0; i < f.Vocab.Size(); i++ {
		p := f.Vocab.pieces[i]
		b = le.AppendUint32(b, uint32(len(p)))
		b = append(b, p...)
	}
	wr, err := ggml.NewRecordWriter(w, b, fileRules)
	if err != nil {
		return err
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if err := wr.WriteTensor(t.Name, t.Type, t.Ne, t.Data); err != nil {
			return err
		}
	}
	return wr.Flush()
}
