package grammar

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"unsafe"
)

// Limits of one Automaton.
const (
	// MaxStacks is the most parser stacks one state may hold: a grammar so ambiguous that a
	// prefix parses more ways than this is refused (ErrAmbiguous) rather than slowing every
	// step down.
	MaxStacks = 4096
	// DefaultMaskCache is how many bytes of token masks an Automaton keeps by default.
	DefaultMaskCache = 64 << 20
)

// Errors the matcher returns. Each is wrapped with detail; test with errors.Is.
var (
	// ErrDeadEnd: no token of the vocabulary can continue the text, and the grammar is not
	// complete (the grammar needs bytes no token spells, or the vocabulary has no
	// end-of-generation token).
	ErrDeadEnd = errors.New("grammar: no token can continue the text")
	// ErrRejected: a token passed to Accept is not allowed by the grammar here.
	ErrRejected = errors.New("grammar: token not allowed")
	// ErrAmbiguous: a prefix parses more than MaxStacks ways.
	ErrAmbiguous = errors.New("grammar: too ambiguous")
	// ErrFinished: a token was accepted after end of generation.
	ErrFinished = errors.New("grammar: generation already ended")
)

// Transition table entries that are not states.
const (
	stUnknown = -2 // not computed yet
	stDead    = -1 // no stack survives
	stError   = -3 // more than MaxStacks stacks
)

// Automaton is a Grammar compiled over a Vocab: a DFA built on demand whose states are sets of
// parser stacks, with each state's transitions (by byte class) and token mask cached as they
// are first needed. It is safe for concurrent use; a mutex guards the caches, held for one
// Mask or Accept at a time.
type Automaton struct {
	g *Grammar
	v *Vocab

	ncls int
	cls  [256]uint8 // byte → class: bytes of one class are in exactly the same byte sets
	rep  []byte     // [ncls] a byte of each class
	// clsSet is the bytes of each class.
	clsSet []byteSet // [ncls]

	mu sync.Mutex

	// Interned stack nodes: node n is position nodePos[n] on top of stack nodeParent[n].
	// Node 0 is the empty stack.
	nodePos    []int32
	nodeParent []int32
	nodeMin    []int32 // fewest bytes that empty the stack
	nodeIndex  map[uint64]int32

	// States: state s is the sorted set of stacks stacks[stateOff[s]:stateOff[s+1]].
	stateOff   []int32
	stacks     []int32
	stateIndex map[string]int32
	trans      []int32   // [states*ncls] next state, or stUnknown, stDead, stError
	complete   []bool    // [states] holds the empty stack
	minBytes   []int32   // [states] fewest bytes to a complete state (infBytes: none)
	rowDone    []bool    // [states] every transition computed, and loopKnown full
	loopKnown  []byteSet // [states] bytes whose transition is known to loop or not
	loop       []byteSet // [states] bytes known to lead back to the same state
	utf8Known  []bool    // [states] utf8Loop computed
	utf8Loop   []bool    // [states] every valid UTF-8 character leads back (when utf8Known)
	masks      [][]uint64
	empty      []bool // [states] mask computed and found empty
	maskBytes  int
	maskBudget int

	// Scratch for step.
	seen   []uint32 // [nodes] stamp of the last step that expanded the node
	stamp  uint32
	work   []int32
	out    []int32
	key    []byte
	walk   []int32 // [depth] state at each depth of a trie walk
	loopAt []bool  // [depth] the walk has only looped on its first state so far
}

