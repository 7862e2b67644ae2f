package whisper

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
	"github.com/parleyhq/parley/runtime/tokenizer"
)

// Whisper in GGUF. No converter has settled a layout for Whisper in GGUF, so this reads what the
// ones in use write and what `parley convert` writes:
//
//   - general.architecture = "whisper";
//   - tensors named and shaped as in whisper.cpp's files, which are OpenAI's checkpoint names
//     ("encoder.conv1.weight", "decoder.blocks.0.cross_attn.query.weight", ...), or under Hugging
//     Face's names ("model.decoder.layers.0.encoder_attn.q_proj.weight", as candle's files have
//     them; proj_out.weight, the tied output projection, is skipped), of any type the ggml
//     reader takes; vectors may be [n] or [1, n];
//   - the shape from the tensors: vocabulary from decoder.token_embedding.weight, widths and
//     positions from the positional embeddings, mel bins from encoder.conv1.weight, layers by
//     counting blocks. Head counts come from whisper.{encoder,decoder}.attention.head_count, or
//     are width / 64, as in every Whisper model. Other whisper.* entries, where present, must
//     agree with the tensors: whisper.{encoder,decoder}.{context_length,embedding_length,
//     block_count} and whisper.encoder.mel_count;
//   - the mel filter bank from an F32 tensor "mel_filters" [201, n_mels], or computed
//     (librosa's Slaney bank, the one OpenAI ships) when the file has none;
//   - the text tokens from tokenizer.ggml.tokens, written in GPT-2's byte-level alphabet
//     (tokenizer.ggml.model "gpt2"), the first 50257 of them (the special tokens follow from the
//     vocabulary size, as in whisper.cpp). A file without them needs a Hugging Face
//     tokenizer.json or vocab.json beside it (Open looks there).

const (
	// Architecture is general.architecture of a Whisper GGUF file.
	Architecture     = "whisper"
	melFiltersTensor = "mel_filters"
	textTokens       = 50257 // tokens a vocabulary stores; the rest are derived
	maxLayers        = 256
)

// LoadGGUF uploads the weights of a Whisper GGUF file to be. vocab supplies the text tokens of a
// file that has none (ParseTokenizerJSON reads them from a Hugging Face tokenizer); it is ignored
// when the file has its own. The file must stay open while the model is used; Close closes both.
func LoadGGUF(be backend.Backend, f *gguf.File, vocab [][]byte) (*Model, error) {
	src, err := ggufSource(f, vocab)
	if err != nil {
		return nil, err
	}
	return load(be, src)
}

func ggufSource(f *gguf.File, vocab [][]byte) (*source, error) {
	if a := f.Architecture(); a != Architecture {
		return nil, fmt.Errorf("whisper: the GGUF file's architecture is %q, not %q", a, Architecture)
	}
	src := &source{index: map[string]int{}, release: f.Release, file: f}
	hf := slices.ContainsFunc(f.Tensors, func(t gguf.TensorInfo) bool { return strings.HasPrefix(t.Name, "model.") })
	for _, t := range f.Tensors {
		name := t.Name
		if hf {
			if name = openAIName(name); name == "" {
				continue // Hugging Face's output projection: Whisper ties it to the token embedding
			}
		}
		ne := make([]int, len(t.Shape))
		for i, d := range t.Shape {
			ne[i] = int(d)
		}
		data := f.TensorData(&t)
		if data == nil && t.Size > 0 {
			return nil, fmt.Errorf("whisper: tensor %q lies outside the file", t.Name)
		}
		if _, dup := src.index[name]; dup {
			return nil, fmt.Errorf("whisper: tensor %q is in the file under two names", name)
		}
		src.index[name] = len(src.tensors)
		src.tensors = append(src.tensors, ggml.Tensor{Name: name, Type: t.DType, Ne: ne, Data: data, Offset: f.DataOffset() + t.Offset})
	}
	hp, err := ggufHParams(f, src)
	if err != nil {
		return nil, err
	}
	src.hp = hp
	if t, ok := src.tensor(melFiltersTensor); ok {
		if t.Type != tensor.F32 || len(t.Ne) != 2 || t.Ne[0] != audio.FreqBins || t.Ne[1] != hp.Mels {
			return nil, fmt.Errorf("whisper: tensor %q is %v %v, want F32 [%d %d]", melFiltersTensor, t.Type, t.Ne, audio.FreqBins, hp.Mels)
		}
		src.filters = ggml.Filters{NMel: hp.Mels, NFFT: audio.FreqBins, Data: make([]float32, hp.Mels*audio.FreqBins)}
		for i := range src.filters.Data {
			src.filters.Data[i] = leF32(t.Data[4*i:])
		}
	} else if src.filters, err = slaney(hp.Mels); err != nil {
		return nil, err
	}
	own, ok, err := ggufVocab(f)
	switch {
	case err != nil:
		return nil, err
	case ok:
		src.vocab = own
	case vocab != nil:
		src.vocab = vocab
	default:
		return nil, errors.New("whisper: the GGUF file has no vocabulary (tokenizer.ggml.tokens); give its tokenizer.json")
	}
	return src, nil
}

