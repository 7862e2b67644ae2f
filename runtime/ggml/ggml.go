// Package ggml reads and writes whisper.cpp's legacy model container (the "ggml" format that
// whisper.cpp's whisper_model_load reads): magic, eleven int32 hyperparameters, the mel filter
// bank, the vocabulary, then tensor records until the end of the file. Everything is
// little-endian and nothing is aligned.
//
// Open memory-maps a file read-only and validates its whole layout before returning; tensor data
// is never copied (Tensor.Data is a slice of the mapping). Parse does the same over bytes already
// in memory. The hyperparameters, filters and vocabulary are copied into Go memory and stay valid
// after Close. Every malformed input yields an error wrapping ErrFormat (a *FormatError carrying
// the byte offset where the problem was found); no count read from a file sizes an allocation
// before it has been checked against the bytes that remain.
//
// Tensor types must be F32, F16, Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0. Tensor names and shapes are not
// checked against a model architecture here: that is the model's business.
//
// whisper.cpp's Parakeet files use the same container with a header of their own; Decoder reads
// such a file field by field, and its tensor records under other TensorRules (scalars, k-quants);
// NewRecordWriter writes one.
package ggml

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/internal/mapfile"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Magic is the first little-endian uint32 of a file ("lmgg" on disk).
const Magic = 0x67676d6c

// QuantVersionFactor is what the quantisation version is multiplied by when it is folded into
// HParams.FType (GGML_QNT_VERSION_FACTOR).
const QuantVersionFactor = 1000

// MaxDims is the most dimensions a tensor may have (GGML_MAX_DIMS).
const MaxDims = 4

// MaxNameLen is the longest tensor name ggml accepts, in bytes (GGML_MAX_NAME - 1).
const MaxNameLen = 63

// ErrFormat is wrapped by every error that reports a malformed file.
var ErrFormat = errors.New("ggml: malformed file")

// FormatError reports a malformed file: what is wrong and the byte offset (from the start of the
// file) where it was found.
type FormatError struct {
	Offset int64
	Msg    string
}

func (e *FormatError) Error() string { return "ggml: " + e.Msg }

// Unwrap returns ErrFormat.
func (e *FormatError) Unwrap() error { return ErrFormat }

// HParams are the eleven int32 hyperparameters that follow the magic, in file order.
type HParams struct {
	NVocab      int
	NAudioCtx   int
	NAudioState int
	NAudioHead  int
	NAudioLayer int
	NTextCtx    int
	NTextState  int
	NTextHead   int
	NTextLayer  int
	NMels       int
	// FType is ggml's file type (enum ggml_ftype) of the large matrices, plus the quantisation
	// version times QuantVersionFactor in quantised files.
	FType int
}

// fields returns pointers to h's fields in file order.
func (h *HParams) fields() [11]*int {
	return [11]*int{&h.NVocab, &h.NAudioCtx, &h.NAudioState, &h.NAudioHead, &h.NAudioLayer,
		&h.NTextCtx, &h.NTextState, &h.NTextHead, &h.NTextLayer, &h.NMels, &h.FType}
}

// Fields returns the hyperparameters' names, as whisper.cpp's loader prints them, and values, in
// file order.
func (h HParams) Fields() (names [11]string, values [11]int) {
	for i, p := range h.fields() {
		values[i] = *p
	}
	return hparamNames, values
}

var hparamNames = [11]string{"n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head",
	"n_audio_layer", "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer", "n_mels", "ftype"}

// ftypes maps ggml_ftype values whisper.cpp loads to the type of the large matrices.
var ftypes = map[int]tensor.DType{
	0: tensor.F32,
	1: tensor.F16,
	2: tensor.Q4_0,
	3: tensor.Q4_1,
	7: tensor.Q8_0,
	8: tensor.Q5_0,
	9: tensor.Q5_1,
}

// FTypeOf returns the ggml_ftype value that declares large matrices of type dt, or false if
// whisper.cpp has none for dt.
func FTypeOf(dt tensor.DType) (int, bool) {
	for f, d := range ftypes {
		if d == dt {
			return f, true
		}
	}
	return 0, false
}

