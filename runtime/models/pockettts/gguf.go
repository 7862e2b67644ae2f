package pockettts

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strings"

	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/tensor"
	"github.com/parleyhq/parley/runtime/tokenizer/sentencepiece"
)

// Pocket TTS in GGUF, as `parley convert` writes it:
//
//   - general.architecture = "pockettts";
//   - the checkpoint's tensors under upstream's names, except that Mimi's transformers drop the
//     repeated ".transformer" ("mimi.decoder_transformer.layers.0...", not
//     "mimi.decoder_transformer.transformer.layers.0...") to fit GGUF's 63-byte names; shapes in
//     ggml's order (reversed); F32, F16 or BF16 as in the source;
//   - the configuration as pockettts.* keys (those the shapes cannot tell are required, the
//     others must agree with the shapes);
//   - the SentencePiece model file, byte for byte, as the uint8 array tokenizer.sentencepiece.model;
//   - optionally voices: pockettts.voices lists their names, and tensors "voice.NAME.L.k" and
//     "voice.NAME.L.v" (F32, ggml shape [heads·headDim, positions]) hold each layer's cache.

// Architecture is general.architecture of a Pocket TTS GGUF file.
const Architecture = "pockettts"

// GGUF keys.
const (
	keyDim            = "pockettts.embedding_length"
	keyLayers         = "pockettts.block_count"
	keyHeads          = "pockettts.attention.head_count"
	keyFF             = "pockettts.feed_forward_length"
	keyVocab          = "pockettts.vocab_size"
	keyLatent         = "pockettts.latent_dim"
	keyRoPEBase       = "pockettts.rope.freq_base"
	keyFlowDim        = "pockettts.flow.embedding_length"
	keyFlowDepth      = "pockettts.flow.block_count"
	keyMimiDim        = "pockettts.mimi.embedding_length"
	keyMimiLayers     = "pockettts.mimi.block_count"
	keyMimiHeads      = "pockettts.mimi.attention.head_count"
	keyMimiFF         = "pockettts.mimi.feed_forward_length"
	keyMimiContext    = "pockettts.mimi.context_length"
	keyRatios         = "pockettts.mimi.ratios"
	keyFilters        = "pockettts.mimi.filters"
	keySampleRate     = "pockettts.sample_rate"
	keyEncoder        = "pockettts.voice_cloning"
	keyBOSBeforeVoice = "pockettts.bos_before_voice"
	keyPadShort       = "pockettts.text.pad_short_inputs"
	keySemicolons     = "pockettts.text.remove_semicolons"
	keyFramesAfterEOS = "pockettts.frames_after_eos"
	keyVoices         = "pockettts.voices"
	keyTokenizer      = "tokenizer.sentencepiece.model"
)

// ggufName is a checkpoint name as GGUF stores it.
func ggufName(name string) string {
	for _, p := range []string{"mimi.encoder_transformer.", "mimi.decoder_transformer."} {
		if rest, ok := strings.CutPrefix(name, p+"transformer."); ok {
			return p + rest
		}
	}
	return name
}

// checkpointName inverts ggufName.
func checkpointName(name string) string {
	for _, p := range []string{"mimi.encoder_transformer.", "mimi.decoder_transformer."} {
		if rest, ok := strings.CutPrefix(name, p); ok {
			return p + "transformer." + rest
		}
	}
	return name
}

var voiceNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,40}$`)

// Checkpoint is an opened model: its weights, and what a GGUF file carries besides (the tokenizer,
// voices, the text front end's settings).
type Checkpoint struct {
	Weights   *Weights
	Tokenizer *sentencepiece.Model // nil when the file has none
	Voices    map[string]*Voice
	Text      TextOptions
	closer    io.Closer
}

// Close releases the file the weights alias.
func (c *Checkpoint) Close() error {
	if c.closer == nil {
		return nil
	}
	err := c.closer.Close()
	c.closer = nil
	return err
}

// WriteGGUF writes the weights, the tokenizer, the voices (may be empty) and the text settings
// as one GGUF file.
func WriteGGUF(out io.Writer, w *Weights, tok *sentencepiece.Model, voices map[string]*Voice, text TextOptions) error {
	cfg := &w.Config
	if tok == nil {
		return fmt.Errorf("pockettts: a GGUF file needs the tokenizer")
	}
	if tok.Len() != cfg.Vocab {
		return fmt.Errorf("pockettts: the tokenizer has %d pieces, the embedding %d rows", tok.Len(), cfg.Vocab+1)
	}
	g := gguf.NewWriter()
	g.SetString("general.architecture", Architecture)
	g.SetString("general.name", "Pocket TTS")
	u32 := func(k string, v int) { g.SetUint32(k, uint32(v)) }
	u32(keyDim, cfg.Dim)
	u32(keyLayers, cfg.Layers)
	u32(keyHeads, cfg.Heads)
	u32(keyFF, cfg.FFDim)
	u32(keyVocab, cfg.Vocab)
	u32(keyLatent, cfg.LatentDim)
	g.SetFloat32(keyRoPEBase, float32(cfg.RoPEBase))
	u32(keyFlowDim, cfg.FlowDim)
	u32(keyFlowDepth, cfg.FlowDepth)
	u32(keyMimiDim, cfg.MimiDim)
	u32(keyMimiLayers, cfg.MimiLayers)
	u32(keyMimiHeads, cfg.MimiHeads)
	u32(keyMimiFF, cfg.MimiFFDim)
	u32(keyMimiContext, cfg.MimiContext)
	ratios := make([]int32, len(cfg.Ratios))
	for i, r := range cfg.Ratios {
		ratios[i] = int32(r)
	}
	g.SetInt32s(keyRatios, ratios)
	u32(keyFilters, cfg.Filters)
	u32(keySampleRate, cfg.SampleRate)
	g.SetBool(keyEncoder, cfg.Encoder)
	g.SetBool(keyBOSBeforeVoice, cfg.BOSBeforeVoice)
	g.SetBool(keyPadShort, text.PadShortInputs)
	g.SetBool(keySemicolons, text.RemoveSemicolons)
	if text.FramesAfterEOS > 0 {
		u32(keyFramesAfterEOS, text.FramesAfterEOS)
	}
	g.Set(keyTokenizer, gguf.Value{Type: gguf.Array, Elem: gguf.Uint8, V: tok.Bytes()})

	bound := map[string]*Tensor{}
	for _, t := range w.All() {
		bound[t.Name] = t
	}
	for _, s := range cfg.Layout() {
		t := bound[s.Name]
		if t == nil {
			return fmt.Errorf("pockettts: tensor %q is not bound", s.Name)
		}
		if err := g.AddTensor(ggufName(s.Name), t.DType, ggmlShape(t.Shape), t.Data); err != nil {
			return err
		}
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range voices {
			if !yield(k) {
				return
			}
		}
	})
	if len(names) > 0 {
		g.SetStrings(keyVoices, names)
	}
	width := cfg.Heads * cfg.HeadDim()
	for _, name := range names {
		v := voices[name]
		if !voiceNameRE.MatchString(name) {
			return fmt.Errorf("pockettts: voice name %q: use 1 to 40 letters, digits, '_' or '-'", name)
		}
		if len(v.Layers) != cfg.Layers {
			return fmt.Errorf("pockettts: voice %q has %d layers, the model %d", name, len(v.Layers), cfg.Layers)
		}
		for i, l := range v.Layers {
			for j, x := range [2][]float32{l.K, l.V} {
				kv := [2]string{"k", "v"}[j]
				if len(x) != v.Positions*width {
					return fmt.Errorf("pockettts: voice %q layer %d: %d values, want %d·%d", name, i, len(x), v.Positions, width)
				}
				if err := g.AddTensor(fmt.Sprintf("voice.%s.%d.%s", name, i, kv), tensor.F32, []int64{int64(width), int64(v.Positions)}, f32Bytes(x)); err != nil {
					return err
				}
			}
		}
	}
	_, err := g.WriteTo(out)
	return err
}

func ggmlShape(shape []int) []int64 {
	out := make([]int64, len(shape))
	for i, d := range shape {
		out[len(shape)-1-i] = int64(d)
	}
	return out
}

func f32Bytes(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// All returns every bound tensor.
func (w *Weights) All() []*Tensor {
	var out []*Tensor
	add := func(ts ...*Tensor) {
		for _, t := range ts {
			if t != nil {
				out = append(out, t)
			}
		}
	}
	lin := func(l Linear) { add(l.W, l.B) }
	norm := func(n Norm) { add(n.W, n.B) }
	conv := func(c Conv) { add(c.W, c.B) }
	res := func(r ResUnit) { conv(r.Conv1); conv(r.Conv2) }
	mimi := func(ls []MimiLayer) {
		for _, l := range ls {
			norm(l.Norm1)
			norm(l.Norm2)
			add(l.InProj, l.OutProj, l.Linear1, l.Linear2, l.Scale1, l.Scale2)
		}
	}
	add(w.BOSEmb, w.BOSBeforeVoice, w.SpeakerProj, w.EmbStd, w.EmbMean, w.Embed, w.InputLinear)
	for _, l := range w.Layers {
		norm(l.Norm1)
		norm(l.Norm2)
		add(l.InProj, l.OutProj, l.Linear1, l.Linear2)
	}
	norm(w.OutNorm)
	lin(w.OutEOS)
	f := &w.Flow
	for _, te := range f.TimeEmbed {
		add(te.Freqs, te.Alpha)
		lin(te.MLP0)
		lin(te.MLP2)
	}
	lin(f.CondEmbed)
	lin(f.InputProj)
	for _, r := range f.ResBlocks {
		norm(r.InLN)
		lin(r.MLP0)
		lin(r.MLP2)
		lin(r.AdaLN)
	}
	lin(f.FinalAdaLN)
	lin(f.FinalProj)
	m := &w.Mimi
	add(m.QuantizerProj, m.Upsample.W, m.Upsample.B)
	mimi(m.DecoderLayers)
	conv(m.DecoderIn)
	for _, s := range m.Decoder {
		add(s.Up.W, s.Up.B)
		res(s.Res)
	}
	conv(m.DecoderOut)
	conv(m.EncoderIn)
	for _, s := range m.Encoder {
		res(s.Res)
		conv(s.Down)
	}
	conv(m.EncoderOut)
	mimi(m.EncoderLayers)
	conv(m.Downsample)
	return out
}

// ggufSource serves a GGUF file's checkpoint tensors under their upstream names.
type ggufSource struct {
	tensors map[string]*Tensor
	order   []string
}

func (s *ggufSource) tensor(name string) (*Tensor, bool) {
	t, ok := s.tensors[name]
	return t, ok
}

func (s *ggufSource) names() []string { return s.order }

// LoadGGUF binds a Pocket TTS GGUF file. The weights alias f, which must stay open while they are
// used (Checkpoint.Close does not close f).
func LoadGGUF(f *gguf.File) (*Checkpoint, error) {
	if a := f.Architecture(); a != Architecture {
		return nil, fmt.Errorf("pockettts: the GGUF file's architecture is %q, not %q", a, Architecture)
	}
	intKey := func(key string, required bool, dst *int) error {
		raw, present := f.Value(key)
		if !present {
			if required {
				return fmt.Errorf("pockettts: GGUF key %s is missing", key)
			}
			return nil
		}
		v, ok := f.Int(key)
		if !ok || v <= 0 || v > math.MaxInt32 {
			return fmt.Errorf("pockettts: GGUF key %s = %v is not a positive integer", key, raw.V)
		}
		*dst = int(v)
		return nil
	}
	base := English()
	for _, k := range []struct {
		key string
		dst *int
	}{{keyHeads, &base.Heads}, {keyMimiHeads, &base.MimiHeads}, {keyMimiContext, &base.MimiContext}, {keySampleRate, &base.SampleRate}} {
		if err := intKey(k.key, true, k.dst); err != nil {
			return nil, err
		}
	}
	rb, ok := f.Float(keyRoPEBase)
	if !ok {
		return nil, fmt.Errorf("pockettts: GGUF key %s is missing or not a number", keyRoPEBase)
	}
	base.RoPEBase = rb

	src := &ggufSource{tensors: map[string]*Tensor{}}
	voiceTensors := map[string]*gguf.TensorInfo{}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if strings.HasPrefix(ti.Name, "voice.") {
			voiceTensors[ti.Name] = ti
			continue
		}
		name := checkpointName(ti.Name)
		if _, dup := src.tensors[name]; dup {
			return nil, fmt.Errorf("pockettts: tensor %q is in the file twice", name)
		}
		shape := make([]int, len(ti.Shape))
		for j, d := range ti.Shape {
			if d > math.MaxInt32 {
				return nil, fmt.Errorf("pockettts: tensor %q has shape %v", ti.Name, ti.Shape)
			}
			shape[len(shape)-1-j] = int(d)
		}
		data := f.TensorData(ti)
		if data == nil && ti.Size > 0 {
			return nil, fmt.Errorf("pockettts: tensor %q lies outside the file", ti.Name)
		}
		src.tensors[name] = &Tensor{Name: name, Shape: shape, DType: ti.DType, Data: data}
		src.order = append(src.order, name)
	}
	// A GGUF vector may be stored [n] or [1, n] by other writers: only exact shapes are accepted.
	cfg, err := deriveConfig(src, base)
	if err != nil {
		return nil, err
	}
	stated := []struct {
		key string
		v   int
	}{{keyDim, cfg.Dim}, {keyLayers, cfg.Layers}, {keyFF, cfg.FFDim}, {keyVocab, cfg.Vocab},
		{keyLatent, cfg.LatentDim}, {keyFlowDim, cfg.FlowDim}, {keyFlowDepth, cfg.FlowDepth},
		{keyMimiDim, cfg.MimiDim}, {keyMimiLayers, cfg.MimiLayers}, {keyMimiFF, cfg.MimiFFDim}, {keyFilters, cfg.Filters}}
	for _, s := range stated {
		v := s.v
		if err := intKey(s.key, false, &v); err != nil {
			return nil, err
		}
		if v != s.v {
			return nil, fmt.Errorf("pockettts: GGUF key %s = %d disagrees with the tensors (%d)", s.key, v, s.v)
		}
	}
	if r, ok := f.Ints(keyRatios); ok {
		same := len(r) == len(cfg.Ratios)
		for i := 0; same && i < len(r); i++ {
			same = r[i] == int64(cfg.Ratios[i])
		}
		if !same {
			return nil, fmt.Errorf("pockettts: GGUF key %s = %v disagrees with the tensors (%v)", keyRatios, r, cfg.Ratios)
		}
	}
	for _, b := range []struct {
		key string
		v   bool
	}{{keyEncoder, cfg.Encoder}, {keyBOSBeforeVoice, cfg.BOSBeforeVoice}} {
		if got, ok := f.Bool(b.key); ok && got != b.v {
			return nil, fmt.Errorf("pockettts: GGUF key %s = %v disagrees with the tensors", b.key, got)
		}
	}
	w, err := bind(src, cfg)
	if err != nil {
		return nil, err
	}
	w.release = f.Release
	ck := &Checkpoint{Weights: w, Voices: map[string]*Voice{}}
	ck.Text.PadShortInputs, _ = f.Bool(keyPadShort)
	ck.Text.RemoveSemicolons, _ = f.Bool(keySemicolons)
	if err := intKey(keyFramesAfterEOS, false, &ck.Text.FramesAfterEOS); err != nil {
		return nil, err
	}
	if v, ok := f.Value(keyTokenizer); ok {
		b, isBytes := v.V.([]uint8)
		if !isBytes {
			return nil, fmt.Errorf("pockettts: GGUF key %s is not a uint8 array", keyTokenizer)
		}
		tok, err := sentencepiece.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("pockettts: %s: %w", keyTokenizer, err)
		}
		if tok.Len() != cfg.Vocab {
			return nil, fmt.Errorf("pockettts: the tokenizer has %d pieces, the embedding %d rows", tok.Len(), cfg.Vocab+1)
		}
		ck.Tokenizer = tok
	}
	names, _ := f.Strings(keyVoices)
	width := cfg.Heads * cfg.HeadDim()
	for _, name := range names {
		if !voiceNameRE.MatchString(name) {
			return nil, fmt.Errorf("pockettts: voice name %q is not 1 to 40 letters, digits, '_' or '-'", name)
		}
		if _, dup := ck.Voices[name]; dup {
			return nil, fmt.Errorf("pockettts: voice %q is listed twice", name)
		}
		v := &Voice{Positions: -1}
		for i := range cfg.Layers {
			var kv [2][]float32
			for j, s := range []string{"k", "v"} {
				tn := fmt.Sprintf("voice.%s.%d.%s", name, i, s)
				ti, ok := voiceTensors[tn]
				if !ok {
					return nil, fmt.Errorf("pockettts: voice %q: tensor %q is missing", name, tn)
				}
				delete(voiceTensors, tn)
				if ti.DType != tensor.F32 || len(ti.Shape) != 2 || ti.Shape[0] != int64(width) || ti.Shape[1] <= 0 || ti.Shape[1] > math.MaxInt32 {
					return nil, fmt.Errorf("pockettts: voice tensor %q is %v %v, want F32 [%d, positions]", tn, ti.DType, ti.Shape, width)
				}
				if v.Positions >= 0 && int64(v.Positions) != ti.Shape[1] {
					return nil, fmt.Errorf("pockettts: voice %q: tensor %q has %d positions, others %d", name, tn, ti.Shape[1], v.Positions)
				}
				v.Positions = int(ti.Shape[1])
				data := f.TensorData(ti)
				if data == nil {
					return nil, fmt.Errorf("pockettts: voice tensor %q lies outside the file", tn)
				}
				t := Tensor{Name: tn, Shape: []int{v.Positions, width}, DType: tensor.F32, Data: data}
				kv[j] = t.Float32s()
				if k := slices.IndexFunc(kv[j], notFinite); k >= 0 {
					return nil, fmt.Errorf("pockettts: voice tensor %q: value %d is %v", tn, k, kv[j][k])
				}
			}
			v.Layers = append(v.Layers, VoiceLayer{K: kv[0], V: kv[1]})
		}
		ck.Voices[name] = v
	}
	for tn := range voiceTensors {
		return nil, fmt.Errorf("pockettts: tensor %q belongs to no listed voice", tn)
	}
	return ck, nil
}
