package decode

import (
	"math"
	"math/rand/v2"
	"sort"
)

// randLogits returns n logits drawn from N(0, scale²); with ties set, values are rounded to
// quarters so that many tokens share a logit.
func randLogits(r *rand.Rand, n int, scale float64, ties bool) []float32 {
	l := make([]float32, n)
	for i := range l {
		v := r.NormFloat64() * scale
		if ties {
			v = math.Round(v*4) / 4
		}
		l[i] = float32(v)
	}
	return l
}

type refTok struct {
	id    int32
	logit float64
}

// refSorted returns every token whose logit is not -Inf, best first (logit descending, id
// ascending), by a full sort.
func refSorted(logits []float32) []refTok {
	var t []refTok
	for i, v := range logits {
		if !math.IsInf(float64(v), -1) {
			t = append(t, refTok{int32(i), float64(v)})
		}
	}
	sort.Slice(t, func(a, b int) bool {
		if t[a].logit != t[b].logit {
			return t[a].logit > t[b].logit
		}
		return t[a].id < t[b].id
	})
	return t
}

// refSoftmax returns softmax(logit/temp) of t in float64, with Kahan summation.
func refSoftmax(t []refTok, temp float64) []float64 {
	mx := math.Inf(-1)
	for _, x := range t {
		mx = max(mx, x.logit)
	}
	p := make([]float64, len(t))
	var sum, comp float64
	for i, x := range t {
		p[i] = math.Exp((x.logit - mx) / temp)
		y := p[i] - comp
		s := sum + y
		comp = (s - sum) - y
		sum = s
	}
	for i := range p {
		p[i] /= sum
	}
	return p
}

// refFilter applies top-k, top-p and min-p to logits the way the Params document them, by
// brute force. ambiguous is set when the top-p cut lies so close to TopP that summation order
// could move it.
func refFilter(logits []float32, p Params) (kept []refTok, ambiguous bool) {
	t := refSorted(logits)
	if p.TopK > 0 && p.TopK < len(t) {
		t = t[:p.TopK]
	}
	if p.TopP < 1 {
		pr := refSoftmax(t, 1)
		cum := 0.0
		cut := len(t)
		for i := range t {
			cum += pr[i]
			if math.Abs(cum-float64(p.TopP)) < 1e-9 {
				ambiguous = true
			}
			if cum >= float64(p.TopP) {
				cut = i + 1
				break
			}
		}
		t = t[:cut]
	}
	if p.MinP > 0 {
		lim := math.Log(float64(p.MinP))
		n := 0
		for _, x := range t {
			if x.logit-t[0].logit >= lim {
				n++
			}
		}
		t = t[:n]
	}
	return t, ambiguous
}

// history is what a reference needs to know about accepted tokens.
type history struct {
	all []int32 // prompt and generated, oldest first
	gen []int32 // generated only
}

// refAdjust applies bias, repetition penalty and presence/frequency penalties to a float64
// copy of logits, straight from the documented formulas.
func refAdjust(logits []float32, p Params, h history) []float64 {
	out := make([]float64, len(logits))
	for i, v := range logits {
		out[i] = float64(v)
	}
	for id, b := range p.LogitBias {
		out[id] += float64(b)
	}
	if p.RepeatPenalty != 1 && p.RepeatLastN > 0 {
		win := h.all
		if len(win) > p.RepeatLastN {
			win = win[len(win)-p.RepeatLastN:]
		}
		seen := map[int32]bool{}
		for _, id := range win {
			if seen[id] {
				continue
			}
			seen[id] = true
			if out[id] > 0 {
				out[id] /= float64(p.RepeatPenalty)
			} else {
				out[id] *= float64(p.RepeatPenalty)
			}
		}
	}
	count := map[int32]int{}
	for _, id := range h.gen {
		count[id]++
	}
	for id, c := range count {
		out[id] -= float64(p.FrequencyPenalty)*float64(c) + float64(p.PresencePenalty)
	}
	return out
}
