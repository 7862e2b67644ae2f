package llama_test

import (
	"math"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestForwardHiddenPooled: a qwen3 file marked for last-token pooling (qwen3.pooling_type, as
// Qwen3-Embedding's) gives, through ForwardHidden and package pooling, the float64 reference's
// final normed hidden state of each sequence's last token, L2-normalised; mean pooling the
// mean of every token's. Two prompts of different lengths run in one step, on every backend.
//
// Tolerance: 1e-5 on the normalised embeddings (elements about 1/8); F32 weights and cache,
// so only the order of F32 sums differs from the reference; seen: 6.7e-8 (go, cpu), 1.2e-7 (cuda
// on its CPU emulation).
func TestForwardHiddenPooled(t *testing.T) {
	base := qwen3Model(t, 24, true, true)
	f := modeltest.Rebuild(t, base, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			w.SetUint32("qwen3.pooling_type", 3)
		}
		return true
	})
	if p, err := pooling.Read(f, f.Architecture()); err != nil || p != pooling.Last {
		t.Fatalf("pooling %v, %v; want last", p, err)
	}
	prompts := [][]int32{{1, 17, 250, 3, 99, 42, 7}, {1, 180, 33}}
	lens := []int{len(prompts[0]), len(prompts[1])}
	for _, pool := range []pooling.Type{pooling.Last, pooling.Mean} {
		// The reference: each prompt alone, its hidden states pooled and normalised.
		var want [][]float64
		for _, p := range prompts {
			ref := newRef64(t, f)
			sum := make([]float64, tinyShape.Dim)
			for _, tk := range p {
				ref.step(tk)
				for i, v := range ref.hidden {
					sum[i] += v / float64(len(p))
				}
			}
			e := ref.hidden
			if pool == pooling.Mean {
				e = sum
			}
			var ss float64
			for _, v := range e {
				ss += v * v
			}
			row := make([]float64, len(e))
			for i, v := range e {
				row[i] = v / math.Sqrt(ss)
			}
			want = append(want, row)
		}
		for _, be := range backendsUnderTest(t) {
			t.Run(pool.String()+"/"+be.Name(), func(t *testing.T) {
				m, c := newContext(t, f, be, llama.ContextConfig{StepTokens: 16, MaxSeqs: 2, KVSlots: 64, KVType: tensor.F32})
				toks, b := promptBatch(t, c, prompts, 32)
				rows, err := pooling.Rows(nil, pool, lens)
				if err != nil {
					t.Fatal(err)
				}
				hidden := make([]float32, len(rows)*m.Dim)
				if err := c.ForwardHidden(toks, b, rows, hidden); err != nil {
					t.Fatal(err)
				}
				out := make([]float32, len(prompts)*m.Dim)
				if err := pooling.Reduce(out, hidden, m.Dim, pool, lens); err != nil {
					t.Fatal(err)
				}
				if err := pooling.Normalize(out, m.Dim, pooling.NormEuclidean); err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for s := range prompts {
					for j, w := range want[s] {
						d := math.Abs(float64(out[s*m.Dim+j]) - w)
						if !(d <= 1e-5) {
							t.Fatalf("sequence %d, element %d: %v, float64 reference %v", s, j, out[s*m.Dim+j], w)
						}
						worst = max(worst, d)
					}
				}
				t.Logf("largest difference %.2g", worst)
			})
		}
	}
}

// TestForwardHiddenRejects: rows and buffers that do not fit the batch are refused.
func TestForwardHiddenRejects(t *testing.T) {
	f, err := llama.SynthFile(tinyShape, tensor.F32, 1)
	if err != nil {
		t.Fatal(err)
	}
	be := backendsUnderTest(t)[0]
	m, c := newContext(t, f, be, llama.ContextConfig{StepTokens: 4, MaxSeqs: 1, KVSlots: 32, KVType: tensor.F32})
	seq := c.Pool().NewSeq(32)
	var bb kvcache.BatchBuilder
	_ = seq.Reserve(2)
	_ = bb.Add(seq, 2)
	for _, tc := range []struct {
		name   string
		tokens []int32
		rows   []int32
		hidden []float32
	}{
		{"a row past the batch", []int32{1, 2}, []int32{2}, make([]float32, m.Dim)},
		{"a negative row", []int32{1, 2}, []int32{-1}, make([]float32, m.Dim)},
		{"a short buffer", []int32{1, 2}, []int32{0, 1}, make([]float32, m.Dim)},
		{"more rows than the context's tokens", []int32{1, 2}, []int32{0, 1, 0, 1, 0}, make([]float32, 5*m.Dim)},
		{"a token outside the vocabulary", []int32{1, 300}, []int32{1}, make([]float32, m.Dim)},
	} {
		if err := c.ForwardHidden(tc.tokens, bb.Batch(), tc.rows, tc.hidden); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if err := c.ForwardHidden([]int32{1, 2}, bb.Batch(), []int32{1, 1}, make([]float32, 2*m.Dim)); err != nil {
		t.Fatalf("a good step fails: %v", err)
	}
}
