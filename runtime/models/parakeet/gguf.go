package parakeet

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/gguf"
)

// Parakeet in GGUF. No converter has settled a layout, so this is Parley's, in llama.cpp's
// style:
//
//   - general.architecture = "parakeet", general.file_type (whisper.cpp's ftype without the
//     quantisation version) and, in quantised files, general.quantization_version;
//   - every hyper-parameter under a key of its own (the table below);
//   - the front end's tables as float32 arrays: parakeet.audio.mel_filters ([n_mels, n_fft/2+1]
//     row-major) and parakeet.audio.window; the TDT durations as an int32 array
//     parakeet.tdt.durations (empty in an RNN-T file);
//   - the vocabulary as tokenizer.ggml.tokens, SentencePiece pieces as stored (tokenizer.ggml.model
//     "llama", llama.cpp's name for SentencePiece vocabularies); the blank follows them;
//   - the tensors under NeMo's names, of the types and shapes of the ggml form
//     (num_batches_tracked, a scalar there, is [1]).

// Architecture is general.architecture of a Parakeet GGUF file.
const Architecture = "parakeet"

const (
	keyFilters   = "parakeet.audio.mel_filters"
	keyWindow    = "parakeet.audio.window"
	keyDurations = "parakeet.tdt.durations"
	keyTokens    = "tokenizer.ggml.tokens"
	keyTokModel  = "tokenizer.ggml.model"
	keyFileType  = "general.file_type"
	keyQuantVer  = "general.quantization_version"
)

// hparamKeys are the GGUF keys of the hyper-parameters, in file order ("" for ftype, which is
// general.file_type, and n_tdt_durations, the length of parakeet.tdt.durations).
var hparamKeys = [15]string{
	"parakeet.vocab_size",
	"parakeet.encoder.context_length",
	"parakeet.encoder.embedding_length",
	"parakeet.encoder.attention.head_count",
	"parakeet.encoder.block_count",
	"parakeet.encoder.mel_count",
	"",
	"parakeet.audio.fft_length",
	"parakeet.encoder.subsampling.factor",
	"parakeet.encoder.subsampling.channels",
	"parakeet.encoder.conv_kernel_size",
	"parakeet.prediction.embedding_length",
	"parakeet.prediction.block_count",
	"",
	"parakeet.decoding.max_symbols_per_step",
}

// ConvertGGML returns a GGUF writer holding the model of f (read from whisper.cpp's ggml form) in
// the layout ReadGGUF reads. The tensors keep their names, types and bytes; the writer refers to
// f's data, so write it before closing f.
func ConvertGGML(f *File, name string) (*gguf.Writer, error) {
	h := f.HParams
	if err := h.Validate(); err != nil {
		return nil, err
	}
	if f.Weights == nil {
		return nil, errors.New("parakeet: the file has no weights")
	}
	w := gguf.NewWriter()
	w.SetString("general.architecture", Architecture)
	if name != "" {
		w.SetString("general.name", name)
	}
	w.SetUint32(keyFileType, uint32(h.FType%quantVersionFactor))
	if qv := h.QuantVersion(); qv > 0 {
		w.SetUint32(keyQuantVer, uint32(qv))
	}
	for i, p := range h.fields() {
		if hparamKeys[i] != "" {
			w.SetUint32(hparamKeys[i], uint32(*p))
		}
	}
	w.SetFloats(keyFilters, append([]float32(nil), f.Filters...))
	w.SetFloats(keyWindow, append([]float32(nil), f.Window...))
	durs := make([]int32, len(f.Durations))
	for i, d := range f.Durations {
		durs[i] = int32(d)
	}
	w.SetInt32s(keyDurations, durs)
	w.SetString(keyTokModel, "llama")
	toks := make([]string, f.Vocab.Size())
	copy(toks, f.Vocab.pieces)
	w.SetStrings(keyTokens, toks)
	for i := range f.Tensors {
		t := &f.Tensors[i]
		shape := make([]int64, max(len(t.Ne), 1))
		shape[0] = 1
		for j, d := range t.Ne {
			shape[j] = int64(d)
		}
		if err := w.AddTensor(t.Name, t.Type, shape, t.Data); err != nil {
			return nil, fmt.Errorf("parakeet: %w", err)
		}
	}
	return w, nil
}

