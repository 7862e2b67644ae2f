package llama

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Shape is a named LLaMA model geometry used to make synthetic models for speed work: weights
// are random, but their sizes and types are those of real models, and speed does not depend on
// the values.
type Shape struct {
	Name                                  string
	Dim, Layers, Heads, KVHeads, FFN, Ctx int
	Vocab                                 int
	// Arch is the architecture written: "" or "llama"; "phi3" (the same weights with the
	// query/key/value and gate/up matrices each fused into one, as Phi-3's files have them);
	// "smollm3"; "granite" (Granite 3's multipliers); "gemma" (no output matrix: tied); or
	// "olmo2" (output norms instead of input norms, and query and key norms).
	Arch string
}

// Shapes are the geometries `parley synth` knows: llama2.c's stories15M and stories110M, and
// TinyLlama-1.1B (grouped-query attention), all with LLaMA's 32,000-token vocabulary.
var Shapes = map[string]Shape{
	"15M":  {"15M", 288, 6, 6, 6, 768, 256, 32000, ""},
	"110M": {"110M", 768, 12, 12, 12, 2048, 1024, 32000, ""},
	"1B":   {"1B", 2048, 22, 32, 4, 5632, 2048, 32000, ""},
}

// SynthArches are the architectures Synth writes.
var SynthArches = []string{"llama", "phi3", "smollm3", "granite", "gemma", "olmo2"}

