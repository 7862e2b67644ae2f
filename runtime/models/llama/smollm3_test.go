package llama_test

import (
	"math"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestSmolLM3MatchesFloat64: the smollm3 architecture (LLaMA's, with every fourth layer's
// queries and keys left unrotated) runs on every backend as the float64 reference computes it,
// and differently from the llama file of the same weights.
func TestSmolLM3MatchesFloat64(t *testing.T) {
	s := tinyShape
	s.Layers = 5 // layer 3 is unrotated
	synth, err := llama.SynthFile(s, tensor.F32, 13)
	if err != nil {
		t.Fatal(err)
	}
	// Queries and keys scaled up, so that attention depends on the rotation.
	scaled := func(arch string) *gguf.File {
		return modeltest.Rebuild(t, synth, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				if arch != "llama" {
					setArch(w, synth, arch)
				}
				return true
			}
			return !addScaled(t, w, synth, ti, 20, isQK)
		})
	}
	f, plain := scaled("smollm3"), scaled("llama")
	cfg, err := llama.ConfigFrom(f)
	if err != nil || cfg.Arch != "smollm3" || cfg.NoRoPE != 4 || cfg.RoPE.Mode != 0 {
		t.Fatalf("smollm3 config %+v, %v", cfg, err)
	}
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7, 7, 180}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			worst, moved := againstRef(newRef64(t, f), toks, oneByOne(t, be, f, toks), oneByOne(t, be, plain, toks))
			if worst > 1e-3 || math.IsNaN(worst) {
				t.Errorf("logits differ from the float64 reference by up to %v", worst)
			}
			if moved < 0.01 {
				t.Errorf("the unrotated layer moved no logit by more than %v", moved)
			}
		})
	}
}
