package decode

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	mod := func(f func(*Params)) Params {
		p := DefaultParams()
		f(&p)
		return p
	}
	bad := []struct {
		name  string
		p     Params
		vocab int
		want  string
	}{
		{"zero vocab", DefaultParams(), 0, "vocabulary size 0"},
		{"huge vocab", DefaultParams(), MaxVocab + 1, "vocabulary size"},
		{"nan temperature", mod(func(p *Params) { p.Temperature = nan }), 10, "temperature is NaN"},
		{"inf temperature", mod(func(p *Params) { p.Temperature = inf }), 10, "temperature is +Inf"},
		{"zero top_p", mod(func(p *Params) { p.TopP = 0 }), 10, "top_p 0 outside (0, 1]"},
		{"top_p above 1", mod(func(p *Params) { p.TopP = 1.5 }), 10, "top_p 1.5"},
		{"nan top_p", mod(func(p *Params) { p.TopP = nan }), 10, "top_p NaN"},
		{"negative min_p", mod(func(p *Params) { p.MinP = -0.1 }), 10, "min_p -0.1"},
		{"nan min_p", mod(func(p *Params) { p.MinP = nan }), 10, "min_p NaN"},
		{"zero repeat", mod(func(p *Params) { p.RepeatPenalty = 0 }), 10, "repeat_penalty 0 outside [0.01, 100]"},
		{"tiny repeat", mod(func(p *Params) { p.RepeatPenalty = 1e-45 }), 10, "repeat_penalty 1e-45 outside"},
		{"huge repeat", mod(func(p *Params) { p.RepeatPenalty = 1e3 }), 10, "repeat_penalty 1000 outside"},
		{"huge frequency", mod(func(p *Params) { p.FrequencyPenalty = -3e38 }), 10, "frequency_penalty -3e+38 outside"},
		{"nan repeat", mod(func(p *Params) { p.RepeatPenalty = nan }), 10, "repeat_penalty is NaN"},
		{"window -1", mod(func(p *Params) { p.RepeatLastN = -1 }), 10, "repeat_last_n -1"},
		{"window huge", mod(func(p *Params) { p.RepeatLastN = MaxRepeatLastN + 1 }), 10, "repeat_last_n"},
		{"nan presence", mod(func(p *Params) { p.PresencePenalty = nan }), 10, "presence_penalty NaN outside"},
		{"inf frequency", mod(func(p *Params) { p.FrequencyPenalty = -inf }), 10, "frequency_penalty -Inf outside"},
		{"bias id high", mod(func(p *Params) { p.LogitBias = map[int32]float32{10: 1} }), 10, "logit_bias token 10 outside"},
		{"bias id negative", mod(func(p *Params) { p.LogitBias = map[int32]float32{-1: 1} }), 10, "logit_bias token -1"},
		{"bias nan", mod(func(p *Params) { p.LogitBias = map[int32]float32{3: nan} }), 10, "logit_bias for token 3 is NaN"},
		{"bias +inf", mod(func(p *Params) { p.LogitBias = map[int32]float32{3: inf} }), 10, "logit_bias for token 3 is +Inf"},
		{"top_logprobs 21", mod(func(p *Params) { p.TopLogprobs = 21 }), 10, "top_logprobs 21"},
		{"top_logprobs -1", mod(func(p *Params) { p.TopLogprobs = -1 }), 10, "top_logprobs -1"},
	}
	for _, c := range bad {
		_, err := NewSampler(c.p, c.vocab)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	good := []Params{
		DefaultParams(),
		mod(func(p *Params) { p.Temperature = -1 }), // negative temperature: greedy
		mod(func(p *Params) { p.TopK = -5 }),        // negative top-k: off
		mod(func(p *Params) { p.TopK = 1000 }),      // top-k above the vocabulary: off
		mod(func(p *Params) { p.TopP = 1; p.MinP = 1 }),
		mod(func(p *Params) { p.LogitBias = map[int32]float32{0: float32(math.Inf(-1)), 9: -3} }),
		mod(func(p *Params) { p.RepeatLastN = 0; p.RepeatPenalty = 1.3 }),
		mod(func(p *Params) { p.PresencePenalty = -2; p.FrequencyPenalty = 2; p.TopLogprobs = 20 }),
	}
	for i, p := range good {
		if _, err := NewSampler(p, 10); err != nil {
			t.Errorf("good params %d: %v", i, err)
		}
	}
	if p := mod(func(p *Params) { p.Temperature = -1 }); !p.Greedy() {
		t.Errorf("negative temperature is not greedy")
	}
}

