package sched_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/sched"
	"github.com/parleyhq/parley/runtime/sched/schedtest"
)

// oneByOne feeds prompt to a fresh context one token at a time and returns, for every token
// after the first, decode.Logprobs of the logits at the position before it.
func oneByOne(t *testing.T, e *models.LLM, prompt []int32, top int) []sched.Event {
	t.Helper()
	c, err := e.Model.NewContext(llama.ContextConfig{StepTokens: 1, MaxSeqs: 1, KVSlots: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seq := c.Pool().NewSeq(len(prompt))
	defer seq.Release()
	var bb kvcache.BatchBuilder
	lg := make([]float32, e.Model.Vocab)
	var evs []sched.Event
	for i, tok := range prompt[:len(prompt)-1] {
		bb.Reset()
		if err := seq.Reserve(1); err != nil {
			t.Fatal(err)
		}
		if err := bb.Add(seq, 1); err != nil {
			t.Fatal(err)
		}
		if err := c.Forward([]int32{tok}, bb.Batch(), []int32{0}, lg); err != nil {
			t.Fatal(err)
		}
		if err := seq.Advance(1); err != nil {
			t.Fatal(err)
		}
		ev := sched.Event{Prompt: true, Token: prompt[i+1]}
		ev.Logprob, ev.Top = decode.Logprobs(lg, prompt[i+1], top, nil)
		evs = append(evs, ev)
	}
	return evs
}

// TestPromptLogprobsMatchForward runs scoring requests on stories260K through the scheduler
// (steps of 8 tokens and 4 logit rows, beside greedy requests decoding, with the prefix cache on
// and holding the prompt) and checks that the prompt log-probabilities and alternatives are
// exactly those of a one-token-at-a-time forward over the same prompt (the Go backend gives a
// row the same arithmetic in any batch), fed a token a step beside others or four a step alone,
// that the generated tokens are schedtest.Generate's, and that MaxTokens 0 scores the prompt alone.
func TestPromptLogprobsMatchForward(t *testing.T) {
	e := openStories(t)
	p, err := e.Tokenizer.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside", true, false)
	if err != nil {
		t.Fatal(err)
	}
	others := []string{"The little dog", "One day, a big"}
	const top, maxTokens = 3, 12
	want := oneByOne(t, e, p, top)
	sp := decode.DefaultParams()
	sp.Temperature = 0
	generate := func(prompt []int32) []int32 {
		c, err := e.Model.NewContext(llama.ContextConfig{StepTokens: 8, MaxSeqs: 1, KVSlots: 128})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		res, err := schedtest.Generate(c, e.Text(), prompt, maxTokens, sp)
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens
	}

	c, err := e.Model.NewContext(llama.ContextConfig{StepTokens: 8, MaxSeqs: 4, KVSlots: 512, BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := sched.NewLlamaModel(c)
	var batches []int // tokens of each step; read after Close
	s, err := sched.New(m, e.Text(), sched.Config{MaxContext: m.Context(), PrefixCache: true,
		OnStep: func(_ time.Duration, _, tokens int) { batches = append(batches, tokens) }})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Run(context.Background()) }()
	read := func(st *sched.Stream) (prompt []sched.Event, gen []int32, reason decode.StopReason) {
		for ev := range st.Events() {
			switch {
			case ev.Prompt:
				if len(gen) > 0 || ev.Seq != 0 {
					t.Fatalf("prompt event %+v after %d generated tokens", ev, len(gen))
				}
				prompt = append(prompt, ev)
			case ev.Token >= 0:
				gen = append(gen, ev.Token)
			}
			if ev.Done {
				reason = ev.Reason
			}
		}
		return prompt, gen, reason
	}
	check := func(what string, got []sched.Event) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d prompt events, want %d", what, len(got), len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.Token != w.Token || g.Logprob != w.Logprob || !slices.Equal(g.Top, w.Top) {
				t.Errorf("%s: prompt token %d: %d %v %v, one by one %d %v %v", what, i+1, g.Token, g.Logprob, g.Top, w.Token, w.Logprob, w.Top)
			}
		}
	}
	// The prompt alone first, so that the cache holds its blocks.
	st, err := s.Submit(context.Background(), &sched.Request{Prompt: p, MaxTokens: maxTokens, Sampling: sp})
	if err != nil {
		t.Fatal(err)
	}
	read(st)
	hits := s.Stats().PrefixHitTokens
	// Scoring it beside two greedy requests decoding.
	var sts []*sched.Stream
	var ops [][]int32
	for _, o := range others {
		op, err := e.Tokenizer.Encode(o, true, false)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
		st, err := s.Submit(context.Background(), &sched.Request{Prompt: op, MaxTokens: maxTokens, Sampling: sp})
		if err != nil {
			t.Fatal(err)
		}
		sts = append(sts, st)
	}
	scoring, err := s.Submit(context.Background(), &sched.Request{Prompt: p, MaxTokens: maxTokens, Sampling: sp, TopLogprobs: top, PromptLogprobs: true})
	if err != nil {
		t.Fatal(err)
	}
	only, err := s.Submit(context.Background(), &sched.Request{Prompt: p, Sampling: sp, TopLogprobs: top, PromptLogprobs: true})
	if err != nil {
		t.Fatal(err)
	}
	got, gen, _ := read(scoring)
	check("scoring", got)
	if w := generate(p); !slices.Equal(gen, w) {
		t.Errorf("scoring request generated %v, reference %v", gen, w)
	}
	got, gen, reason := read(only)
	check("MaxTokens 0", got)
	if len(gen) != 0 || reason != decode.StopLength || only.Usage().CompletionTokens != 0 || only.Usage().PromptTokens != len(p) {
		t.Errorf("MaxTokens 0: generated %v, reason %s, usage %+v", gen, reason, only.Usage())
	}
	for i, st := range sts {
		_, g, _ := read(st)
		if w := generate(ops[i]); !slices.Equal(g, w) {
			t.Errorf("%q beside the scoring: %v, reference %v", others[i], g, w)
		}
	}
	// Alone, it is fed four tokens a step (the four rows): the same again.
	alone, err := s.Submit(context.Background(), &sched.Request{Prompt: p, Sampling: sp, TopLogprobs: top, PromptLogprobs: true})
	if err != nil {
		t.Fatal(err)
	}
	got, _, _ = read(alone)
	check("alone", got)
	if h := s.Stats().PrefixHitTokens; h != hits {
		t.Errorf("scoring took %d tokens from the prefix cache", h-hits)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if c.Pool().FreeBlocks() != c.Pool().Blocks() {
		t.Fatalf("%d of %d blocks free after Close", c.Pool().FreeBlocks(), c.Pool().Blocks())
	}
	var wantSteps []int
	for k := len(p); k > 0; k -= 4 {
		wantSteps = append(wantSteps, min(k, 4))
	}
	if last := batches[max(len(batches)-len(wantSteps), 0):]; !slices.Equal(last, wantSteps) {
		t.Errorf("scoring %d tokens alone: steps of %v tokens, want %v", len(p), last, wantSteps)
	}
}
