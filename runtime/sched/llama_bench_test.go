package sched_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/sched"
)

// BenchmarkDecode measures greedy generation on stories260K, whose steps are short enough (tens
// of microseconds on a CPU) for the scheduler's own cost to show: "context" is the plainest loop
// over llama.Context (a token a step for each sequence, chosen where the logits are), the
// baseline; "scheduler" runs the same requests through a Scheduler stepped by hand, as `parley
// generate` and `parley bench` run them (admission, batch building, sampler and stopper,
// events). An op is one generation of 64 tokens from a one-token prompt for each of the seqs
// sequences, request setup included.
//
//	go test ./runtime/sched -run '^$' -bench Decode
func BenchmarkDecode(b *testing.B) {
	const gen = 64
	be := sharedtest.Backend(b, "cpu", 0)
	m, err := models.OpenLLM(sharedtest.Path(b, "models/llm/stories260K-f32.gguf"), be)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	c, err := m.Model.NewContext(llama.ContextConfig{StepTokens: 16, MaxSeqs: 4, KVSlots: 4 * 128})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, seqs := range []int{1, 4} {
		b.Run(fmt.Sprintf("context/seqs=%d", seqs), func(b *testing.B) {
			var bb kvcache.BatchBuilder
			toks, next, rows := make([]int32, seqs), make([]int32, seqs), make([]int32, seqs)
			kv := make([]*kvcache.Seq, seqs)
			for range b.N {
				for i := range kv {
					kv[i] = c.Pool().NewSeq(gen)
					toks[i], rows[i] = int32(5+i), int32(i)
				}
				for range gen {
					bb.Reset()
					for _, s := range kv {
						if err := s.Reserve(1); err != nil {
							b.Fatal(err)
						}
						if err := bb.Add(s, 1); err != nil {
							b.Fatal(err)
						}
					}
					if err := c.ForwardPick(toks, bb.Batch(), nil, nil, rows, next); err != nil {
						b.Fatal(err)
					}
					for i, s := range kv {
						if toks[i] = next[i]; toks[i] < 0 {
							b.Fatal(backend.ErrNoArgmax)
						}
						if err := s.Advance(1); err != nil {
							b.Fatal(err)
						}
					}
				}
				for _, s := range kv {
					s.Release()
				}
			}
			b.ReportMetric(float64(b.N*gen*seqs)/b.Elapsed().Seconds(), "tokens/s")
		})
		b.Run(fmt.Sprintf("scheduler/seqs=%d", seqs), func(b *testing.B) {
			s, err := sched.New(sched.NewLlamaModel(c), m.Text(), sched.Config{MaxActive: seqs, MaxQueue: seqs})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			sp := decode.DefaultParams()
			sp.Temperature = 0
			sts := make([]*sched.Stream, seqs)
			done := make([]bool, seqs)
			for range b.N {
				for i := range sts {
					if sts[i], err = s.Submit(context.Background(), &sched.Request{Prompt: []int32{int32(5 + i)}, MaxTokens: gen, Sampling: sp, IgnoreEOS: true}); err != nil {
						b.Fatal(err)
					}
					done[i] = false
				}
				for ended := 0; ended < seqs; {
					if !s.Step() {
						b.Fatal("nothing to run")
					}
					for i, st := range sts {
						for !done[i] && st.Ready() {
							if _, err := st.Next(context.Background()); err == io.EOF {
								done[i] = true
								ended++
							}
						}
					}
				}
			}
			b.ReportMetric(float64(b.N*gen*seqs)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