func refArgmax(l []float64) int32 {
	best := 0
	for i, v := range l {
		if v > l[best] {
			best = i
		}
	}
	return int32(best)
}

// TestGreedy checks greedy decoding against the argmax of the reference-adjusted logits, with
// ties (lowest id wins), bias and penalties.
func TestGreedy(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 7, 257, 5003} {
		for trial := 0; trial < 20; trial++ {
			p := DefaultParams()
			p.Temperature = 0
			if trial%2 == 1 {
				p.RepeatPenalty = 1.3
				p.RepeatLastN = 16
				p.PresencePenalty = 0.4
				p.FrequencyPenalty = 0.3
				p.LogitBias = map[int32]float32{int32(r.IntN(n)): 2, int32(r.IntN(n)): -1.5}
			}
			s, err := NewSampler(p, n)
			if err != nil {
				t.Fatal(err)
			}
			var h history
			for step := 0; step < 30; step++ {
				l := randLogits(r, n, 2, true)
				want := refArgmax(refAdjust(l, p, h))
				got, err := s.Sample(l)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("n=%d trial %d step %d: greedy chose %d, reference argmax %d", n, trial, step, got, want)
				}
				if err := s.Accept(got); err != nil {
					t.Fatal(err)
				}
				h.all = append(h.all, got)
				h.gen = append(h.gen, got)
			}
		}
	}
}

// TestPenalties compares the adjusted logits with a direct float64 reference. The Sampler
// works in float32 like llama.cpp: at most three roundings (bias add, penalty divide or
// multiply, penalty subtract) of 2^-24 relative each, so 1e-6 of max(1, |logit|) is ample.
func TestPenalties(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n = 301
	for trial := 0; trial < 40; trial++ {
		p := Params{
			Temperature:      0.7,
			TopP:             1,
			RepeatPenalty:    []float32{1, 1.1, 1.5, 0.8}[trial%4],
			RepeatLastN:      []int{0, 1, 8, 64}[(trial/4)%4],
			PresencePenalty:  []float32{0, 0.5, -0.3}[trial%3],
			FrequencyPenalty: []float32{0, 0.25, 1}[(trial/3)%3],
			LogitBias:        map[int32]float32{},
		}
		for k := 0; k < trial%5; k++ {
			p.LogitBias[int32(r.IntN(n))] = float32(r.NormFloat64() * 3)
		}
		if trial%7 == 0 {
			p.LogitBias[int32(r.IntN(n))] = float32(math.Inf(-1))
		}
		s, err := NewSampler(p, n)
		if err != nil {
			t.Fatal(err)
		}
		var h history
		prompt := make([]int32, r.IntN(40))
		for i := range prompt {
			prompt[i] = int32(r.IntN(30)) // a small range so that tokens repeat
		}
		if err := s.AcceptPrompt(prompt); err != nil {
			t.Fatal(err)
		}
		h.all = append(h.all, prompt...)
		for step := 0; step < 50; step++ {
			l := randLogits(r, n, 3, step%2 == 0)
			orig := slices.Clone(l)
			want := refAdjust(l, p, h)
			s.adjust(l)
			for i := range l {
				tol := 1e-6 * max(1, math.Abs(want[i]))
				if d := math.Abs(float64(l[i]) - want[i]); !(d <= tol) && !(math.IsInf(want[i], -1) && math.IsInf(float64(l[i]), -1)) {
					t.Fatalf("trial %d step %d token %d: adjusted %v, reference %v", trial, step, i, l[i], want[i])
				}
			}
			s.restore(l)
			for i := range l {
				if math.Float32bits(l[i]) != math.Float32bits(orig[i]) {
					t.Fatalf("trial %d step %d token %d: restored %v, was %v", trial, step, i, l[i], orig[i])
				}
			}
			id := int32(r.IntN(30))
			if err := s.Accept(id); err != nil {
				t.Fatal(err)
			}
			h.all = append(h.all, id)
			h.gen = append(h.gen, id)
		}
	}
}

