package sched

import (
	"context"
	"io"
	"runtime"
	"testing"
)

// BenchmarkStep measures one scheduling step with 32 sequences decoding on the fake model (whose
// forward pass is a few microseconds), so that what is reported is the scheduler's own cost:
// allocs/op are per step and include the amortised cost of replacing finished requests.
// TopLogprobs 2 adds one allocation per 128 tokens of a sequence (its slab of alternatives).
func BenchmarkStep(b *testing.B) {
	b.Run("top0", func(b *testing.B) { benchStep(b, 0) })
	b.Run("top2", func(b *testing.B) { benchStep(b, 2) })
}

func benchStep(b *testing.B, top int) {
	const seqs, maxTokens = 32, 1000
	m := newFake(b, seqs*(16+maxTokens)/16+seqs, 16, 64, seqs)
	m.record = false
	s, err := New(m, fakeText{}, Config{StepTokens: 64, MaxActive: seqs, MaxQueue: seqs})
	if err != nil {
		b.Fatal(err)
	}
	sp := greedy()
	var streams []*Stream
	submit := func(i int) {
		st, err := s.Submit(nil, &Request{Prompt: prompt(int32(1+i%60), 8), MaxTokens: maxTokens, Sampling: sp, TopLogprobs: top})
		if err != nil {
			b.Fatal(err)
		}
		streams = append(streams, st)
	}
	for i := range seqs {
		submit(i)
	}
	for range 4 { // past the prompts
		s.loop.Step()
	}
	now, cancel := context.WithCancel(context.Background())
	cancel() // Next with now takes what is queued and does not wait
	b.ReportAllocs()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ResetTimer()
	toks := 0
	for i := 0; i < b.N; i++ {
		s.loop.Step()
		toks += int(s.loop.lastSeqs.Load())
		for j := 0; j < len(streams); j++ {
			st := streams[j]
		drain:
			for {
				_, err := st.Next(now)
				if err == io.EOF {
					streams = append(streams[:j], streams[j+1:]...)
					j--
					submit(i + j)
					break drain
				}
				if err != nil {
					break drain
				}
			}
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(b.N), "allocs/step")
	b.ReportMetric(float64(toks)/b.Elapsed().Seconds(), "tokens/s")
	s.Close()
}
