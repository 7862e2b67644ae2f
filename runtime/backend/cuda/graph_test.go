//go:build cuda && cgo && !nocgo

package cuda

import (
	"slices"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestGraphs runs the same steps of a small random Q8_0 model (GQA, an F16 cache, a context long
// enough for split attention) with and without CUDA graphs: the decode steps are recorded and
// run as graphs, the first instantiating one and later ones updating it, and every logit is bit
// for bit the same (the same kernels run in the same order). A call that waits while recording
// fails, and the context goes on without it.
func TestGraphs(t *testing.T) {
	gpu(t)
	f, err := llama.SynthFile(llama.Shape{Name: "small", Dim: 256, Layers: 3, Heads: 8, KVHeads: 2, FFN: 512, Ctx: 2048, Vocab: 1024}, tensor.Q8_0, 3)
	if err != nil {
		t.Fatal(err)
	}
	const decode = 40
	run := func(t *testing.T, graphs bool) ([][]float32, *Backend) {
		be, err := New(Options{Graphs: graphs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		m, err := llama.Load(f, be)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		c, err := m.NewContext(llama.ContextConfig{StepTokens: 1200, MaxSeqs: 3, KVSlots: 4096, KVType: tensor.F16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		seqs := []*kvcache.Seq{c.Pool().NewSeq(2048), c.Pool().NewSeq(2048), c.Pool().NewSeq(2048)}
		var bb kvcache.BatchBuilder
		var got [][]float32
		step := func(toks [][]int32) {
			t.Helper()
			var lg []float32
			if err := kvcache.Feed(&bb, seqs, toks, func(all []int32, b *backend.Batch, last []int32, _ []int) error {
				lg = make([]float32, len(last)*m.Vocab)
				return c.Forward(all, b, last, lg)
			}); err != nil {
				t.Fatal(err)
			}
			got = append(got, lg)
		}
		prompt := func(n, seed int) []int32 {
			p := make([]int32, n)
			for i := range p {
				p[i] = int32(3 + (i*seed+7)%1000)
			}
			return p
		}
		long := 1100 // long enough to split attention along the keys
		if emulated() {
			long = 600 // still split in three (the emulation reports an H100's 132 SMs)
		}
		step([][]int32{prompt(long, 13), nil, nil})
		step([][]int32{nil, prompt(9, 5), nil})
		for s := range decode {
			toks := [][]int32{{int32(10 + s)}, {int32(500 + s)}, nil}
			if s >= decode/2 { // a third sequence joins: the step's kernels change shape
				toks[2] = []int32{int32(700 + s)}
			}
			step(toks)
		}
		return got, be
	}
	want, _ := run(t, false)
	got, be := run(t, true)
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("step %d: logits with graphs differ from those without", i)
		}
	}
	st, err := be.GraphStats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("graph stats: %+v", st)
	// The 9-token prompt and every decode step are recorded; the 1100-token one is not.
	if st.Runs != decode+1 || st.Instantiations < 1 || st.Updates < decode/2 || st.Updates+st.Instantiations != st.Runs {
		t.Fatalf("graph stats %+v: want %d runs, mostly updates", st, decode+1)
	}

	// Waiting while recording fails; the context is usable after the recording is dropped.
	if err := be.Record(); err != nil {
		t.Fatal(err)
	}
	if err := be.ctx.Sync(); err == nil {
		t.Fatal("Sync while recording succeeded")
	} else {
		t.Logf("Sync while recording: %v", err)
	}
	be.Discard()
	if err := be.ctx.Sync(); err != nil {
		t.Fatalf("Sync after Discard: %v", err)
	}
}