// TestFilter compares the candidates left by top-k, top-p and min-p with a brute-force full
// sort in float64, on logits with ties and banned tokens.
func TestFilter(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	checked, skipped := 0, 0
	for _, n := range []int{1, 3, 41, 300, 1001, 5003} {
		for _, k := range []int{0, 1, 5, 40, 2000} {
			for _, tp := range []float32{1, 0.3, 0.9, 0.99} {
				for _, mp := range []float32{0, 0.05, 0.3} {
					p := Params{Temperature: 1, TopK: k, TopP: tp, MinP: mp, RepeatPenalty: 1}
					s, err := NewSampler(p, n)
					if err != nil {
						t.Fatal(err)
					}
					for trial := 0; trial < 3; trial++ {
						l := randLogits(r, n, []float64{0.5, 2, 6}[trial], trial != 1)
						for b := 0; b < n/10; b++ {
							l[r.IntN(n)] = float32(math.Inf(-1))
						}
						l[r.IntN(n)] = 1 // at least one selectable token
						want, amb := refFilter(l, p)
						if amb {
							skipped++
							continue
						}
						got, err := s.filter(l)
						if err != nil {
							t.Fatal(err)
						}
						gi, wi := candIDs(got), refIDs(want)
						if k == 0 || k >= n {
							// without top-k the kept set need not be best-first (unsorted
							// path: id order; top-p past its first sort: buckets kept whole)
							slices.Sort(wi)
							slices.Sort(gi)
						}
						if !slices.Equal(gi, wi) {
							t.Fatalf("n=%d k=%d top_p=%v min_p=%v trial %d:\n got  %v\n want %v", n, k, tp, mp, trial, gi, wi)
						}
						checked++
					}
				}
			}
		}
	}
	if skipped > checked/20 {
		t.Errorf("%d of %d cases skipped as ambiguous", skipped, checked+skipped)
	}
}

// chiSquare returns the chi-square statistic of counts against probabilities probs over total
// draws, pooling cells whose expected count is below 5, and the degrees of freedom.
func chiSquare(counts []int, probs []float64, total int) (float64, int) {
	var x2, poolE, poolO float64
	cells := 0
	for i, p := range probs {
		e := p * float64(total)
		if e < 5 {
			poolE += e
			poolO += float64(counts[i])
			continue
		}
		d := float64(counts[i]) - e
		x2 += d * d / e
		cells++
	}
	if poolE > 0 {
		d := poolO - poolE
		x2 += d * d / max(poolE, 1)
		cells++
	}
	return x2, cells - 1
}

// chiSquareCrit is the 0.999 quantile of the chi-square distribution (Wilson–Hilferty
// approximation, accurate to a few percent for df >= 3; the bound is loose on purpose).
func chiSquareCrit(df int) float64 {
	const z = 3.090 // standard normal 0.999 quantile
	k := float64(df)
	a := 1 - 2/(9*k) + z*math.Sqrt(2/(9*k))
	return k * a * a * a
}

// TestDistribution draws 20,000 tokens with a fixed seed and checks the frequencies against
// the reference softmax (after filtering and temperature) with a chi-square test at the 0.1%
// level. The seed is fixed, so the outcome is deterministic.
func TestDistribution(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	cases := []Params{
		{Temperature: 1, TopP: 1, RepeatPenalty: 1, Seed: 11},
		{Temperature: 0.7, TopK: 12, TopP: 0.9, RepeatPenalty: 1, Seed: 12},
		{Temperature: 1.5, TopP: 0.95, MinP: 0.02, RepeatPenalty: 1, Seed: 13},
	}
	const n, draws = 40, 20000
	for ci, p := range cases {
		l := randLogits(r, n, 1.5, false)
		s, err := NewSampler(p, n)
		if err != nil {
			t.Fatal(err)
		}
		kept, amb := refFilter(l, p)
		if amb {
			t.Fatalf("case %d: ambiguous top-p cut; change the seed", ci)
		}
		pr := refSoftmax(kept, float64(p.Temperature))
		probs := make([]float64, n)
		for i, k := range kept {
			probs[k.id] = pr[i]
		}
		counts := make([]int, n)
		for i := 0; i < draws; i++ {
			id, err := s.Sample(l)
			if err != nil {
				t.Fatal(err)
			}
			counts[id]++
		}
		for id, c := range counts {
			if c > 0 && probs[id] == 0 {
				t.Fatalf("case %d: token %d drawn %d times but filtered out", ci, id, c)
			}
		}
		x2, df := chiSquare(counts, probs, draws)
		if crit := chiSquareCrit(df); x2 > crit {
			t.Errorf("case %d: chi-square %.1f over %d df exceeds %.1f", ci, x2, df, crit)
		}
		// The test has power: the same counts reject a temperature 20% off.
		wrong := refSoftmax(kept, 1.2*float64(p.Temperature))
		for i, k := range kept {
			probs[k.id] = wrong[i]
		}
		if x2w, dfw := chiSquare(counts, probs, draws); x2w <= chiSquareCrit(dfw) {
			t.Errorf("case %d: chi-square %.1f against a wrong temperature passes", ci, x2w)
		}
	}
}

