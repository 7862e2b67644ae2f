package sched

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/parleyhq/parley/runtime/decode"
)

// promptRef is what the fake model gives as the prompt log-probabilities of p: for every token
// after the first, decode.Logprobs of the logits at the position before it, with topN
// alternatives.
func (f *fakeModel) promptRef(p []int32, topN int) []Event {
	row := make([]float32, fakeVocab)
	var evs []Event
	var sum int64
	for i := 1; i < len(p); i++ {
		sum += int64(p[i-1])
		f.fill(row, sum, i-1)
		ev := Event{Prompt: true, Token: p[i]}
		var top []decode.TokenLogprob
		ev.Logprob, top = decode.Logprobs(row, p[i], topN, nil)
		if topN > 0 {
			ev.Top = top
		}
		evs = append(evs, ev)
	}
	return evs
}

// scoredResult is what a scoring request produced: its prompt events and its sequences.
type scoredResult struct {
	prompt []Event
	seqs   []seqResult
}

// drainScored reads st to the end, checking that prompt events belong to sequence 0, carry no
// text, and come before any other event of any sequence.
func drainScored(t *testing.T, st *Stream, n int) scoredResult {
	t.Helper()
	var res scoredResult
	res.seqs = drainWith(t, st, n, func(ev Event, afterOther bool) {
		if ev.Seq != 0 || afterOther || ev.Done || len(ev.Text) > 0 {
			t.Fatalf("prompt event %+v (after another event: %v)", ev, afterOther)
		}
		res.prompt = append(res.prompt, ev)
	})
	return res
}

func checkPromptEvents(t *testing.T, got, want []Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d prompt events, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Token != w.Token || g.Logprob != w.Logprob || !slices.Equal(g.Top, w.Top) {
			t.Fatalf("prompt event %d: token %d logprob %v top %v, want %d %v %v", i, g.Token, g.Logprob, g.Top, w.Token, w.Logprob, w.Top)
		}
	}
}

// TestPromptLogprobs: a scoring request reports every prompt token after the first with the
// log-probability (and alternatives) the model gives it after the tokens before it, in order and
// before its generated tokens, which are what it generates without scoring; usage counts only
// the generated tokens as completion.
func TestPromptLogprobs(t *testing.T) {
	m := newFake(t, 16, 4, 16, 4)
	h := newHarness(t, m, Config{})
	h.run()
	for _, top := range []int{0, 3} {
		p := prompt(5, 11)
		st := h.submit(t, &Request{Prompt: p, MaxTokens: 6, Sampling: greedy(), TopLogprobs: top, PromptLogprobs: true})
		res := drainScored(t, st, 1)
		checkPromptEvents(t, res.prompt, m.promptRef(p, top))
		checkSeq(t, m, res.seqs[0], p, 6, greedy())
		if u := st.Usage(); u.PromptTokens != 11 || u.CompletionTokens != 6 {
			t.Fatalf("usage %+v", u)
		}
	}
	// A one-token prompt has nothing to score.
	p := prompt(7, 1)
	res := drainScored(t, h.submit(t, &Request{Prompt: p, MaxTokens: 3, Sampling: greedy(), PromptLogprobs: true}), 1)
	if len(res.prompt) != 0 {
		t.Fatalf("one-token prompt: %d prompt events", len(res.prompt))
	}
	checkSeq(t, m, res.seqs[0], p, 3, greedy())
}

