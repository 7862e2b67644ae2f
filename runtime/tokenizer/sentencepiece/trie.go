package sentencepiece

// trie is a byte trie over piece texts. Node 0 is the root.
type trie struct {
	next  map[uint64]int32 // node<<8 | byte -> child node
	value []int32          // per node: the piece id ending there, or -1
}

func newTrie() *trie { return &trie{next: map[uint64]int32{}, value: []int32{-1}} }

func (t *trie) insert(s string, id int32) {
	node := int32(0)
	for i := 0; i < len(s); i++ {
		k := uint64(node)<<8 | uint64(s[i])
		c, ok := t.next[k]
		if !ok {
			c = int32(len(t.value))
			t.value = append(t.value, -1)
			t.next[k] = c
		}
		node = c
	}
	t.value[node] = id
}

// child returns the child of node along byte b, or -1.
func (t *trie) child(node int32, b byte) int32 {
	if c, ok := t.next[uint64(node)<<8|uint64(b)]; ok {
		return c
	}
	return -1
}

// longestPrefix returns the length of the longest key that prefixes s, or 0.
func (t *trie) longestPrefix(s string) int {
	best := 0
	node := int32(0)
	for i := 0; i < len(s); i++ {
		if node = t.child(node, s[i]); node < 0 {
			break
		}
		if t.value[node] >= 0 {
			best = i + 1
		}
	}
	return best
}
