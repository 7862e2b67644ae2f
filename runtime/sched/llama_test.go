package sched_test

import (
	"context"
	"slices"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/engine"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/sched"
)

// TestMatchesEngine runs four greedy requests at once through the scheduler on stories260K and
// checks that each produces exactly the tokens and text engine.Generate produces for its prompt
// alone. The step budget (8 tokens) forces the prompts to be chunked and mixed with decode tokens.
func TestMatchesEngine(t *testing.T) {
	e := openStories(t)
	texts := []string{"Once upon a time", "The little dog", "Lily wanted to play with her friend", "One day, a big"}
	const maxTokens = 24
	type want struct {
		tokens []int32
		text   string
		reason decode.StopReason
	}
	prompts := make([][]int32, len(texts))
	wants := make([]want, len(texts))
	for i, s := range texts {
		p, err := e.Tokenizer.Encode(s, true, false)
		if err != nil {
			t.Fatal(err)
		}
		prompts[i] = p
		c, err := e.NewContext(engine.ContextOptions{Ctx: 128, Chunk: 8})
		if err != nil {
			t.Fatal(err)
		}
		sp := decode.DefaultParams()
		sp.Temperature = 0
		res, err := e.Generate(context.Background(), c, engine.Request{Prompt: p, MaxTokens: maxTokens, Sampling: sp}, nil)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		wants[i] = want{res.Tokens, res.Text, res.Reason}
		t.Logf("%q -> %q (%s)", s, res.Text, res.Reason)
	}

	c, err := e.Model.NewContext(llama.ContextConfig{StepTokens: 8, MaxSeqs: 4, KVSlots: 256, BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := sched.NewLlamaModel(c)
	s, err := sched.New(m, sched.NewTokenizerText(e.Tokenizer), sched.Config{MaxContext: m.Context()})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	var streams []*sched.Stream
	for _, p := range prompts {
		sp := decode.DefaultParams()
		sp.Temperature = 0
		st, err := s.Submit(context.Background(), &sched.Request{Prompt: p, MaxTokens: maxTokens, Sampling: sp})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	// Three sequences sharing the first prompt's whole blocks: each must match the engine too.
	sp := decode.DefaultParams()
	sp.Temperature = 0
	shared, err := s.Submit(context.Background(), &sched.Request{Prompt: prompts[0], MaxTokens: maxTokens, Sampling: sp, N: 3})
	if err != nil {
		t.Fatal(err)
	}
	go func() { errc <- s.Run(context.Background()) }()
	got := make([][]int32, 3)
	for ev := range shared.Events() {
		if ev.Token >= 0 {
			got[ev.Seq] = append(got[ev.Seq], ev.Token)
		}
	}
	for i, g := range got {
		if !slices.Equal(g, wants[0].tokens) {
			t.Errorf("sequence %d of 3: %v, engine %v", i, g, wants[0].tokens)
		}
	}
	for i, st := range streams {
		var toks []int32
		var text []byte
		var reason decode.StopReason
		for ev := range st.Events() {
			if ev.Token >= 0 {
				toks = append(toks, ev.Token)
			}
			text = append(text, ev.Text...)
			if ev.Done {
				reason = ev.Reason
			}
		}
		if !slices.Equal(toks, wants[i].tokens) || string(text) != wants[i].text || reason != wants[i].reason {
			t.Errorf("prompt %q:\n scheduler %v %q (%s)\n engine    %v %q (%s)", texts[i], toks, text, reason, wants[i].tokens, wants[i].text, wants[i].reason)
		}
	}
	if st := s.Stats(); st.GeneratedTokens == 0 || st.Steps == 0 {
		t.Errorf("stats %+v", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if c.Pool().FreeBlocks() != c.Pool().Blocks() {
		t.Fatalf("%d of %d blocks free", c.Pool().FreeBlocks(), c.Pool().Blocks())
	}
}

// TestPrefixMatchesEngine: with the prefix cache on, a prompt sharing its first 20 tokens with an
// earlier one (and the earlier one again, alongside it) takes those tokens' KV blocks from the
// cache and still produces exactly engine.Generate's tokens and text.
func TestPrefixMatchesEngine(t *testing.T) {
	e := openStories(t)
	a, err := e.Tokenizer.Encode("Once upon a time, there was a little girl named Lily. She loved to play outside", true, false)
	if err != nil {
		t.Fatal(err)
	}
	tail, err := e.Tokenizer.Encode("The big dog ran to the park and saw a cat", false, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) < 24 || len(tail) < 4 {
		t.Fatalf("prompts of %d and %d tokens, want at least 24 and 4", len(a), len(tail))
	}
	b := append(slices.Clone(a[:20]), tail...)
	const maxTokens = 20
	sp := decode.DefaultParams()
	sp.Temperature = 0
	type result struct {
		tokens []int32
		text   string
	}
	prompts := [][]int32{a, b}
	var want []result
	for _, p := range prompts {
		c, err := e.NewContext(engine.ContextOptions{Ctx: 128, Chunk: 8})
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.Generate(context.Background(), c, engine.Request{Prompt: p, MaxTokens: maxTokens, Sampling: sp}, nil)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, result{res.Tokens, res.Text})
	}

	c, err := e.Model.NewContext(llama.ContextConfig{StepTokens: 8, MaxSeqs: 4, KVSlots: 256, BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := sched.NewLlamaModel(c)
	s, err := sched.New(m, sched.NewTokenizerText(e.Tokenizer), sched.Config{MaxContext: m.Context(), PrefixCache: true})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Run(context.Background()) }()
	run := func(which ...int) {
		t.Helper()
		var sts []*sched.Stream
		for _, k := range which {
			st, err := s.Submit(context.Background(), &sched.Request{Prompt: prompts[k], MaxTokens: maxTokens, Sampling: sp})
			if err != nil {
				t.Fatal(err)
			}
			sts = append(sts, st)
		}
		for i, st := range sts {
			var got result
			for ev := range st.Events() {
				if ev.Token >= 0 {
					got.tokens = append(got.tokens, ev.Token)
				}
				got.text += string(ev.Text)
			}
			w := want[which[i]]
			if !slices.Equal(got.tokens, w.tokens) || got.text != w.text {
				t.Errorf("prompt %d:\n scheduler %v %q\n engine    %v %q", which[i], got.tokens, got.text, w.tokens, w.text)
			}
		}
	}
	run(0)
	run(1, 0)
	// b shares 20 tokens (five blocks of 4); a again shares all its whole blocks but the last token's.
	if st, wantHit := s.Stats(), uint64(20+(len(a)-1)/4*4); st.PrefixHitTokens != wantHit {
		t.Errorf("%d prompt tokens from the cache, want %d", st.PrefixHitTokens, wantHit)
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
}

// openStories opens the shared stories260K F32 model on a one-thread pure-Go backend, both closed
// when t ends.
func openStories(t *testing.T) *engine.Engine {
	t.Helper()
	path := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	be, _, err := backend.New("go", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	e, err := engine.Open(path, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}
