package grammar

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// allowedIDs lists the tokens a mask allows, into dst.
func allowedIDs(mask []uint64, vocab int, dst []int32) []int32 {
	dst = dst[:0]
	for w, bits := range mask {
		for bits != 0 {
			b := 0
			for bits&(1<<b) == 0 {
				b++
			}
			bits &^= 1 << b
			if id := w*64 + b; id < vocab {
				dst = append(dst, int32(id))
			}
		}
	}
	return dst
}

// structural reports whether a token starts with a byte that moves JSON along (punctuation or a
// digit), so that a random walk that favours them finishes.
func structural(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	switch c := p[0]; {
	case c == '"' || c == ',' || c == '}' || c == ']' || c == ':' || c == '{' || c == '[':
		return true
	case c >= '0' && c <= '9' || c == '-':
		return true
	}
	return false
}

// generation is the outcome of one random constrained generation.
type generation struct {
	text     []byte
	tokens   []int32
	complete bool // ended with an end-of-generation token
}

// randomGenerate drives m with a random choice among the allowed tokens at every step (half of
// the time among the structural ones, and the end-of-generation token as soon as it is
// allowed, after a few steps) until it ends or maxTokens pass. Every step it checks, for a few
// random tokens, that the mask agrees with Allowed, and that a token outside the mask is
// rejected by Accept without moving the matcher.
func randomGenerate(t *testing.T, m *Matcher, v *Vocab, r *rand.Rand, maxTokens int) generation {
	t.Helper()
	var g generation
	var ids, pref []int32
	for step := 0; step < maxTokens; step++ {
		mask, err := m.Mask()
		if err != nil {
			t.Fatalf("step %d after %q: %v", step, g.text, err)
		}
		ids = allowedIDs(mask, v.Size(), ids)
		if len(ids) == 0 {
			t.Fatalf("step %d: empty mask without error", step)
		}
		for k := 0; k < 4; k++ {
			id := int32(r.IntN(v.Size()))
			in := mask[id>>6]>>(uint(id)&63)&1 != 0
			if in != m.Allowed(id) {
				t.Fatalf("step %d after %q: token %d (%q) mask %v, Allowed %v", step, g.text, id, v.Piece(id), in, !in)
			}
			if !in {
				c := m.Clone()
				if err := c.Accept(id); !errors.Is(err, ErrRejected) {
					t.Fatalf("step %d after %q: token %d (%q) outside the mask accepted (err %v)", step, g.text, id, v.Piece(id), err)
				}
			}
		}
		var id int32 = -1
		if m.Complete() && (step > 4 || r.IntN(2) == 0) {
			for _, e := range v.eog {
				if mask[e>>6]>>(uint(e)&63)&1 != 0 {
					id = e
				}
			}
		}
		if id < 0 {
			pool := ids
			if r.IntN(2) == 0 || step > maxTokens/2 {
				pref = pref[:0]
				for _, x := range ids {
					if structural(v.Piece(x)) {
						pref = append(pref, x)
					}
				}
				if len(pref) > 0 {
					pool = pref
				}
			}
			id = pool[r.IntN(len(pool))]
		}
		if err := m.Accept(id); err != nil {
			t.Fatalf("step %d after %q: accepting allowed token %d (%q): %v", step, g.text, id, v.Piece(id), err)
		}
		g.tokens = append(g.tokens, id)
		if m.Ended() {
			g.complete = true
			return g
		}
		g.text = append(g.text, v.Piece(id)...)
	}
	return g
}
