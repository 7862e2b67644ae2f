package llama_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestQwen2MatchesFloat64: the qwen2 architecture (query/key/value biases, NeoX RoPE, its own
// metadata prefix and rope base) runs on every backend as the float64 reference computes it.
func TestQwen2MatchesFloat64(t *testing.T) {
	w, err := llama.Synth(tinyShape, tensor.F32, 5)
	if err != nil {
		t.Fatal(err)
	}
	base := parse(t, w)
	rng := rand.New(rand.NewPCG(5, 6))
	f := rebuild(t, base, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
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
		for _, kv := range base.KVs {
			if strings.HasPrefix(kv.Key, "llama.") {
				w.Set("qwen2."+strings.TrimPrefix(kv.Key, "llama."), kv.Value)
			}
		}
		w.SetString("general.architecture", "qwen2")
		w.SetFloat32("qwen2.rope.freq_base", 1e6)
		return true
	})
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7, 7, 180}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := llama.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.RoPE.Mode != backend.RoPENeoX || !m.QKVBias || m.RoPE.Base != 1e6 {
				t.Fatalf("qwen2 config %+v", m.Config)
			}
			c, err := m.NewContext(llama.ContextConfig{MaxTokens: 4, MaxSeqs: 1, KVSlots: 32, KVType: tensor.F32})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ref := newRef64(t, f)
			seq := c.Pool().NewSeq(32)
			var bb kvcache.BatchBuilder
			logits := make([]float32, m.Vocab)
			for i, tk := range toks {
				want := ref.step(tk)
				_ = seq.Reserve(1)
				bb.Reset()
				_ = bb.Add(seq, 1)
				if err := c.Forward([]int32{tk}, bb.Batch(), []int32{0}, logits); err != nil {
					t.Fatal(err)
				}
				_ = seq.Advance(1)
				for j := range want {
					if d := math.Abs(float64(logits[j]) - want[j]); d > 1e-3 {
						t.Fatalf("position %d: logit %d = %v, float64 reference %v", i, j, logits[j], want[j])
					}
				}
			}
		})
	}
}
