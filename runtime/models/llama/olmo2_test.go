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

// olmo2Model turns the tiny synthetic model into an olmo2 one as llama.cpp's converter writes
// OLMo 2: the block norms become output norms (post_attention_norm, post_ffw_norm), and the queries
// and keys get norms over all their heads (attn_q_norm [qDim], attn_k_norm [kvDim]); every norm
// weight random around 1, so that each one matters.
func olmo2Model(t testing.TB) *gguf.File {
	t.Helper()
	base, err := llama.SynthFile(tinyShape, tensor.F32, 17)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(17, 18))
	norm := func(n int) []byte {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(1+0.4*rng.NormFloat64())))
		}
		return b
	}
	s := tinyShape
	qDim, kvDim := s.Dim, s.KVHeads*s.Dim/s.Heads
	return modeltest.Rebuild(t, base, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			setArch(w, base, "olmo2")
			return true
		}
		add := func(name string, n int) {
			if err := w.AddTensor(name, tensor.F32, []int64{int64(n)}, norm(n)); err != nil {
				t.Fatal(err)
			}
		}
		switch {
		case strings.HasSuffix(ti.Name, "attn_norm.weight"):
			p := strings.TrimSuffix(ti.Name, "attn_norm.weight")
			add(p+"post_attention_norm.weight", s.Dim)
			add(p+"attn_q_norm.weight", qDim)
			add(p+"attn_k_norm.weight", kvDim)
			return false
		case strings.HasSuffix(ti.Name, "ffn_norm.weight"):
			add(strings.TrimSuffix(ti.Name, "ffn_norm.weight")+"post_ffw_norm.weight", s.Dim)
			return false
		}
		return true
	})
}

// TestOLMo2MatchesFloat64: the olmo2 architecture (each block's output normalised before it
// joins the residual stream instead of its input, queries and keys normalised over all heads,
// NeoX rotation) runs on every backend as the float64 reference computes it; OLMo 3's sliding
// window is refused, as is a file without its query norm.
func TestOLMo2MatchesFloat64(t *testing.T) {
	f := olmo2Model(t)
	cfg, err := llama.ConfigFrom(f)
	if err != nil || cfg.Arch != "olmo2" || !cfg.PostNorm || !cfg.QKNorm || cfg.RoPE.Mode != backend.RoPENeoX {
		t.Fatalf("olmo2 config %+v, %v", cfg, err)
	}
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7, 7, 180}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			ref := newRef64(t, f)
			for i, logits := range oneByOne(t, be, f, toks) {
				want := ref.step(toks[i])
				for j := range want {
					if d := math.Abs(float64(logits[j]) - want[j]); d > 1e-3*math.Max(1, math.Abs(want[j])) || math.IsNaN(d) {
						t.Fatalf("position %d: logit %d = %v, float64 reference %v", i, j, logits[j], want[j])
					}
				}
			}
		})
	}
	// The output norms matter: without them (PostNorm off, the same weights read as pre-norms
	// would not even load) the reference differs.
	a, b := newRef64(t, f), newRef64(t, f)
	b.w["blk.0.post_attention_norm.weight"] = make([]float64, tinyShape.Dim)
	for i := range b.w["blk.0.post_attention_norm.weight"] {
		b.w["blk.0.post_attention_norm.weight"][i] = 1
	}
	var diff float64
	for _, tk := range toks[:4] {
		x, y := a.step(tk), b.step(tk)
		for j := range x {
			diff = math.Max(diff, math.Abs(x[j]-y[j]))
		}
	}
	if diff < 1e-3 {
		t.Fatalf("an output norm's weights move the logits by at most %g", diff)
	}
	be := backendsUnderTest(t)[0]
	swa := modeltest.Rebuild(t, f, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			w.SetUint32("olmo2.attention.sliding_window", 4096)
		}
		return true
	})
	if _, err := llama.ConfigFrom(swa); err == nil || !strings.Contains(err.Error(), "sliding-window") {
		t.Errorf("OLMo 3's window: %v", err)
	}
	noQ := modeltest.Rebuild(t, f, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		return ti == nil || ti.Name != "blk.1.attn_q_norm.weight"
	})
	if m, err := llama.Load(noQ, be); err == nil || !strings.Contains(err.Error(), "blk.1.attn_q_norm.weight") {
		if m != nil {
			m.Close()
		}
		t.Errorf("no query norm: %v", err)
	}
}
