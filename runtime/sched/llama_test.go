package sched_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/backend/backendtest"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/sched"
	"github.com/parleyhq/parley/runtime/sched/schedtest"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestMatchesReference runs four greedy requests at once through the scheduler on stories260K and
// checks that each produces exactly the tokens and text schedtest.Generate produces for its prompt
// alone. The step budget (8 tokens) forces the prompts to be chunked and mixed with decode tokens.
func TestMatchesReference(t *testing.T) {
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
		c, err := e.Model.NewContext(llama.ContextConfig{StepTokens: 8, MaxSeqs: 1, KVSlots: 128})
		if err != nil {
			t.Fatal(err)
		}
		sp := decode.DefaultParams()
		sp.Temperature = 0
		res, err := schedtest.Generate(c, e.Text(), p, maxTokens, sp)
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
	s, err := sched.New(m, e.Text(), sched.Config{MaxContext: m.Context()})
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
	// Three sequences sharing the first prompt's whole blocks: each must match the reference too.
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
			t.Errorf("sequence %d of 3: %v, reference %v", i, g, wants[0].tokens)
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
			t.Errorf("prompt %q:\n scheduler %v %q (%s)\n reference %v %q (%s)", texts[i], toks, text, reason, wants[i].tokens, wants[i].text, wants[i].reason)
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

// TestPrefixMatchesReference: with the prefix cache on, a prompt sharing its first 20 tokens with an
// earlier one (and the earlier one again, alongside it) takes those tokens' KV blocks from the
// cache and still produces exactly schedtest.Generate's tokens and text.
func TestPrefixMatchesReference(t *testing.T) {
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
		c, err := e.Model.NewContext(llama.ContextConfig{StepTokens: 8, MaxSeqs: 1, KVSlots: 128})
		if err != nil {
			t.Fatal(err)
		}
		res, err := schedtest.Generate(c, e.Text(), p, maxTokens, sp)
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
	s, err := sched.New(m, e.Text(), sched.Config{MaxContext: m.Context(), PrefixCache: true})
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
				t.Errorf("prompt %d:\n scheduler %v %q\n reference %v %q", which[i], got.tokens, got.text, w.tokens, w.text)
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
func openStories(t *testing.T) *models.LLM {
	t.Helper()
	path := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	be, _, err := backend.New("go", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	e, err := models.OpenLLM(path, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// plain hides a backend's optional interfaces (backend.Argmaxer and backend.Drawer among them).
type plain struct{ backend.Backend }

// synthFile writes a small random-weight model with a 512-token vocabulary.
func synthFile(t *testing.T) string {
	t.Helper()
	w, err := llama.Synth(llama.Shape{Name: "tiny", Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 96, Ctx: 128, Vocab: 512}, tensor.Q8_0, 4)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteTo(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// generateAlone runs req alone through a scheduler over the model at path on be, with the
// context `parley generate` gives it (128 positions, F16 cache), and returns its tokens.
func generateAlone(t *testing.T, path string, be backend.Backend, req sched.Request) []int32 {
	t.Helper()
	m, err := models.OpenLLM(path, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := m.Model.NewContext(llama.ContextConfig{StepTokens: 128, MaxSeqs: 1, KVSlots: 128, KVType: tensor.F16})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := sched.New(sched.NewLlamaModel(c), m.Text(), sched.Config{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Run(context.Background()) }()
	st, err := s.Submit(context.Background(), &req)
	if err != nil {
		t.Fatal(err)
	}
	var toks []int32
	for ev := range st.Events() {
		if ev.Err != nil {
			t.Fatal(ev.Err)
		}
		if ev.Token >= 0 {
			toks = append(toks, ev.Token)
		}
	}
	s.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return toks
}

// TestChoosesWhereLogitsAre: a greedy sequence alone takes its tokens from a backend that finds
// the argmax where the logits are (the same tokens as from the logits), and a sampling one from
// a backend that draws there (backend.Draw's rule, from the sampler's random stream, one draw a
// token); with log-probabilities it keeps the logits.
func TestChoosesWhereLogitsAre(t *testing.T) {
	path := synthFile(t)
	newGo := func() backend.Backend {
		be, _, err := backend.New("go", backend.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		return be
	}
	prompt := []int32{1, 300, 301, 302}
	greedy := decode.DefaultParams()
	greedy.Temperature = 0
	req := sched.Request{Prompt: prompt, MaxTokens: 12, Sampling: greedy, IgnoreEOS: true}
	if a, b := generateAlone(t, path, newGo(), req), generateAlone(t, path, plain{newGo()}, req); !slices.Equal(a, b) {
		t.Fatalf("greedy: %v with the backend's argmax, %v from the logits", a, b)
	}

	sp := decode.DefaultParams()
	sp.Seed = 11
	req.Sampling = sp
	d := &backendtest.Drawing{Backend: newGo()}
	got := generateAlone(t, path, d, req)
	if d.Calls != len(got) {
		t.Errorf("%d draws by the backend for %d tokens", d.Calls, len(got))
	}
	// The reference: the same steps, drawn here by the host rule.
	want := func() []int32 {
		be := newGo()
		m, err := models.OpenLLM(path, be)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		c, err := m.Model.NewContext(llama.ContextConfig{StepTokens: 128, MaxSeqs: 1, KVSlots: 128, KVType: tensor.F16})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		smp, err := decode.NewSampler(sp, m.Model.Vocab)
		if err != nil {
			t.Fatal(err)
		}
		dr, _ := smp.Drawable()
		seq := c.Pool().NewSeq(128)
		var bb kvcache.BatchBuilder
		lg := make([]float32, m.Model.Vocab)
		id := []int32{0}
		var gen []int32
		for toks := prompt; len(gen) < 12; toks = id {
			bb.Reset()
			if err := seq.Reserve(len(toks)); err != nil {
				t.Fatal(err)
			}
			if err := bb.Add(seq, len(toks)); err != nil {
				t.Fatal(err)
			}
			if err := c.Forward(toks, bb.Batch(), []int32{int32(len(toks) - 1)}, lg); err != nil {
				t.Fatal(err)
			}
			if err := seq.Advance(len(toks)); err != nil {
				t.Fatal(err)
			}
			dr.Random = smp.NextRandom()
			if err := backend.DrawRows(lg, m.Model.Vocab, []backend.Draw{dr}, id); err != nil {
				t.Fatal(err)
			}
			gen = append(gen, id[0])
		}
		return gen
	}()
	if !slices.Equal(got, want) {
		t.Fatalf("drawn by the backend: %v, want %v", got, want)
	}

	req.TopLogprobs = 2
	calls := d.Calls
	generateAlone(t, path, d, req)
	if d.Calls != calls {
		t.Errorf("with log-probabilities the backend drew %d tokens, want none", d.Calls-calls)
	}
}
