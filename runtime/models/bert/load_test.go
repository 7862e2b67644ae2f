package bert_test

import (
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/bert"
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestLoadRejectsBadModels: each defect of a file is refused at load with an error that names
// it, never by a panic or a model that computes something else.
func TestLoadRejectsBadModels(t *testing.T) {
	good := testModel(t, tensor.F32, nil)
	be := sharedtest.Backend(t, "go", 1)
	m, err := bert.Load(good, be)
	if err != nil {
		t.Fatalf("the good model fails: %v", err)
	}
	m.Close()
	set := func(key string, v gguf.Value) func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		return func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.Set(key, v)
			}
			return true
		}
	}
	drop := func(name string) func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		return func(w *gguf.Writer, ti *gguf.TensorInfo) bool { return ti == nil || ti.Name != name }
	}
	replace := func(name string, dt tensor.DType, shape []int64) func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		return func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil || ti.Name != name {
				return true
			}
			n := int64(1)
			for _, d := range shape {
				n *= d
			}
			rs, _ := dt.RowSize(shape[0])
			if err := w.AddTensor(name, dt, shape, make([]byte, rs*(n/shape[0]))); err != nil {
				t.Fatal(err)
			}
			return false
		}
	}
	add := func(name string, shape []int64) func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		return func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				addZeros(t, w, name, shape)
			}
			return true
		}
	}
	u32 := func(v uint32) gguf.Value { return gguf.Value{Type: gguf.Uint32, V: v} }
	for _, tc := range []struct {
		name string
		f    *gguf.File
		want string
	}{
		{"another architecture", modeltest.Rebuild(t, good, set("general.architecture", gguf.Value{Type: gguf.String, V: "nomic-bert"})), `"nomic-bert" is not "bert"`},
		{"zero layers", modeltest.Rebuild(t, good, set("bert.block_count", u32(0))), "bert.block_count = 0"},
		{"width not a multiple of the heads", modeltest.Rebuild(t, good, set("bert.attention.head_count", u32(5))), "not a multiple of 5 heads"},
		{"kv heads that do not divide", modeltest.Rebuild(t, good, set("bert.attention.head_count_kv", u32(3))), "cannot share 3"},
		{"key length other than width over heads", modeltest.Rebuild(t, good, set("bert.attention.key_length", u32(32))), "key_length = 32"},
		{"no epsilon", withoutKey(t, good, "bert.attention.layer_norm_epsilon"), "lacks bert.attention.layer_norm_epsilon"},
		{"no causal flag", withoutKey(t, good, "bert.attention.causal"), "lacks bert.attention.causal"},
		{"no context length", withoutKey(t, good, "bert.context_length"), "lacks bert.context_length"},
		{"epsilon out of range", modeltest.Rebuild(t, good, set("bert.attention.layer_norm_epsilon", gguf.Value{Type: gguf.Float32, V: float32(0)})), "epsilon 0"},
		{"causal", modeltest.Rebuild(t, good, set("bert.attention.causal", gguf.Value{Type: gguf.Bool, V: true})), "attention.causal = true"},
		{"rank pooling", modeltest.Rebuild(t, good, set("bert.pooling_type", u32(4))), "rank pooling"},
		{"unknown pooling", modeltest.Rebuild(t, good, set("bert.pooling_type", u32(7))), "pooling type 7"},
		{"token type count", modeltest.Rebuild(t, good, set("tokenizer.ggml.token_type_count", u32(3))), "token_type_count = 3"},
		{"missing tensor", modeltest.Rebuild(t, good, drop("blk.1.ffn_down.bias")), "lacks tensor blk.1.ffn_down.bias"},
		{"missing position embeddings", modeltest.Rebuild(t, good, drop("position_embd.weight")), "lacks tensor position_embd.weight"},
		{"positions other than the context", modeltest.Rebuild(t, good, replace("position_embd.weight", tensor.F32, []int64{64, 40})), "position_embd.weight has shape [64 40]"},
		{"matrix of the wrong shape", modeltest.Rebuild(t, good, replace("blk.0.attn_k.weight", tensor.F32, []int64{64, 32})), "blk.0.attn_k.weight has shape"},
		{"F16 bias", modeltest.Rebuild(t, good, replace("blk.0.attn_q.bias", tensor.F16, []int64{64})), "want F32"},
		{"unknown tensor", modeltest.Rebuild(t, good, add("blk.0.ffn_gate.weight", []int64{64, 128})), "blk.0.ffn_gate.weight is not part of the bert architecture"},
		{"fused query/key/value", modeltest.Rebuild(t, good, add("blk.0.attn_qkv.weight", []int64{64, 192})), "fused query/key/value"},
		{"no vocabulary", modeltest.Rebuild(t, good, drop("token_embd.weight")), "lacks tensor token_embd.weight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := bert.Load(tc.f, be)
			if err == nil {
				m.Close()
				t.Fatalf("loaded; want an error with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// TestLoadIgnoresClassificationHead: the tensors of a reranker's head (cls.*), which llama.cpp
// reads only for rank pooling, load with a file of another pooling and change nothing.
func TestLoadIgnoresClassificationHead(t *testing.T) {
	f := testModel(t, tensor.F32, nil)
	withHead := modeltest.Rebuild(t, f, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			for name, shape := range map[string][]int64{"cls.weight": {64, 64}, "cls.bias": {64}, "cls.output.weight": {64, 1}, "cls.output.bias": {1}} {
				addZeros(t, w, name, shape)
			}
		}
		return true
	})
	be := sharedtest.Backend(t, "go", 1)
	var embs [2][][]float32
	for i, file := range []*gguf.File{f, withHead} {
		_, c := newContext(t, file, be, bert.ContextConfig{StepTokens: 16})
		embs[i] = embedAll(t, c, testSeqs[:1], pooling.NormEuclidean)
	}
	for j := range embs[0][0] {
		if embs[0][0][j] != embs[1][0][j] {
			t.Fatalf("element %d: %v without the head, %v with it", j, embs[0][0][j], embs[1][0][j])
		}
	}
}

// TestEmbedGroupedHeads: keys and values of fewer heads than the queries (llama.cpp's bert
// takes attn_k and attn_v of n_embd_gqa rows), against the float64 reference.
func TestEmbedGroupedHeads(t *testing.T) {
	src := testModel(t, tensor.F32, nil)
	f := modeltest.Rebuild(t, src, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			w.SetUint32("bert.attention.head_count_kv", 2)
			return true
		}
		if !strings.Contains(ti.Name, "attn_k.") && !strings.Contains(ti.Name, "attn_v.") {
			return true
		}
		// The first 32 rows (two heads of 16) of each matrix and bias.
		shape, data := append([]int64(nil), ti.Shape...), src.TensorData(ti)
		if len(shape) == 2 {
			shape[1], data = 32, data[:32*64*4]
		} else {
			shape[0], data = 32, data[:32*4]
		}
		if err := w.AddTensor(ti.Name, ti.DType, shape, data); err != nil {
			t.Fatal(err)
		}
		return false
	})
	ref := newRef64(t, f)
	if ref.c.KVHeads != 2 || ref.c.Heads != 4 {
		t.Fatalf("config %+v", ref.c)
	}
	var want [][]float64
	for _, s := range testSeqs {
		want = append(want, ref.embed(s, pooling.Mean)...)
	}
	for _, be := range backendsUnderTest(t) {
		_, c := newContext(t, f, be, bert.ContextConfig{StepTokens: 80, Pooling: pooling.Mean})
		if diff, _ := worstDiff(embedAll(t, c, testSeqs, pooling.NormEuclidean), want); !(diff <= 1e-6) {
			t.Fatalf("%s: embeddings differ from the float64 reference's by up to %g", be.Name(), diff)
		}
	}
}

