// Package llama implements the LLaMA family of decoder-only transformers (Llama 2/3, Mistral's
// layout, and relatives: Qwen2, whose only difference is a bias on the query, key and value
// projections; Qwen3, whose queries and keys are RMS-normalised per head before the rotation;
// Phi-3, whose query, key and value projections are one matrix and whose gate and up
// projections are another, with LongRoPE's two sets of frequency factors; SmolLM3, whose every
// fourth layer attends without rotation; OLMo 2, which normalises each block's outputs instead
// of its inputs, and its queries and keys whole; Granite, which scales its embeddings, its
// blocks' outputs, its attention and its logits by constants of the file; and Gemma (the first),
// whose embeddings are scaled by the square root of the width and whose feed-forward network
// gates with GELU): hyper-parameters and
// weights bound from a GGUF file, and a batched forward step over a shared block KV cache,
// written once against backend.Backend.
//
// The computation follows llama.cpp's graph for LLM_ARCH_LLAMA and LLM_ARCH_QWEN2 (src/llama-model.cpp,
// llm_build_llama / llm_build_qwen2 at commit c392e5094deaf2d1a7c18683214f007fad3fe42b),
// LLM_ARCH_QWEN3, LLM_ARCH_PHI3, LLM_ARCH_SMOLLM3, LLM_ARCH_OLMO2, LLM_ARCH_GRANITE and
// LLM_ARCH_GEMMA (llm_build_qwen3, llm_build_phi3, llm_build_smollm3, llm_build_olmo2,
// llm_build_granite, llm_build_gemma):
// RMSNorm, rotary position
// embedding, grouped-query attention, SwiGLU feed-forward, tied or separate output. As llama.cpp
// does, Phi-3's sliding window (phi3.attention.sliding_window) is not applied: every position
// attends to the whole sequence.
package llama

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Config holds a model's hyper-parameters.
type Config struct {
	Arch      string
	Dim       int // embedding width
	Layers    int
	Heads     int // query heads
	KVHeads   int // key/value heads (grouped-query attention when < Heads)
	HeadDim   int
	FFN       int // feed-forward hidden width
	Vocab     int
	Context   int // training context length
	NormEps   float32
	RoPE      backend.RoPE
	QKVBias   bool
	QKNorm    bool // queries and keys RMS-normalised per head before RoPE (qwen3)
	TiedEmbed bool // output projection shares token_embd.weight
	Fused     bool // attn_qkv.weight (where the file has it) and ffn_up.weight of gate then up (phi3)
	NoRoPE    int  // when > 0, layers li with (li+1)%NoRoPE == 0 are not rotated (smollm3: 4)
	// PostNorm (olmo2): no norm before attention or the feed-forward network; their outputs are
	// RMS-normalised (post_attention_norm, post_ffw_norm) before they join the residual stream, and
	// the queries and keys are normalised whole (QKNorm over all heads at once).
	PostNorm bool
	// Granite's multipliers, 0 where a model has none: the embeddings are multiplied by
	// EmbedScale, each block's output by ResidualScale before it joins the residual stream, and
	// the logits divided by LogitScale; AttnScale replaces 1/sqrt(HeadDim) in attention.
	EmbedScale, ResidualScale, LogitScale, AttnScale float32
	GeGLU                                            bool // gelu(gate)*up in place of silu(gate)*up (gemma)

	// LongRoPE (phi3): RoPE.Factors are the short factors (rope_factors_short.weight); a context
	// whose sequences may run past OrigContext positions uses LongFactors
	// (rope_factors_long.weight) instead. AttnFactor multiplies the rotated queries and keys
	// (phi3.rope.scaling.attn_factor, 1 when absent; any architecture's file may set it, as
	// llama.cpp reads it for all).
	LongFactors []float32
	OrigContext int
	AttnFactor  float32
}

