package decode

import (
	"math"
	"math/rand/v2"
	"testing"
)

// randMask returns a mask over n tokens allowing each with probability p, and at least one.
func randMask(r *rand.Rand, n int, p float64) []uint64 {
	m := make([]uint64, (n+63)/64)
	for id := 0; id < n; id++ {
		if r.Float64() < p {
			m[id/64] |= 1 << (id % 64)
		}
	}
	id := r.IntN(n)
	m[id/64] |= 1 << (id % 64)
	return m
}

func maskHas(m []uint64, id int32) bool { return m[id/64]>>(id%64)&1 != 0 }

// maskedCopy is the reference for SampleMasked: the logits with -Inf where the mask is clear.
func maskedCopy(l []float32, m []uint64) []float32 {
	out := make([]float32, len(l))
	for i := range l {
		if maskHas(m, int32(i)) {
			out[i] = l[i]
		} else {
			out[i] = float32(math.Inf(-1))
		}
	}
	return out
}

// TestSampleMasked checks that SampleMasked is Sample over the masked logits for every sampler
// setting: two samplers built alike, one given the mask and one the masked logits by hand, draw
// the same tokens step after step (penalties, seeds and all), every token is allowed, and the
// caller's logits are left as they were.
func TestSampleMasked(t *testing.T) {
	bias := map[int32]float32{3: 2, 5: float32(math.Inf(-1)), 64: -1.5, 130: 4}
	configs := map[string]Params{
		"greedy":            {Temperature: 0, TopP: 1, RepeatPenalty: 1},
		"greedy+bias":       {Temperature: 0, TopP: 1, RepeatPenalty: 1, LogitBias: bias},
		"default":           DefaultParams(),
		"full-vocab":        {Temperature: 1, TopP: 1, RepeatPenalty: 1, Seed: 3},
		"topk":              {Temperature: 0.7, TopK: 10, TopP: 1, RepeatPenalty: 1, Seed: 4},
		"topp":              {Temperature: 1.2, TopP: 0.8, RepeatPenalty: 1, Seed: 5},
		"minp":              {Temperature: 0.9, TopP: 1, MinP: 0.1, RepeatPenalty: 1, Seed: 6},
		"penalties":         {Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1.3, RepeatLastN: 16, PresencePenalty: 0.5, FrequencyPenalty: 0.4, Seed: 7},
		"penalties+greedy":  {Temperature: 0, TopP: 1, RepeatPenalty: 1.5, RepeatLastN: 8, FrequencyPenalty: 1},
		"bias+topp+minp":    {Temperature: 0.6, TopP: 0.9, MinP: 0.02, RepeatPenalty: 1, LogitBias: bias, Seed: 8},
		"tiny-temperature":  {Temperature: 1e-6, TopP: 1, RepeatPenalty: 1, Seed: 9},
		"bias+penalty+topk": {Temperature: 1, TopK: 3, TopP: 1, RepeatPenalty: 2, RepeatLastN: 4, LogitBias: bias, Seed: 10},
	}
	const vocab = 300
	for name, p := range configs {
		for _, density := range []float64{0.02, 0.3, 0.9} {
			r := rand.New(rand.NewPCG(1, uint64(density*100)))
			a, err := NewSampler(p, vocab)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := NewSampler(p, vocab)
			a.AcceptPrompt([]int32{1, 2, 3, 130})
			b.AcceptPrompt([]int32{1, 2, 3, 130})
			for step := 0; step < 200; step++ {
				l := randLogits(r, vocab, 2, step%3 == 0)
				orig := append([]float32(nil), l...)
				m := randMask(r, vocab, density)
				m[5/64] |= 1 << 5 // a token the bias bans, allowed by the mask
				ref := maskedCopy(l, m)
				want, werr := b.Sample(ref)
				got, gerr := a.SampleMasked(l, m)
				if (werr != nil) != (gerr != nil) || got != want {
					t.Fatalf("%s density %v step %d: SampleMasked %d (%v), Sample of masked logits %d (%v)", name, density, step, got, gerr, want, werr)
				}
				for i := range l {
					if math.Float32bits(l[i]) != math.Float32bits(orig[i]) {
						t.Fatalf("%s: logit %d changed from %v to %v", name, i, orig[i], l[i])
					}
				}
				if gerr != nil {
					continue
				}
				if _, banned := p.LogitBias[got]; !maskHas(m, got) || banned && math.IsInf(float64(p.LogitBias[got]), -1) {
					t.Fatalf("%s density %v step %d: drew token %d, not allowed", name, density, step, got)
				}
				a.Accept(got)
				b.Accept(want)
			}
		}
	}
}

func TestSampleMaskedErrors(t *testing.T) {
	s, _ := NewSampler(DefaultParams(), 100)
	l := make([]float32, 100)
	if _, err := s.SampleMasked(l, make([]uint64, 1)); err == nil {
		t.Error("a mask one word short was accepted")
	}
	if _, err := s.SampleMasked(l[:99], make([]uint64, 2)); err == nil {
		t.Error("short logits accepted")
	}
	if _, err := s.SampleMasked(l, make([]uint64, 2)); err == nil {
		t.Error("an empty mask drew a token")
	}
	m := make([]uint64, 2)
	m[0] = 1 << 7
	l[7] = float32(math.Inf(-1))
	if _, err := s.SampleMasked(l, m); err == nil {
		t.Error("the only allowed token has logit -Inf, yet a token was drawn")
	}
	l[7] = 0
	m[1] = ^uint64(0) // bits past the vocabulary are ignored
	for i := 0; i < 50; i++ {
		if id, err := s.SampleMasked(l, m); err != nil || id < 64 && id != 7 {
			t.Fatalf("drew %d (%v)", id, err)
		}
	}
}

func TestSampleMaskedZeroAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for name, p := range map[string]Params{"greedy": {Temperature: 0, TopP: 1, RepeatPenalty: 1}, "default": DefaultParams()} {
		s, _ := NewSampler(p, 32000)
		l := randLogits(r, 32000, 2, false)
		m := randMask(r, 32000, 0.5)
		s.SampleMasked(l, m) // allocates the masked copy once
		if allocs := testing.AllocsPerRun(50, func() {
			id, err := s.SampleMasked(l, m)
			if err != nil {
				t.Fatal(err)
			}
			s.Accept(id)
		}); allocs != 0 {
			t.Errorf("%s: %v allocations per SampleMasked", name, allocs)
		}
	}
}
