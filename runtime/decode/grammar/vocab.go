package grammar

import (
	"bytes"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"unicode/utf8"
)

// Vocab is a vocabulary's tokens as a byte trie, for computing masks: built once per model and
// shared, read-only, by every Automaton on that model.
//
// The trie's nodes are stored in depth-first preorder, children in byte order, so a node's
// subtree is the run of nodes [i, end[i]) and the tokens ending in it are a run of order.
type Vocab struct {
	size int     // vocabulary size
	eog  []int32 // end-of-generation ids, ascending

	edge  []byte    // [nodes] byte on the edge into the node (0 for the root)
	depth []uint16  // [nodes] bytes from the root
	end   []int32   // [nodes] one past the last node of the node's subtree
	tokLo []int32   // [nodes+1] start in order of the tokens ending at or below the node
	own   []int32   // [nodes] how many tokens end exactly at the node
	below []byteSet // [nodes] bytes on the edges strictly below the node
	// utf8 marks nodes whose path from the root is complete, valid UTF-8 and below which every
	// token is valid UTF-8 but for a possibly unfinished last character.
	utf8 []bool // [nodes]
	// sub marks nodes below which every token (its bytes from the root) is valid UTF-8 but for
	// a possibly unfinished last character.
	sub   []bool  // [nodes]
	order []int32 // token ids in trie order

	pieces [][]byte // [size] each token's bytes (nil: never allowed, unless end of generation)

	// Masks of the tokens spelt within a byte set (loopMask), shared by every Automaton.
	loopMu sync.Mutex
	loops  map[loopKey][]uint64
}

// loopKey names a loop mask: the byte set, and whether whole UTF-8 characters count too.
type loopKey struct {
	set  byteSet
	utf8 bool
}

// maxLoopMasks bounds the loop masks a Vocab keeps (a grammar has few distinct loops: the
// characters of its strings, its digits).
const maxLoopMasks = 64

// MaxTokenBytes is the longest token the trie accepts; longer tokens are never allowed.
const MaxTokenBytes = 1 << 12

// NewVocab indexes a vocabulary of len(pieces) tokens: pieces[id] holds the bytes token id
// stands for in the output (the tokenizer's detokenised piece; nil or empty for control and
// other tokens that print nothing, which a grammar never allows). eog lists the
// end-of-generation tokens, allowed exactly when the grammar is complete. The pieces are
// copied.
func NewVocab(pieces [][]byte, eog []int32) (*Vocab, error) {
	n := len(pieces)
	if n < 1 || n > 1<<24 {
		return nil, fmt.Errorf("grammar: vocabulary size %d outside [1, %d]", n, 1<<24)
	}
	v := &Vocab{size: n, pieces: make([][]byte, n)}
	for _, id := range eog {
		if id < 0 || int(id) >= n {
			return nil, fmt.Errorf("grammar: end-of-generation token %d outside vocabulary [0, %d)", id, n)
		}
	}
	v.eog = slices.Clone(eog)
	slices.Sort(v.eog)
	v.eog = slices.Compact(v.eog)
	ids := make([]int32, 0, n)
	total := 0
	for id, p := range pieces {
		if len(p) == 0 || len(p) > MaxTokenBytes || slices.Contains(v.eog, int32(id)) {
			continue
		}
		total += len(p)
		ids = append(ids, int32(id))
	}
	arena := make([]byte, 0, total)
	for _, id := range ids {
		arena = append(arena, pieces[id]...)
		v.pieces[id] = arena[len(arena)-len(pieces[id]) : len(arena) : len(arena)]
	}
	slices.SortFunc(ids, func(a, b int32) int {
		if c := bytes.Compare(v.pieces[a], v.pieces[b]); c != 0 {
			return c
		}
		return int(a - b)
	})
	v.order = ids
	nodes := total/2 + 1 // about what real vocabularies need
	v.edge = make([]byte, 0, nodes)
	v.depth = make([]uint16, 0, nodes)
	v.end = make([]int32, 0, nodes)
	v.tokLo = make([]int32, 0, nodes+1)
	v.own = make([]int32, 0, nodes)
	v.below = make([]byteSet, 0, nodes)
	v.utf8 = make([]bool, 0, nodes)
	subValid := make([]bool, 0, nodes) // every token at or below the node is validPrefix

	// Build the trie from the sorted pieces: each piece shares with the path so far its common
	// prefix; nodes past it are closed, and new nodes opened for the rest of the piece.
	v.edge = append(v.edge, 0)
	v.depth = append(v.depth, 0)
	v.end = append(v.end, 0)
	v.tokLo = append(v.tokLo, 0)
	v.own = append(v.own, 0)
	v.below = append(v.below, byteSet{})
	v.utf8 = append(v.utf8, false)
	subValid = append(subValid, true)
	path := []int32{0} // path[d]: the open node at depth d
	var prev []byte
	closeTo := func(d int) { // close the open nodes deeper than d
		for len(path)-1 > d {
			c := path[len(path)-1]
			path = path[:len(path)-1]
			v.end[c] = int32(len(v.edge))
			p := path[len(path)-1]
			for w := range v.below[p] {
				v.below[p][w] |= v.below[c][w]
			}
			v.below[p].add(v.edge[c], v.edge[c])
			subValid[p] = subValid[p] && subValid[c]
			v.utf8[c] = v.utf8[c] && subValid[c]
		}
	}
	for k, id := range ids {
		p := v.pieces[id]
		common := 0
		for common < len(p) && common < len(prev) && p[common] == prev[common] {
			common++
		}
		closeTo(common)
		for d := common; d < len(p); d++ {
			path = append(path, int32(len(v.edge)))
			v.edge = append(v.edge, p[d])
			v.depth = append(v.depth, uint16(d+1))
			v.end = append(v.end, 0)
			v.tokLo = append(v.tokLo, int32(k))
			v.own = append(v.own, 0)
			v.below = append(v.below, byteSet{})
			v.utf8 = append(v.utf8, utf8.Valid(p[:d+1]))
			subValid = append(subValid, true)
		}
		last := path[len(path)-1]
		v.own[last]++
		subValid[last] = subValid[last] && validPrefix(p)
		prev = p
	}
	closeTo(0)
	v.end[0] = int32(len(v.edge))
	v.tokLo = append(v.tokLo, int32(len(ids)))
	v.sub = subValid
	return v, nil
}