// NewAutomaton prepares g for the tokens of v. Nothing is determinised until the first Mask or
// Accept; the cost is then paid once per state reached. maskCache bounds the bytes of token
// masks kept (0 selects DefaultMaskCache; negative keeps none); past it, masks of new states are
// computed each time they are asked for.
func NewAutomaton(g *Grammar, v *Vocab, maskCache int) (*Automaton, error) {
	a := &Automaton{
		g:          g,
		v:          v,
		nodeIndex:  map[uint64]int32{},
		stateIndex: map[string]int32{},
		maskBudget: maskCache,
	}
	if maskCache == 0 {
		a.maskBudget = DefaultMaskCache
	}
	a.classify()
	a.nodePos = append(a.nodePos, -1)
	a.nodeParent = append(a.nodeParent, -1)
	a.nodeMin = append(a.nodeMin, 0)
	a.stateOff = append(a.stateOff, 0)
	a.seen = append(a.seen, 0)
	// State 0: the root rule's alternatives on the empty stack.
	a.newStep()
	a.work = a.work[:0]
	for _, alt := range g.alts[g.root] {
		if g.elems[alt].kind == kEnd {
			a.work = append(a.work, 0)
		} else {
			a.work = append(a.work, a.push(alt, 0))
		}
	}
	a.expand()
	if s := a.intern(); s != 0 {
		return nil, fmt.Errorf("%w: the start parses more than %d ways", ErrAmbiguous, MaxStacks)
	}
	return a, nil
}

// Vocab is the vocabulary a is compiled over.
func (a *Automaton) Vocab() *Vocab { return a.v }

// newStep starts an expansion: a fresh stamp and empty work and output lists.
func (a *Automaton) newStep() {
	if a.stamp++; a.stamp == 0 {
		clear(a.seen)
		a.stamp = 1
	}
	a.out = a.out[:0]
	a.work = a.work[:0]
}

// classify partitions the byte values into classes that no byte set of the grammar tells apart.
func (a *Automaton) classify() {
	var remap [512]int16
	n := 1
	for _, s := range a.g.sets {
		for i := range remap[:2*n] {
			remap[i] = -1
		}
		m := 0
		var next [256]uint8
		for b := 0; b < 256; b++ {
			k := int(a.cls[b]) * 2
			if s.has(byte(b)) {
				k++
			}
			if remap[k] < 0 {
				remap[k] = int16(m)
				m++
			}
			next[b] = uint8(remap[k])
		}
		a.cls = next
		n = m
	}
	a.ncls = n
	a.rep = make([]byte, n)
	a.clsSet = make([]byteSet, n)
	for b := 0; b < 256; b++ {
		a.clsSet[a.cls[b]].add(byte(b), byte(b))
	}
	done := make([]bool, n)
	for b := 0; b < 256; b++ {
		if c := a.cls[b]; !done[c] {
			done[c] = true
			a.rep[c] = byte(b)
		}
	}
}

// push returns the stack with position pos on top of parent (pos is never an end).
func (a *Automaton) push(pos, parent int32) int32 {
	k := uint64(uint32(pos))<<32 | uint64(uint32(parent))
	if n, ok := a.nodeIndex[k]; ok {
		return n
	}
	n := int32(len(a.nodePos))
	a.nodePos = append(a.nodePos, pos)
	a.nodeParent = append(a.nodeParent, parent)
	a.nodeMin = append(a.nodeMin, addBytes(a.g.rest[pos], a.nodeMin[parent]))
	a.seen = append(a.seen, 0)
	a.nodeIndex[k] = n
	return n
}

// after returns the stack left when the element at the top of node n has been matched: the
// next position of the same alternative on the parent, or the parent alone at its end.
func (a *Automaton) after(n int32) int32 {
	p := a.nodePos[n] + 1
	if a.g.elems[p].kind == kEnd {
		return a.nodeParent[n]
	}
	return a.push(p, a.nodeParent[n])
}

// expand drains a.work into a.out: every stack is expanded until its top is a byte set, or it is
// empty (llama.cpp's llama_grammar_advance_stack). Stacks already seen this step are skipped,
// which also ends cycles of tail references.
func (a *Automaton) expand() {
	els := a.g.elems
	for len(a.work) > 0 {
		n := a.work[len(a.work)-1]
		a.work = a.work[:len(a.work)-1]
		if a.seen[n] == a.stamp {
			continue
		}
		a.seen[n] = a.stamp
		if n == 0 {
			a.out = append(a.out, 0)
			continue
		}
		e := els[a.nodePos[n]]
		if e.kind == kBytes {
			a.out = append(a.out, n)
			continue
		}
		next := a.after(n)
		for _, alt := range a.g.alts[e.arg] {
			if els[alt].kind == kEnd {
				a.work = append(a.work, next)
			} else {
				a.work = append(a.work, a.push(alt, next))
			}
		}
	}
}

