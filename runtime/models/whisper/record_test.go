package whisper_test

import (
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/backendtest"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/whisper"
)

// TestRecordedDecoderSteps runs the same decoder steps (two sequences over two audio windows) on
// a backend and on recording forms of it (backendtest.Recorder, as a GPU backend's graphs
// behave): steps of at most 64 tokens are recorded and replayed, a longer one runs as called,
// and every logit is bit for bit the same; a step whose recording fails runs again unrecorded,
// and after three such steps the decoder stops recording.
func TestRecordedDecoderSteps(t *testing.T) {
	path := synthModel(t, ggml.Shape{Name: "mini", State: 64, Head: 2, AudioLayer: 1, TextLayer: 2}, "tiny.en")
	// steps returns the logits of a 70-token prompt (not recorded), a 4-token one, then eight
	// decode steps of both sequences.
	steps := func(t *testing.T, be backend.Backend) [][]float32 {
		m, err := whisper.Open(be, path)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		enc, err := m.NewBatchEncoder(2)
		if err != nil {
			t.Fatal(err)
		}
		defer enc.Close()
		mels, cross := make([][]float32, 2), make([]*whisper.Cross, 2)
		for i := range mels {
			if cross[i], err = m.NewCross(); err != nil {
				t.Fatal(err)
			}
			defer cross[i].Close()
			mels[i] = make([]float32, m.Mels*whisper.WindowFrames)
			for k := range mels[i] {
				mels[i][k] = float32((k*(i+3))%101)/50 - 1
			}
		}
		if err := enc.EncodeBatch(mels, cross); err != nil {
			t.Fatal(err)
		}
		dec, err := m.NewDecoder(whisper.DecoderConfig{StepTokens: 80, MaxSeqs: 2, KVSlots: 448 * 2, BlockSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer dec.Close()
		seqs := []*kvcache.Seq{dec.Pool().NewSeq(448), dec.Pool().NewSeq(448)}
		var bb kvcache.BatchBuilder
		var got [][]float32
		run := func(toks [][]int32) {
			t.Helper()
			var lg []float32
			if err := kvcache.Feed(&bb, seqs, toks, func(all []int32, b *backend.Batch, last []int32, fed []int) error {
				cr := make([]*whisper.Cross, len(fed))
				for j, i := range fed {
					cr[j] = cross[i]
				}
				lg = make([]float32, len(last)*m.NVocab)
				return dec.Forward(all, b, cr, last, lg)
			}); err != nil {
				t.Fatal(err)
			}
			got = append(got, lg)
		}
		long := make([]int32, 70)
		for i := range long {
			long[i] = int32(100 + i*13%900)
		}
		run([][]int32{long, nil})
		run([][]int32{nil, {50257, 50362, 400, 401}})
		for s := range 8 {
			run([][]int32{{int32(500 + s)}, {int32(700 + s)}})
		}
		return got
	}
	modeltest.CheckRecorded(t, steps, []modeltest.RecordCase{
		{Name: "recorded", Recorder: &backendtest.Recorder{}, Records: 9, Replays: 9},
		{Name: "op not recordable", Recorder: &backendtest.Recorder{FailOp: "FullAttention"}, Records: 3, Discards: 3},
		{Name: "replay refused", Recorder: &backendtest.Recorder{FailReplay: true}, Records: 3},
		{Name: "recording off", Recorder: &backendtest.Recorder{Off: true}, Records: 1},
	})
}