func TestSeeds(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const n = 1000
	rows := make([][]float32, 100)
	for i := range rows {
		rows[i] = randLogits(r, n, 1, false)
	}
	run := func(s *Sampler) []int32 {
		var out []int32
		for _, l := range rows {
			id, err := s.Sample(l)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, id)
			if err := s.Accept(id); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	p := DefaultParams()
	p.TopK = 0
	p.MinP = 0
	p.Temperature = 1.2
	p.RepeatPenalty = 1.1
	p.FrequencyPenalty = 0.2
	p.Seed = 42
	a, _ := NewSampler(p, n)
	b, _ := NewSampler(p, n)
	sa, sb := run(a), run(b)
	if !slices.Equal(sa, sb) {
		t.Fatalf("same seed, different tokens:\n%v\n%v", sa, sb)
	}
	a.Reset()
	if again := run(a); !slices.Equal(sa, again) {
		t.Fatalf("after Reset, different tokens:\n%v\n%v", sa, again)
	}
	p.Seed = 43
	c, _ := NewSampler(p, n)
	if sc := run(c); slices.Equal(sa, sc) {
		t.Fatalf("seeds 42 and 43 gave the same 100 tokens")
	}
}

func TestSampleLeavesLogits(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	const n = 777
	for _, temp := range []float32{0, 0.9} {
		p := DefaultParams()
		p.Temperature = temp
		p.RepeatPenalty = 1.2
		p.PresencePenalty = 0.5
		p.LogitBias = map[int32]float32{5: 3, 6: float32(math.Inf(-1))}
		s, _ := NewSampler(p, n)
		for step := 0; step < 50; step++ {
			l := randLogits(r, n, 2, true)
			orig := slices.Clone(l)
			id, err := s.Sample(l)
			if err != nil {
				t.Fatal(err)
			}
			if id == 6 {
				t.Fatalf("banned token drawn")
			}
			for i := range l {
				if math.Float32bits(l[i]) != math.Float32bits(orig[i]) {
					t.Fatalf("temp %v step %d: logit %d changed from %v to %v", temp, step, i, orig[i], l[i])
				}
			}
			s.Accept(id)
			s.Accept(5)
		}
	}
}

func TestSampleErrors(t *testing.T) {
	for _, temp := range []float32{0, 1} {
		p := DefaultParams()
		p.Temperature = temp
		s, _ := NewSampler(p, 4)
		cases := []struct {
			l    []float32
			want string
		}{
			{[]float32{1, 2, 3}, "3 logits for a vocabulary of 4"},
			{[]float32{1, float32(math.NaN()), 3, 0}, "token 1 is NaN"},
			{[]float32{1, 2, float32(math.Inf(1)), 0}, "token 2 is +Inf"},
			{[]float32{float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1))}, "every token"},
		}
		for _, c := range cases {
			if _, err := s.Sample(c.l); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("temp %v, logits %v: error %v, want %q", temp, c.l, err, c.want)
			}
		}
		if err := s.Accept(4); err == nil {
			t.Errorf("Accept(4) with vocabulary 4: no error")
		}
		if err := s.AcceptPrompt([]int32{0, -1}); err == nil {
			t.Errorf("AcceptPrompt(-1): no error")
		}
		// Only one token left after bans: it must be chosen.
		inf := float32(math.Inf(-1))
		if id, err := s.Sample([]float32{inf, inf, -50, inf}); err != nil || id != 2 {
			t.Errorf("temp %v: single survivor: got %d, %v", temp, id, err)
		}
	}
}

