package llama_test

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// tinyShape is small enough to build in a test and still has grouped-query attention.
var tinyShape = llama.Shape{Name: "tiny", Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 96, Ctx: 64, Vocab: 300}

// setArch makes w, a copy of f's llama model, a model of arch: its llama.* keys under arch's name.
func setArch(w *gguf.Writer, f *gguf.File, arch string) {
	for _, kv := range f.KVs {
		if strings.HasPrefix(kv.Key, "llama.") {
			w.Set(arch+"."+strings.TrimPrefix(kv.Key, "llama."), kv.Value)
		}
	}
	w.SetString("general.architecture", arch)
}

func TestLoadRejectsBadModels(t *testing.T) {
	good, err := llama.SynthFile(tinyShape, tensor.F32, 1)
	if err != nil {
		t.Fatal(err)
	}
	be := sharedtest.Backend(t, "go", 1)
	if m, err := llama.Load(good, be); err != nil {
		t.Fatalf("the synthetic model does not load: %v", err)
	} else {
		m.Close()
	}
	cases := []struct {
		name string
		edit func(w *gguf.Writer, ti *gguf.TensorInfo) bool
		want string
	}{
		{"architecture", func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.SetString("general.architecture", "rwkv6")
			}
			return true
		}, `unsupported model architecture "rwkv6"`},
		{"missing tensor", func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			return ti == nil || ti.Name != "blk.1.ffn_down.weight"
		}, "lacks tensor blk.1.ffn_down.weight"},
		{"wrong shape", func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti != nil && ti.Name == "blk.0.attn_k.weight" {
				_ = w.AddTensor(ti.Name, tensor.F32, []int64{64, 64}, make([]byte, 64*64*4))
				return false
			}
			return true
		}, "blk.0.attn_k.weight has shape [64 64]"},
		{"unsupported dtype", func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti != nil && ti.Name == "blk.0.ffn_up.weight" {
				n := 96 * 64 / 256 * tensor.IQ2_XXS.TypeSize()
				_ = w.AddTensor(ti.Name, tensor.IQ2_XXS, []int64{256, 24}, make([]byte, n))
				return false
			}
			return true
		}, "IQ2_XXS"},
		{"heads", func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.SetUint32("llama.attention.head_count_kv", 3)
			}
			return true
		}, "cannot share"},
		{"no block count", func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.SetUint32("llama.block_count", 0)
			}
			return true
		}, "block_count = 0"},
		{"rope scaling", func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.SetString("llama.rope.scaling.type", "longrope")
			}
			return true
		}, "longrope"},
		// Values in range as float64 that float32, the backends' type, cannot hold.
		{"rope base past float32", func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.Set("llama.rope.freq_base", gguf.Value{Type: gguf.Float64, V: 1e300})
			}
			return true
		}, "rope frequency base"},
		{"norm epsilon below float32", func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.Set("llama.attention.layer_norm_rms_epsilon", gguf.Value{Type: gguf.Float64, V: 1e-60})
			}
			return true
		}, "epsilon"},
		{"rope scale past float32", func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.SetString("llama.rope.scaling.type", "linear")
				w.Set("llama.rope.scaling.factor", gguf.Value{Type: gguf.Float64, V: 1e300})
			}
			return true
		}, "rope scaling factor"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := modeltest.Rebuild(t, good, c.edit)
			m, err := llama.Load(f, be)
			if err == nil {
				m.Close()
				t.Fatal("loaded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not say %q", err, c.want)
			}
		})
	}
}

