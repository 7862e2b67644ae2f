package grammar

import "container/heap"

// infBytes stands for "no finite completion" in minimal lengths; sums saturate at it.
const infBytes = 1 << 30

func addBytes(a, b int32) int32 {
	if s := int64(a) + int64(b); s < infBytes {
		return int32(s)
	}
	return infBytes
}

// minRest returns, for every element position p, the fewest bytes that finish p's
// alternative from p on (0 at its end): the shortest derivations of the rules, found as
// Knuth's generalisation of Dijkstra's algorithm finds them (each rule's length is final when
// it leaves the queue, since an alternative is never shorter than any rule it references).
func (g *Grammar) minRest() []int32 {
	nr := len(g.alts)
	minLen := make([]int32, nr)
	for i := range minLen {
		minLen[i] = infBytes
	}
	// For each alternative: its rule, the sum of its known elements, and how many references
	// are still unknown; for each rule, the alternatives referencing it (once per reference).
	type altInfo struct {
		rule    int32
		sum     int32
		pending int32
	}
	var alts []altInfo
	users := make([][]int32, nr)
	q := &lenQueue{}
	for r, as := range g.alts {
		for _, a := range as {
			ai := altInfo{rule: int32(r)}
			k := int32(len(alts))
			for p := a; g.elems[p].kind != kEnd; p++ {
				if e := g.elems[p]; e.kind == kBytes {
					ai.sum = addBytes(ai.sum, 1)
				} else {
					ai.pending++
					users[e.arg] = append(users[e.arg], k)
				}
			}
			alts = append(alts, ai)
			if ai.pending == 0 {
				heap.Push(q, lenItem{int32(r), ai.sum})
			}
		}
	}
	done := make([]bool, nr)
	for q.Len() > 0 {
		it := heap.Pop(q).(lenItem)
		if done[it.rule] {
			continue
		}
		done[it.rule] = true
		minLen[it.rule] = it.n
		for _, k := range users[it.rule] {
			a := &alts[k]
			a.sum = addBytes(a.sum, it.n)
			if a.pending--; a.pending == 0 && !done[a.rule] {
				heap.Push(q, lenItem{a.rule, a.sum})
			}
		}
	}
	rest := make([]int32, len(g.elems))
	for _, as := range g.alts {
		for _, a := range as {
			end := a
			for g.elems[end].kind != kEnd {
				end++
			}
			var s int32
			for p := end - 1; p >= a; p-- {
				if e := g.elems[p]; e.kind == kBytes {
					s = addBytes(s, 1)
				} else {
					s = addBytes(s, minLen[e.arg])
				}
				rest[p] = s
			}
		}
	}
	return rest
}

type lenItem struct {
	rule int32
	n    int32
}

// lenQueue is a min-heap of rules by length.
type lenQueue []lenItem

func (q lenQueue) Len() int           { return len(q) }
func (q lenQueue) Less(i, j int) bool { return q[i].n < q[j].n }
func (q lenQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *lenQueue) Push(x any)        { *q = append(*q, x.(lenItem)) }
func (q *lenQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}
