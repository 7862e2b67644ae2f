package decode

import (
	"math"

	"github.com/parleyhq/parley/internal/vec"
)

// TokenLogprob is a token with its natural-log probability.
type TokenLogprob struct {
	ID      int32
	Logprob float64
}

// LogSumExp returns log(sum(exp(logits))) over logits ([vocab]), computed stably: the maximum
// is subtracted before exponentiating, the exponentials are float32 (vec.SumExp: within a few
// ulp) and their sum float64, so the result is within about 1e-6 of the exact one. The
// log-probability of token i is float64(logits[i]) - LogSumExp(logits). It returns -Inf for
// empty or all -Inf logits, +Inf if any logit is +Inf, and NaN if any is NaN.
func LogSumExp(logits []float32) float64 {
	mx, nan := vec.Max(logits)
	if nan {
		return math.NaN()
	}
	if math.IsInf(float64(mx), 0) {
		return float64(mx)
	}
	return float64(mx) + math.Log(vec.SumExp(logits, mx))
}

// Logprob returns the natural-log softmax probability of token id under the raw logits
// ([vocab]). It is NaN when id is outside logits or the logits hold NaN or +Inf.
func Logprob(logits []float32, id int32) float64 {
	if id < 0 || int(id) >= len(logits) {
		return math.NaN()
	}
	return float64(logits[id]) - LogSumExp(logits)
}

// TopLogprobs returns the n most likely tokens of the raw logits ([vocab]), most likely first
// (ties to the lower id), with their natural-log softmax probabilities; these are the
// probabilities before bias, penalties, filtering and temperature, as llama.cpp reports with
// post_sampling_probs off. n is clamped to [0, len(logits)]; NaN logits are never listed. The
// result is appended to dst[:0], which allocates nothing when cap(dst) >= n.
func TopLogprobs(logits []float32, n int, dst []TokenLogprob) []TokenLogprob {
	return topLogprobs(logits, n, dst, LogSumExp(logits))
}

// Logprobs returns both Logprob(logits, id) and TopLogprobs(logits, n, dst) with one
// log-sum-exp pass over the logits instead of two; that pass (an exp per entry) is most of
// the cost of either.
func Logprobs(logits []float32, id int32, n int, dst []TokenLogprob) (float64, []TokenLogprob) {
	lse := LogSumExp(logits)
	lp := math.NaN()
	if id >= 0 && int(id) < len(logits) {
		lp = float64(logits[id]) - lse
	}
	return lp, topLogprobs(logits, n, dst, lse)
}

// topLogprobs is TopLogprobs given lse = LogSumExp(logits).
func topLogprobs(logits []float32, n int, dst []TokenLogprob, lse float64) []TokenLogprob {
	dst = dst[:0]
	n = min(max(n, 0), len(logits))
	if n == 0 {
		return dst
	}
	// dst is a heap of the best n so far with the worst at dst[0]; Logprob holds the logit
	// until the end.
	i := 0
	for ; i < len(logits) && len(dst) < n; i++ {
		if v := logits[i]; v == v {
			dst = append(dst, TokenLogprob{int32(i), float64(v)})
		}
	}
	for j := len(dst)/2 - 1; j >= 0; j-- {
		siftDownLP(dst, j)
	}
	if len(dst) > 0 {
		root := dst[0].Logprob
		for ; i < len(logits); i++ {
			if v := float64(logits[i]); v > root {
				dst[0] = TokenLogprob{int32(i), v}
				siftDownLP(dst, 0)
				root = dst[0].Logprob
			}
		}
	}
	for k := len(dst) - 1; k > 0; k-- {
		dst[0], dst[k] = dst[k], dst[0]
		siftDownLP(dst[:k], 0)
	}
	for k := range dst {
		dst[k].Logprob -= lse
	}
	return dst
}

func worseLP(a, b TokenLogprob) bool {
	return a.Logprob < b.Logprob || (a.Logprob == b.Logprob && a.ID > b.ID)
}

func siftDownLP(h []TokenLogprob, i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && worseLP(h[r], h[l]) {
			m = r
		}
		if !worseLP(h[m], h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