// intern returns the state whose stacks are a.out (sorted here), adding it if new; stDead when
// a.out is empty and stError when it holds more than MaxStacks.
func (a *Automaton) intern() int32 {
	if len(a.out) == 0 {
		return stDead
	}
	if len(a.out) > MaxStacks {
		return stError
	}
	slices.Sort(a.out)
	a.key = a.key[:0]
	a.key = append(a.key, unsafe.Slice((*byte)(unsafe.Pointer(&a.out[0])), 4*len(a.out))...)
	if s, ok := a.stateIndex[string(a.key)]; ok {
		return s
	}
	s := int32(len(a.stateOff) - 1)
	a.stateIndex[string(a.key)] = s
	a.stacks = append(a.stacks, a.out...)
	a.stateOff = append(a.stateOff, int32(len(a.stacks)))
	for range a.ncls {
		a.trans = append(a.trans, stUnknown)
	}
	a.complete = append(a.complete, a.out[0] == 0)
	least := int32(infBytes)
	for _, n := range a.out {
		least = min(least, a.nodeMin[n])
	}
	a.minBytes = append(a.minBytes, least)
	a.rowDone = append(a.rowDone, false)
	a.loopKnown = append(a.loopKnown, byteSet{})
	a.loop = append(a.loop, byteSet{})
	a.utf8Known = append(a.utf8Known, false)
	a.utf8Loop = append(a.utf8Loop, false)
	a.masks = append(a.masks, nil)
	a.empty = append(a.empty, false)
	return s
}

// next returns the state after byte class c from state s, computing it if needed.
func (a *Automaton) next(s int32, c uint8) int32 {
	t := &a.trans[int(s)*a.ncls+int(c)]
	if *t != stUnknown {
		return *t
	}
	b := a.rep[c]
	a.newStep()
	for _, n := range a.stacks[a.stateOff[s]:a.stateOff[s+1]] {
		if n == 0 {
			continue
		}
		if e := a.g.elems[a.nodePos[n]]; a.g.sets[e.arg].has(b) {
			a.work = append(a.work, a.after(n))
		}
	}
	a.expand()
	r := a.intern()
	a.trans[int(s)*a.ncls+int(c)] = r // a.trans may have grown
	return r
}

// row computes every transition of s, the set of bytes that lead back to s, and whether every
// UTF-8 character does.
func (a *Automaton) row(s int32) {
	for c := range a.ncls {
		ns := a.next(s, uint8(c))
		cs := &a.clsSet[c]
		for k := range cs {
			a.loopKnown[s][k] |= cs[k]
			if ns == s {
				a.loop[s][k] |= cs[k]
			}
		}
	}
	a.utf8Loops(s)
	a.rowDone[s] = true
}

// loopsOver reports whether every byte of set leads from s back to s, computing the
// transitions it needs and no more: it stops at the first byte that does not.
func (a *Automaton) loopsOver(s int32, set *byteSet) bool {
	for w := range set {
		if set[w]&a.loopKnown[s][w]&^a.loop[s][w] != 0 {
			return false
		}
	}
	for w := range set {
		for unknown := set[w] &^ a.loopKnown[s][w]; unknown != 0; unknown = set[w] &^ a.loopKnown[s][w] {
			c := a.cls[byte(w*64+bits.TrailingZeros64(unknown))]
			ns := a.next(s, c) // may grow the per-state slices: index them afresh
			cs := &a.clsSet[c]
			for k := range cs {
				a.loopKnown[s][k] |= cs[k]
			}
			if ns != s {
				return false
			}
			for k := range cs {
				a.loop[s][k] |= cs[k]
			}
		}
	}
	return true
}

