package llama_test

import (
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/backendtest"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestRecordedSteps runs the same steps on a backend and on recording forms of it: decode steps
// (at most 64 tokens) are recorded and replayed, larger ones run as called, and the logits are
// bit for bit the same. A step whose recording fails (an operation the backend cannot record,
// or a refused replay) runs again unrecorded with the same result; after three such steps in a
// row the context stops recording, as it does at once when the backend's recording is off.
func TestRecordedSteps(t *testing.T) {
	f, err := llama.SynthFile(llama.Shape{Name: "tiny", Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 96, Ctx: 128, Vocab: 512}, tensor.Q8_0, 7)
	if err != nil {
		t.Fatal(err)
	}
	// steps runs a 70-token prompt (not recorded), a 5-token prompt, then six decode steps of
	// both sequences, and returns every step's logits.
	steps := func(t *testing.T, be backend.Backend) [][]float32 {
		m, err := llama.Load(f, be)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		c, err := m.NewContext(llama.ContextConfig{StepTokens: 80, MaxSeqs: 2, KVSlots: 256, BlockSize: 8, KVType: tensor.F16})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		seqs := []*kvcache.Seq{c.Pool().NewSeq(128), c.Pool().NewSeq(128)}
		var bb kvcache.BatchBuilder
		var got [][]float32
		run := func(toks [][]int32) {
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
		long := make([]int32, 70)
		for i := range long {
			long[i] = int32(3 + i*7%500)
		}
		run([][]int32{long, nil})
		run([][]int32{nil, {1, 300, 301, 302, 303}})
		for s := range 6 {
			run([][]int32{{int32(10 + s)}, {int32(400 + s)}})
		}
		return got
	}
	modeltest.CheckRecorded(t, steps, []modeltest.RecordCase{
		// 7 steps of at most 64 tokens, each recorded and replayed.
		{Name: "recorded", Recorder: &backendtest.Recorder{}, Records: 7, Replays: 7},
		// Three steps fail to record (and run unrecorded); the context then stops trying.
		{Name: "op not recordable", Recorder: &backendtest.Recorder{FailOp: "Attention"}, Records: 3, Discards: 3},
		{Name: "replay refused", Recorder: &backendtest.Recorder{FailReplay: true}, Records: 3},
		{Name: "recording off", Recorder: &backendtest.Recorder{Off: true}, Records: 1},
	})
}
