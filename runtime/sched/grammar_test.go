package sched

import (
	"errors"
	"regexp"
	"testing"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/decode/grammar"
)

// compileFake compiles GBNF src over the fake model's vocabulary, as a server would.
func compileFake(t *testing.T, s *Scheduler, src string) *grammar.Automaton {
	t.Helper()
	c, err := s.Grammars()
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Get("gbnf:"+src, func() (*grammar.Grammar, error) { return grammar.ParseGBNF(src) })
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestGrammarSequences runs several constrained requests of several sequences at once, greedy
// and sampled, with budgets that leave room and budgets that barely do: every sequence's text
// is in the grammar's language when it ends by end of generation, and complete even when it
// ends by its token limit, whenever the limit allows a complete text at all.
func TestGrammarSequences(t *testing.T) {
	m := newFake(t, 64, 4, 32, 16)
	h := newHarness(t, m, Config{})
	h.run()
	const src = `root ::= "q" [a-y]{0,30} ("z" | "xx")`
	re := regexp.MustCompile(`^q[a-y]{0,30}(z|xx)$`)
	a := compileFake(t, h.s, src)
	if c, _ := h.s.Grammars(); c.Len() != 1 || compileFake(t, h.s, src) != a {
		t.Fatal("the grammar cache compiled one grammar twice")
	}
	type run struct {
		st        *Stream
		n, max    int
		sampling  decode.Params
		ignoreEOS bool
	}
	var runs []run
	for i, max := range []int{2, 3, 5, 40, 60} {
		for _, temp := range []float32{0, 1.5} {
			p := decode.DefaultParams()
			p.Temperature, p.Seed = temp, uint64(i)
			r := &Request{Prompt: prompt(int32(1+i), 5), MaxTokens: max, Sampling: p, N: 3, Grammar: a, Logprobs: i%2 == 0, IgnoreEOS: max == 60}
			runs = append(runs, run{h.submit(t, r), 3, max, p, r.IgnoreEOS})
		}
	}
	for _, r := range runs {
		for i, got := range drain(t, r.st, r.n) {
			if got.err != nil {
				t.Fatalf("max %d seq %d: %v", r.max, i, got.err)
			}
			switch got.reason {
			case decode.StopEOS, decode.StopLength:
			default:
				t.Fatalf("max %d seq %d: reason %s", r.max, i, got.reason)
			}
			if !re.MatchString(got.text) {
				t.Errorf("max %d temp %v seq %d: %q (%s) is not a complete sentence of %s", r.max, r.sampling.Temperature, i, got.text, got.reason, src)
			}
		}
	}
}

// TestGrammarVocabMismatch refuses an automaton compiled over another vocabulary.
func TestGrammarVocabMismatch(t *testing.T) {
	m := newFake(t, 16, 4, 32, 4)
	h := newHarness(t, m, Config{})
	v, err := grammar.NewVocab([][]byte{[]byte("a"), []byte("b")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := grammar.ParseGBNF(`root ::= "a"`)
	a, err := grammar.NewAutomaton(g, v, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.s.Submit(nil, &Request{Prompt: []int32{1}, MaxTokens: 4, Sampling: greedy(), Grammar: a}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Submit with another vocabulary's grammar: %v, want ErrInvalid", err)
	}
}