// Size is the number of tokens.
func (v *Vocab) Size() int { return v.size }

// Nodes is the number of trie nodes, the root included.
func (v *Vocab) Nodes() int { return len(v.edge) }

// Piece returns the bytes of token id as indexed (nil for tokens a grammar never allows and
// for end-of-generation tokens).
func (v *Vocab) Piece(id int32) []byte {
	if id < 0 || int(id) >= v.size {
		return nil
	}
	return v.pieces[id]
}

// IsEOG reports whether id is an end-of-generation token.
func (v *Vocab) IsEOG(id int32) bool {
	_, ok := slices.BinarySearch(v.eog, id)
	return ok
}

// maskWords is the length of a mask over the vocabulary in 64-bit words.
func (v *Vocab) maskWords() int { return (v.size + 63) / 64 }

// validPrefix reports whether p is valid UTF-8 but for a last character that may be unfinished
// (a prefix of a valid encoding).
func validPrefix(p []byte) bool {
	for len(p) > 0 {
		r, n := utf8.DecodeRune(p)
		if r != utf8.RuneError || n > 1 {
			p = p[n:]
			continue
		}
		// p starts with an invalid or unfinished sequence: it is unfinished if it is short and
		// some completion of it is valid.
		if len(p) >= utf8.UTFMax || !utf8.RuneStart(p[0]) {
			return false
		}
		var buf [utf8.UTFMax]byte
		copy(buf[:], p)
		for c := byte(0x80); c <= 0xBF; c++ {
			for k := len(p); k < utf8.UTFMax; k++ {
				buf[k] = c
			}
			for k := len(p) + 1; k <= utf8.UTFMax; k++ {
				if r, m := utf8.DecodeRune(buf[:k]); (r != utf8.RuneError || m > 1) && m == k {
					return true
				}
			}
		}
		return false
	}
	return true
}

// loopMask returns the mask of the tokens whose every byte is in set (with wholeChars, every
// byte below 0x80, and the token valid UTF-8 but for a possibly unfinished last character):
// from a state that each byte of set leads back to (and each whole character too, with
// wholeChars), exactly the tokens that never leave it. Masks are computed once per Vocab and
// shared, read-only; nil when the Vocab already holds maxLoopMasks others.
func (v *Vocab) loopMask(set byteSet, wholeChars bool) []uint64 {
	k := loopKey{set, wholeChars}
	v.loopMu.Lock()
	defer v.loopMu.Unlock()
	if m, ok := v.loops[k]; ok {
		return m
	}
	if len(v.loops) >= maxLoopMasks {
		return nil
	}
	m := make([]uint64, v.maskWords())
	for _, id := range v.order {
		p := v.pieces[id]
		in, high := true, false
		for _, b := range p {
			if !set.has(b) {
				if b < 0x80 || !wholeChars {
					in = false
					break
				}
				high = true
			}
		}
		if in && (!high || validPrefix(p)) {
			m[id>>6] |= 1 << (uint(id) & 63)
		}
	}
	if v.loops == nil {
		v.loops = map[loopKey][]uint64{}
	}
	v.loops[k] = m
	return m
}

// setSize is the number of bytes in s.
func setSize(s *byteSet) int {
	return bits.OnesCount64(s[0]) + bits.OnesCount64(s[1]) + bits.OnesCount64(s[2]) + bits.OnesCount64(s[3])
}
