package llama_test

import (
	"math"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// graniteModel turns the tiny synthetic model into a granite one with Granite 3's kind of
// multipliers: embeddings ×12, block outputs ×0.22, logits ÷8, attention scaled by 1/16 (not
// 1/sqrt(16)); rotated unless finetuned is false. Its block weights are ten times the synthetic
// model's.
func graniteModel(t testing.TB, finetuned *bool, drop string) *gguf.File {
	t.Helper()
	base, err := llama.SynthFile(tinyShape, tensor.F32, 19)
	if err != nil {
		t.Fatal(err)
	}
	return modeltest.Rebuild(t, base, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			setArch(w, base, "granite")
			for k, v := range map[string]float32{"embedding_scale": 12, "residual_scale": 0.22, "logit_scale": 8, "attention.scale": 0.0625} {
				if k != drop {
					w.SetFloat32("granite."+k, v)
				}
			}
			if finetuned != nil {
				w.SetBool("granite.rope.scaling.finetuned", *finetuned)
			}
			return true
		}
		// Block weights large enough that each block's output, and so its multiplier, shows in
		// the logits.
		return !addScaled(t, w, base, ti, 10, func(name string) bool {
			return (strings.Contains(name, "ffn_") || strings.Contains(name, "attn_")) && !strings.HasSuffix(name, "norm.weight")
		})
	})
}

// TestGraniteMatchesFloat64: the granite architecture (embedding, residual, attention and logit
// multipliers; rotation switched off by rope.scaling.finetuned false) runs on every backend as
// the float64 reference computes it, which differs from the llama model of the same weights; a
// file without one of the multipliers is refused, as llama.cpp refuses it.
func TestGraniteMatchesFloat64(t *testing.T) {
	off := false
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7, 7, 180}
	for _, tc := range []struct {
		name      string
		finetuned *bool
	}{{"rotated", nil}, {"not rotated", &off}} {
		f := graniteModel(t, tc.finetuned, "")
		cfg, err := llama.ConfigFrom(f)
		if err != nil || cfg.EmbedScale != 12 || cfg.ResidualScale != 0.22 || cfg.LogitScale != 8 || cfg.AttnScale != 0.0625 || (cfg.NoRoPE == 1) != (tc.finetuned != nil) {
			t.Fatalf("%s: granite config %+v, %v", tc.name, cfg, err)
		}
		for _, be := range backendsUnderTest(t) {
			t.Run(tc.name+"/"+be.Name(), func(t *testing.T) {
				ref, plain := newRef64(t, f), newRef64(t, f)
				plain.c.EmbedScale, plain.c.ResidualScale, plain.c.LogitScale, plain.c.AttnScale = 0, 0, 0, 0
				moved := 0.0
				for i, logits := range oneByOne(t, be, f, toks) {
					want, other := ref.step(toks[i]), plain.step(toks[i])
					for j := range want {
						if d := math.Abs(float64(logits[j]) - want[j]); d > 1e-3*math.Max(1, math.Abs(want[j])) || math.IsNaN(d) {
							t.Fatalf("position %d: logit %d = %v, float64 reference %v", i, j, logits[j], want[j])
						}
						moved = math.Max(moved, math.Abs(want[j]-other[j]))
					}
				}
				if moved < 0.01 {
					t.Errorf("the multipliers moved no logit by more than %v", moved)
				}
			})
		}
	}
	if _, err := llama.ConfigFrom(graniteModel(t, nil, "residual_scale")); err == nil || !strings.Contains(err.Error(), "granite.residual_scale") {
		t.Errorf("no residual scale: %v", err)
	}
}