// TestPromptLogprobsChunked: a scoring prompt spread over many steps by a small token budget and
// few logit rows, beside sequences decoding and other prompts, gives the same log-probabilities;
// no step passes the budget or the model's rows, every step feeds some of the scoring prompt, and
// every other sequence produces what it produces alone.
func TestPromptLogprobsChunked(t *testing.T) {
	for _, c := range []struct {
		name             string
		steps, seqs, act int
	}{
		{"budget 3", 3, 8, 3},
		{"rows 4", 16, 4, 4},
		{"rows 2", 16, 2, 2},
		{"budget 1", 1, 4, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newFake(t, 64, 4, 16, c.seqs)
			h := newHarness(t, m, Config{StepTokens: c.steps, MaxActive: c.act})
			var ps [][]int32
			var sts []*Stream
			for i, n := range []int{3, 9, 2} {
				p := prompt(int32(40+i), n)
				ps = append(ps, p)
				sts = append(sts, h.submit(t, &Request{Prompt: p, MaxTokens: 12, Sampling: greedy(), TopLogprobs: i % 2}))
			}
			sp := decode.DefaultParams()
			sp.Seed = 9
			scoreP := prompt(3, 29)
			scoring := h.submit(t, &Request{Prompt: scoreP, MaxTokens: 4, Sampling: sp, TopLogprobs: 2, PromptLogprobs: true})
			// Scoring only, after it.
			onlyP := prompt(11, 17)
			only := h.submit(t, &Request{Prompt: onlyP, Sampling: greedy(), TopLogprobs: 1, PromptLogprobs: true})
			h.run()
			for i, st := range sts {
				checkSeq(t, m, drain(t, st, 1)[0], ps[i], 12, greedy())
			}
			res := drainScored(t, scoring, 1)
			checkPromptEvents(t, res.prompt, m.promptRef(scoreP, 2))
			checkSeq(t, m, res.seqs[0], scoreP, 4, sp)
			res = drainScored(t, only, 1)
			checkPromptEvents(t, res.prompt, m.promptRef(onlyP, 1))
			if s := res.seqs[0]; s.reason != decode.StopLength || len(s.tokens) != 0 || s.text != "" {
				t.Fatalf("scoring only: %+v", s)
			}
			for i, n := range m.batches {
				if n > c.steps || m.rows[i] > c.seqs {
					t.Fatalf("step %d: %d tokens, %d rows; budget %d, rows %d", i, n, m.rows[i], c.steps, c.seqs)
				}
			}
		})
	}
}

// TestPromptLogprobsRows: with three sequences decoding and four logit rows, a scoring prompt
// gets the one row left and feeds one token a step; alone, it feeds four.
func TestPromptLogprobsRows(t *testing.T) {
	m := newFake(t, 64, 4, 16, 4)
	h := newHarness(t, m, Config{})
	var sts []*Stream
	for i := range 3 {
		sts = append(sts, h.submit(t, &Request{Prompt: prompt(int32(20+i), 2), MaxTokens: 30, Sampling: greedy(), IgnoreEOS: true}))
	}
	for range 3 { // their prompts, then decoding
		h.s.loop.Step()
	}
	p := prompt(8, 9)
	st := h.submit(t, &Request{Prompt: p, MaxTokens: 1, Sampling: greedy(), PromptLogprobs: true})
	m.batches, m.rows = nil, nil
	for range 9 {
		h.s.loop.Step()
	}
	// Nine steps of three decode tokens and one prompt token; the last one samples.
	for i := range 9 {
		if m.batches[i] != 4 || m.rows[i] != 4 {
			t.Fatalf("step %d: %d tokens, %d rows; want 4 and 4 (%v %v)", i, m.batches[i], m.rows[i], m.batches, m.rows)
		}
	}
	h.run()
	res := drainScored(t, st, 1)
	checkPromptEvents(t, res.prompt, m.promptRef(p, 0))
	checkSeq(t, m, res.seqs[0], p, 1, greedy())
	for _, st := range sts {
		drain(t, st, 1)
	}
	// Alone: chunks of 4, 4 and 1.
	m.batches, m.rows = nil, nil
	res = drainScored(t, h.submit(t, &Request{Prompt: p, MaxTokens: 1, Sampling: greedy(), PromptLogprobs: true}), 1)
	checkPromptEvents(t, res.prompt, m.promptRef(p, 0))
	if !slices.Equal(m.batches, []int{4, 4, 1}) || !slices.Equal(m.rows, []int{4, 4, 1}) {
		t.Fatalf("alone: batches %v rows %v, want [4 4 1] twice", m.batches, m.rows)
	}
}