// TestEmbedRejectsBadBatches: a batch that does not fit the model or the context is refused with
// an error, and the context still works afterwards.
func TestEmbedRejectsBadBatches(t *testing.T) {
	f := testModel(t, tensor.F32, nil)
	be := sharedtest.Backend(t, "go", 1)
	m, err := bert.Load(f, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, cfg := range []bert.ContextConfig{{StepTokens: 0}, {StepTokens: -1}, {StepTokens: bert.MaxStepTokens + 1}, {StepTokens: 8, Pooling: pooling.Rank}, {StepTokens: 8, Pooling: pooling.Type(9)}} {
		if c, err := m.NewContext(cfg); err == nil {
			c.Close()
			t.Errorf("context %+v accepted", cfg)
		}
	}
	c, err := m.NewContext(bert.ContextConfig{StepTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	long := make([]int32, 49) // one more than the model's 48 positions
	out := make([]float32, m.Dim)
	for _, tc := range []struct {
		name   string
		tokens []int32
		lens   []int
		norm   pooling.Norm
		out    []float32
	}{
		{"empty", nil, nil, pooling.NormEuclidean, out},
		{"more tokens than the context takes", make([]int32, 65), []int{65}, pooling.NormEuclidean, out},
		{"lengths short of the tokens", []int32{1, 2, 3}, []int{2}, pooling.NormEuclidean, out},
		{"lengths beyond the tokens", []int32{1, 2, 3}, []int{2, 2}, pooling.NormEuclidean, make([]float32, 2*m.Dim)},
		{"an empty sequence", []int32{1, 2}, []int{2, 0}, pooling.NormEuclidean, make([]float32, 2*m.Dim)},
		{"a negative length", []int32{1, 2}, []int{3, -1}, pooling.NormEuclidean, make([]float32, 2*m.Dim)},
		{"a sequence longer than the positions", long, []int{49}, pooling.NormEuclidean, out},
		{"a token outside the vocabulary", []int32{1, 200}, []int{2}, pooling.NormEuclidean, out},
		{"a negative token", []int32{-1}, []int{1}, pooling.NormEuclidean, out},
		{"an output of the wrong size", []int32{1, 2}, []int{2}, pooling.NormEuclidean, make([]float32, 2*m.Dim)},
		{"an unknown normalisation", []int32{1, 2}, []int{2}, pooling.Norm(-2), out},
	} {
		if err := c.Embed(tc.tokens, tc.lens, tc.norm, tc.out); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if err := c.Embed([]int32{101, 5, 102}, []int{3}, pooling.NormEuclidean, out); err != nil {
		t.Fatalf("a good batch fails after bad ones: %v", err)
	}
}

// withoutKey is a copy of f without the metadata key.
func withoutKey(t testing.TB, f *gguf.File, key string) *gguf.File {
	t.Helper()
	w := gguf.NewWriter()
	for _, kv := range f.KVs {
		if kv.Key != key {
			w.Set(kv.Key, kv.Value)
		}
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if err := w.AddTensor(ti.Name, ti.DType, ti.Shape, f.TensorData(ti)); err != nil {
			t.Fatal(err)
		}
	}
	return modeltest.Parse(t, w)
}

// newContext loads f on be and makes a context of cfg, both closed when t ends.
func newContext(t testing.TB, f *gguf.File, be backend.Backend, cfg bert.ContextConfig) (*bert.Model, *bert.Context) {
	t.Helper()
	m, err := bert.Load(f, be)
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

// addZeros adds an F32 tensor of shape (ggml order) holding zeros.
func addZeros(t testing.TB, w *gguf.Writer, name string, shape []int64) {
	t.Helper()
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	if err := w.AddTensor(name, tensor.F32, shape, make([]byte, 4*n)); err != nil {
		t.Fatal(err)
	}
}
