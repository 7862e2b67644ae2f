package grammar

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// minCompletion is the reference for MinBytes: the length of the shortest completion, found by
// breadth-first search over bytes on the byte vocabulary (every state that a text reaches is
// distinct, so this is exact for the small grammars below).
func minCompletion(t *testing.T, a *Automaton, prefix string) int {
	t.Helper()
	m := a.NewMatcher()
	if err := m.AcceptBytes([]byte(prefix)); err != nil {
		t.Fatal(err)
	}
	type node struct {
		m *Matcher
		d int
	}
	seen := map[int32]bool{m.state: true}
	queue := []node{{m, 0}}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if n.m.Complete() {
			return n.d
		}
		for b := range 256 {
			c := n.m.Clone()
			if c.AcceptBytes([]byte{byte(b)}) == nil && !seen[c.state] {
				seen[c.state] = true
				queue = append(queue, node{c, n.d + 1})
			}
		}
	}
	return -1
}

// TestMinBytes checks MinBytes against a search for the shortest completion.
func TestMinBytes(t *testing.T) {
	v := byteVocab(t)
	cases := []struct {
		src      string
		prefixes []string
	}{
		{`root ::= "abc" | "de"`, []string{"", "a", "ab", "d", "de"}},
		{`root ::= "(" root ")" | "x"`, []string{"", "(", "((", "((x", "((x)"}},
		{`root ::= [0-9]{3,5} "."`, []string{"", "1", "12", "123", "1234", "12345"}},
		{"root ::= a b\na ::= \"aa\" | \"a\" a\nb ::= \"bbb\"? \"c\"", []string{"", "a", "aa", "aaab", "aab"}},
	}
	for _, c := range cases {
		g, err := ParseGBNF(c.src)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := NewAutomaton(g, v, 0)
		for _, p := range c.prefixes {
			m := a.NewMatcher()
			if err := m.AcceptBytes([]byte(p)); err != nil {
				t.Fatalf("%s: %q: %v", c.src, p, err)
			}
			if got, want := m.MinBytes(), minCompletion(t, a, p); got != want {
				t.Errorf("%s after %q: MinBytes %d, shortest completion %d", c.src, p, got, want)
			}
		}
	}
	g, _ := FromJSONSchema([]byte(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a","b"]}`))
	a, _ := NewAutomaton(g, v, 0)
	if got := a.NewMatcher().MinBytes(); got != len(`{"a":0,"b":""}`) {
		t.Errorf("schema: MinBytes %d, want %d", got, len(`{"a":0,"b":""}`))
	}
}

// TestMaskWithin checks, over a real vocabulary and random schemas, that MaskWithin is the part
// of Mask that Fits allows, and that a random walk steered by it (as a scheduler steers a
// sequence near its token limit: each token must leave a text that the tokens left, less one
// for the end of generation, can complete) always ends complete within its budget.
func TestMaskWithin(t *testing.T) {
	v := sharedVocab(t, vocabLlama)
	r := rand.New(rand.NewPCG(3, 9))
	n := 60
	if testing.Short() || raceEnabled {
		n = 12
	}
	var ids []int32
	for i := 0; i < n; i++ {
		schema := randomSchema(r)
		g, err := FromJSONSchema(schema)
		if err != nil {
			t.Fatal(err)
		}
		val := validator(t, schema)
		a, _ := NewAutomaton(g, v, 0)
		m := a.NewMatcher()
		need := m.MinBytes()
		if need < 0 {
			continue
		}
		budget := need + 1 + r.IntN(12) // tokens, the end of generation included
		var text []byte
		for left := budget; ; left-- {
			if left == 0 {
				t.Fatalf("schema %s: budget of %d tokens spent at %q", schema, budget, text)
			}
			full, err := m.Mask()
			if err != nil {
				t.Fatal(err)
			}
			full = append([]uint64(nil), full...)
			within, err := m.MaskWithin(left - 2)
			if err != nil {
				t.Fatalf("schema %s after %q (%d tokens left, %d bytes needed): %v", schema, text, left, m.MinBytes(), err)
			}
			ids = allowedIDs(within, v.Size(), ids)
			for k := 0; k < 64; k++ {
				id := int32(r.IntN(v.Size()))
				in := within[id>>6]>>(uint(id)&63)&1 != 0
				if in != (full[id>>6]>>(uint(id)&63)&1 != 0 && m.Fits(id, left-2)) {
					t.Fatalf("schema %s after %q: token %d (%q) in MaskWithin %v, Fits %v", schema, text, id, v.Piece(id), in, m.Fits(id, left-2))
				}
			}
			id := ids[r.IntN(len(ids))]
			if err := m.Accept(id); err != nil {
				t.Fatal(err)
			}
			if m.Ended() {
				break
			}
			text = append(text, v.Piece(id)...)
		}
		checkOutput(t, a, val, schema, text)
	}
}

// TestMaskMatchesAllowed compares whole masks with Allowed, token by token, along random walks
// through string-heavy schemas: the masks of states inside strings start from the Vocab's
// loop masks and skip subtrees, which Allowed never does.
func TestMaskMatchesAllowed(t *testing.T) {
	v := sharedVocab(t, vocabLlama)
	schemas := []string{
		`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array","items":{"type":"string"}}},"required":["a","b"]}`,
		`{"type":"string","pattern":"^[a-z ]+$"}`,
		`{"type":"string","maxLength":5}`,
		benchSchema,
	}
	r := rand.New(rand.NewPCG(5, 5))
	steps := 40
	if testing.Short() || raceEnabled {
		steps = 8
	}
	for _, schema := range schemas {
		g, err := FromJSONSchema([]byte(schema))
		if err != nil {
			t.Fatal(err)
		}
		a, _ := NewAutomaton(g, v, 0)
		m := a.NewMatcher()
		var ids []int32
		var text []byte
		for step := 0; step < steps && !m.Ended(); step++ {
			mask, err := m.Mask()
			if errors.Is(err, ErrFinished) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for id := int32(0); int(id) < v.Size(); id++ {
				if in := mask[id>>6]>>(uint(id)&63)&1 != 0; in != m.Allowed(id) {
					t.Fatalf("%s after %q: token %d (%q): mask %v, Allowed %v", schema, text, id, v.Piece(id), in, !in)
				}
			}
			ids = allowedIDs(mask, v.Size(), ids)
			id := ids[r.IntN(len(ids))]
			if v.IsEOG(id) && step < steps/2 && len(ids) > 1 {
				continue // keep going a while
			}
			if err := m.Accept(id); err != nil {
				t.Fatal(err)
			}
			text = append(text, v.Piece(id)...)
		}
	}
}

// TestCache checks that a Cache returns one Automaton per key, keeps the most recently used,
// and caches no failure.
func TestCache(t *testing.T) {
	v := byteVocab(t)
	c, err := NewCache(v, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	builds := 0
	build := func(src string) func() (*Grammar, error) {
		return func() (*Grammar, error) {
			builds++
			return ParseGBNF(src)
		}
	}
	a1, _ := c.Get("x", build(`root ::= "x"`))
	a2, _ := c.Get("x", build(`root ::= "x"`))
	if a1 != a2 || builds != 1 {
		t.Fatalf("same key: %p %p after %d builds", a1, a2, builds)
	}
	c.Get("y", build(`root ::= "y"`))
	c.Get("x", build(`root ::= "x"`)) // x is now the most recent
	c.Get("z", build(`root ::= "z"`)) // evicts y
	if c.Len() != 2 || builds != 3 {
		t.Fatalf("%d cached after %d builds", c.Len(), builds)
	}
	if a, _ := c.Get("x", build(`root ::= "x"`)); a != a1 || builds != 3 {
		t.Fatal("the most recently used automaton was evicted")
	}
	c.Get("y", build(`root ::= "y"`))
	if builds != 4 {
		t.Fatal("an evicted automaton was still cached")
	}
	if _, err := c.Get("bad", build(`root ::= undefined`)); err == nil {
		t.Fatal("a bad grammar built")
	}
	if _, err := c.Get("bad", build(`root ::= undefined`)); err == nil || builds != 6 {
		t.Fatalf("a failed build was cached (%d builds, %v)", builds, err)
	}
}
