package llama_test

import (
	"math"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// fuzzKeys are the hyper-parameters FuzzLoad sets, under the file's architecture.
var fuzzKeys = []string{"context_length", "embedding_length", "block_count", "feed_forward_length",
	"attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
	"rope.dimension_count", "rope.freq_base", "rope.scaling.factor", "rope.scaling.original_context_length",
	"rope.scaling.attn_factor", "attention.layer_norm_rms_epsilon", "rope.scale_linear",
	"embedding_scale", "residual_scale", "logit_scale", "attention.scale"}

// FuzzLoad: whatever the hyper-parameters of a file (two set to any integer or float, under any
// of the architectures, with any rope scaling type and factor), loading it never panics, and a model that
// loads runs a forward step without error: what the backends would refuse is refused at load.
func FuzzLoad(f *testing.F) {
	f.Add(uint8(0), uint8(0), int64(64), 0.0, true, uint8(0), 4.0, uint8(0), 0.0)
	f.Add(uint8(3), uint8(10), int64(0), 1.0, false, uint8(2), 4.0, uint8(12), 1.5)
	f.Add(uint8(1), uint8(11), int64(1<<20), 0.0, true, uint8(2), 0.5, uint8(9), 1.0)
	f.Add(uint8(2), uint8(9), int64(0), 1.0, false, uint8(2), 4.0, uint8(11), 4096.0) // YaRN over a base of 1
	f.Add(uint8(0), uint8(11), int64(1), 0.0, true, uint8(2), 8.0, uint8(13), 1e-30)
	w, err := llama.Synth(tinyShape, tensor.Q8_0, 1)
	if err != nil {
		f.Fatal(err)
	}
	synth := modeltest.Parse(f, w)
	phi, olmo, granite := phi3Model(f, phi3Opts{longRoPE: true}), olmo2Model(f), graniteModel(f, nil, "")
	be := sharedtest.Backend(f, "go", 1)
	arches := []string{"llama", "qwen2", "qwen3", "phi3", "smollm3", "olmo2", "granite", "gemma"}
	types := []string{"", "linear", "yarn", "none", "su"}
	f.Fuzz(func(t *testing.T, arch, key uint8, iv int64, fv float64, isInt bool, typ uint8, factor float64, key2 uint8, fv2 float64) {
		a := arches[int(arch)%len(arches)]
		base := synth
		switch a {
		case "phi3":
			base = phi
		case "olmo2":
			base = olmo
		case "granite":
			base = granite
		}
		from := base.Architecture()
		file := modeltest.Rebuild(t, base, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti != nil {
				return true
			}
			setArchFrom(w, base, from, a)
			k := a + "." + fuzzKeys[int(key)%len(fuzzKeys)]
			if isInt {
				w.Set(k, gguf.Value{Type: gguf.Int64, V: iv})
			} else {
				w.Set(k, gguf.Value{Type: gguf.Float64, V: fv})
			}
			if k2 := a + "." + fuzzKeys[int(key2)%len(fuzzKeys)]; k2 != k {
				w.Set(k2, gguf.Value{Type: gguf.Float64, V: fv2})
			}
			if s := types[int(typ)%len(types)]; s != "" {
				w.SetString(a+".rope.scaling.type", s)
				if k != a+".rope.scaling.factor" {
					w.Set(a+".rope.scaling.factor", gguf.Value{Type: gguf.Float64, V: factor})
				}
			}
			return true
		})
		m, err := llama.Load(file, be)
		if err != nil {
			return
		}
		defer m.Close()
		c, err := m.NewContext(llama.ContextConfig{StepTokens: 2, MaxSeqs: 1, KVSlots: 32, KVType: tensor.F32})
		if err != nil {
			t.Fatalf("loaded (%s %v %v %v), but no context: %v", a, iv, fv, isInt, err)
		}
		defer c.Close()
		seq := c.Pool().NewSeq(32)
		var bb kvcache.BatchBuilder
		_ = seq.Reserve(2)
		_ = bb.Add(seq, 2)
		logits := make([]float32, m.Vocab)
		if err := c.Forward([]int32{1, 2}, bb.Batch(), []int32{1}, logits); err != nil {
			t.Fatalf("loaded %+v, but the forward step fails: %v", m.Config, err)
		}
		for _, v := range logits {
			if math.IsNaN(float64(v)) {
				t.Fatalf("loaded %+v, but the logits are NaN", m.Config)
			}
		}
	})
}

// setArchFrom renames the keys of arch from to arch to.
func setArchFrom(w *gguf.Writer, f *gguf.File, from, to string) {
	for _, kv := range f.KVs {
		if strings.HasPrefix(kv.Key, from+".") {
			w.Set(to+"."+strings.TrimPrefix(kv.Key, from+"."), kv.Value)
		}
	}
	w.SetString("general.architecture", to)
}
