package sched

import (
	"container/heap"
	"slices"

	"github.com/parleyhq/parley/runtime/kvcache"
)

// prefixCache keeps the whole prompt blocks of earlier sequences so that a later prompt starting
// with the same tokens shares them instead of recomputing them.
//
// It is a trie of blocks: the node at depth d stands for the block holding positions
// d*bs .. (d+1)*bs-1 of every prompt whose first (d+1)*bs tokens are the tokens on the path from
// the root to it. Since positions are absolute and the keys and values of a position depend only
// on the tokens up to it, that block holds exactly what any such prompt would compute there. A
// node is found by its parent and a hash of its bs tokens, and the tokens are compared, so a hash
// collision is a miss, never a wrong share.
//
// References: every leaf holds a kvcache.Seq forked from the sequence that computed it, covering
// the blocks of its whole path; an inner node's block is held by the leaves below it. A running
// sequence that holds blocks of the trie pins the path of those nodes (pins counts such
// sequences). Its pinned nodes always form a path from the root, so a node nobody pins has no
// pinned node below it, and its block is held by nothing but the leaves below it: evicting leaves
// from the bottom frees exactly one block per node. Such nodes are idle; idle leaves wait in an
// LRU heap ordered by when they were last unpinned.
//
// Owned by the step loop.
type prefixCache struct {
	bs      int
	nodes   map[nodeKey]*node
	idle    int      // nodes no sequence pins
	lru     nodeHeap // idle leaves, least recently released first
	tick    uint64
	evicted uint64
}

type nodeKey struct {
	parent *node // nil at depth 0
	hash   uint64
}

type node struct {
	key    nodeKey
	tokens []int32 // [bs] the block's tokens
	depth  int
	kids   []*node
	seq    *kvcache.Seq // leaves only: holds the (depth+1) blocks of the path
	pins   int
	used   uint64 // tick at which pins last dropped to 0
	at     int    // index in the LRU heap, -1 when not there
}

func newPrefixCache(bs int) *prefixCache {
	return &prefixCache{bs: bs, nodes: make(map[nodeKey]*node)}
}

// hashBlock is FNV-1a over the tokens' bytes.
func hashBlock(toks []int32) uint64 {
	h := uint64(14695981039346656037)
	for _, t := range toks {
		u := uint32(t)
		for range 4 {
			h ^= uint64(u & 0xff)
			h *= 1099511628211
			u >>= 8
		}
	}
	return h
}

func (c *prefixCache) child(parent *node, toks []int32) *node {
	n := c.nodes[nodeKey{parent, hashBlock(toks)}]
	if n == nil || !slices.Equal(n.tokens, toks) {
		return nil
	}
	return n
}

// match returns the deepest node whose path is a prefix of prompt, stopping one block short when
// needed so that at least the last prompt token is left to feed, and the number of blocks it
// covers.
func (c *prefixCache) match(prompt []int32) (*node, int) {
	limit := (len(prompt) - 1) / c.bs
	var cur *node
	d := 0
	for ; d < limit; d++ {
		n := c.child(cur, prompt[d*c.bs:(d+1)*c.bs])
		if n == nil {
			break
		}
		cur = n
	}
	return cur, d
}

// idleOn counts the idle nodes on the path ending at n.
func idleOn(n *node) int {
	k := 0
	for ; n != nil && n.pins == 0; n = n.key.parent {
		k++
	}
	return k
}

// pin marks the path ending at n as held by one more sequence.
func (c *prefixCache) pin(n *node) {
	for ; n != nil; n = n.key.parent {
		if n.pins == 0 {
			c.idle--
			if n.at >= 0 {
				heap.Remove(&c.lru, n.at)
			}
		}
		n.pins++
	}
}

// unpin undoes pin.
func (c *prefixCache) unpin(n *node) {
	c.tick++
	for ; n != nil; n = n.key.parent {
		n.pins--
		if n.pins == 0 {
			c.idle++
			n.used = c.tick
			if len(n.kids) == 0 {
				heap.Push(&c.lru, n)
			}
		}
	}
}

// ancestor returns the node at depth d-1 on the path ending at n (nil if d is 0).
func ancestor(n *node, d int) *node {
	for n != nil && n.depth >= d {
		n = n.key.parent
	}
	return n
}

// share returns a new sequence holding the blocks of the path ending at n.
func (c *prefixCache) share(n *node) *kvcache.Seq {
	leaf := n
	for leaf.seq == nil {
		leaf = leaf.kids[0]
	}
	return leaf.seq.Fork((n.depth + 1) * c.bs)
}

// insert adds the whole prompt blocks of kv (whose first len(prompt) positions hold prompt) below
// the node at, which kv's sequence pins (nil: none), and returns the deepest node kv's sequence
// now pins. It stops at the first block whose tokens are already cached under another block (a
// prompt computed twice at once): the sequence's later blocks are not in the trie.
func (c *prefixCache) insert(at *node, prompt []int32, kv *kvcache.Seq) *node {
	whole := min(len(prompt), kv.Len()) / c.bs
	top := at
	d := 0
	if at != nil {
		d = at.depth + 1
	}
	cur := at
	for ; d < whole; d++ {
		toks := prompt[d*c.bs : (d+1)*c.bs]
		key := nodeKey{cur, hashBlock(toks)}
		if c.nodes[key] != nil {
			break
		}
		n := &node{key: key, tokens: slices.Clone(toks), depth: d, pins: 1, at: -1}
		c.nodes[key] = n
		if cur != nil {
			cur.kids = append(cur.kids, n)
		}
		cur = n
	}
	if cur == top {
		return at
	}
	cur.seq = kv.Fork((cur.depth + 1) * c.bs)
	if top != nil && top.seq != nil {
		top.seq.Release() // top is no longer a leaf; the new leaf's sequence holds its path
		top.seq = nil
	}
	return cur
}

// evict drops the least recently released idle leaf, freeing its block. It reports false when no
// node is idle.
func (c *prefixCache) evict() bool {
	if len(c.lru) == 0 {
		return false
	}
	n := heap.Pop(&c.lru).(*node)
	c.evicted++
	delete(c.nodes, n.key)
	c.idle--
	p := n.key.parent
	if p == nil {
		n.seq.Release()
	} else {
		i := slices.Index(p.kids, n)
		p.kids = slices.Delete(p.kids, i, i+1)
		if len(p.kids) == 0 {
			// The parent becomes a leaf and keeps the path minus n's block.
			n.seq.Truncate((p.depth + 1) * c.bs)
			p.seq = n.seq
			if p.pins == 0 {
				heap.Push(&c.lru, p)
			}
		} else {
			n.seq.Release()
		}
	}
	n.seq = nil
	n.key.parent = nil
	n.kids = nil
	return true
}

// clear releases every block the cache holds. No sequence may pin any node.
func (c *prefixCache) clear() {
	for _, n := range c.nodes {
		if n.seq != nil {
			n.seq.Release()
		}
	}
	clear(c.nodes)
	clear(c.lru)
	c.lru = c.lru[:0]
	c.idle = 0
}

// nodeHeap is a min-heap of nodes by used.
type nodeHeap []*node

func (h nodeHeap) Len() int           { return len(h) }
func (h nodeHeap) Less(i, j int) bool { return h[i].used < h[j].used }
func (h nodeHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}

func (h *nodeHeap) Push(x any) {
	n := x.(*node)
	n.at = len(*h)
	*h = append(*h, n)
}

func (h *nodeHeap) Pop() any {
	old := *h
	n := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	n.at = -1
	return n
}