// TestForwardRejectsBadBatches: malformed steps are errors, not panics.
func TestForwardRejectsBadBatches(t *testing.T) {
	f, err := llama.SynthFile(tinyShape, tensor.Q8_0, 2)
	if err != nil {
		t.Fatal(err)
	}
	be := sharedtest.Backend(t, "go", 1)
	m, c := newContext(t, f, be, llama.ContextConfig{StepTokens: 4, MaxSeqs: 1, KVSlots: 32})
	seq := c.Pool().NewSeq(8)
	_ = seq.Reserve(2)
	b := &backend.Batch{Pos: []int32{0, 1}, Slot: []int32{seq.Slot(0), seq.Slot(1)}, Seqs: []backend.Seq{{Start: 0, Count: 2, CtxLen: 2, Blocks: seq.Blocks()}}}
	logits := make([]float32, m.Vocab)
	for _, c2 := range []struct {
		name   string
		toks   []int32
		out    []int32
		logits []float32
	}{
		{"empty", nil, nil, nil},
		{"token out of vocabulary", []int32{1, 300}, []int32{1}, logits},
		{"negative token", []int32{-1, 2}, []int32{1}, logits},
		{"too many tokens", []int32{1, 2, 3, 4, 5}, []int32{1}, logits},
		{"positions mismatch", []int32{1}, []int32{0}, logits},
		{"output row outside batch", []int32{1, 2}, []int32{2}, logits},
		{"logits buffer size", []int32{1, 2}, []int32{1}, logits[:10]},
	} {
		if err := c.Forward(c2.toks, b, c2.out, c2.logits); err == nil {
			t.Errorf("%s: accepted", c2.name)
		}
	}
	if err := c.Forward([]int32{1, 2}, b, []int32{1}, logits); err != nil {
		t.Fatalf("a good batch fails: %v", err)
	}
}

// scaledF32 is a copy of the F32 data b with every value multiplied by k.
func scaledF32(b []byte, k float32) []byte {
	out := make([]byte, len(b))
	for i := 0; i+4 <= len(b); i += 4 {
		binary.LittleEndian.PutUint32(out[i:], math.Float32bits(k*math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))))
	}
	return out
}

// addScaled adds ti to w with its F32 values multiplied by k, when keep reports its name; it
// reports whether it did (a rebuild edit then drops the original).
func addScaled(t testing.TB, w *gguf.Writer, f *gguf.File, ti *gguf.TensorInfo, k float32, keep func(name string) bool) bool {
	t.Helper()
	if !keep(ti.Name) {
		return false
	}
	if err := w.AddTensor(ti.Name, ti.DType, ti.Shape, scaledF32(f.TensorData(ti), k)); err != nil {
		t.Fatal(err)
	}
	return true
}

// isQK reports a query or key matrix.
func isQK(name string) bool {
	return strings.HasSuffix(name, "attn_q.weight") || strings.HasSuffix(name, "attn_k.weight")
}

// againstRef returns the largest difference of got (logits a token at a time, of toks) from the
// float64 reference's, and of got from other's (nil: 0).
func againstRef(ref *ref64, toks []int32, got, other [][]float32) (worst, moved float64) {
	for i, tk := range toks {
		want := ref.step(tk)
		for j := range want {
			d := math.Abs(float64(got[i][j]) - want[j])
			if d != d {
				return math.NaN(), 0
			}
			worst = math.Max(worst, d)
			if other != nil {
				moved = math.Max(moved, math.Abs(float64(got[i][j]-other[i][j])))
			}
		}
	}
	return worst, moved
}

// isFFN reports a feed-forward matrix.
func isFFN(name string) bool {
	return strings.HasSuffix(name, "ffn_gate.weight") || strings.HasSuffix(name, "ffn_up.weight") || strings.HasSuffix(name, "ffn_down.weight")
}

// TestSynthArches: every architecture Synth writes loads as that architecture and runs.
func TestSynthArches(t *testing.T) {
	for _, arch := range llama.SynthArches {
		s := tinyShape
		s.Arch = arch
		f, err := llama.SynthFile(s, tensor.Q8_0, 2)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		if cfg, err := llama.ConfigFrom(f); err != nil || cfg.Arch != arch {
			t.Fatalf("%s: config %+v, %v", arch, cfg, err)
		}
		for _, be := range backendsUnderTest(t) {
			for _, row := range oneByOne(t, be, f, []int32{1, 2}) {
				for _, v := range row {
					if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
						t.Fatalf("%s on %s: logit %v", arch, be.Name(), v)
					}
				}
			}
		}
	}
}

// newContext loads f on be and makes a context of cfg, both closed when t ends.
func newContext(t testing.TB, f *gguf.File, be backend.Backend, cfg llama.ContextConfig) (*llama.Model, *llama.Context) {
	t.Helper()
	m, err := llama.Load(f, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	c, err := m.NewContext(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return m, c
}
