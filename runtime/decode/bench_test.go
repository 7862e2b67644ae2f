package decode

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkSample steps one Sampler over rotating logit rows shaped like a language model's
// (N(0, 2²) noise), reporting samples/s and the logit bandwidth scanned (4 bytes per entry).
func BenchmarkSample(b *testing.B) {
	configs := []struct {
		name string
		p    Params
	}{
		{"greedy", Params{Temperature: 0, TopP: 1, RepeatPenalty: 1}},
		{"topk40-topp0.9-temp0.8", Params{Temperature: 0.8, TopK: 40, TopP: 0.9, RepeatPenalty: 1, Seed: 1}},
		{"default+penalties", func() Params {
			p := DefaultParams()
			p.RepeatPenalty, p.PresencePenalty, p.FrequencyPenalty = 1.1, 0.3, 0.2
			return p
		}()},
		{"full-vocab-temp1", Params{Temperature: 1, TopP: 1, RepeatPenalty: 1, Seed: 1}},
		{"topp0.9-temp0.7", Params{Temperature: 0.7, TopP: 0.9, RepeatPenalty: 1, Seed: 1}},
	}
	for _, vocab := range []int{32000, 151936} {
		r := rand.New(rand.NewPCG(1, uint64(vocab)))
		rows := make([][]float32, 4)
		for i := range rows {
			rows[i] = randLogits(r, vocab, 2, false)
		}
		for _, c := range configs {
			b.Run(fmt.Sprintf("%s/vocab=%d", c.name, vocab), func(b *testing.B) {
				s, err := NewSampler(c.p, vocab)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.SetBytes(int64(4 * vocab))
				i := 0
				for b.Loop() {
					id, err := s.Sample(rows[i&3])
					if err != nil {
						b.Fatal(err)
					}
					s.Accept(id)
					i++
				}
				b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "samples/s")
			})
		}
	}
}

func BenchmarkTopLogprobs(b *testing.B) {
	for _, vocab := range []int{32000, 151936} {
		r := rand.New(rand.NewPCG(2, uint64(vocab)))
		l := randLogits(r, vocab, 2, false)
		dst := make([]TokenLogprob, 0, MaxTopLogprobs)
		b.Run(fmt.Sprintf("n=20/vocab=%d", vocab), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(4 * vocab))
			for b.Loop() {
				dst = TopLogprobs(l, MaxTopLogprobs, dst)
			}
		})
	}
}

func BenchmarkStopperPush(b *testing.B) {
	s, _ := NewStopper(StopConfig{VocabSize: 100, EOG: []int32{2}, Stop: []string{"</answer>", "\n\nUser:"}})
	pieces := []string{"The", " answer", " is", " <", "/", "ans", "wer", "?", " no", "\n", "x", "\xe6\x97", "\xa5"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Push(10, pieces[i%len(pieces)])
		i++
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkSampleMasked is BenchmarkSample's greedy and default configurations with a grammar's
// mask applied: "sparse" allows 1% of the vocabulary (a JSON structural position), "dense" 99%
// (inside a JSON string). The difference from BenchmarkSample is the cost of the mask.
func BenchmarkSampleMasked(b *testing.B) {
	configs := []struct {
		name string
		p    Params
	}{
		{"greedy", Params{Temperature: 0, TopP: 1, RepeatPenalty: 1}},
		{"default", DefaultParams()},
	}
	for _, vocab := range []int{32000, 151936} {
		r := rand.New(rand.NewPCG(1, uint64(vocab)))
		rows := make([][]float32, 4)
		for i := range rows {
			rows[i] = randLogits(r, vocab, 2, false)
		}
		for _, density := range []struct {
			name string
			p    float64
		}{{"sparse", 0.01}, {"dense", 0.99}} {
			m := randMask(r, vocab, density.p)
			for _, c := range configs {
				b.Run(fmt.Sprintf("%s/%s/vocab=%d", c.name, density.name, vocab), func(b *testing.B) {
					s, err := NewSampler(c.p, vocab)
					if err != nil {
						b.Fatal(err)
					}
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						id, err := s.SampleMasked(rows[i&3], m)
						if err != nil {
							b.Fatal(err)
						}
						s.Accept(id)
						i++
					}
					b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "samples/s")
				})
			}
		}
	}
}

// BenchmarkTDTBeam measures the beam search's own work per round (row normalisers, top-k,
// merging, selection, slot and history bookkeeping, Stable) on random joint rows of
// Parakeet-TDT-0.6b-v2's width (1024 tokens, the blank, 5 durations), against the greedy rule
// on the same rows. ns/frame divides by the encoder frames the search moved over; a joint call
// at this shape costs about 0.1 ms on a 2-thread CPU (reference/asr-transducer §8).
func BenchmarkTDTBeam(b *testing.B) {
	for _, w := range []int{1, 4, 8} {
		b.Run(fmt.Sprintf("width=%d/vocab=1024", w), func(b *testing.B) {
			r := newRandRounds(w, 1024, []int{0, 1, 2, 3, 4}, 10)
			for range 100 {
				r.round()
			}
			f0, n0, rows := r.s.t, r.rounds, 0
			b.ReportAllocs()
			for b.Loop() {
				rows += len(r.s.Joints())
				r.round()
			}
			frames := float64(r.s.t - f0)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/frames, "ns/frame")
			b.ReportMetric(float64(rows)/float64(r.rounds-n0), "rows/round")
			b.ReportMetric(float64(rows)/frames, "rows/frame")
		})
	}
	b.Run("greedy/vocab=1024", func(b *testing.B) {
		r := newRandRounds(1, 1024, []int{0, 1, 2, 3, 4}, 10)
		rule := r.s.Config().Rule
		s := TDTState{}
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			if _, err := rule.Step(&s, r.rows[i%len(r.rows)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(s.Frame), "ns/frame")
	})
}
