package llama_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// BenchmarkDecodeStep measures one steady-state single-sequence decode step (one token through
// the whole model, logits read back) on a synthetic model in the stories15M shape, per weight
// type and backend, reporting tokens/s and allocations per step (which must be zero).
func BenchmarkDecodeStep(b *testing.B) {
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.Q8_0, tensor.Q4_0, tensor.Q4_K} {
		f, err := llama.SynthFile(llama.Shapes["15M"], dt, 1)
		if err != nil {
			b.Fatal(err)
		}
		for _, name := range []string{"go", "cpu"} {
			be, _, err := backend.New(name, backend.Options{Threads: 2})
			if err != nil {
				continue
			}
			b.Run(fmt.Sprintf("15M/%v/%s", dt, name), func(b *testing.B) {
				defer be.Close()
				m, err := llama.Load(f, be)
				if err != nil {
					b.Fatal(err)
				}
				defer m.Close()
				c, err := m.NewContext(llama.ContextConfig{StepTokens: 1, MaxSeqs: 1, KVSlots: 256, KVType: tensor.F16})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				seq := c.Pool().NewSeq(256)
				var bb kvcache.BatchBuilder
				tok, out := []int32{1}, []int32{0}
				logits := make([]float32, m.Vocab)
				step := func() {
					if seq.Len() == 255 {
						seq.Release()
					}
					if err := seq.Reserve(1); err != nil {
						b.Fatal(err)
					}
					bb.Reset()
					if err := bb.Add(seq, 1); err != nil {
						b.Fatal(err)
					}
					if err := c.Forward(tok, bb.Batch(), out, logits); err != nil {
						b.Fatal(err)
					}
					if err := seq.Advance(1); err != nil {
						b.Fatal(err)
					}
					tok[0] = (tok[0]*7 + 3) % int32(m.Vocab)
				}
				for i := 0; i < 64; i++ { // warm up: views, pools, context length 64
					step()
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					step()
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}

// TestDecodeStepAllocatesNothing: a steady-state decode step of two sequences allocates nothing,
// on every backend, with both rows' logits handed over (Forward) or one row picked (ForwardPick).
func TestDecodeStepAllocatesNothing(t *testing.T) {
	f, err := llama.SynthFile(tinyShape, tensor.Q8_0, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := llama.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			c, err := m.NewContext(llama.ContextConfig{StepTokens: 2, MaxSeqs: 2, KVSlots: 64, KVType: tensor.F16})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			a, s := c.Pool().NewSeq(32), c.Pool().NewSeq(32)
			var bb kvcache.BatchBuilder
			toks, out := []int32{1, 2}, []int32{0, 1}
			logits := make([]float32, 2*m.Vocab)
			ids := make([]int32, 1)
			pick := false
			step := func() {
				if a.Len() >= 30 {
					a.Release()
					s.Release()
				}
				bb.Reset()
				for _, q := range []*kvcache.Seq{a, s} {
					if err := q.Reserve(1); err != nil {
						t.Fatal(err)
					}
					if err := bb.Add(q, 1); err != nil {
						t.Fatal(err)
					}
				}
				var err error
				if pick {
					err = c.ForwardPick(toks, bb.Batch(), out[:1], logits[:m.Vocab], out[1:], ids)
				} else {
					err = c.Forward(toks, bb.Batch(), out, logits)
				}
				if err != nil {
					t.Fatal(err)
				}
				_ = a.Advance(1)
				_ = s.Advance(1)
			}
			for _, pick = range []bool{false, true} {
				for i := 0; i < 8; i++ {
					step()
				}
				if n := testing.AllocsPerRun(20, step); n != 0 {
					t.Fatalf("a decode step of two sequences (one picked: %v) allocates %v times", pick, n)
				}
			}
		})
	}
}

// BenchmarkBatchedDecode measures one decode step of n sequences together (one token each, at
// context 128) on a synthetic stories15M-shape Q8_0 model (PARLEY_BENCH_SHAPE=110M for the
// larger shape): the batched step a server runs. tokens/s is the aggregate over the n sequences.
// The picked variants find each row's argmax where the logits are (ForwardPick), as the
// scheduler does for greedy sequences, instead of handing the logits over.
func BenchmarkBatchedDecode(b *testing.B) {
	shape := "15M"
	if s := os.Getenv("PARLEY_BENCH_SHAPE"); s != "" {
		shape = s
	}
	sh, ok := llama.Shapes[shape]
	if !ok {
		b.Fatalf("PARLEY_BENCH_SHAPE=%q: no such shape", shape)
	}
	f, err := llama.SynthFile(sh, tensor.Q8_0, 1)
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"cpu", "go"} {
		be, _, err := backend.New(name, backend.Options{Threads: 2})
		if err != nil {
			continue
		}
		m, err := llama.Load(f, be)
		if err != nil {
			b.Fatal(err)
		}
		for _, bc := range []struct {
			n    int
			pick bool
		}{{1, false}, {4, false}, {8, false}, {16, false}, {1, true}, {8, true}} {
			n := bc.n
			bname := fmt.Sprintf("%s/seqs=%d", name, n)
			if bc.pick {
				bname += "/picked"
			}
			b.Run(bname, func(b *testing.B) {
				c, err := m.NewContext(llama.ContextConfig{StepTokens: 128, MaxSeqs: n, KVSlots: 256 * n, KVType: tensor.F16})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				seqs := make([]*kvcache.Seq, n)
				var bb kvcache.BatchBuilder
				logits := make([]float32, n*m.Vocab)
				toks := make([]int32, 128)
				for i := range toks {
					toks[i] = int32(i + 3)
				}
				out := []int32{127}
				for i := range seqs { // fill each sequence's context to 128 positions
					seqs[i] = c.Pool().NewSeq(256)
					_ = seqs[i].Reserve(128)
					bb.Reset()
					_ = bb.Add(seqs[i], 128)
					if err := c.Forward(toks, bb.Batch(), out, logits[:m.Vocab]); err != nil {
						b.Fatal(err)
					}
					_ = seqs[i].Advance(128)
				}
				step := toks[:n]
				ids := make([]int32, n)
				rows := make([]int32, n)
				for i := range rows {
					rows[i] = int32(i)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for it := 0; it < b.N; it++ {
					bb.Reset()
					for _, s := range seqs {
						if s.Len() >= 250 {
							s.Truncate(128)
						}
						_ = s.Reserve(1)
						_ = bb.Add(s, 1)
					}
					var err error
					if bc.pick {
						err = c.ForwardPick(step, bb.Batch(), nil, nil, rows, ids)
					} else {
						err = c.Forward(step, bb.Batch(), rows, logits)
					}
					if err != nil {
						b.Fatal(err)
					}
					for _, s := range seqs {
						_ = s.Advance(1)
					}
				}
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
		m.Close()
		be.Close()
	}
}