// TestPromptLogprobsOnly: MaxTokens 0 scores the prompt and ends with StopLength, generating
// nothing; it reserves the prompt's positions (a prompt one past a block boundary fills a pool
// of that many positions' blocks exactly), and needs N 1 and PromptLogprobs.
func TestPromptLogprobsOnly(t *testing.T) {
	m := newFake(t, 3, 4, 16, 4) // 12 positions
	h := newHarness(t, m, Config{})
	h.run()
	p := prompt(6, 9) // 9 positions: 3 blocks
	st := h.submit(t, &Request{Prompt: p, Sampling: greedy(), TopLogprobs: 2, PromptLogprobs: true})
	res := drainScored(t, st, 1)
	checkPromptEvents(t, res.prompt, m.promptRef(p, 2))
	if s := res.seqs[0]; s.reason != decode.StopLength || len(s.tokens) != 0 || s.events != 1 {
		t.Fatalf("got %+v", s)
	}
	if u := st.Usage(); u.PromptTokens != 9 || u.CompletionTokens != 0 {
		t.Fatalf("usage %+v", u)
	}
	if s := h.s.Stats(); s.GeneratedTokens != 0 || s.PromptTokens != 9 {
		t.Fatalf("stats %+v", s)
	}
	// The whole pool: 12 positions.
	p = prompt(2, 12)
	res = drainScored(t, h.submit(t, &Request{Prompt: p, Sampling: greedy(), PromptLogprobs: true}), 1)
	checkPromptEvents(t, res.prompt, m.promptRef(p, 0))
	// One token: nothing to score.
	res = drainScored(t, h.submit(t, &Request{Prompt: p[:1], Sampling: greedy(), PromptLogprobs: true}), 1)
	if len(res.prompt) != 0 || res.seqs[0].reason != decode.StopLength {
		t.Fatalf("one token: %+v", res)
	}
	for _, r := range []*Request{
		{Prompt: p, Sampling: greedy()},
		{Prompt: p, Sampling: greedy(), PromptLogprobs: true, N: 2},
		{Prompt: p, MaxTokens: -1, Sampling: greedy(), PromptLogprobs: true},
	} {
		if _, err := h.s.Submit(context.Background(), r); !errors.Is(err, ErrInvalid) {
			t.Errorf("MaxTokens %d N %d PromptLogprobs %v: %v, want ErrInvalid", r.MaxTokens, r.N, r.PromptLogprobs, err)
		}
	}
	if _, err := h.s.Submit(context.Background(), &Request{Prompt: prompt(1, 13), Sampling: greedy(), PromptLogprobs: true}); !errors.Is(err, ErrTooLong) {
		t.Errorf("13 positions in a pool of 12: %v, want ErrTooLong", err)
	}
}

// TestPromptLogprobsN: with N 2, sequence 0 alone reports the prompt, once; both sequences
// produce what they produce alone.
func TestPromptLogprobsN(t *testing.T) {
	m := newFake(t, 32, 4, 16, 4)
	h := newHarness(t, m, Config{StepTokens: 5})
	h.run()
	p := prompt(12, 10)
	sp := decode.DefaultParams()
	sp.Seed = 4
	res := drainScored(t, h.submit(t, &Request{Prompt: p, MaxTokens: 7, Sampling: sp, Logprobs: true, PromptLogprobs: true, N: 2}), 2)
	checkPromptEvents(t, res.prompt, m.promptRef(p, 0))
	for i := range 2 {
		sp.Seed = SeqSeed(4, i)
		checkSeq(t, m, res.seqs[i], p, 7, sp)
	}
}

// TestPromptLogprobsPrefixCache: a scoring request takes nothing from the prefix cache (its
// prompt is fed from position 0 although the cache holds its blocks) but inserts its own blocks,
// which a later request takes.
func TestPromptLogprobsPrefixCache(t *testing.T) {
	m := newFake(t, 32, 4, 16, 4)
	h := newHarness(t, m, Config{PrefixCache: true})
	h.run()
	a, b := prompt(9, 14), prompt(17, 14)
	drain(t, h.submit(t, &Request{Prompt: a, MaxTokens: 3, Sampling: greedy()}), 1)
	m.starts = nil
	res := drainScored(t, h.submit(t, &Request{Prompt: a, MaxTokens: 3, Sampling: greedy(), PromptLogprobs: true}), 1)
	checkPromptEvents(t, res.prompt, m.promptRef(a, 0))
	checkSeq(t, m, res.seqs[0], a, 3, greedy())
	if s := h.s.Stats(); s.PrefixHitTokens != 0 || !slices.Equal(m.starts, a[:1]) {
		t.Fatalf("scoring a cached prompt: %d tokens from the cache, starts %v", s.PrefixHitTokens, m.starts)
	}
	// Scoring b (not cached; scoring only) caches its 3 whole blocks for a plain request.
	res = drainScored(t, h.submit(t, &Request{Prompt: b, Sampling: greedy(), PromptLogprobs: true}), 1)
	checkPromptEvents(t, res.prompt, m.promptRef(b, 0))
	checkSeq(t, m, drain(t, h.submit(t, &Request{Prompt: b, MaxTokens: 3, Sampling: greedy()}), 1)[0], b, 3, greedy())
	if s := h.s.Stats(); s.PrefixHitTokens != 12 {
		t.Fatalf("%d tokens from the cache after scoring b, want 12", s.PrefixHitTokens)
	}
}