func slaney(mels int) (ggml.Filters, error) {
	fb, err := audio.SlaneyFilters(mels)
	if err != nil {
		return ggml.Filters{}, fmt.Errorf("whisper: %w", err)
	}
	return ggml.Filters{NMel: fb.NMel, NFFT: fb.NFFT, Data: fb.Data}, nil
}

func leF32(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }

// ggufHParams reads the model's shape off its tensors and checks the metadata that states it.
func ggufHParams(f *gguf.File, src *source) (HParams, error) {
	shape := func(name string, dims int) ([]int, error) {
		t, ok := src.tensor(name)
		if !ok {
			return nil, fmt.Errorf("whisper: tensor %q is missing", name)
		}
		if len(t.Ne) != dims {
			return nil, fmt.Errorf("whisper: tensor %q has shape %v, want %d dimensions", name, t.Ne, dims)
		}
		for _, d := range t.Ne {
			if d <= 0 || d > 1<<20 {
				return nil, fmt.Errorf("whisper: tensor %q has shape %v", name, t.Ne)
			}
		}
		return t.Ne, nil
	}
	te, err := shape("decoder.token_embedding.weight", 2)
	if err != nil {
		return HParams{}, err
	}
	dpe, err := shape("decoder.positional_embedding", 2)
	if err != nil {
		return HParams{}, err
	}
	epe, err := shape("encoder.positional_embedding", 2)
	if err != nil {
		return HParams{}, err
	}
	c1, err := shape("encoder.conv1.weight", 3)
	if err != nil {
		return HParams{}, err
	}
	layers := func(prefix string) int {
		n := 0
		for n < maxLayers {
			if _, ok := src.tensor(fmt.Sprintf("%s.blocks.%d.attn.query.weight", prefix, n)); !ok {
				break
			}
			n++
		}
		return n
	}
	hp := HParams{
		NVocab: te[1], TextState: te[0], TextCtx: dpe[1],
		AudioState: epe[0], AudioCtx: epe[1], Mels: c1[1],
		AudioLayer: layers("encoder"), TextLayer: layers("decoder"),
	}
	if dpe[0] != hp.TextState || c1[2] != hp.AudioState {
		return HParams{}, fmt.Errorf("whisper: the decoder's positional embedding %v or the first convolution %v disagrees with the widths %d/%d", dpe, c1, hp.TextState, hp.AudioState)
	}
	heads := func(key string, width int) (int, error) {
		if raw, present := f.Value(key); present {
			v, ok := f.Int(key)
			if !ok || v <= 0 || v > int64(width) {
				return 0, fmt.Errorf("whisper: %s = %v is out of range or not an integer", key, raw.V)
			}
			return int(v), nil
		}
		if width%64 != 0 {
			return 0, fmt.Errorf("whisper: %s is missing and the width %d is not a multiple of Whisper's head size 64", key, width)
		}
		return width / 64, nil
	}
	if hp.AudioHead, err = heads("whisper.encoder.attention.head_count", hp.AudioState); err != nil {
		return HParams{}, err
	}
	if hp.TextHead, err = heads("whisper.decoder.attention.head_count", hp.TextState); err != nil {
		return HParams{}, err
	}
	for _, c := range []struct {
		key  string
		have int
	}{
		{"whisper.encoder.context_length", hp.AudioCtx}, {"whisper.encoder.embedding_length", hp.AudioState},
		{"whisper.encoder.block_count", hp.AudioLayer}, {"whisper.encoder.mel_count", hp.Mels},
		{"whisper.decoder.context_length", hp.TextCtx}, {"whisper.decoder.embedding_length", hp.TextState},
		{"whisper.decoder.block_count", hp.TextLayer}, {"whisper.vocab_size", hp.NVocab},
	} {
		if v, ok := f.Value(c.key); ok {
			if n, isInt := f.Int(c.key); !isInt || n != int64(c.have) {
				return HParams{}, fmt.Errorf("whisper: %s = %v, but the tensors say %d", c.key, v.V, c.have)
			}
		}
	}
	// FType as whisper.cpp's header states it: the large matrices' type, plus the quantisation
	// version times 1000 in quantised files (2, ggml's current one, where the file does not say).
	if t, ok := src.tensor("encoder.blocks.0.attn.query.weight"); ok {
		hp.FType, _ = ggml.FTypeOf(t.Type)
		if t.Type.Quantized() {
			qv, ok := f.Int("general.quantization_version")
			if !ok || qv < 0 || qv > 1000 {
				qv = 2
			}
			hp.FType += int(qv) * ggml.QuantVersionFactor
		}
	}
	return hp, nil
}

