package decode

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// refLogSumExp sums exp(l - max) over the logits sorted ascending with Kahan summation: a
// different order and algorithm from LogSumExp, so agreement checks its rounding.
func refLogSumExp(logits []float32) float64 {
	t := refSorted(logits)
	mx := t[0].logit
	var sum, comp float64
	for i := len(t) - 1; i >= 0; i-- {
		y := math.Exp(t[i].logit-mx) - comp
		s := sum + y
		comp = (s - sum) - y
		sum = s
	}
	return mx + math.Log(sum)
}

// TestTopLogprobs checks ids, order and values against a full sort and a compensated float64
// log-sum-exp. Tolerance 1e-6: LogSumExp's exponentials are float32, each within a few ulp
// (2^-24 ≈ 6e-8) of e^x, so their sum is within a few times 6e-8 relative and its log within
// that absolute; the float64 summation adds at most n·2^-53 ≈ 2e-11.
func TestTopLogprobs(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{1, 2, 19, 20, 21, 999, 32000, 151936} {
		for _, offset := range []float64{0, -300, 5000} { // large offsets overflow a naive exp
			l := randLogits(r, n, 3, n%2 == 1)
			for i := range l {
				l[i] += float32(offset)
			}
			if n > 1 {
				l[r.IntN(n)] = float32(math.Inf(-1))
			}
			ref := refSorted(l)
			lse := refLogSumExp(l)
			for _, k := range []int{0, 1, 5, 20, n + 3} {
				got := TopLogprobs(l, k, nil)
				want := min(k, n) // a -Inf token is listed, with log-probability -Inf
				if len(got) != want {
					t.Fatalf("n=%d k=%d: %d results, want %d", n, k, len(got), want)
				}
				for i, g := range got {
					if i >= len(ref) {
						if !math.IsInf(g.Logprob, -1) {
							t.Fatalf("n=%d k=%d: result %d = %+v, want a -Inf token", n, k, i, g)
						}
						continue
					}
					w := ref[i].logit - lse
					if g.ID != ref[i].id || math.Abs(g.Logprob-w) > 1e-6 {
						t.Fatalf("n=%d offset %v k=%d rank %d: got %+v, want {%d %v}", n, offset, k, i, g, ref[i].id, w)
					}
				}
			}
			id := ref[len(ref)/2].id
			if g, w := Logprob(l, id), float64(l[id])-lse; math.Abs(g-w) > 1e-6 {
				t.Fatalf("n=%d: Logprob(%d) = %v, want %v", n, id, g, w)
			}
			// Logprobs is the two calls above in one pass, bit for bit.
			lp, top := Logprobs(l, id, 5, nil)
			if lp != Logprob(l, id) || !slices.Equal(top, TopLogprobs(l, 5, nil)) {
				t.Fatalf("n=%d: Logprobs disagrees with Logprob and TopLogprobs", n)
			}
		}
	}
	// The probabilities of a distribution sum to one (within the float32 exponentials' error).
	l := randLogits(r, 5000, 4, false)
	var total float64
	for _, x := range TopLogprobs(l, 5000, nil) {
		total += math.Exp(x.Logprob)
	}
	if math.Abs(total-1) > 1e-6 {
		t.Errorf("probabilities sum to %v", total)
	}
}

func TestLogprobEdges(t *testing.T) {
	inf := float32(math.Inf(1))
	if v := Logprob([]float32{1, 2}, 2); !math.IsNaN(v) {
		t.Errorf("Logprob out of range = %v, want NaN", v)
	}
	if v := Logprob([]float32{1, 2}, -1); !math.IsNaN(v) {
		t.Errorf("Logprob(-1) = %v, want NaN", v)
	}
	if v, top := Logprobs([]float32{1, 2}, 7, 1, nil); !math.IsNaN(v) || len(top) != 1 || top[0].ID != 1 {
		t.Errorf("Logprobs(id 7) = %v, %+v", v, top)
	}
	if v := LogSumExp(nil); !math.IsInf(v, -1) {
		t.Errorf("LogSumExp(nil) = %v, want -Inf", v)
	}
	if v := LogSumExp([]float32{-inf, -inf}); !math.IsInf(v, -1) {
		t.Errorf("LogSumExp(-Inf...) = %v, want -Inf", v)
	}
	if v := LogSumExp([]float32{1, float32(math.NaN())}); !math.IsNaN(v) {
		t.Errorf("LogSumExp with NaN = %v, want NaN", v)
	}
	if v := LogSumExp([]float32{0, 0, 0, 0}); math.Abs(v-math.Log(4)) > 1e-12 {
		t.Errorf("LogSumExp(0,0,0,0) = %v, want log 4", v)
	}
	got := TopLogprobs([]float32{float32(math.NaN()), 3, 3, 1}, 3, nil)
	if len(got) != 3 || got[0].ID != 1 || got[1].ID != 2 || got[2].ID != 3 {
		t.Errorf("TopLogprobs skipping NaN, ties to lower id: got %+v", got)
	}
	if got := TopLogprobs([]float32{1, 2}, -3, nil); len(got) != 0 {
		t.Errorf("TopLogprobs(n=-3) = %+v", got)
	}
}
