package llama_test

import (
	"math"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestGemmaMatchesFloat64: the gemma architecture (embeddings times sqrt(width), GELU-gated
// feed-forward network, NeoX rotation, output tied to the embeddings) runs on every backend as
// the float64 reference computes it, which differs from the llama model of the same weights.
func TestGemmaMatchesFloat64(t *testing.T) {
	synth, err := llama.SynthFile(tinyShape, tensor.F32, 23)
	if err != nil {
		t.Fatal(err)
	}
	f := modeltest.Rebuild(t, synth, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			setArch(w, synth, "gemma")
			return true
		}
		// Block weights large enough that the feed-forward network's gating shows.
		return ti.Name != "output.weight" && !addScaled(t, w, synth, ti, 10, func(name string) bool { return isQK(name) || isFFN(name) })
	})
	cfg, err := llama.ConfigFrom(f)
	if err != nil || !cfg.GeGLU || cfg.EmbedScale != 8 || !cfg.TiedEmbed || cfg.RoPE.Mode != backend.RoPENeoX {
		t.Fatalf("gemma config %+v, %v", cfg, err)
	}
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7, 7, 180}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			ref, swiglu := newRef64(t, f), newRef64(t, f)
			swiglu.c.GeGLU = false
			var other [][]float32
			for _, tk := range toks {
				o := swiglu.step(tk)
				row := make([]float32, len(o))
				for j, v := range o {
					row[j] = float32(v)
				}
				other = append(other, row)
			}
			worst, moved := againstRef(ref, toks, oneByOne(t, be, f, toks), other)
			if worst > 1e-3 || math.IsNaN(worst) {
				t.Errorf("logits differ from the float64 reference by up to %v", worst)
			}
			if moved < 0.01 {
				t.Errorf("GELU gating moved no logit by more than %v from SiLU's", moved)
			}
		})
	}
}

// TestGemma23Refused: Gemma 2 and 3 files are refused with what they need.
func TestGemma23Refused(t *testing.T) {
	synth, err := llama.SynthFile(tinyShape, tensor.F32, 23)
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range []string{"gemma2", "gemma3"} {
		f := modeltest.Rebuild(t, synth, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				setArch(w, synth, arch)
			}
			return true
		})
		if _, err := llama.ConfigFrom(f); err == nil || !strings.Contains(err.Error(), "sliding window") {
			t.Errorf("%s: %v", arch, err)
		}
	}
}