// TestZeroAllocs checks that stepping a Sampler allocates nothing, in every configuration.
func TestZeroAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	const n = 32000
	l := randLogits(r, n, 2, false)
	configs := map[string]Params{
		"greedy":    {Temperature: 0, TopP: 1, RepeatPenalty: 1},
		"topk-topp": {Temperature: 0.8, TopK: 40, TopP: 0.9, RepeatPenalty: 1},
		"full-vocab": {Temperature: 0.8, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1.1, RepeatLastN: 64,
			PresencePenalty: 0.3, FrequencyPenalty: 0.2, LogitBias: map[int32]float32{1: 2, 2: float32(math.Inf(-1))}},
		"min-p only": {Temperature: 1, TopP: 1, MinP: 0.1, RepeatPenalty: 1},
	}
	for name, p := range configs {
		s, err := NewSampler(p, n)
		if err != nil {
			t.Fatal(err)
		}
		step := 0
		allocs := testing.AllocsPerRun(200, func() {
			id, err := s.Sample(l)
			if err != nil {
				t.Fatal(err)
			}
			s.Accept(id)
			s.Accept(int32(step % n)) // grows the distinct-token sets
			step += 97
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per step", name, allocs)
		}
		s.Reset()
		if allocs := testing.AllocsPerRun(10, func() { s.AcceptPrompt([]int32{1, 2, 3}); s.Reset() }); allocs != 0 {
			t.Errorf("%s: %v allocations per AcceptPrompt+Reset", name, allocs)
		}
	}
	dst := make([]TokenLogprob, 0, MaxTopLogprobs)
	if allocs := testing.AllocsPerRun(20, func() { dst = TopLogprobs(l, MaxTopLogprobs, dst) }); allocs != 0 {
		t.Errorf("TopLogprobs: %v allocations per call", allocs)
	}
	if allocs := testing.AllocsPerRun(20, func() { _, dst = Logprobs(l, 7, MaxTopLogprobs, dst) }); allocs != 0 {
		t.Errorf("Logprobs: %v allocations per call", allocs)
	}
}

// TestDrawAll checks the whole-vocabulary draw of samplers that filter nothing, and draw over the
// filtered candidates, against refDraw, a float64 draw: for the same u all pick the same token
// except where u·sum falls within float32 rounding of a boundary between two tokens (a few in
// 10^5); a token banned with -Inf is never picked, and the errors are filter's.
func TestDrawAll(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	differ, total := 0, 0
	for _, n := range []int{1, 2, 63, 64, 65, 1000, 32000} {
		for _, temp := range []float32{0.3, 1, 1.7} {
			p := Params{Temperature: temp, TopP: 1, RepeatPenalty: 1}
			s, err := NewSampler(p, n)
			if err != nil {
				t.Fatal(err)
			}
			if !s.plain {
				t.Fatalf("n=%d: a sampler that filters nothing has no whole-vocabulary draw", n)
			}
			l := randLogits(r, n, 2, false)
			for b := 0; b < n/5; b++ {
				l[r.IntN(n)] = float32(math.Inf(-1))
			}
			l[r.IntN(n)] = 1
			c, err := s.filter(l)
			if err != nil {
				t.Fatal(err)
			}
			rw := refWeights(l, temp)
			for i := 0; i < 2000; i++ {
				u := r.Float64()
				got, err := s.drawAll(l, u)
				if err != nil {
					t.Fatal(err)
				}
				if math.IsInf(float64(l[got]), -1) {
					t.Fatalf("n=%d temp %v u=%v: banned token %d drawn", n, temp, u, got)
				}
				want := refDraw(rw, u)
				if got != want {
					differ++
				}
				if s.draw(c, u) != want {
					differ++
				}
				total += 2
			}
		}
	}
	t.Logf("%d of %d draws differ from the float64 draw", differ, total)
	if differ > total/1000 {
		t.Errorf("%d of %d draws differ from the float64 draw", differ, total)
	}
	s, _ := NewSampler(Params{Temperature: 1, TopP: 1, RepeatPenalty: 1}, 4)
	inf := float32(math.Inf(1))
	for _, c := range []struct {
		l    []float32
		want string
	}{
		{[]float32{1, float32(math.NaN()), inf, 0}, "token 1 is NaN"},
		{[]float32{1, 2, inf, inf}, "token 2 is +Inf"},
		{[]float32{-inf, -inf, -inf, -inf}, "every token"},
	} {
		if _, err := s.Sample(c.l); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("logits %v: error %v, want %q", c.l, err, c.want)
		}
	}
	if id, err := s.Sample([]float32{-inf, -inf, -50, -inf}); err != nil || id != 2 {
		t.Errorf("single survivor: got %d, %v", id, err)
	}
}

