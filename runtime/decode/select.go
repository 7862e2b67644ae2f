package decode

// candidate is one token still in the running during a draw.
type candidate struct {
	id    int32
	logit float32
}

// worse orders candidates: a lower logit is worse, and among equal logits the higher id is
// worse, so best-first order is logit descending, id ascending.
func worse(a, b candidate) bool {
	return a.logit < b.logit || (a.logit == b.logit && a.id > b.id)
}

// siftDown restores the heap property below i in h, a heap with the worst candidate at h[0].
func siftDown(h []candidate, i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && worse(h[r], h[l]) {
			m = r
		}
		if !worse(h[m], h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func heapify(h []candidate) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
}

// sortHeap turns a worst-at-root heap into best-first order, in place.
func sortHeap(h []candidate) {
	for n := len(h) - 1; n > 0; n-- {
		h[0], h[n] = h[n], h[0]
		siftDown(h[:n], 0)
	}
}

// topKFromLogits writes the k best tokens of logits into buf[:k], best first, and returns them.
// It needs 0 < k <= len(logits) and k <= cap(buf). A NaN logit stops the scan: it returns nil
// and the NaN's index; otherwise the index is -1. Cost: one comparison per
// logit plus O(log k) per heap replacement (about k*ln(n/k) of them for random input).
func topKFromLogits(logits []float32, k int, buf []candidate) ([]candidate, int) {
	h := buf[:k]
	for i := 0; i < k; i++ {
		v := logits[i]
		if v != v {
			return nil, i
		}
		h[i] = candidate{int32(i), v}
	}
	heapify(h)
	root := h[0].logit
	for i := k; i < len(logits); i++ {
		v := logits[i]
		// Ids arrive in increasing order, so a newcomer that ties the root is worse than it.
		if v > root {
			h[0] = candidate{int32(i), v}
			siftDown(h, 0)
			root = h[0].logit
		} else if v != v {
			return nil, i
		}
	}
	sortHeap(h)
	return h, -1
}

// partialSort moves the m best candidates of c to c[:m], best first; the rest of c is left
// in some order. 0 < m <= len(c).
func partialSort(c []candidate, m int) {
	h := c[:m]
	heapify(h)
	for i := m; i < len(c); i++ {
		if worse(h[0], c[i]) {
			h[0], c[i] = c[i], h[0]
			siftDown(h, 0)
		}
	}
	sortHeap(h)
}
