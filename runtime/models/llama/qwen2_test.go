package llama_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestQwen2MatchesFloat64: the qwen2 architecture (query/key/value biases, NeoX RoPE, its own
// metadata prefix and rope base) runs on every backend as the float64 reference computes it.
func TestQwen2MatchesFloat64(t *testing.T) {
	base, err := llama.SynthFile(tinyShape, tensor.F32, 5)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	f := modeltest.Rebuild(t, base, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti != nil {
			if strings.HasSuffix(ti.Name, "attn_k.weight") || strings.HasSuffix(ti.Name, "attn_q.weight") || strings.HasSuffix(ti.Name, "attn_v.weight") {
				n := int(ti.Shape[1])
				b := make([]byte, 4*n)
				for i := 0; i < n; i++ {
					binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(rng.NormFloat64()*0.5)))
				}
				_ = w.AddTensor(strings.Replace(ti.Name, ".weight", ".bias", 1), tensor.F32, []int64{int64(n)}, b)
			}
			return true
		}
		setArch(w, base, "qwen2")
		w.SetFloat32("qwen2.rope.freq_base", 1e6)
		return true
	})
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7, 7, 180}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			cfg, err := llama.ConfigFrom(f)
			if err != nil || cfg.RoPE.Mode != backend.RoPENeoX || !cfg.QKVBias || cfg.RoPE.Base != 1e6 {
				t.Fatalf("qwen2 config %+v, %v", cfg, err)
			}
			ref := newRef64(t, f)
			for i, logits := range oneByOne(t, be, f, toks) {
				want := ref.step(toks[i])
				for j := range want {
					if d := math.Abs(float64(logits[j]) - want[j]); d > 1e-3 {
						t.Fatalf("position %d: logit %d = %v, float64 reference %v", i, j, logits[j], want[j])
					}
				}
			}
		})
	}
}

// oneByOne loads f on be and feeds toks one at a time to one sequence (F32 cache), returning
// the logits after each.
func oneByOne(t *testing.T, be backend.Backend, f *gguf.File, toks []int32) [][]float32 {
	t.Helper()
	return oneByOneIn(t, be, f, toks, llama.ContextConfig{StepTokens: 4, MaxSeqs: 1, KVSlots: 32, KVType: tensor.F32})
}