// arches lists the architectures this package runs and how they differ.
var arches = map[string]struct {
	rope    backend.RoPEMode
	qkvBias bool
	qkNorm  bool
	fused   bool
	noRoPE  int
	post    bool
	granite bool
	gemma   bool
}{
	"llama":   {backend.RoPENormal, false, false, false, 0, false, false, false},
	"mistral": {backend.RoPENormal, false, false, false, 0, false, false, false},
	"qwen2":   {backend.RoPENeoX, true, false, false, 0, false, false, false},
	"qwen3":   {backend.RoPENeoX, false, true, false, 0, false, false, false},
	"phi3":    {backend.RoPENeoX, false, false, true, 0, false, false, false},
	"smollm3": {backend.RoPENormal, false, false, false, 4, false, false, false},
	"olmo2":   {backend.RoPENeoX, false, true, false, 0, true, false, false},
	"granite": {backend.RoPENormal, false, false, false, 0, false, true, false},
	"gemma":   {backend.RoPENeoX, false, false, false, 0, false, false, true},
}

// notYet says what the architectures nearest those supported need that this package lacks.
var notYet = map[string]string{
	"gemma2": "it attends within a sliding window on every other layer and soft-caps its attention logits",
	"gemma3": "it attends within a sliding window on five layers of six",
}

// Supported reports whether arch is an architecture this package runs.
func Supported(arch string) bool { _, ok := arches[arch]; return ok }

// ConfigFrom reads the hyper-parameters from a GGUF file's metadata.
func ConfigFrom(f *gguf.File) (Config, error) {
	arch := f.Architecture()
	a, ok := arches[arch]
	if !ok {
		if arch == "" {
			return Config{}, fmt.Errorf("model has no general.architecture")
		}
		if why, ok := notYet[arch]; ok {
			return Config{}, fmt.Errorf("model architecture %q is not supported: %s", arch, why)
		}
		return Config{}, fmt.Errorf("unsupported model architecture %q (supported: llama, mistral, qwen2, qwen3, phi3, smollm3, olmo2, granite, gemma)", arch)
	}
	c := Config{Arch: arch, QKVBias: a.qkvBias, QKNorm: a.qkNorm, Fused: a.fused, NoRoPE: a.noRoPE, PostNorm: a.post}
	if a.granite {
		if err := c.graniteScales(f, arch+"."); err != nil {
			return Config{}, err
		}
	}
	if arch == "olmo2" {
		// OLMo 3 files (olmo2 with a window) attend within a window on three layers of four.
		if v, ok := f.Int(arch + ".attention.sliding_window"); ok && v > 0 {
			return Config{}, fmt.Errorf("sliding-window attention (%s.attention.sliding_window = %d, OLMo 3) is not supported", arch, v)
		}
	}
	p := arch + "."
	req := func(key string, dst *int) error {
		v, ok := f.Int(p + key)
		if !ok {
			return fmt.Errorf("model metadata lacks %s%s", p, key)
		}
		if v <= 0 || v > 1<<24 {
			return fmt.Errorf("model metadata %s%s = %d is out of range", p, key, v)
		}
		*dst = int(v)
		return nil
	}
	opt := func(key string, dst *int, def int) error {
		if _, ok := f.Value(p + key); !ok {
			*dst = def
			return nil
		}
		return req(key, dst)
	}
	for _, r := range []struct {
		key string
		dst *int
	}{{"embedding_length", &c.Dim}, {"block_count", &c.Layers}, {"feed_forward_length", &c.FFN}, {"attention.head_count", &c.Heads}} {
		if err := req(r.key, r.dst); err != nil {
			return Config{}, err
		}
	}
	if err := opt("attention.head_count_kv", &c.KVHeads, c.Heads); err != nil {
		return Config{}, err
	}
	if c.Dim%c.Heads != 0 {
		return Config{}, fmt.Errorf("embedding width %d is not a multiple of %d heads", c.Dim, c.Heads)
	}
	if err := opt("attention.key_length", &c.HeadDim, c.Dim/c.Heads); err != nil {
		return Config{}, err
	}
	valueDim := c.HeadDim
	if err := opt("attention.value_length", &valueDim, c.HeadDim); err != nil {
		return Config{}, err
	}
	if valueDim != c.HeadDim {
		return Config{}, fmt.Errorf("value heads of %d elements differ from key heads of %d, which Parley does not run", valueDim, c.HeadDim)
	}
	if c.KVHeads > c.Heads || c.Heads%c.KVHeads != 0 {
		return Config{}, fmt.Errorf("%d query heads cannot share %d key/value heads", c.Heads, c.KVHeads)
	}
	if err := opt("context_length", &c.Context, 2048); err != nil {
		return Config{}, err
	}
	c.NormEps = 1e-5
	if v, ok := f.Float(p + "attention.layer_norm_rms_epsilon"); ok {
		if !(v > 0 && v < 1) || !(float32(v) > 0) {
			return Config{}, fmt.Errorf("rms norm epsilon %g is out of range", v)
		}
		c.NormEps = float32(v)
	}
	ropeDims := c.HeadDim
	if err := opt("rope.dimension_count", &ropeDims, c.HeadDim); err != nil {
		return Config{}, err
	}
	if ropeDims > c.HeadDim || ropeDims%2 != 0 {
		return Config{}, fmt.Errorf("rope dimension count %d does not fit head size %d", ropeDims, c.HeadDim)
	}
	base := 10000.0
	if v, ok := f.Float(p + "rope.freq_base"); ok {
		if !(v > 0) || math.IsInf(float64(float32(v)), 0) || !(float32(v) > 0) {
			return Config{}, fmt.Errorf("rope frequency base %g is out of range", v)
		}
		base = v
	}
	// As llama.cpp reads them: the type defaults to linear; the factor is rope.scaling.factor,
	// else the older rope.scale_linear, and positions are divided by it unless the type is none.
	// YaRN adds its ramp towards the unscaled angles of the fastest pairs (set below).
	scale := 1.0
	typ, hasType := f.String(p + "rope.scaling.type")
	if hasType && typ != "none" && typ != "linear" && typ != "yarn" {
		return Config{}, fmt.Errorf("rope scaling %q is not supported (linear or yarn)", typ)
	}
	factor, ok := f.Float(p + "rope.scaling.factor")
	if !ok {
		factor, ok = f.Float(p + "rope.scale_linear")
	}
	switch {
	case ok && factor > 0:
		scale = 1 / factor
	case ok && factor != 0 || hasType && (typ == "linear" || typ == "yarn") && !ok:
		if typ != "yarn" {
			typ = "linear"
		}
		return Config{}, fmt.Errorf("%s rope scaling without a valid factor", typ)
	}
	if typ == "none" { // llama.cpp: "never scale if scaling type is none"
		scale = 1
	}
	if fs := float32(scale); !(fs > 0) || math.IsInf(float64(fs), 0) || math.IsInf(float64(1/fs), 0) {
		return Config{}, fmt.Errorf("rope scaling factor %g is out of range", 1/scale)
	}
	c.RoPE = backend.RoPE{Mode: a.rope, HeadDim: c.HeadDim, Dims: ropeDims, Base: float32(base), FreqScale: float32(scale)}
	factors, err := ropeFactors(f, "rope_freqs.weight", ropeDims)
	if err != nil {
		return Config{}, err
	}
	c.RoPE.Factors = factors
	if err := c.longRoPE(f, p); err != nil {
		return Config{}, err
	}
	if typ == "yarn" && scale != 1 {
		// As llama.cpp runs YaRN for these architectures: full extrapolation, its default
		// rotation counts (32 fast, 1 slow) over the original context, the file's attention
		// factor (rope.scaling.attn_factor) times YaRN's own magnitude correction.
		c.RoPE.ExtFactor = 1
		c.RoPE.CorrDims = backend.YaRNCorrDims(ropeDims, c.OrigContext, c.RoPE.Base, 32, 1)
	}

	emb, ok := f.Tensor("token_embd.weight")
	if !ok {
		return Config{}, fmt.Errorf("model lacks tensor token_embd.weight")
	}
	if len(emb.Shape) != 2 || emb.Shape[0] != int64(c.Dim) || emb.Shape[1] <= 0 || emb.Shape[1] > 1<<24 {
		return Config{}, fmt.Errorf("token_embd.weight has shape %v, want [%d vocab]", emb.Shape, c.Dim)
	}
	c.Vocab = int(emb.Shape[1])
	_, hasOut := f.Tensor("output.weight")
	c.TiedEmbed = !hasOut
	if a.gemma {
		// The embeddings times sqrt(width) (in float32, as ggml_scale's sqrtf), GELU gating.
		c.EmbedScale, c.GeGLU = sqrt32(float32(c.Dim)), true
	}
	return c, nil
}