// ShapeNames lists the known shapes.
func ShapeNames() []string {
	var s []string
	for k := range Shapes {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// synthFallback maps the type of 2-D weights to the one used where a row's length is not a
// multiple of the type's block size, as llama.cpp's quantiser does (Q2_K, Q3_K and IQ4_XS fall
// back to IQ4_NL, 32-element blocks).
var synthFallback = map[tensor.DType]tensor.DType{
	tensor.Q2_K: tensor.IQ4_NL, tensor.Q3_K: tensor.IQ4_NL, tensor.IQ4_XS: tensor.IQ4_NL,
	tensor.Q4_K: tensor.Q5_0, tensor.Q5_K: tensor.Q5_1, tensor.Q6_K: tensor.Q8_0,
}

// SynthFile is Synth's model parsed from memory, ready for Load: for tests and benchmarks.
func SynthFile(s Shape, dt tensor.DType, seed uint64) (*gguf.File, error) {
	w, err := Synth(s, dt, seed)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return nil, err
	}
	return gguf.Parse(buf.Bytes())
}

// Synth builds a GGUF model of the given shape whose 2-D weights are random (normal, standard
// deviation 0.02, seeded) and stored as dt; norm weights are F32 ones. output.weight uses Q6_K
// in Q4_0, K-quant and IQ4 files, as llama.cpp writes them. The vocabulary is a valid
// SentencePiece vocabulary (control tokens, 256 byte tokens, then synthetic pieces) so that the
// file also loads in llama.cpp.
func Synth(s Shape, dt tensor.DType, seed uint64) (*gguf.Writer, error) {
	switch dt {
	case tensor.F32, tensor.F16, tensor.BF16, tensor.Q8_0, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0,
		tensor.Q5_1, tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K, tensor.IQ4_NL,
		tensor.IQ4_XS:
	default:
		return nil, fmt.Errorf("synth: unsupported type %v", dt)
	}
	arch := s.Arch
	switch arch {
	case "":
		arch = "llama"
	case "llama", "phi3", "smollm3", "granite", "gemma", "olmo2":
	default:
		return nil, fmt.Errorf("synth: unsupported architecture %q (%s)", s.Arch, strings.Join(SynthArches, ", "))
	}
	fused := arch == "phi3"
	w := gguf.NewWriter()
	w.SetString("general.architecture", arch)
	w.SetString("general.name", "parley-synth-"+s.Name)
	w.SetUint32("general.file_type", gguf.FileType(dt))
	w.SetUint32("general.alignment", 32)
	p := arch + "."
	w.SetUint32(p+"context_length", uint32(s.Ctx))
	w.SetUint32(p+"embedding_length", uint32(s.Dim))
	w.SetUint32(p+"block_count", uint32(s.Layers))
	w.SetUint32(p+"feed_forward_length", uint32(s.FFN))
	w.SetUint32(p+"attention.head_count", uint32(s.Heads))
	w.SetUint32(p+"attention.head_count_kv", uint32(s.KVHeads))
	w.SetUint32(p+"rope.dimension_count", uint32(s.Dim/s.Heads))
	w.SetFloat32(p+"attention.layer_norm_rms_epsilon", 1e-5)
	w.SetFloat32(p+"rope.freq_base", 10000)
	w.SetUint32(p+"vocab_size", uint32(s.Vocab))
	if fused {
		// Phi-3-mini's, which every phi3 file has (older llama.cpp requires it); Parley, like
		// llama.cpp now, does not apply it.
		w.SetUint32(p+"attention.sliding_window", 2047)
	}
	if arch == "granite" { // Granite 3's multipliers
		w.SetFloat32(p+"embedding_scale", 12)
		w.SetFloat32(p+"residual_scale", 0.22)
		w.SetFloat32(p+"logit_scale", 8)
		w.SetFloat32(p+"attention.scale", 0.015625)
	}
	tokens, scores, types := synthVocab(s.Vocab)
	w.SetString("tokenizer.ggml.model", "llama")
	w.SetStrings("tokenizer.ggml.tokens", tokens)
	w.SetFloats("tokenizer.ggml.scores", scores)
	w.SetInt32s("tokenizer.ggml.token_type", types)
	w.SetUint32("tokenizer.ggml.unknown_token_id", 0)
	w.SetUint32("tokenizer.ggml.bos_token_id", 1)
	w.SetUint32("tokenizer.ggml.eos_token_id", 2)
	w.SetBool("tokenizer.ggml.add_bos_token", true)
	w.SetBool("tokenizer.ggml.add_eos_token", false)

	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	buf := make([]float32, 0)
	add := func(name string, typ tensor.DType, rows, cols int, norm bool) error {
		n := rows * cols
		if cap(buf) < n {
			buf = make([]float32, n)
		}
		buf = buf[:n]
		for i := range buf {
			if norm {
				buf[i] = 1
			} else {
				buf[i] = float32(rng.NormFloat64() * 0.02)
			}
		}
		if cols%typ.BlockSize() != 0 {
			if fb, ok := synthFallback[typ]; ok && cols%fb.BlockSize() == 0 {
				typ = fb
			} else {
				typ = tensor.F16
			}
		}
		data, err := quant.QuantizeRows(typ, buf, cols)
		if err != nil {
			return fmt.Errorf("synth: %s: %w", name, err)
		}
		shape := []int64{int64(cols), int64(rows)}
		if norm {
			shape = shape[:1]
		}
		return w.AddTensor(name, typ, shape, data)
	}
	outType := dt
	switch dt {
	case tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K,
		tensor.IQ4_NL, tensor.IQ4_XS:
		outType = tensor.Q6_K
	}
	hd := s.Dim / s.Heads
	steps := []synthTensor{
		{"token_embd.weight", dt, s.Vocab, s.Dim, false},
		{"output_norm.weight", tensor.F32, 1, s.Dim, true},
	}
	if arch != "gemma" {
		steps = append(steps, synthTensor{"output.weight", outType, s.Vocab, s.Dim, false})
	}
	olmo := arch == "olmo2"
	attnNorm, ffnNorm := "attn_norm.weight", "ffn_norm.weight"
	if olmo {
		attnNorm, ffnNorm = "post_attention_norm.weight", "post_ffw_norm.weight"
	}
	for i := 0; i < s.Layers; i++ {
		p := fmt.Sprintf("blk.%d.", i)
		steps = append(steps, synthTensor{p + attnNorm, tensor.F32, 1, s.Dim, true})
		if olmo {
			steps = append(steps, synthTensor{p + "attn_q_norm.weight", tensor.F32, 1, s.Heads * hd, true},
				synthTensor{p + "attn_k_norm.weight", tensor.F32, 1, s.KVHeads * hd, true})
		}
		if fused {
			steps = append(steps, synthTensor{p + "attn_qkv.weight", dt, (s.Heads + 2*s.KVHeads) * hd, s.Dim, false})
		} else {
			steps = append(steps,
				synthTensor{p + "attn_q.weight", dt, s.Heads * hd, s.Dim, false},
				synthTensor{p + "attn_k.weight", dt, s.KVHeads * hd, s.Dim, false},
				synthTensor{p + "attn_v.weight", dt, s.KVHeads * hd, s.Dim, false})
		}
		steps = append(steps,
			synthTensor{p + "attn_output.weight", dt, s.Dim, s.Heads * hd, false},
			synthTensor{p + ffnNorm, tensor.F32, 1, s.Dim, true})
		if fused {
			steps = append(steps, synthTensor{p + "ffn_up.weight", dt, 2 * s.FFN, s.Dim, false})
		} else {
			steps = append(steps,
				synthTensor{p + "ffn_gate.weight", dt, s.FFN, s.Dim, false},
				synthTensor{p + "ffn_up.weight", dt, s.FFN, s.Dim, false})
		}
		steps = append(steps, synthTensor{p + "ffn_down.weight", dt, s.Dim, s.FFN, false})
	}
	for _, st := range steps {
		if err := add(st.name, st.typ, st.rows, st.cols, st.norm); err != nil {
			return nil, err
		}
	}
	return w, nil
}

type synthTensor struct {
	name       string
	typ        tensor.DType
	rows, cols int
	norm       bool
}

// synthVocab makes a SentencePiece vocabulary of n tokens: <unk>, <s>, </s>, the 256 byte
// tokens, then distinct synthetic pieces with decreasing scores.
func synthVocab(n int) (tokens []string, scores []float32, types []int32) {
	tokens = make([]string, 0, n)
	scores = make([]float32, 0, n)
	types = make([]int32, 0, n)
	add := func(t string, s float32, ty int32) {
		tokens = append(tokens, t)
		scores = append(scores, s)
		types = append(types, ty)
	}
	add("<unk>", 0, 2)
	add("<s>", 0, 3)
	add("</s>", 0, 3)
	for b := 0; b < 256 && len(tokens) < n; b++ {
		add(fmt.Sprintf("<0x%02X>", b), 0, 6)
	}
	letters := "abcdefghijklmnopqrstuvwxyz"
	var sb strings.Builder
	for i := 0; len(tokens) < n; i++ {
		sb.Reset()
		sb.WriteString("▁")
		for v := i; ; v /= 26 {
			sb.WriteByte(letters[v%26])
			if v < 26 {
				break
			}
		}
		add(sb.String(), float32(-i), 1)
	}
	return tokens, scores, types
}