// oneByOneIn is oneByOne in a context of cfg (KVSlots 32 or more).
func oneByOneIn(t *testing.T, be backend.Backend, f *gguf.File, toks []int32, cfg llama.ContextConfig) [][]float32 {
	t.Helper()
	m, err := llama.Load(f, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := m.NewContext(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seq := c.Pool().NewSeq(32)
	var bb kvcache.BatchBuilder
	var out [][]float32
	for _, tk := range toks {
		logits := make([]float32, m.Vocab)
		_ = seq.Reserve(1)
		bb.Reset()
		_ = bb.Add(seq, 1)
		if err := c.Forward([]int32{tk}, bb.Batch(), []int32{0}, logits); err != nil {
			t.Fatal(err)
		}
		_ = seq.Advance(1)
		out = append(out, logits)
	}
	return out
}

// TestRopeFreqsMatchesFloat64: a model with rope_freqs.weight (the per-pair divisors of the
// rotary angles with which llama.cpp writes Llama 3.1's frequency scaling) runs on every backend
// as the float64 reference computes it; factors of 1 change nothing; a malformed tensor is
// refused at load.
func TestRopeFreqsMatchesFloat64(t *testing.T) {
	synth, err := llama.SynthFile(tinyShape, tensor.F32, 7)
	if err != nil {
		t.Fatal(err)
	}
	// Queries and keys 30 times the synthetic model's, so that attention, and with it the
	// logits, depends strongly on the rotary angles.
	base := modeltest.Rebuild(t, synth, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		return ti == nil || !addScaled(t, w, synth, ti, 30, isQK)
	})
	cfg, err := llama.ConfigFrom(base)
	if err != nil {
		t.Fatal(err)
	}
	half := cfg.RoPE.Dims / 2
	withFreqs := func(dt tensor.DType, n int, value func(i int) float32) *gguf.File {
		return modeltest.Rebuild(t, base, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				b := make([]byte, 4*n)
				for i := 0; i < n; i++ {
					binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(value(i)))
				}
				if dt == tensor.F16 {
					b = b[:2*n]
				}
				if err := w.AddTensor("rope_freqs.weight", dt, []int64{int64(n)}, b); err != nil {
					t.Fatal(err)
				}
			}
			return true
		})
	}
	rng := rand.New(rand.NewPCG(7, 8))
	factors := make([]float32, half)
	for i := range factors {
		factors[i] = float32(0.5 + 3.5*rng.Float64()) // angles shrunk up to 4 times, or doubled
	}
	scaled := withFreqs(tensor.F32, half, func(i int) float32 { return factors[i] })
	ones := withFreqs(tensor.F32, half, func(int) float32 { return 1 })
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7, 7, 180, 33, 12}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			ref := newRef64(t, scaled)
			if len(ref.c.RoPE.Factors) != half {
				t.Fatalf("factors %v", ref.c.RoPE.Factors)
			}
			plain := oneByOne(t, be, base, toks)
			worst, moved := againstRef(ref, toks, oneByOne(t, be, scaled, toks), plain)
			// 1e-3, as for qwen2 (F32 here is within 1e-6 of float64; the bound leaves room for a
			// GPU's TF32 products); the factors themselves move logits by about 0.5.
			if worst > 1e-3 || math.IsNaN(worst) {
				t.Errorf("logits differ from the float64 reference by up to %v", worst)
			}
			if moved < 0.1 {
				t.Errorf("the factors moved no logit by more than %v", moved)
			}
			for i, row := range oneByOne(t, be, ones, toks) {
				for j, v := range row {
					if v != plain[i][j] {
						t.Fatalf("factors of 1: position %d logit %d = %v, without factors %v", i, j, v, plain[i][j])
					}
				}
			}
		})
	}
	for _, c := range []struct {
		name string
		f    *gguf.File
	}{
		{"F16", withFreqs(tensor.F16, half, func(int) float32 { return 1 })},
		{"too short", withFreqs(tensor.F32, half-1, func(int) float32 { return 1 })},
		{"zero", withFreqs(tensor.F32, half, func(i int) float32 { return float32(i % 2) })},
		{"NaN", withFreqs(tensor.F32, half, func(int) float32 { return float32(math.NaN()) })},
		{"negative", withFreqs(tensor.F32, half, func(int) float32 { return -2 })},
	} {
		if _, err := llama.ConfigFrom(c.f); err == nil || !strings.Contains(err.Error(), "rope_freqs") {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// TestLlamaBiasesMatchFloat64: a llama file with every optional bias llama.cpp reads (query,
// key, value and output projections, the feed-forward's gate, up and down, the output matrix)
// runs on every backend as the float64 reference computes it; a tensor the architecture does not
// have is refused at load instead of being left out.
func TestLlamaBiasesMatchFloat64(t *testing.T) {
	synth, err := llama.SynthFile(tinyShape, tensor.F32, 9)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := llama.ConfigFrom(synth)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 10))
	vec := func(n int) []byte {
		b := make([]byte, 4*n)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(rng.NormFloat64()*0.5)))
		}
		return b
	}
	qDim, kvDim := cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
	biased := modeltest.Rebuild(t, synth, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			if err := w.AddTensor("output.bias", tensor.F32, []int64{int64(cfg.Vocab)}, vec(cfg.Vocab)); err != nil {
				t.Fatal(err)
			}
			return true
		}
		var l int
		if _, err := fmt.Sscanf(ti.Name, "blk.%d.", &l); err != nil || !strings.HasSuffix(ti.Name, "attn_norm.weight") {
			return true
		}
		for _, b := range []struct {
			name string
			n    int
		}{{"attn_q", qDim}, {"attn_k", kvDim}, {"attn_v", kvDim}, {"attn_output", cfg.Dim}, {"ffn_gate", cfg.FFN}, {"ffn_up", cfg.FFN}, {"ffn_down", cfg.Dim}} {
			if err := w.AddTensor(fmt.Sprintf("blk.%d.%s.bias", l, b.name), tensor.F32, []int64{int64(b.n)}, vec(b.n)); err != nil {
				t.Fatal(err)
			}
		}
		return true
	})
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			ref, plain := newRef64(t, biased), newRef64(t, synth)
			moved := 0.0
			for i, logits := range oneByOne(t, be, biased, toks) {
				want, without := ref.step(toks[i]), plain.step(toks[i])
				for j := range want {
					if d := math.Abs(float64(logits[j]) - want[j]); d > 1e-3 || math.IsNaN(d) {
						t.Fatalf("position %d: logit %d = %v, float64 reference %v", i, j, logits[j], want[j])
					}
					moved = math.Max(moved, math.Abs(want[j]-without[j]))
				}
			}
			if moved < 0.1 {
				t.Errorf("the biases moved no logit by more than %v", moved)
			}
		})
	}
	stray := modeltest.Rebuild(t, synth, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			_ = w.AddTensor("blk.0.attn_q_norm.weight", tensor.F32, []int64{int64(cfg.HeadDim)}, vec(cfg.HeadDim))
		}
		return true
	})
	if m, err := llama.Load(stray, sharedtest.Backend(t, "go", 1)); err == nil || !strings.Contains(err.Error(), "blk.0.attn_q_norm.weight") {
		if m != nil {
			m.Close()
		}
		t.Errorf("a tensor the architecture lacks: %v", err)
	}
}

