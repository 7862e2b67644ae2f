// Package bert implements BERT-family encoders as llama.cpp's converter writes them into GGUF
// (architecture "bert": bge, e5, MiniLM and other sentence-transformers models with WordPiece
// vocabularies): learned absolute position embeddings, token-type embeddings (type 0 for every
// token, as llama.cpp runs them), post-norm layers with biases, GELU feed-forward networks and
// attention that is not causal, within each sequence. A batched forward over several sequences
// of different lengths returns one pooled, normalised embedding per sequence (package pooling).
// Hyper-parameters and weights are bound from a GGUF file, and the computation is written once
// against backend.Backend.
//
// The computation follows llama.cpp's graph for LLM_ARCH_BERT at commit
// c392e5094deaf2d1a7c18683214f007fad3fe42b: src/llama.cpp, build_bert (lines 2626-2818) and
// append_pooling (lines 1364-1427); the hyper-parameters and tensors as src/llama-model.cpp
// reads them (lines 621-642 and 1828-1875). llama.cpp's CPU backend looks GELU up in an F16 table;
// Parley computes it exactly.
package bert

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/pooling"
)

// Arch is the architecture this package runs (general.architecture).
const Arch = "bert"

// Config holds a model's hyper-parameters.
type Config struct {
	Dim        int // embedding width
	Layers     int
	Heads      int // query heads
	KVHeads    int // key/value heads (grouped-query attention when < Heads)
	HeadDim    int // Dim / Heads
	FFN        int // feed-forward hidden width
	Vocab      int
	Positions  int // context_length: rows of position_embd, the longest sequence
	TokenTypes int // rows of token_types (only the first is used)
	NormEps    float32
	// Pooling is the file's (bert.pooling_type), Unspecified when it has none; a context
	// without a pooling of its own then runs None, as llama.cpp does.
	Pooling pooling.Type
}

// Limits on hyper-parameters, against overflow and absurd allocations, not a memory budget.
const maxDim = 1 << 16

// ConfigFrom reads the hyper-parameters from a GGUF file's metadata and tensor shapes.
func ConfigFrom(f *gguf.File) (Config, error) {
	if arch := f.Architecture(); arch != Arch {
		if arch == "" {
			return Config{}, fmt.Errorf("bert: model has no general.architecture")
		}
		return Config{}, fmt.Errorf("bert: model architecture %q is not %q", arch, Arch)
	}
	const p = Arch + "."
	var c Config
	req := func(key string, dst *int, limit int) error {
		v, ok := f.Int(p + key)
		if !ok {
			return fmt.Errorf("bert: model metadata lacks %s%s", p, key)
		}
		if v <= 0 || v > int64(limit) {
			return fmt.Errorf("bert: model metadata %s%s = %d is out of range (1 to %d)", p, key, v, limit)
		}
		*dst = int(v)
		return nil
	}
	for _, r := range []struct {
		key   string
		dst   *int
		limit int
	}{
		{"embedding_length", &c.Dim, maxDim}, {"block_count", &c.Layers, 1 << 10},
		{"feed_forward_length", &c.FFN, 1 << 18}, {"attention.head_count", &c.Heads, 1 << 10},
		{"context_length", &c.Positions, 1 << 20},
	} {
		if err := req(r.key, r.dst, r.limit); err != nil {
			return Config{}, err
		}
	}
	c.KVHeads = c.Heads
	if _, ok := f.Value(p + "attention.head_count_kv"); ok {
		if err := req("attention.head_count_kv", &c.KVHeads, 1<<10); err != nil {
			return Config{}, err
		}
	}
	if c.Dim%c.Heads != 0 {
		return Config{}, fmt.Errorf("bert: embedding width %d is not a multiple of %d heads", c.Dim, c.Heads)
	}
	c.HeadDim = c.Dim / c.Heads
	if c.KVHeads > c.Heads || c.Heads%c.KVHeads != 0 {
		return Config{}, fmt.Errorf("bert: %d query heads cannot share %d key/value heads", c.Heads, c.KVHeads)
	}
	for _, key := range []string{"attention.key_length", "attention.value_length"} {
		if v, ok := f.Int(p + key); ok && v != int64(c.HeadDim) {
			return Config{}, fmt.Errorf("bert: %s%s = %d, but heads are %d wide (width over heads), which llama.cpp's bert requires", p, key, v, c.HeadDim)
		}
	}
	eps, ok := f.Float(p + "attention.layer_norm_epsilon")
	if !ok {
		return Config{}, fmt.Errorf("bert: model metadata lacks %sattention.layer_norm_epsilon", p)
	}
	if !(eps > 0 && eps < 1) || !(float32(eps) > 0) {
		return Config{}, fmt.Errorf("bert: layer norm epsilon %g is out of range", eps)
	}
	c.NormEps = float32(eps)
	// llama.cpp requires the key; a causal encoder would attend as a decoder does.
	v, ok := f.Value(p + "attention.causal")
	if !ok {
		return Config{}, fmt.Errorf("bert: model metadata lacks %sattention.causal", p)
	}
	if causal, isBool := v.V.(bool); !isBool || causal {
		return Config{}, fmt.Errorf("bert: %sattention.causal = %v; only attention over the whole sequence (false) is supported", p, v.V)
	}
	var err error
	if c.Pooling, err = pooling.Read(f, Arch); err != nil {
		return Config{}, fmt.Errorf("bert: %w", err)
	}
	if c.Pooling == pooling.Rank {
		return Config{}, fmt.Errorf("bert: rank pooling (a reranker's classification head) is not supported")
	}
	rows := func(name string) (int, error) {
		t, ok := f.Tensor(name)
		if !ok {
			return 0, fmt.Errorf("bert: model lacks tensor %s", name)
		}
		if len(t.Shape) != 2 || t.Shape[0] != int64(c.Dim) || t.Shape[1] <= 0 || t.Shape[1] > 1<<24 {
			return 0, fmt.Errorf("bert: %s has shape %v, want [%d rows]", name, t.Shape, c.Dim)
		}
		return int(t.Shape[1]), nil
	}
	if c.Vocab, err = rows("token_embd.weight"); err != nil {
		return Config{}, err
	}
	if c.TokenTypes, err = rows("token_types.weight"); err != nil {
		return Config{}, err
	}
	if n, ok := f.Int("tokenizer.ggml.token_type_count"); ok && n != int64(c.TokenTypes) {
		return Config{}, fmt.Errorf("bert: token_types.weight has %d rows, but tokenizer.ggml.token_type_count = %d", c.TokenTypes, n)
	}
	if c.Positions > math.MaxInt32/2 {
		return Config{}, fmt.Errorf("bert: context length %d is out of range", c.Positions)
	}
	return c, nil
}

func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }
