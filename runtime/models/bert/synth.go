package bert

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"

	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Shape is a named BERT geometry used to make synthetic models: weights are random, but their
// sizes, types and names are those of real models as llama.cpp's converter writes them.
type Shape struct {
	Name                         string
	Dim, Layers, Heads, FFN      int
	Positions, Vocab, TokenTypes int
	Pooling                      pooling.Type
	NormEps                      float32
}

// Shapes are the geometries `parley synth --arch bert` knows: BAAI/bge-small-en-v1.5 (CLS
// pooling) and sentence-transformers/all-MiniLM-L6-v2 (mean pooling), both with BERT's
// 30,522-token uncased WordPiece vocabulary.
var Shapes = map[string]Shape{
	"bge-small": {"bge-small", 384, 12, 12, 1536, 512, 30522, 2, pooling.CLS, 1e-12},
	"minilm":    {"minilm", 384, 6, 12, 1536, 512, 30522, 2, pooling.Mean, 1e-12},
}

// ShapeNames lists the known shapes.
func ShapeNames() []string {
	var s []string
	for k := range Shapes {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// SynthTypes are the weight types Synth writes: those whose blocks divide the rows of the
// shapes above.
var SynthTypes = []tensor.DType{tensor.F32, tensor.F16, tensor.BF16, tensor.Q8_0, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1}

// llamaPooling is llama.cpp's enum llama_pooling_type value for t.
func llamaPooling(t pooling.Type) (uint32, error) {
	switch t {
	case pooling.None, pooling.Mean, pooling.CLS, pooling.Last:
		return uint32(t - pooling.None), nil
	}
	return 0, fmt.Errorf("bert synth: pooling %v cannot be written", t)
}

// SynthFile is Synth's model parsed from memory, ready for Load: for tests and benchmarks.
func SynthFile(s Shape, dt tensor.DType, seed uint64, vocab *gguf.File) (*gguf.File, error) {
	w, err := Synth(s, dt, seed, vocab)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return nil, err
	}
	return gguf.Parse(buf.Bytes())
}

// Synth builds a GGUF model of the given shape with the keys and tensor names llama.cpp's
// converter writes for a BERT model (convert_hf_to_gguf.py, BertModel), whose weights are random
// and seeded: matrices and biases normal with standard deviation 0.02, norm weights 1 plus
// normal noise of 0.1. Matrices and token_embd.weight are stored as dt (F16 where a row is not
// a whole number of dt's blocks); position_embd.weight, token_types.weight, norms and biases in
// F32, as the converter keeps them. The tokenizer is vocab's (its tokenizer.* keys copied, and
// its vocabulary size taken), or without one a synthetic uncased WordPiece vocabulary of
// s.Vocab tokens with BERT's special tokens at their usual ids.
func Synth(s Shape, dt tensor.DType, seed uint64, vocab *gguf.File) (*gguf.Writer, error) {
	if !slices.Contains(SynthTypes, dt) {
		return nil, fmt.Errorf("bert synth: unsupported type %v (%v)", dt, SynthTypes)
	}
	if s.Dim <= 0 || s.Layers <= 0 || s.Heads <= 0 || s.Dim%s.Heads != 0 || s.FFN <= 0 || s.Positions <= 0 || s.TokenTypes <= 0 {
		return nil, fmt.Errorf("bert synth: invalid shape %+v", s)
	}
	pool, err := llamaPooling(s.Pooling)
	if err != nil {
		return nil, err
	}
	eps := s.NormEps
	if eps == 0 {
		eps = 1e-12
	}
	w := gguf.NewWriter()
	w.SetString("general.architecture", Arch)
	w.SetString("general.name", "parley-synth-"+s.Name)
	const p = Arch + "."
	w.SetUint32(p+"block_count", uint32(s.Layers))
	w.SetUint32(p+"context_length", uint32(s.Positions))
	w.SetUint32(p+"embedding_length", uint32(s.Dim))
	w.SetUint32(p+"feed_forward_length", uint32(s.FFN))
	w.SetUint32(p+"attention.head_count", uint32(s.Heads))
	w.SetFloat32(p+"attention.layer_norm_epsilon", eps)
	w.SetUint32("general.file_type", gguf.FileType(dt))
	w.SetBool(p+"attention.causal", false)
	w.SetUint32(p+"pooling_type", pool)
	w.SetUint32("tokenizer.ggml.token_type_count", uint32(s.TokenTypes))
	if vocab != nil {
		toks, ok := vocab.Strings("tokenizer.ggml.tokens")
		if !ok || len(toks) == 0 {
			return nil, fmt.Errorf("bert synth: the vocabulary file has no tokenizer.ggml.tokens")
		}
		s.Vocab = len(toks)
		for _, kv := range vocab.KVs {
			if strings.HasPrefix(kv.Key, "tokenizer.") && kv.Key != "tokenizer.ggml.token_type_count" {
				w.Set(kv.Key, kv.Value)
			}
		}
	} else {
		if s.Vocab < 104 {
			return nil, fmt.Errorf("bert synth: a vocabulary of %d tokens has no room for BERT's special tokens (ids 0 to 103)", s.Vocab)
		}
		tokens, types := synthVocab(s.Vocab)
		w.SetString("tokenizer.ggml.model", "bert")
		w.SetString("tokenizer.ggml.pre", "default")
		w.SetStrings("tokenizer.ggml.tokens", tokens)
		w.SetInt32s("tokenizer.ggml.token_type", types)
		w.SetUint32("tokenizer.ggml.unknown_token_id", 100)
		w.SetUint32("tokenizer.ggml.seperator_token_id", 102)
		w.SetUint32("tokenizer.ggml.padding_token_id", 0)
		w.SetUint32("tokenizer.ggml.cls_token_id", 101)
		w.SetUint32("tokenizer.ggml.mask_token_id", 103)
	}

	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	var buf []float32
	add := func(name string, typ tensor.DType, rows, cols int, vector bool, fill func() float32) error {
		n := rows * cols
		if cap(buf) < n {
			buf = make([]float32, n)
		}
		buf = buf[:n]
		for i := range buf {
			buf[i] = fill()
		}
		if cols%typ.BlockSize() != 0 {
			typ = tensor.F16
		}
		data, err := quant.QuantizeRows(typ, buf, cols)
		if err != nil {
			return fmt.Errorf("bert synth: %s: %w", name, err)
		}
		shape := []int64{int64(cols), int64(rows)}
		if vector {
			shape = shape[:1]
		}
		return w.AddTensor(name, typ, shape, data)
	}
	weight := func() float32 { return float32(rng.NormFloat64() * 0.02) }
	gain := func() float32 { return float32(1 + rng.NormFloat64()*0.1) }
	type st struct {
		name       string
		typ        tensor.DType
		rows, cols int
		fill       func() float32
	}
	steps := []st{
		{"token_embd.weight", dt, s.Vocab, s.Dim, weight},
		{"position_embd.weight", tensor.F32, s.Positions, s.Dim, weight},
		{"token_types.weight", tensor.F32, s.TokenTypes, s.Dim, weight},
		{"token_embd_norm.weight", tensor.F32, 1, s.Dim, gain},
		{"token_embd_norm.bias", tensor.F32, 1, s.Dim, weight},
	}
	for i := range s.Layers {
		b := fmt.Sprintf("blk.%d.", i)
		steps = append(steps,
			st{b + "attn_q.weight", dt, s.Dim, s.Dim, weight}, st{b + "attn_q.bias", tensor.F32, 1, s.Dim, weight},
			st{b + "attn_k.weight", dt, s.Dim, s.Dim, weight}, st{b + "attn_k.bias", tensor.F32, 1, s.Dim, weight},
			st{b + "attn_v.weight", dt, s.Dim, s.Dim, weight}, st{b + "attn_v.bias", tensor.F32, 1, s.Dim, weight},
			st{b + "attn_output.weight", dt, s.Dim, s.Dim, weight}, st{b + "attn_output.bias", tensor.F32, 1, s.Dim, weight},
			st{b + "attn_output_norm.weight", tensor.F32, 1, s.Dim, gain}, st{b + "attn_output_norm.bias", tensor.F32, 1, s.Dim, weight},
			st{b + "ffn_up.weight", dt, s.FFN, s.Dim, weight}, st{b + "ffn_up.bias", tensor.F32, 1, s.FFN, weight},
			st{b + "ffn_down.weight", dt, s.Dim, s.FFN, weight}, st{b + "ffn_down.bias", tensor.F32, 1, s.Dim, weight},
			st{b + "layer_output_norm.weight", tensor.F32, 1, s.Dim, gain}, st{b + "layer_output_norm.bias", tensor.F32, 1, s.Dim, weight},
		)
	}
	for _, t := range steps {
		vector := t.typ == tensor.F32 && (strings.HasSuffix(t.name, ".bias") || strings.HasSuffix(t.name, "norm.weight"))
		if err := add(t.name, t.typ, t.rows, t.cols, vector, t.fill); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// synthVocab makes an uncased WordPiece vocabulary of n tokens (n >= 104) in the form llama.cpp's
// converter writes (a word-initial piece prefixed with U+2581, a continuation piece bare): [PAD],
// [unused0] to [unused98], [UNK], [CLS], [SEP], [MASK] at BERT's ids 0 to 103, then each
// printable ASCII character as a word and as a continuation, then synthetic words.
func synthVocab(n int) (tokens []string, types []int32) {
	add := func(t string, ty int32) {
		if len(tokens) < n {
			tokens = append(tokens, t)
			types = append(types, ty)
		}
	}
	add("[PAD]", 3)
	for i := range 99 {
		add(fmt.Sprintf("[unused%d]", i), 1)
	}
	for _, s := range []string{"[UNK]", "[CLS]", "[SEP]", "[MASK]"} {
		add(s, 3)
	}
	for c := byte('!'); c <= '~'; c++ {
		if c >= 'A' && c <= 'Z' {
			continue // uncased
		}
		add("\u2581"+string(c), 1)
		add(string(c), 1)
	}
	const letters = "abcdefghijklmnopqrstuvwxyz"
	var sb strings.Builder
	for i := 0; len(tokens) < n; i++ {
		sb.Reset()
		sb.WriteString("\u2581")
		for v := i + 26; ; v /= 26 { // two letters and more: single letters are above
			sb.WriteByte(letters[v%26])
			if v < 26 {
				break
			}
		}
		add(sb.String(), 1)
	}
	return tokens, types
}