// TestRopeScalingFactor: as llama.cpp reads it, rope.scaling.factor divides positions when
// rope.scaling.type says linear or yarn or nothing (the type defaults to linear), but not when
// it says none; the older rope.scale_linear serves when the factor is absent; yarn adds its ramp
// over the pairs of the original context; another type is refused.
func TestRopeScalingFactor(t *testing.T) {
	synth, err := llama.SynthFile(tinyShape, tensor.F32, 3)
	if err != nil {
		t.Fatal(err)
	}
	with := func(kv map[string]gguf.Value) *gguf.File {
		return modeltest.Rebuild(t, synth, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				for k, v := range kv {
					w.Set(k, v)
				}
			}
			return true
		})
	}
	f32 := func(v float32) gguf.Value { return gguf.Value{Type: gguf.Float32, V: v} }
	str := func(s string) gguf.Value { return gguf.Value{Type: gguf.String, V: s} }
	for _, c := range []struct {
		name  string
		kv    map[string]gguf.Value
		scale float32
		err   string
	}{
		{"none given", nil, 1, ""},
		{"factor without a type", map[string]gguf.Value{"llama.rope.scaling.factor": f32(4)}, 0.25, ""},
		{"linear", map[string]gguf.Value{"llama.rope.scaling.type": str("linear"), "llama.rope.scaling.factor": f32(2)}, 0.5, ""},
		{"type none with a factor", map[string]gguf.Value{"llama.rope.scaling.type": str("none"), "llama.rope.scaling.factor": f32(8)}, 1, ""},
		{"old key", map[string]gguf.Value{"llama.rope.scale_linear": f32(4)}, 0.25, ""},
		{"factor 0", map[string]gguf.Value{"llama.rope.scaling.factor": f32(0)}, 1, ""},
		{"yarn", map[string]gguf.Value{"llama.rope.scaling.type": str("yarn"), "llama.rope.scaling.factor": f32(4)}, 0.25, ""},
		{"yarn without a factor", map[string]gguf.Value{"llama.rope.scaling.type": str("yarn")}, 0, "yarn rope scaling without a valid factor"},
		{"su", map[string]gguf.Value{"llama.rope.scaling.type": str("su")}, 0, "not supported"},
		{"negative factor", map[string]gguf.Value{"llama.rope.scaling.factor": f32(-2)}, 0, "valid factor"},
		// 1/factor is below float32's normal range, and the factor itself beyond it.
		{"factor 1e39", map[string]gguf.Value{"llama.rope.scaling.type": str("yarn"), "llama.rope.scaling.factor": {Type: gguf.Float64, V: 1e39}}, 0, "out of range"},
	} {
		cfg, err := llama.ConfigFrom(with(c.kv))
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: %v, want an error about %q", c.name, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err == "" && cfg.RoPE.FreqScale != c.scale:
			t.Errorf("%s: frequency scale %v, want %v", c.name, cfg.RoPE.FreqScale, c.scale)
		case c.err == "" && (cfg.RoPE.ExtFactor != 0) != (c.name == "yarn"):
			t.Errorf("%s: YaRN extrapolation %v", c.name, cfg.RoPE.ExtFactor)
		}
	}
}

// TestYaRNMatchesFloat64: a model with YaRN rope scaling (rope.scaling.type yarn, factor 4 over
// an original context of 4096) runs on every backend as the float64 reference computes it,
// which derives the ramp's pairs itself; and YaRN gives other logits than linear scaling.
func TestYaRNMatchesFloat64(t *testing.T) {
	synth, err := llama.SynthFile(tinyShape, tensor.F32, 7)
	if err != nil {
		t.Fatal(err)
	}
	with := func(typ string, qk float32) *gguf.File {
		return modeltest.Rebuild(t, synth, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.SetString("llama.rope.scaling.type", typ)
				w.SetFloat32("llama.rope.scaling.factor", 4)
				w.SetUint32("llama.rope.scaling.original_context_length", 4096)
				return true
			}
			// Queries and keys scaled up, so that attention depends strongly on the angles.
			return !addScaled(t, w, synth, ti, qk, isQK)
		})
	}
	yarn, linear := with("yarn", 30), with("linear", 30)
	cfg, err := llama.ConfigFrom(yarn)
	if err != nil || cfg.RoPE.ExtFactor != 1 || cfg.OrigContext != 4096 || cfg.RoPE.CorrDims != [2]float32{2, 6} {
		t.Fatalf("yarn config %+v, %v", cfg.RoPE, err)
	}
	// A base of 1 makes ggml's ramp bounds infinite: clamped, they still run.
	one := modeltest.Rebuild(t, yarn, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			w.SetFloat32("llama.rope.freq_base", 1)
		}
		return true
	})
	if cfg, err := llama.ConfigFrom(one); err != nil || cfg.RoPE.CorrDims != [2]float32{16, 15} {
		t.Fatalf("base 1: %+v, %v", cfg.RoPE, err)
	}
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7, 7, 180, 33, 12}
	for _, be := range backendsUnderTest(t) {
		if got := oneByOne(t, be, one, toks[:3]); math.IsNaN(float64(got[2][0])) {
			t.Fatalf("%s: base 1: NaN logits", be.Name())
		}
	}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			worst, moved := againstRef(newRef64(t, yarn), toks, oneByOne(t, be, yarn, toks), oneByOne(t, be, linear, toks))
			if worst > 1e-3 || math.IsNaN(worst) {
				t.Errorf("logits differ from the float64 reference by up to %v", worst)
			}
			if moved < 0.1 {
				t.Errorf("YaRN moved no logit by more than %v from linear scaling", moved)
			}
		})
	}
}
