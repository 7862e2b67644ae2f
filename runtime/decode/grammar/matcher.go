package grammar

import "fmt"

// Matcher is one sequence's place in an Automaton. Build one per sequence with
// Automaton.NewMatcher, or Clone one (for n > 1 or beam search: a Matcher is a state number and
// a pointer, so a clone costs one small allocation). Mask, Accept and Complete allocate nothing
// once the states they reach have been determinised. A Matcher is not safe for concurrent use;
// distinct Matchers of one Automaton are.
type Matcher struct {
	a     *Automaton
	state int32
	ended bool     // an end-of-generation token was accepted
	buf   []uint64 // mask storage when the Automaton's cache is full
}

// NewMatcher returns a Matcher at the start of the grammar.
func (a *Automaton) NewMatcher() *Matcher { return &Matcher{a: a} }

// Clone returns an independent copy of m at the same place.
func (m *Matcher) Clone() *Matcher { return &Matcher{a: m.a, state: m.state, ended: m.ended} }

// CopyFrom moves m to o's place (o must share m's Automaton), reusing m's storage.
func (m *Matcher) CopyFrom(o *Matcher) error {
	if o.a != m.a {
		return fmt.Errorf("grammar: CopyFrom a Matcher of another Automaton")
	}
	m.state, m.ended = o.state, o.ended
	return nil
}

// Reset returns m to the start of the grammar.
func (m *Matcher) Reset() { m.state, m.ended = 0, false }

// Complete reports whether the text so far is a sentence of the grammar, so that an
// end-of-generation token is allowed.
func (m *Matcher) Complete() bool {
	m.a.mu.Lock()
	defer m.a.mu.Unlock()
	return m.a.complete[m.state]
}

// Ended reports whether an end-of-generation token has been accepted.
func (m *Matcher) Ended() bool { return m.ended }

// Mask returns the tokens allowed next as a bit set over the vocabulary: token id is allowed
// when bit id%64 of word id/64 is set. End-of-generation tokens are allowed exactly when the
// grammar is complete. The slice is read-only and stays valid until m's next call. When no
// token is allowed it returns ErrDeadEnd (never an empty mask); after an end-of-generation
// token, ErrFinished.
func (m *Matcher) Mask() ([]uint64, error) {
	if m.ended {
		return nil, ErrFinished
	}
	a := m.a
	a.mu.Lock()
	defer a.mu.Unlock()
	mask, buf, err := a.cachedMask(m.state, m.buf)
	m.buf = buf
	return mask, err
}

// MinBytes is the fewest bytes of text that complete the grammar from here: 0 when Complete,
// -1 when no finite text does (or after an end-of-generation token). A caller that must finish
// within a number of tokens steers by it (Fits, MaskWithin): with a token for every byte value,
// as byte-fallback and byte-level vocabularies have, n bytes take at most n tokens.
func (m *Matcher) MinBytes() int {
	if m.ended {
		return -1
	}
	m.a.mu.Lock()
	defer m.a.mu.Unlock()
	if n := m.a.minBytes[m.state]; n < infBytes {
		return int(n)
	}
	return -1
}

// Fits reports whether token id may come next and leaves a text that n more bytes can complete
// (an end-of-generation token: whether the grammar is complete, whatever n).
func (m *Matcher) Fits(id int32, n int) bool {
	if m.ended {
		return false
	}
	a := m.a
	if id < 0 || int(id) >= a.v.size {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.v.IsEOG(id) {
		return a.complete[m.state]
	}
	p := a.v.pieces[id]
	if len(p) == 0 {
		return false
	}
	s, ok := a.walkBytes(m.state, p)
	return ok && int64(a.minBytes[s]) <= int64(n)
}

// MaskWithin is Mask restricted to the tokens after which n more bytes can complete the
// grammar (end-of-generation tokens when it is complete, whatever n; n below 0 leaves only
// them), for a sequence that must end soon.
// It is computed on every call (it walks the whole vocabulary), into the Matcher's own
// storage: the slice stays valid until m's next call. ErrDeadEnd when no token qualifies.
func (m *Matcher) MaskWithin(n int) ([]uint64, error) {
	if m.ended {
		return nil, ErrFinished
	}
	a := m.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if words := a.v.maskWords(); len(m.buf) < words {
		m.buf = make([]uint64, words)
	}
	any, err := a.mask(m.state, m.buf[:a.v.maskWords()], int32(max(min(n, infBytes-1), -1)))
	if err != nil {
		return nil, err
	}
	if !any {
		return nil, fmt.Errorf("%w: no token leaves a text that %d more bytes complete", ErrDeadEnd, n)
	}
	return m.buf[:a.v.maskWords()], nil
}

// Allowed reports whether token id may come next (the bit Mask would set), without computing
// the whole mask.
func (m *Matcher) Allowed(id int32) bool {
	if m.ended {
		return false
	}
	a := m.a
	if id < 0 || int(id) >= a.v.size {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.v.IsEOG(id) {
		return a.complete[m.state]
	}
	p := a.v.pieces[id]
	if len(p) == 0 {
		return false
	}
	_, ok := a.walkBytes(m.state, p)
	return ok
}

// Accept advances m by token id. A token the grammar does not allow here is ErrRejected, and
// m is left unchanged. An end-of-generation token is accepted when the grammar is complete and
// ends the Matcher.
func (m *Matcher) Accept(id int32) error {
	if m.ended {
		return ErrFinished
	}
	a := m.a
	if id < 0 || int(id) >= a.v.size {
		return fmt.Errorf("grammar: token %d outside vocabulary [0, %d)", id, a.v.size)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.v.IsEOG(id) {
		if !a.complete[m.state] {
			return fmt.Errorf("%w: end of generation (token %d) before the grammar is complete", ErrRejected, id)
		}
		m.ended = true
		return nil
	}
	p := a.v.pieces[id]
	if len(p) == 0 {
		return fmt.Errorf("%w: token %d prints no text", ErrRejected, id)
	}
	s, ok := a.walkBytes(m.state, p)
	if !ok {
		if s == stError {
			return fmt.Errorf("%w: a prefix parses more than %d ways", ErrAmbiguous, MaxStacks)
		}
		return fmt.Errorf("%w: token %d (%q)", ErrRejected, id, p)
	}
	m.state = s
	return nil
}

// AcceptBytes advances m by text that did not come from one token (a forced prefix, for
// instance); like Accept it leaves m unchanged on error.
func (m *Matcher) AcceptBytes(text []byte) error {
	if m.ended {
		return ErrFinished
	}
	a := m.a
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.walkBytes(m.state, text)
	if !ok {
		if s == stError {
			return fmt.Errorf("%w: a prefix parses more than %d ways", ErrAmbiguous, MaxStacks)
		}
		return fmt.Errorf("%w: text %q", ErrRejected, text)
	}
	m.state = s
	return nil
}

// walkBytes runs the DFA over p from s; ok is false (and the state stDead or stError) if p
// leaves the grammar.
func (a *Automaton) walkBytes(s int32, p []byte) (int32, bool) {
	for _, b := range p {
		if s = a.next(s, a.cls[b]); s < 0 {
			return s, false
		}
	}
	return s, true
}