// utf8Loops reports whether every UTF-8 character leads from s through live states back to s.
func (a *Automaton) utf8Loops(s int32) bool {
	if !a.utf8Known[s] {
		ok := true
		for _, seq := range utf8Encodings {
			if ok = a.seqLoops(s, s, seq); !ok {
				break
			}
		}
		a.utf8Loop[s], a.utf8Known[s] = ok, true
	}
	return a.utf8Loop[s]
}

// utf8Encodings are the byte ranges of every multi-byte UTF-8 encoding (RFC 3629's table).
var utf8Encodings = [][]byteRange{
	{{0xC2, 0xDF}, {0x80, 0xBF}},
	{{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}},
	{{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}},
	{{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}},
	{{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}},
	{{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
	{{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
	{{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
}

// seqLoops reports whether from cur every byte string of seq leads through live states, and,
// complete, back to home.
func (a *Automaton) seqLoops(home, cur int32, seq []byteRange) bool {
	var done [256]bool
	for b := int(seq[0].lo); b <= int(seq[0].hi); b++ {
		c := a.cls[b]
		if done[c] {
			continue
		}
		done[c] = true
		n := a.next(cur, c)
		if n < 0 {
			return false
		}
		if len(seq) == 1 {
			if n != home {
				return false
			}
		} else if !a.seqLoops(home, n, seq[1:]) {
			return false
		}
	}
	return true
}

// States is the number of DFA states built so far.
func (a *Automaton) States() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.stateOff) - 1
}

// Classes is the number of byte classes the grammar tells apart.
func (a *Automaton) Classes() int { return a.ncls }

// bulkMin is the smallest subtree (in nodes) for which mask computes a state's whole row of
// transitions to try accepting the subtree at once; smaller ones are walked.
const bulkMin = 16

// known reports whether every byte of set is known to loop on s or not.
func (a *Automaton) known(s int32, set *byteSet) bool {
	k := &a.loopKnown[s]
	return set[0]&^k[0]|set[1]&^k[1]|set[2]&^k[2]|set[3]&^k[3] == 0
}

// loopMin is the fewest bytes a state must loop on for mask to start from the Vocab's loop
// mask of that set (a string's body loops on about a hundred) instead of setting the bits of
// those tokens one by one.
const loopMin = 32

// mask computes the token mask of state s into m (cleared here, a.v.maskWords() long): the
// trie is walked depth first with the state reached at each depth; a dead state prunes its
// subtree, and a subtree all of whose bytes loop on the state reached at its root is accepted
// whole. When s itself loops on many bytes, the tokens that never leave s come from the Vocab's
// loop mask of those bytes (shared by every state and every Automaton with the same loop), and
// the walk skips the subtrees whose tokens all stay in s. End-of-generation tokens are set
// when s is complete.
//
// With within below infBytes, only the tokens after which the grammar can be completed within
// that many more bytes are set (and no subtree is accepted whole).
func (a *Automaton) mask(s int32, m []uint64, within int32) (bool, error) {
	v := a.v
	any := false
	bounded := within < infBytes
	if !a.rowDone[s] && !bounded {
		a.row(s)
	}
	var loop *byteSet
	loopSet := a.loop[s]
	if setSize(&loopSet) >= loopMin && !bounded {
		if lm := v.loopMask(loopSet, a.utf8Loop[s]); lm != nil {
			copy(m, lm)
			loop = &loopSet
			any = slices.ContainsFunc(lm, func(w uint64) bool { return w != 0 })
		}
	}
	if loop == nil {
		clear(m)
	}
	if a.complete[s] {
		for _, id := range v.eog {
			m[id>>6] |= 1 << (uint(id) & 63)
			any = true
		}
	}
	if cap(a.walk) < 64 {
		a.walk = make([]int32, 64)
		a.loopAt = make([]bool, 64)
	}
	a.walk = a.walk[:cap(a.walk)]
	a.loopAt = a.loopAt[:cap(a.walk)]
	a.walk[0] = s
	a.loopAt[0] = loop != nil // loopAt[d]: every byte to depth d is in loop, so the walk is in s
	wholeChars := a.utf8Loop[s]
	nodes := int32(len(v.edge))
	ncls := a.ncls
	for i := int32(1); i < nodes; {
		d := int(v.depth[i])
		if a.loopAt[d-1] {
			// Skip a subtree whose tokens are all in the loop mask: its ASCII bytes loop, and
			// so do its other bytes, or they form whole characters that loop.
			var sub byteSet
			sub = v.below[i]
			sub.add(v.edge[i], v.edge[i])
			ascii := sub[0]&^loop[0] | sub[1]&^loop[1]
			if ascii == 0 && (sub[2]&^loop[2]|sub[3]&^loop[3] == 0 || wholeChars && v.sub[i]) {
				i = v.end[i]
				continue
			}
		}
		ps := a.walk[d-1]
		ns := a.trans[int(ps)*ncls+int(a.cls[v.edge[i]])]
		if ns == stUnknown {
			ns = a.next(ps, a.cls[v.edge[i]])
		}
		if ns < 0 {
			if ns == stError {
				return false, fmt.Errorf("%w: a prefix parses more than %d ways", ErrAmbiguous, MaxStacks)
			}
			i = v.end[i]
			continue
		}
		end := v.end[i]
		if !bounded && (end-i >= bulkMin || end > i+1 && a.known(ns, &v.below[i])) {
			// The whole subtree is allowed when every byte below loops on ns, or when its
			// tokens are UTF-8 from a character boundary, ns loops on every character, and its
			// ASCII bytes loop on ns. Transitions are computed only until one fails.
			bl := &v.below[i]
			ascii, high := byteSet{bl[0], bl[1]}, byteSet{2: bl[2], 3: bl[3]}
			if a.loopsOver(ns, &ascii) && (a.loopsOver(ns, &high) || v.utf8[i] && a.utf8Loops(ns)) {
				for _, id := range v.order[v.tokLo[i]:v.tokLo[end]] {
					m[id>>6] |= 1 << (uint(id) & 63)
				}
				any = true
				i = end
				continue
			}
		}
		if lo := v.tokLo[i]; !bounded || a.minBytes[ns] <= within {
			for _, id := range v.order[lo : lo+v.own[i]] {
				m[id>>6] |= 1 << (uint(id) & 63)
				any = true
			}
		}
		if d >= len(a.walk) {
			a.walk = append(a.walk, make([]int32, len(a.walk))...)
			a.loopAt = append(a.loopAt, make([]bool, len(a.loopAt))...)
		}
		a.walk[d] = ns
		a.loopAt[d] = a.loopAt[d-1] && loop.has(v.edge[i])
		i++
	}
	return any, nil
}

// cachedMask returns s's mask from the cache, computing and caching it if the budget allows;
// otherwise it computes it into buf (allocated if too short) and returns it with buf. A mask with
// no token is ErrDeadEnd.
func (a *Automaton) cachedMask(s int32, buf []uint64) ([]uint64, []uint64, error) {
	if m := a.masks[s]; m != nil {
		return m, buf, nil
	}
	if a.empty[s] {
		return nil, buf, a.deadEnd(s)
	}
	words := a.v.maskWords()
	var m []uint64
	cache := a.maskBytes+8*words <= a.maskBudget
	if cache {
		m = make([]uint64, words)
	} else {
		if len(buf) < words {
			buf = make([]uint64, words)
		}
		m = buf[:words]
	}
	any, err := a.mask(s, m, infBytes)
	if err != nil {
		return nil, buf, err
	}
	if !any {
		a.empty[s] = true
		return nil, buf, a.deadEnd(s)
	}
	if cache {
		a.masks[s] = m
		a.maskBytes += 8 * words
	}
	return m, buf, nil
}

func (a *Automaton) deadEnd(s int32) error {
	if a.complete[s] {
		return fmt.Errorf("%w: the grammar is complete but the vocabulary has no end-of-generation token", ErrDeadEnd)
	}
	return fmt.Errorf("%w: no token spells a continuation the grammar allows", ErrDeadEnd)
}
