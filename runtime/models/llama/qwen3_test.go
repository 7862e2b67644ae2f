package llama_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// qwen3Model turns the tiny synthetic model into a qwen3 one as llama.cpp's converter writes
// Qwen3: heads of headDim elements (Qwen3's are 128 where its width over its heads is 64 to
// 80), per-head norm weights for queries and keys, NeoX rotation with a base of 1e6, an epsilon
// of 1e-6, and, with tied, no output.weight (the small Qwen3 models share the embeddings).
// With norms false the norm weights are left out.
func qwen3Model(t *testing.T, headDim int, tied, norms bool) *gguf.File {
	t.Helper()
	base, err := llama.SynthFile(tinyShape, tensor.F32, 9)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 10))
	f32s := func(n int, mean, sd float64) []byte {
		b := make([]byte, 4*n)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(mean+sd*rng.NormFloat64())))
		}
		return b
	}
	s := tinyShape
	qDim, kvDim := int64(s.Heads*headDim), int64(s.KVHeads*headDim)
	add := func(w *gguf.Writer, name string, shape []int64, mean, sd float64) {
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		if err := w.AddTensor(name, tensor.F32, shape, f32s(int(n), mean, sd)); err != nil {
			t.Fatal(err)
		}
	}
	return modeltest.Rebuild(t, base, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			setArch(w, base, "qwen3")
			w.SetUint32("qwen3.attention.key_length", uint32(headDim))
			w.SetUint32("qwen3.attention.value_length", uint32(headDim))
			w.SetUint32("qwen3.rope.dimension_count", uint32(headDim))
			w.SetFloat32("qwen3.rope.freq_base", 1e6)
			w.SetFloat32("qwen3.attention.layer_norm_rms_epsilon", 1e-6)
			return true
		}
		dim := int64(s.Dim)
		p := "" // the layer's prefix, blk.N.
		if i := strings.LastIndex(ti.Name, "attn_"); i >= 0 {
			p = ti.Name[:i]
		}
		switch {
		case ti.Name == "output.weight":
			return !tied
		case strings.HasSuffix(ti.Name, "attn_q.weight"):
			// Queries and keys large enough that attention, and with it the logits, depends
			// on the norms and the rotation.
			add(w, ti.Name, []int64{dim, qDim}, 0, 0.5)
			if norms {
				add(w, p+"attn_q_norm.weight", []int64{int64(headDim)}, 1, 0.5)
			}
		case strings.HasSuffix(ti.Name, "attn_k.weight"):
			add(w, ti.Name, []int64{dim, kvDim}, 0, 0.5)
			if norms {
				add(w, p+"attn_k_norm.weight", []int64{int64(headDim)}, 1, 0.5)
			}
		case strings.HasSuffix(ti.Name, "attn_v.weight"):
			add(w, ti.Name, []int64{dim, kvDim}, 0, 0.2)
		case strings.HasSuffix(ti.Name, "attn_output.weight"):
			add(w, ti.Name, []int64{qDim, dim}, 0, 0.1)
		default:
			return true
		}
		return false
	})
}

// TestQwen3MatchesFloat64: the qwen3 architecture (queries and keys RMS-normalised per head
// before the rotation, heads wider than the width over the heads, tied or separate output)
// runs on every backend as the float64 reference computes it.
func TestQwen3MatchesFloat64(t *testing.T) {
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7, 7, 180}
	for _, tc := range []struct {
		name    string
		headDim int
		tied    bool
	}{{"wide heads, tied", 24, true}, {"heads of width/heads, separate output", 16, false}} {
		f := qwen3Model(t, tc.headDim, tc.tied, true)
		cfg, err := llama.ConfigFrom(f)
		if err != nil || cfg.Arch != "qwen3" || !cfg.QKNorm || cfg.QKVBias || cfg.RoPE.Mode != backend.RoPENeoX ||
			cfg.HeadDim != tc.headDim || cfg.RoPE.Base != 1e6 || cfg.NormEps != 1e-6 || cfg.TiedEmbed != tc.tied {
			t.Fatalf("%s: qwen3 config %+v, %v", tc.name, cfg, err)
		}
		for _, be := range backendsUnderTest(t) {
			t.Run(tc.name+"/"+be.Name(), func(t *testing.T) {
				ref := newRef64(t, f)
				for i, logits := range oneByOne(t, be, f, toks) {
					want := ref.step(toks[i])
					for j := range want {
						if d := math.Abs(float64(logits[j]) - want[j]); d > 1e-3*math.Max(1, math.Abs(want[j])) {
							t.Fatalf("position %d: logit %d = %v, float64 reference %v", i, j, logits[j], want[j])
						}
					}
				}
			})
		}
	}
	// The norms matter: the reference without them gives other logits.
	f := qwen3Model(t, 24, true, true)
	a, b := newRef64(t, f), newRef64(t, f)
	b.c.QKNorm = false
	var diff float64
	for _, tk := range toks[:4] {
		x, y := a.step(tk), b.step(tk)
		for j := range x {
			diff = math.Max(diff, math.Abs(x[j]-y[j]))
		}
	}
	if diff < 1e-2 {
		t.Fatalf("logits with and without the query/key norms differ by at most %g", diff)
	}
}

// TestQwen3RefusesMissingNorms: a qwen3 file without its query/key norm weights is refused
// with the tensor named, and a value width other than the key width is refused.
func TestQwen3RefusesMissingNorms(t *testing.T) {
	be := backendsUnderTest(t)[0]
	if _, err := llama.Load(qwen3Model(t, 24, true, false), be); err == nil || !strings.Contains(err.Error(), "attn_q_norm.weight") {
		t.Fatalf("qwen3 without norms: %v", err)
	}
	f := qwen3Model(t, 24, true, true)
	g := modeltest.Rebuild(t, f, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			w.SetUint32("qwen3.attention.value_length", 16)
		}
		return true
	})
	if _, err := llama.ConfigFrom(g); err == nil || !strings.Contains(err.Error(), "value heads") {
		t.Fatalf("value_length 16 against key_length 24: %v", err)
	}
}