// hfParts maps the components of Hugging Face's Whisper parameter names to OpenAI's, which
// whisper.cpp's files use.
var hfParts = map[string]string{
	"layers": "blocks", "self_attn": "attn", "encoder_attn": "cross_attn",
	"q_proj": "query", "k_proj": "key", "v_proj": "value", "out_proj": "out",
	"self_attn_layer_norm": "attn_ln", "encoder_attn_layer_norm": "cross_attn_ln",
	"final_layer_norm": "mlp_ln", "fc1": "mlp.0", "fc2": "mlp.2", "embed_tokens": "token_embedding",
}

// openAIName translates a tensor name of a file in Hugging Face's names
// ("model.encoder.layers.0.self_attn.q_proj.weight", as candle's GGUF files keep them) to
// OpenAI's, under which the loader looks for it; "" for proj_out.weight, Hugging Face's copy of
// the token embedding.
func openAIName(name string) string {
	rest, ok := strings.CutPrefix(name, "model.")
	if !ok {
		if name == "proj_out.weight" {
			return ""
		}
		return name
	}
	switch rest {
	case "encoder.embed_positions.weight":
		return "encoder.positional_embedding"
	case "decoder.embed_positions.weight":
		return "decoder.positional_embedding"
	case "encoder.layer_norm.weight", "encoder.layer_norm.bias":
		return "encoder.ln_post." + rest[len("encoder.layer_norm."):]
	case "decoder.layer_norm.weight", "decoder.layer_norm.bias":
		return "decoder.ln." + rest[len("decoder.layer_norm."):]
	}
	parts := strings.Split(rest, ".")
	for i, p := range parts {
		if o, ok := hfParts[p]; ok {
			parts[i] = o
		}
	}
	return strings.Join(parts, ".")
}

// ggufVocab returns the file's text tokens, and false if it has none.
func ggufVocab(f *gguf.File) ([][]byte, bool, error) {
	toks, ok := f.Strings("tokenizer.ggml.tokens")
	if !ok {
		if _, present := f.Value("tokenizer.ggml.tokens"); present {
			return nil, false, errors.New("whisper: tokenizer.ggml.tokens is not an array of strings")
		}
		return nil, false, nil
	}
	if m, ok := f.String("tokenizer.ggml.model"); ok && m != "gpt2" && m != Architecture {
		return nil, false, fmt.Errorf("whisper: tokenizer.ggml.model is %q; Whisper's tokens are GPT-2 byte-level (\"gpt2\")", m)
	}
	vocab := make([][]byte, min(len(toks), textTokens))
	for i := range vocab {
		b, ok := tokenizer.FromByteLevel(toks[i])
		if !ok {
			return nil, false, fmt.Errorf("whisper: token %d %q is not written in GPT-2's byte-level alphabet", i, toks[i])
		}
		vocab[i] = b
	}
	return vocab, true, nil
}

// ParseTokenizerJSON reads the text tokens of a Whisper vocabulary from a Hugging Face
// tokenizer.json (its model.vocab) or vocab.json (the map alone): token strings in GPT-2's
// byte-level alphabet by id. Ids from 50257 on (the special tokens) are left out, as whisper.cpp's
// files leave them out; an id below that the map lacks is an empty token.
func ParseTokenizerJSON(data []byte) ([][]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("whisper: tokenizer: %w", err)
	}
	raw := data
	// A tokenizer.json has an object under "model"; a vocab.json maps the token "model" to its id.
	if m, ok := doc["model"]; ok && len(bytes.TrimSpace(m)) > 0 && bytes.TrimSpace(m)[0] == '{' {
		var model struct {
			Type  string          `json:"type"`
			Vocab json.RawMessage `json:"vocab"`
		}
		if err := json.Unmarshal(m, &model); err != nil {
			return nil, fmt.Errorf("whisper: tokenizer: model: %w", err)
		}
		if model.Type != "" && model.Type != "BPE" {
			return nil, fmt.Errorf("whisper: tokenizer: model type %q, want BPE", model.Type)
		}
		raw = model.Vocab
	}
	var ids map[string]int64
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, fmt.Errorf("whisper: tokenizer: vocab: %w", err)
	}
	n := 0
	for _, id := range ids {
		if id < 0 {
			return nil, fmt.Errorf("whisper: tokenizer: negative token id %d", id)
		}
		if id < textTokens {
			n = max(n, int(id)+1)
		}
	}
	if n == 0 {
		return nil, errors.New("whisper: tokenizer: no text tokens")
	}
	vocab := make([][]byte, n)
	seen := make([]bool, n)
	for s, id := range ids {
		if id >= textTokens {
			continue
		}
		if seen[id] {
			return nil, fmt.Errorf("whisper: tokenizer: id %d is given twice", id)
		}
		seen[id] = true
		b, ok := tokenizer.FromByteLevel(s)
		if !ok {
			return nil, fmt.Errorf("whisper: tokenizer: token %q (id %d) is not written in GPT-2's byte-level alphabet", s, id)
		}
		vocab[id] = b
	}
	return vocab, nil
}