// TestPromptLogprobsPick: on a Picker, a greedy scoring request without generated
// log-probabilities still scores its prompt from logits, and its tokens are picked.
func TestPromptLogprobsPick(t *testing.T) {
	m := &pickFake{fakeModel: newFake(t, 64, 4, 64, 8)}
	h := newHarnessOf(t, m, m.fakeModel, Config{MaxActive: 4, StepTokens: 6})
	h.run()
	p := prompt(30, 13)
	plain := h.submit(t, &Request{Prompt: prompt(31, 3), MaxTokens: 10, Sampling: greedy()})
	res := drainScored(t, h.submit(t, &Request{Prompt: p, MaxTokens: 5, Sampling: greedy(), PromptLogprobs: true}), 1)
	checkPromptEvents(t, res.prompt, m.promptRef(p, 0))
	checkSeq(t, m.fakeModel, res.seqs[0], p, 5, greedy())
	checkSeq(t, m.fakeModel, drain(t, plain, 1)[0], prompt(31, 3), 10, greedy())
	picked := 0
	for _, k := range m.picks {
		picked += k
	}
	if picked < 15 {
		t.Fatalf("%d rows picked, want the 15 generated tokens at least", picked)
	}
}

// TestPromptLogprobsCancel: a scoring request cancelled or timed out halfway through its prompt
// ends with the prompt events it had and releases its blocks (the harness checks the pool).
func TestPromptLogprobsCancel(t *testing.T) {
	m := newFake(t, 32, 4, 16, 2)
	h := newHarness(t, m, Config{})
	p := prompt(4, 20)
	st := h.submit(t, &Request{Prompt: p, MaxTokens: 5, Sampling: greedy(), PromptLogprobs: true})
	m.hook = func(call int) {
		if call == 3 {
			st.Cancel()
		}
	}
	h.run()
	res := drainScored(t, st, 1)
	if res.seqs[0].reason != ReasonCancelled || len(res.prompt) != 6 {
		t.Fatalf("cancelled after 3 steps of 2 rows: %d prompt events, reason %s", len(res.prompt), res.seqs[0].reason)
	}
	checkPromptEvents(t, res.prompt, m.promptRef(p, 0)[:6])
	// The context is cancelled during the request's first step, and that step waits until the
	// stream has seen it (context.AfterFunc runs on a goroutine of its own), so that the request
	// cannot finish first.
	ctx, cancel := context.WithCancel(context.Background())
	submitted := make(chan *Stream, 1)
	var once sync.Once
	m.hook = func(int) {
		once.Do(func() {
			st := <-submitted
			cancel()
			for st.cause.Load() == 0 {
				runtime.Gosched()
			}
		})
	}
	st, err := h.s.Submit(ctx, &Request{Prompt: p, Sampling: greedy(), PromptLogprobs: true})
	if err != nil {
		t.Fatal(err)
	}
	submitted <- st
	if res := drainScored(t, st, 1); res.seqs[0].reason != ReasonCancelled {
		t.Fatalf("context cancelled: %s", res.seqs[0].reason)
	}
}

// TestStepAllocs: a step of sequences decoding without prompt log-probabilities allocates
// nothing, after a scoring request has come and gone.
func TestStepAllocs(t *testing.T) {
	m := newFake(t, 128, 16, 64, 8)
	m.record = false
	h := newHarness(t, m, Config{})
	res := h.submit(t, &Request{Prompt: prompt(3, 40), Sampling: greedy(), TopLogprobs: 2, PromptLogprobs: true})
	var sts []*Stream
	for i := range 4 {
		sts = append(sts, h.submit(t, &Request{Prompt: prompt(int32(5+i), 6), MaxTokens: 400, Sampling: greedy(), IgnoreEOS: true, TopLogprobs: i % 2}))
	}
	sts = append(sts, res)
	now, cancel := context.WithCancel(context.Background())
	cancel()
	step := func() {
		h.s.loop.Step()
		for _, st := range sts {
			for {
				if _, err := st.Next(now); err != nil {
					break
				}
			}
		}
	}
	for range 10 {
		step()
	}
	if n := h.s.Stats().Active; n != 4 {
		t.Fatalf("%d sequences active, want the 4 decoding", n)
	}
	if a := testing.AllocsPerRun(100, step); a != 0 {
		t.Fatalf("%v allocations per decode step", a)
	}
}