// TestTopPLargeVocab: top-p without top-k over a vocabulary's worth of flat and peaked logits,
// where the cut lies past the first sort and the bucketed path finds it, keeps exactly the
// reference's best-first prefix (as a set: that path does not sort it).
func TestTopPLargeVocab(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	for _, n := range []int{32000, 151936} {
		for _, scale := range []float64{0.3, 1, 3} {
			for _, tp := range []float32{0.5, 0.9, 0.99} {
				p := Params{Temperature: 1, TopP: tp, RepeatPenalty: 1}
				s, err := NewSampler(p, n)
				if err != nil {
					t.Fatal(err)
				}
				l := randLogits(r, n, scale, scale == 1)
				want, amb := refFilter(l, p)
				if amb {
					continue
				}
				got, err := s.filter(l)
				if err != nil {
					t.Fatal(err)
				}
				gi, wi := candIDs(got), refIDs(want)
				slices.Sort(gi)
				slices.Sort(wi)
				if !slices.Equal(gi, wi) {
					t.Fatalf("n=%d scale %v top_p %v: kept %d tokens, want %d", n, scale, tp, len(gi), len(wi))
				}
			}
		}
	}
}

// candIDs and refIDs list the ids of candidates and of reference tokens, in order.
func candIDs(c []candidate) []int32 {
	ids := make([]int32, len(c))
	for i, x := range c {
		ids[i] = x.id
	}
	return ids
}

func refIDs(t []refTok) []int32 {
	ids := make([]int32, len(t))
	for i, x := range t {
		ids[i] = x.id
	}
	return ids
}

// refWeights returns the float64 weights exp((logit - max)/temp) of logits, in id order.
func refWeights(logits []float32, temp float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = max(mx, float64(v))
	}
	w := make([]float64, len(logits))
	for i, v := range logits {
		w[i] = math.Exp((float64(v) - mx) / float64(temp))
	}
	return w
}

// refDraw picks token i with probability w[i]/Σw using u in [0, 1), summing and walking the
// weights in id order in float64.
func refDraw(w []float64, u float64) int32 {
	sum := 0.0
	for _, x := range w {
		sum += x
	}
	acc, target := 0.0, u*sum
	for i := range w {
		if acc += w[i]; acc > target {
			return int32(i)
		}
	}
	return int32(len(w) - 1)
}

// TestDrawable: a sampler may have a backend draw its tokens (Sampler.Drawable) when it samples
// without logit bias or penalties, with its temperature, top-k, top-p and min-p; and NextRandom
// consumes the one draw a Sample call consumes, so both keep the same random stream.
func TestDrawable(t *testing.T) {
	p := DefaultParams()
	p.Seed = 5
	s, err := NewSampler(p, 100)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := s.Drawable()
	if !ok || d.Temperature != p.Temperature || d.TopK != int32(p.TopK) || d.TopP != p.TopP || d.MinP != p.MinP || d.Random != 0 {
		t.Fatalf("Drawable() = %+v, %v for %+v", d, ok, p)
	}
	p.TopK = 1000 // past the vocabulary: off
	if s, _ := NewSampler(p, 100); s != nil {
		if d, _ := s.Drawable(); d.TopK != 0 {
			t.Errorf("top-k past the vocabulary: %d, want 0 (off)", d.TopK)
		}
	}
	for name, q := range map[string]func(*Params){
		"greedy":    func(p *Params) { p.Temperature = 0 },
		"bias":      func(p *Params) { p.LogitBias = map[int32]float32{3: 1} },
		"repeat":    func(p *Params) { p.RepeatPenalty = 1.1 },
		"presence":  func(p *Params) { p.PresencePenalty = 0.5 },
		"frequency": func(p *Params) { p.FrequencyPenalty = 0.5 },
	} {
		pp := DefaultParams()
		q(&pp)
		s, err := NewSampler(pp, 100)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Drawable(); ok {
			t.Errorf("%s: Drawable", name)
		}
	}
	a, _ := NewSampler(p, 100)
	b, _ := NewSampler(p, 100)
	logits := make([]float32, 100)
	for i := range logits {
		logits[i] = float32(i % 7)
	}
	a.NextRandom()
	if _, err := b.Sample(logits); err != nil {
		t.Fatal(err)
	}
	if x, y := a.NextRandom(), b.NextRandom(); x != y {
		t.Errorf("after one NextRandom and one Sample: %x and %x, want the same next draw", x, y)
	}
}