// IsModelFile reports whether path is a Whisper model: whisper.cpp's ggml file (the bytes "lmgg"
// first) or a GGUF file whose architecture is whisper.
func IsModelFile(path string) (bool, error) {
	if ok, err := ggml.IsFile(path); ok || err != nil {
		return ok, err
	}
	f, err := gguf.Open(path)
	if err != nil {
		return false, nil // not GGUF either; the reader that loads it says why
	}
	defer f.Close()
	return f.Architecture() == Architecture, nil
}

// openGGUF opens a Whisper GGUF file, taking its vocabulary from a tokenizer.json or vocab.json
// in the same directory when the file has none.
func openGGUF(be backend.Backend, path string) (*Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	if a := f.Architecture(); a != Architecture {
		f.Close()
		return nil, fmt.Errorf("%s: whisper: the GGUF file's architecture is %q, not %q", path, a, Architecture)
	}
	var vocab [][]byte
	if _, ok := f.Value("tokenizer.ggml.tokens"); !ok {
		for _, name := range []string{"tokenizer.json", "vocab.json"} {
			p := filepath.Join(filepath.Dir(path), name)
			data, err := os.ReadFile(p)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err == nil {
				vocab, err = ParseTokenizerJSON(data)
			}
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			break
		}
		if vocab == nil {
			f.Close()
			return nil, fmt.Errorf("whisper: %s has no vocabulary (tokenizer.ggml.tokens) and no tokenizer.json or vocab.json is beside it", path)
		}
	}
	m, err := LoadGGUF(be, f, vocab)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// ConvertGGML returns a GGUF writer holding the model of a whisper.cpp ggml file in the layout
// LoadGGUF reads, with every hyper-parameter stated, the file's own mel filter bank and its
// vocabulary. The tensors keep their names, types and bytes; the writer refers to f's data, so
// write it before closing f.
func ConvertGGML(f *ggml.File, name string) (*gguf.Writer, error) {
	hp := f.HParams
	if len(f.Tensors) == 0 {
		return nil, errors.New("whisper: the file has no weights (a vocabulary-only file?)")
	}
	if f.Filters.NMel != hp.NMels || f.Filters.NFFT != audio.FreqBins {
		return nil, fmt.Errorf("whisper: the file's mel filter bank is %d × %d for a model of %d mels", f.Filters.NMel, f.Filters.NFFT, hp.NMels)
	}
	w := gguf.NewWriter()
	w.SetString("general.architecture", Architecture)
	if name != "" {
		w.SetString("general.name", name)
	}
	ftype, qv := hp.FType%ggml.QuantVersionFactor, hp.QuantVersion()
	w.SetUint32("general.file_type", uint32(ftype))
	if qv > 0 {
		w.SetUint32("general.quantization_version", uint32(qv))
	}
	for _, kv := range []struct {
		key string
		v   int
	}{
		{"whisper.vocab_size", hp.NVocab},
		{"whisper.encoder.context_length", hp.NAudioCtx}, {"whisper.encoder.embedding_length", hp.NAudioState},
		{"whisper.encoder.attention.head_count", hp.NAudioHead}, {"whisper.encoder.block_count", hp.NAudioLayer},
		{"whisper.encoder.mel_count", hp.NMels},
		{"whisper.decoder.context_length", hp.NTextCtx}, {"whisper.decoder.embedding_length", hp.NTextState},
		{"whisper.decoder.attention.head_count", hp.NTextHead}, {"whisper.decoder.block_count", hp.NTextLayer},
	} {
		if kv.v < 0 || int64(kv.v) > math.MaxUint32 {
			return nil, fmt.Errorf("whisper: %s = %d is out of range", kv.key, kv.v)
		}
		w.SetUint32(kv.key, uint32(kv.v))
	}
	toks := make([]string, len(f.Vocab))
	for i, b := range f.Vocab {
		toks[i] = tokenizer.ByteLevel(b)
	}
	w.SetString("tokenizer.ggml.model", "gpt2")
	w.SetStrings("tokenizer.ggml.tokens", toks)
	fb := make([]byte, 4*len(f.Filters.Data))
	for i, v := range f.Filters.Data {
		binary.LittleEndian.PutUint32(fb[4*i:], math.Float32bits(v))
	}
	if err := w.AddTensor(melFiltersTensor, tensor.F32, []int64{int64(audio.FreqBins), int64(hp.NMels)}, fb); err != nil {
		return nil, fmt.Errorf("whisper: %w", err)
	}
	for _, t := range f.Tensors {
		if t.Name == melFiltersTensor {
			return nil, fmt.Errorf("whisper: the file has a tensor named %q", t.Name)
		}
		shape := make([]int64, len(t.Ne))
		for i, d := range t.Ne {
			shape[i] = int64(d)
		}
		if err := w.AddTensor(t.Name, t.Type, shape, t.Data); err != nil {
			return nil, fmt.Errorf("whisper: %w", err)
		}
	}
	return w, nil
}

// quantSkip are the two-dimensional tensors whisper.cpp's quantize tool leaves as they are.
var quantSkip = map[string]bool{
	"encoder.conv1.bias": true, "encoder.conv2.bias": true,
	"encoder.positional_embedding": true, "decoder.positional_embedding": true,
}

// QuantizeGGML returns f's header and tensors with the matrices quantised to dt as whisper.cpp's
// quantize tool does it: every two-dimensional F32 or F16 tensor but the convolutions' biases and
// the positional embeddings, rounded as ggml's reference quantisers round; the rest unchanged,
// but for the convolutions' weights, which whisper.cpp's loader takes in F32 in an F32 file and
// in F16 in any other, and which are converted to that type where they are not in it. dt is one
// of the types whisper.cpp loads: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (or F16, F32). The returned
// tensors share the data of those left unchanged with f.
func QuantizeGGML(f *ggml.File, dt tensor.DType) (ggml.HParams, []ggml.Tensor, error) {
	ft, ok := ggml.FTypeOf(dt)
	if !ok {
		return ggml.HParams{}, nil, fmt.Errorf("whisper: %v is not a type whisper.cpp loads (F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)", dt)
	}
	hp := f.HParams
	hp.FType = ft
	if dt.Quantized() {
		hp.FType += 2 * ggml.QuantVersionFactor // GGML_QNT_VERSION
	}
	convType := tensor.F16 // whisper.cpp's vtype
	if dt == tensor.F32 {
		convType = tensor.F32
	}
	out := make([]ggml.Tensor, len(f.Tensors))
	var row []float32
	for i, t := range f.Tensors {
		out[i] = t
		to := dt
		switch {
		case len(t.Ne) == 3 && (t.Type == tensor.F32 || t.Type == tensor.F16):
			to = convType
		case len(t.Ne) != 2 || quantSkip[t.Name]:
			continue
		}
		if t.Type == to {
			continue
		}
		if t.Type != tensor.F32 && t.Type != tensor.F16 {
			return ggml.HParams{}, nil, fmt.Errorf("whisper: tensor %q is %v: only F32 and F16 tensors can be quantised", t.Name, t.Type)
		}
		n := t.Ne[0]
		rowBytes, err := to.RowSize(int64(n))
		if err != nil {
			return ggml.HParams{}, nil, fmt.Errorf("whisper: tensor %q: %w", t.Name, err)
		}
		srcRow, _ := t.Type.RowSize(int64(n))
		rows := int(t.Rows())
		data := make([]byte, int(rowBytes)*rows)
		row = slices.Grow(row[:0], n)[:n]
		for r := range rows {
			if err := quant.Dequantize(t.Type, t.Data[r*int(srcRow):(r+1)*int(srcRow)], row); err != nil {
				return ggml.HParams{}, nil, fmt.Errorf("whisper: tensor %q: %w", t.Name, err)
			}
			if err := quant.Quantize(to, row, data[r*int(rowBytes):(r+1)*int(rowBytes)]); err != nil {
				return ggml.HParams{}, nil, fmt.Errorf("whisper: tensor %q: %w", t.Name, err)
			}
		}
		out[i].Type, out[i].Data, out[i].Offset = to, data, 0
	}
	return hp, out, nil
}