// ReadGGUF reads a Parakeet GGUF file: the hyper-parameters, front-end tables, durations and
// vocabulary from its metadata, the tensors bound and checked as ParseGGML checks them. Tensor
// data aliases g, which must stay open while the model is used.
func ReadGGUF(g *gguf.File) (*File, error) {
	if a := g.Architecture(); a != Architecture {
		return nil, formatErr("the GGUF file's architecture is %q, not %q", a, Architecture)
	}
	f := &File{}
	fields := f.HParams.fields()
	for i, key := range hparamKeys {
		if key == "" {
			continue
		}
		v, err := ggufInt(g, key)
		if err != nil {
			return nil, err
		}
		*fields[i] = v
	}
	ft, err := ggufInt(g, keyFileType)
	if err != nil {
		return nil, err
	}
	qv := 0
	if _, ok := g.Value(keyQuantVer); ok {
		if qv, err = ggufInt(g, keyQuantVer); err != nil {
			return nil, err
		}
		if qv > 1000 {
			return nil, formatErr("%s = %d is out of range", keyQuantVer, qv)
		}
	}
	f.HParams.FType = ft + qv*quantVersionFactor

	durs, ok := g.Ints(keyDurations)
	if !ok {
		return nil, formatErr("%s is missing or not an integer array", keyDurations)
	}
	f.HParams.NTDTDurations = len(durs)
	if err := f.HParams.Validate(); err != nil {
		return nil, err
	}
	h := f.HParams
	f.Durations = make([]int, len(durs))
	for i, d := range durs {
		if d < 0 || d > maxDuration {
			return nil, formatErr("%s[%d] = %d is out of range", keyDurations, i, d)
		}
		f.Durations[i] = int(d)
	}

	fl, ok := g.Floats(keyFilters)
	if !ok || len(fl) != h.NMels*(h.NFFT/2+1) {
		return nil, formatErr("%s is missing or not %d × %d float32s", keyFilters, h.NMels, h.NFFT/2+1)
	}
	if err := finite("mel filter bank", fl); err != nil {
		return nil, err
	}
	f.Filters = append([]float32(nil), fl...)
	win, ok := g.Floats(keyWindow)
	if !ok || len(win) > h.NFFT {
		return nil, formatErr("%s is missing or longer than n_fft = %d", keyWindow, h.NFFT)
	}
	if err := finite("window", win); err != nil {
		return nil, err
	}
	f.Window = append([]float32(nil), win...)

	if m, ok := g.String(keyTokModel); ok && m != "llama" && m != Architecture {
		return nil, formatErr("%s is %q; Parakeet's pieces are SentencePiece's (\"llama\")", keyTokModel, m)
	}
	toks, ok := g.Strings(keyTokens)
	if !ok {
		return nil, formatErr("%s is missing or not an array of strings", keyTokens)
	}
	if len(toks) != h.NVocab {
		return nil, formatErr("%s has %d pieces, %s = %d", keyTokens, len(toks), hparamKeys[0], h.NVocab)
	}
	pieces := make([][]byte, len(toks))
	for i, s := range toks {
		pieces[i] = []byte(s)
	}
	f.Vocab = NewVocab(pieces)

	f.index = make(map[string]int, len(g.Tensors))
	for i := range g.Tensors {
		ti := &g.Tensors[i]
		if !slices.Contains(fileTypes, ti.DType) {
			return nil, formatErr("tensor %q is %v, not a type whisper.cpp's Parakeet loader takes", ti.Name, ti.DType)
		}
		data := g.TensorData(ti)
		if data == nil && ti.Size > 0 {
			return nil, formatErr("tensor %q lies outside the file", ti.Name)
		}
		ne := make([]int, len(ti.Shape))
		for j, d := range ti.Shape {
			if d > math.MaxInt32 {
				return nil, formatErr("tensor %q has shape %v", ti.Name, ti.Shape)
			}
			ne[j] = int(d)
		}
		f.index[ti.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, ggml.Tensor{Name: ti.Name, Type: ti.DType, Ne: ne, Data: data, Offset: g.DataOffset() + ti.Offset})
	}
	if len(f.Tensors) == 0 {
		return nil, formatErr("the GGUF file has no tensors")
	}
	if f.Weights, err = bindWeights(h, f.Tensors, f.index); err != nil {
		return nil, err
	}
	return f, nil
}

// ggufInt reads a non-negative integer that fits an int32.
func ggufInt(g *gguf.File, key string) (int, error) {
	raw, present := g.Value(key)
	if !present {
		return 0, formatErr("%s is missing", key)
	}
	v, ok := g.Int(key)
	if !ok || v < 0 || v > math.MaxInt32 {
		return 0, formatErr("%s = %v is out of range or not an integer", key, raw.V)
	}
	return int(v), nil
}
