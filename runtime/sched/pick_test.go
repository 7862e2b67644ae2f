package sched

import (
	"fmt"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
)

// pickFake is the fake model as a Picker: ForwardPick computes every row's logits with Forward
// and hands over only the argmax of the picked rows.
type pickFake struct {
	*fakeModel
	lg     []float32
	out    []int32
	outs   []int // logit rows of each ForwardPick
	picks  []int // picked rows of each ForwardPick
	poison bool  // the next ForwardPick refuses its picked rows (-1)
}

func (f *pickFake) ForwardPick(tokens []int32, b *backend.Batch, out []int32, logits []float32, pick, ids []int32) error {
	if len(ids) != len(pick) || len(logits) != len(out)*fakeVocab {
		return fmt.Errorf("fake: %d ids for %d picked rows, %d logits for %d rows", len(ids), len(pick), len(logits), len(out))
	}
	f.out = append(append(f.out[:0], out...), pick...)
	f.lg = append(f.lg[:0], make([]float32, len(f.out)*fakeVocab)...)
	if err := f.Forward(tokens, b, f.out, f.lg); err != nil {
		return err
	}
	copy(logits, f.lg)
	f.outs, f.picks = append(f.outs, len(out)), append(f.picks, len(pick))
	if f.poison {
		f.poison = false
		for i := range ids {
			ids[i] = -1
		}
		return nil
	}
	return backend.ArgmaxRows(f.lg[len(out)*fakeVocab:], fakeVocab, ids)
}

// TestPickGreedy: with a model that is a Picker, the tokens of plain greedy sequences come from
// ForwardPick's argmax and every other sequence (sampling, repetition, presence and frequency
// penalties, logit bias, log-probabilities)
// still gets its logits, in the same steps; every sequence produces what it produces alone.
func TestPickGreedy(t *testing.T) {
	m := &pickFake{fakeModel: newFake(t, 64, 4, 64, 8)}
	h := newHarnessOf(t, m, m.fakeModel, Config{MaxActive: 8})
	h.run()
	penalised := greedy()
	penalised.RepeatPenalty, penalised.RepeatLastN = 1.3, 8
	biased := greedy()
	biased.LogitBias = map[int32]float32{5: 2}
	present := greedy()
	present.PresencePenalty = 1.5
	frequent := greedy()
	frequent.FrequencyPenalty = 0.7
	sampled := decode.DefaultParams()
	sampled.Seed = 9
	reqs := []struct {
		p        decode.Params
		logprobs bool
		picked   bool
	}{
		{greedy(), false, true},
		{greedy(), true, false},
		{penalised, false, false},
		{biased, false, false},
		{present, false, false},
		{frequent, false, false},
		{sampled, false, false},
		{greedy(), false, true},
	}
	streams := make([]*Stream, len(reqs))
	prompts := make([][]int32, len(reqs))
	for i, r := range reqs {
		prompts[i] = prompt(int32(3+i), 5+i)
		streams[i] = h.submit(t, &Request{Prompt: prompts[i], MaxTokens: 12, Sampling: r.p, Logprobs: r.logprobs})
	}
	for i, st := range streams {
		res := drain(t, st, 1)
		if res[0].err != nil {
			t.Fatalf("request %d: %v", i, res[0].err)
		}
		checkSeq(t, m.fakeModel, res[0], prompts[i], 12, reqs[i].p)
	}
	picked, withLogits := 0, 0
	for i := range m.picks {
		picked += m.picks[i]
		withLogits += m.outs[i]
	}
	// Two picked sequences of 12 tokens each; the others' rows went through ForwardPick only
	// when a picked row was in the same step.
	if picked != 2*12 {
		t.Errorf("%d rows picked, want %d (two greedy sequences of 12 tokens)", picked, 2*12)
	}
	if withLogits == 0 {
		t.Error("no step handed over logits beside picked rows")
	}
}

// TestPickRefused: a picked row the model refuses (-1: NaN, +Inf or nothing above -Inf) ends
// its sequence with an error, as a sampler's refusal does, and the scheduler goes on.
func TestPickRefused(t *testing.T) {
	m := &pickFake{fakeModel: newFake(t, 64, 4, 64, 8)}
	h := newHarnessOf(t, m, m.fakeModel, Config{MaxActive: 8})
	m.poison = true
	h.run()
	res := drain(t, h.submit(t, &Request{Prompt: prompt(3, 5), MaxTokens: 4, Sampling: greedy()}), 1)
	if res[0].err == nil || res[0].reason != ReasonError {
		t.Fatalf("a refused pick: %v (%s), want an error", res[0].err, res[0].reason)
	}
	res = drain(t, h.submit(t, &Request{Prompt: prompt(4, 5), MaxTokens: 4, Sampling: greedy()}), 1)
	checkSeq(t, m.fakeModel, res[0], prompt(4, 5), 4, greedy())
}
