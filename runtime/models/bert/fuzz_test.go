package bert_test

import (
	"math"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/bert"
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/tensor"
)

// fuzzKeys are the metadata FuzzLoad sets.
var fuzzKeys = []string{"bert.context_length", "bert.embedding_length", "bert.block_count", "bert.feed_forward_length",
	"bert.attention.head_count", "bert.attention.head_count_kv", "bert.attention.key_length", "bert.attention.value_length",
	"bert.attention.layer_norm_epsilon", "bert.pooling_type", "bert.attention.causal", "tokenizer.ggml.token_type_count"}

// FuzzLoad: whatever the hyper-parameters of a file (two set to any integer, float or boolean),
// loading it never panics, and a model that loads embeds a batch of two sequences without error
// or NaN: what the backends would refuse is refused at load.
func FuzzLoad(f *testing.F) {
	f.Add(uint8(0), int64(48), 0.0, uint8(0), uint8(9), int64(2), 0.0, uint8(0))
	f.Add(uint8(8), int64(0), 1e-30, uint8(1), uint8(5), int64(2), 0.0, uint8(0))
	f.Add(uint8(9), int64(3), 0.0, uint8(0), uint8(10), int64(1), 0.0, uint8(2))
	f.Add(uint8(4), int64(4), 0.0, uint8(0), uint8(5), int64(4), 0.0, uint8(0))
	f.Add(uint8(9), int64(-1), 0.0, uint8(0), uint8(8), int64(0), 0.5, uint8(1))
	f.Add(uint8(11), int64(2), 0.0, uint8(0), uint8(6), int64(16), 0.0, uint8(0))
	base := testModel(f, tensor.Q8_0, nil)
	be := sharedtest.Backend(f, "go", 1)
	f.Fuzz(func(t *testing.T, key uint8, iv int64, fv float64, kind uint8, key2 uint8, iv2 int64, fv2 float64, kind2 uint8) {
		value := func(iv int64, fv float64, kind uint8) gguf.Value {
			switch kind % 3 {
			case 0:
				return gguf.Value{Type: gguf.Int64, V: iv}
			case 1:
				return gguf.Value{Type: gguf.Float64, V: fv}
			}
			return gguf.Value{Type: gguf.Bool, V: iv != 0}
		}
		file := modeltest.Rebuild(t, base, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.Set(fuzzKeys[int(key)%len(fuzzKeys)], value(iv, fv, kind))
				w.Set(fuzzKeys[int(key2)%len(fuzzKeys)], value(iv2, fv2, kind2))
			}
			return true
		})
		m, err := bert.Load(file, be)
		if err != nil {
			return
		}
		defer m.Close()
		c, err := m.NewContext(bert.ContextConfig{StepTokens: 8})
		if err != nil {
			t.Fatalf("loaded %+v, but no context: %v", m.Config, err)
		}
		defer c.Close()
		lens := []int{3, 2}
		out := make([]float32, pooling.Count(c.Pooling(), lens)*m.Dim)
		if err := c.Embed([]int32{101, 7, 102, 101, 102}, lens, pooling.NormEuclidean, out); err != nil {
			t.Fatalf("loaded %+v, but embedding fails: %v", m.Config, err)
		}
		for _, v := range out {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("loaded %+v, but the embeddings hold %v", m.Config, v)
			}
		}
	})
}
