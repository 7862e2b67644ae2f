package sched

import (
	"fmt"
	"slices"
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
	// All queued before the loop starts, so that they share steps however the test goroutine is
	// scheduled.
	h.run()
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

// drawFake is pickFake as a Drawer that draws where its logits are: ForwardDraw computes every
// row's logits with Forward and hands over only the ids of the picked rows, drawn by the host
// rule of backend.Draw.
type drawFake struct {
	pickFake
	draws []int // drawn rows of each ForwardDraw
}

func (f *drawFake) DrawsWhereLogitsAre() bool { return true }

func (f *drawFake) ForwardDraw(tokens []int32, b *backend.Batch, out []int32, logits []float32, pick []int32, draws []backend.Draw, ids []int32) error {
	if len(draws) != len(pick) {
		return fmt.Errorf("fake: %d draws for %d picked rows", len(draws), len(pick))
	}
	if err := f.ForwardPick(tokens, b, out, logits, pick, ids); err != nil {
		return err
	}
	n := 0
	for _, d := range draws {
		if d.Temperature > 0 {
			n++
		}
	}
	f.draws = append(f.draws, n)
	return backend.DrawRows(f.lg[len(out)*fakeVocab:], fakeVocab, draws, ids)
}

// referenceDraw is fakeModel.reference for a sequence whose tokens the model draws
// (decode.Sampler.Drawable, NextRandom and backend.DrawRows).
func (f *fakeModel) referenceDraw(t testing.TB, prompt []int32, maxTokens int, p decode.Params) []int32 {
	smp, err := decode.NewSampler(p, fakeVocab)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := smp.Drawable()
	if !ok {
		t.Fatalf("%+v: not drawable", p)
	}
	toks := slices.Clone(prompt)
	var gen []int32
	row := make([]float32, fakeVocab)
	id := []int32{0}
	for len(gen) < maxTokens {
		var sum int64
		for _, x := range toks {
			sum += int64(x)
		}
		f.fill(row, sum, len(toks)-1)
		d.Random = smp.NextRandom()
		if err := backend.DrawRows(row, fakeVocab, []backend.Draw{d}, id); err != nil {
			t.Fatal(err)
		}
		if id[0] == 0 {
			break
		}
		gen = append(gen, id[0])
		toks = append(toks, id[0])
	}
	return gen
}

// TestDrawSampled: with a model that draws where its logits are (Drawer), sampling sequences
// without bias, penalties or log-probabilities are drawn by ForwardDraw, in the same steps as
// greedy ones (picked) and as those that still sample from their logits; each produces what it
// produces alone, the drawn ones by backend.Draw's rule from their sampler's random stream.
func TestDrawSampled(t *testing.T) {
	m := &drawFake{pickFake: pickFake{fakeModel: newFake(t, 64, 4, 64, 8)}}
	h := newHarnessOf(t, m, m.fakeModel, Config{MaxActive: 8})
	plain := decode.DefaultParams()
	plain.Seed = 3
	open := plain
	open.TopK, open.TopP, open.MinP, open.Temperature, open.Seed = 0, 1, 0, 1, 4
	penalised := plain
	penalised.RepeatPenalty, penalised.RepeatLastN = 1.3, 8
	reqs := []struct {
		p        decode.Params
		logprobs bool
		drawn    bool
	}{
		{plain, false, true},
		{open, false, true},
		{greedy(), false, false},
		{penalised, false, false},
		{plain, true, false},
	}
	streams := make([]*Stream, len(reqs))
	prompts := make([][]int32, len(reqs))
	for i, r := range reqs {
		prompts[i] = prompt(int32(3+i), 5+i)
		streams[i] = h.submit(t, &Request{Prompt: prompts[i], MaxTokens: 10, Sampling: r.p, Logprobs: r.logprobs})
	}
	h.run()
	drawnTokens := 0
	for i, st := range streams {
		res := drain(t, st, 1)
		if res[0].err != nil {
			t.Fatalf("request %d: %v", i, res[0].err)
		}
		if !reqs[i].drawn {
			checkSeq(t, m.fakeModel, res[0], prompts[i], 10, reqs[i].p)
			continue
		}
		want := m.referenceDraw(t, prompts[i], 10, reqs[i].p)
		if !slices.Equal(res[0].tokens, want) {
			t.Fatalf("drawn request %d: %v, want %v", i, res[0].tokens, want)
		}
		drawnTokens += len(want)
		if len(want) < 10 {
			drawnTokens++ // the end-of-generation token was drawn too
		}
	}
	drawn := 0
	for _, n := range m.draws {
		drawn += n
	}
	if drawn != drawnTokens {
		t.Errorf("%d rows drawn by the model, want %d (the two drawable sequences' tokens)", drawn, drawnTokens)
	}
}