// longRoPE reads Phi-3's LongRoPE: the short and long frequency factors, the original context
// that chooses between them, and the attention factor, as llama.cpp reads them (a file's
// rope_freqs.weight, where it has one, is used at every length instead).
func (c *Config) longRoPE(f *gguf.File, p string) error {
	c.AttnFactor = 1
	if v, ok := f.Float(p + "rope.scaling.attn_factor"); ok {
		if !(v > 0) || math.IsInf(v, 0) || !(float32(v) > 0) || math.IsInf(float64(float32(v)), 0) {
			return fmt.Errorf("rope attention factor %g is out of range", v)
		}
		c.AttnFactor = float32(v)
	}
	// As llama.cpp: 0 (or no value) means the training context.
	c.OrigContext = c.Context
	if v, ok := f.Int(p + "rope.scaling.original_context_length"); ok && v > 0 {
		c.OrigContext = int(min(v, math.MaxInt32))
	}
	short, err := ropeFactors(f, "rope_factors_short.weight", c.RoPE.Dims)
	if err != nil {
		return err
	}
	long, err := ropeFactors(f, "rope_factors_long.weight", c.RoPE.Dims)
	if err != nil {
		return err
	}
	if (short != nil || long != nil) && !c.Fused {
		return fmt.Errorf("LongRoPE frequency factors in a %s model, which Parley runs only for phi3", c.Arch)
	}
	if c.RoPE.Factors == nil {
		c.RoPE.Factors, c.LongFactors = short, long
	}
	return nil
}

// graniteScales reads Granite's multipliers, which llama.cpp requires, and its switch for the
// rotation (rope.scaling.finetuned, true when absent: false means no layer is rotated).
func (c *Config) graniteScales(f *gguf.File, p string) error {
	for _, s := range []struct {
		key string
		dst *float32
	}{{"embedding_scale", &c.EmbedScale}, {"residual_scale", &c.ResidualScale}, {"logit_scale", &c.LogitScale}, {"attention.scale", &c.AttnScale}} {
		v, ok := f.Float(p + s.key)
		if !ok {
			return fmt.Errorf("model metadata lacks %s%s", p, s.key)
		}
		if fv := float32(v); fv != fv || math.IsInf(float64(fv), 0) || v < 0 || s.key == "logit_scale" && !(fv > 0 && !math.IsInf(float64(1/fv), 0)) {
			return fmt.Errorf("model metadata %s%s = %g is out of range", p, s.key, v)
		}
		*s.dst = float32(v)
	}
	if v, ok := f.Value(p + "rope.scaling.finetuned"); ok {
		b, isBool := v.V.(bool)
		if !isBool {
			return fmt.Errorf("model metadata %srope.scaling.finetuned is not a boolean", p)
		}
		if !b {
			c.NoRoPE = 1 // (li+1)%1 == 0 for every layer
		}
	}
	return nil
}

// RoPEFor is the rotation of a context whose sequences may reach seqCtx positions: the long
// LongRoPE factors beyond the original context, as llama.cpp chooses them, and the attention
// factor.
func (c *Config) RoPEFor(seqCtx int) backend.RoPE {
	r := c.RoPE
	if c.AttnFactor != 1 {
		r.AttnFactor = c.AttnFactor
	}
	if c.LongFactors != nil && seqCtx > c.OrigContext {
		r.Factors = c.LongFactors
	}
	return r
}

// ropeFactors reads name, the per-pair divisors of the rotary angles: rope_freqs.weight, with
// which llama.cpp's converter writes Llama 3.1's frequency scaling (rope_scaling "llama3"), or
// Phi-3's rope_factors_short.weight and rope_factors_long.weight (LongRoPE). F32 [dims/2],
// finite and above 0. nil when the file has none.
func ropeFactors(f *gguf.File, name string, dims int) ([]float32, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return nil, nil
	}
	if t.DType != tensor.F32 || len(t.Shape) != 1 || t.Shape[0] != int64(dims/2) {
		return nil, fmt.Errorf("%s is %v %v, want F32 [%d]", name, t.DType, t.Shape, dims/2)
	}
	b := f.TensorData(t)
	if len(b) != 4*(dims/2) {
		return nil, fmt.Errorf("%s lies outside the file's data", name)
	}
	out := make([]float32, dims/2)
	for i := range out {
		v := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		if !(v > 0) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%s[%d] = %v, want a finite value above 0", name, i, v)
		}
		out[i] = v
	}
	return out, nil
}