// WeightType returns the type FType declares for the large matrices (the quantisation version
// removed). Conv weights of quantised files stay F16 and vectors stay F32 whatever it says.
func (h HParams) WeightType() (tensor.DType, error) {
	dt, ok := ftypes[h.FType%QuantVersionFactor]
	if !ok || h.FType < 0 {
		return 0, fmt.Errorf("ggml: ftype %d names no weight type whisper.cpp loads", h.FType)
	}
	return dt, nil
}

// QuantVersion returns the quantisation version folded into FType (0 in F32 and F16 files).
func (h HParams) QuantVersion() int { return h.FType / QuantVersionFactor }

// check returns the index of the first field that is out of range and why; -1 if none is.
func (h *HParams) check() (int, string) {
	for i, p := range h.fields() {
		v := *p
		if v < 0 || v > 1<<31-1 {
			return i, fmt.Sprintf("%d is out of range", v)
		}
		if i < 10 && v == 0 {
			return i, "0, want a positive value"
		}
	}
	if _, err := h.WeightType(); err != nil {
		return 10, fmt.Sprintf("%d names no weight type whisper.cpp loads (F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)", h.FType)
	}
	return -1, ""
}

// Filters is the mel filter bank stored in the file.
type Filters struct {
	NMel, NFFT int
	Data       []float32 // [NMel, NFFT]: row m holds mel filter m's weight of each FFT bin
}

// Tensor is one tensor record.
type Tensor struct {
	Name string
	Type tensor.DType
	// Ne is the shape in ggml order: Ne[0] elements per row (fastest), 1 to MaxDims entries
	// (none for a scalar, where TensorRules.Scalars admits one).
	Ne []int
	// Data holds the tensor's bytes (Type's row size of Ne[0] times the number of rows). In a
	// parsed file it aliases the file, is read-only when the file was opened, need not be
	// aligned, and must not be used after Close.
	Data []byte
	// Offset is the file offset of Data (0 for tensors not read from a file).
	Offset int64
}

// Elements returns the number of elements of t (the product of Ne).
func (t *Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Ne {
		n *= int64(d)
	}
	return n
}

// Rows returns the number of rows of t: the product of Ne[1:].
func (t *Tensor) Rows() int64 {
	n := int64(1)
	for i := 1; i < len(t.Ne); i++ {
		n *= int64(t.Ne[i])
	}
	return n
}

// File is a parsed model file.
type File struct {
	HParams HParams
	Filters Filters
	// Vocab holds the token bytes as stored, in id order. whisper.cpp's files store the 50257
	// text tokens only, not the special tokens up to HParams.NVocab.
	Vocab   [][]byte
	Tensors []Tensor // in file order; empty in files that carry no weights

	index  map[string]int
	mapped *mapfile.File // the mapping to release on Close, if any
}

// Tensor returns the tensor named name.
func (f *File) Tensor(name string) (*Tensor, bool) {
	i, ok := f.index[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorRules says which tensor records a file admits. The zero value is the rule of
// whisper.cpp's Whisper loader: one to MaxDims dimensions, types F32, F16, Q4_0, Q4_1, Q5_0, Q5_1
// and Q8_0.
type TensorRules struct {
	// Scalars admits records of zero dimensions (one element; Tensor.Ne is empty), which
	// whisper.cpp's Parakeet loader reads (batch norm's num_batches_tracked).
	Scalars bool
	// Types lists the admitted element types; nil means whisper's.
	Types []tensor.DType
}

// whisperTypes are the tensor types whisper.cpp's Whisper loader takes.
var whisperTypes = []tensor.DType{tensor.F32, tensor.F16, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.Q8_0}

func (r TensorRules) types() []tensor.DType {
	if r.Types == nil {
		return whisperTypes
	}
	return r.Types
}

// accepts reports whether r admits tensors of type dt.
func (r TensorRules) accepts(dt tensor.DType) bool {
	for _, t := range r.types() {
		if t == dt {
			return true
		}
	}
	return false
}

// minDims is the fewest dimensions a record may have under r.
func (r TensorRules) minDims() int {
	if r.Scalars {
		return 0
	}
	return 1
}

// typeList names r's types as a sentence: "F32, F16 or Q8_0".
func (r TensorRules) typeList() string {
	ts := r.types()
	s := ""
	for i, t := range ts {
		switch {
		case i == 0:
		case i == len(ts)-1:
			s += " or "
		default:
			s += ", "
		}
		s += t.String()
	}
	return s
}
