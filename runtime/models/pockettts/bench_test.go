package pockettts

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The forward steps' costs on the random-weight checkpoint (the real shapes) on the native CPU
// backend with 2 threads: a chunk's text pass, a FlowLM frame step (backbone, EOS head, flow
// head) and the flow head alone, and a Mimi decoder frame, for 1, 4 and 8 syntheses at once,
// with F32 weights and with the FlowLM transformer's matrices in Q8_0.

func benchModel(b *testing.B, dtype string) *Model {
	b.Helper()
	be := sharedtest.Backend(b, "cpu", 2)
	ck, err := Open(sharedtest.PocketTTSRandomWeights(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ck.Close() })
	if dtype == "q8_0" {
		if _, err := ck.Weights.QuantizeFlowLM(tensor.Q8_0); err != nil {
			b.Fatal(err)
		}
	}
	m, err := New(be, ck.Weights)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

func benchTokens(m *Model, n int, seed uint64) []int32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(rng.IntN(m.cfg.Vocab))
	}
	return ids
}

// benchSeqs starts n syntheses (the reference voice, 20 tokens of text each).
func benchSeqs(b *testing.B, f *FlowLM, n int) ([]*kvcache.Seq, int) {
	b.Helper()
	voice := refVoice(b, &f.m.cfg)
	seqs := make([]*kvcache.Seq, n)
	toks := make([][]int32, n)
	for i := range seqs {
		seqs[i] = f.Pool().NewSeq(0)
		if err := f.SetVoice(seqs[i], voice); err != nil {
			b.Fatal(err)
		}
		toks[i] = benchTokens(f.m, 20, uint64(i))
	}
	if err := f.Text(seqs, toks); err != nil {
		b.Fatal(err)
	}
	return seqs, seqs[0].Len()
}

var benchDTypes = []string{"f32", "q8_0"}

// BenchmarkTextPass: a chunk's start, the voice state stored and 20 tokens of text through the
// FlowLM, for one synthesis.
func BenchmarkTextPass(b *testing.B) {
	for _, dt := range benchDTypes {
		b.Run(dt, func(b *testing.B) {
			m := benchModel(b, dt)
			f, err := m.NewFlowLM(FlowLMConfig{StepTokens: 64, MaxSeqs: 1, KVSlots: 1024})
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			voice := refVoice(b, &m.cfg)
			toks := [][]int32{benchTokens(m, 20, 1)}
			s := f.Pool().NewSeq(0)
			seqs := []*kvcache.Seq{s}
			b.ResetTimer()
			for range b.N {
				s.Release()
				if err := f.SetVoice(s, voice); err != nil {
					b.Fatal(err)
				}
				if err := f.Text(seqs, toks); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFrameStep: one FlowLM frame step (input projection, backbone, EOS head, flow head) of
// B syntheses at once; ns/op is the whole batch's.
func BenchmarkFrameStep(b *testing.B) {
	for _, dt := range benchDTypes {
		for _, n := range []int{1, 4, 8} {
			b.Run(fmt.Sprintf("%s/B=%d", dt, n), func(b *testing.B) {
				m := benchModel(b, dt)
				f, err := m.NewFlowLM(FlowLMConfig{StepTokens: 64, MaxSeqs: n, KVSlots: n * 512})
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				seqs, base := benchSeqs(b, f, n)
				L := m.cfg.LatentDim
				in, noise, out, eos := make([]float32, n*L), make([]float32, n*L), make([]float32, n*L), make([]float32, n)
				for i := range in {
					in[i] = float32(math.NaN())
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if seqs[0].Len() >= base+200 { // a chunk's budget; then the frames start over
						for _, s := range seqs {
							s.Truncate(base)
						}
					}
					if err := f.Step(seqs, in, noise, out, eos); err != nil {
						b.Fatal(err)
					}
					copy(in, out)
				}
			})
		}
	}
}

// BenchmarkFlowHead: the flow head alone over B rows of the backbone's output.
func BenchmarkFlowHead(b *testing.B) {
	for _, n := range []int{1, 4, 8} {
		b.Run(fmt.Sprintf("B=%d", n), func(b *testing.B) {
			m := benchModel(b, "f32")
			f, err := m.NewFlowLM(FlowLMConfig{StepTokens: 64, MaxSeqs: n, KVSlots: n * 512})
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			seqs, _ := benchSeqs(b, f, n)
			L := m.cfg.LatentDim
			in, noise, out, eos := make([]float32, n*L), make([]float32, n*L), make([]float32, n*L), make([]float32, n)
			for i := range in {
				in[i] = float32(math.NaN())
			}
			if err := f.Step(seqs, in, noise, out, eos); err != nil { // the backbone's rows in place
				b.Fatal(err)
			}
			vs, err := f.views(n)
			if err != nil {
				b.Fatal(err)
			}
			fv, err := f.flowViews(n)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := m.be.Write(fv.x, 0, noise); err != nil {
					b.Fatal(err)
				}
				if err := m.flowHead(f.flow, fv, vs.x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecoderStep: one Mimi decoder frame (1,920 samples) of B syntheses at once.
func BenchmarkDecoderStep(b *testing.B) {
	for _, n := range []int{1, 4, 8} {
		b.Run(fmt.Sprintf("B=%d", n), func(b *testing.B) {
			m := benchModel(b, "f32")
			dec, err := m.NewDecoder(n)
			if err != nil {
				b.Fatal(err)
			}
			defer dec.Close()
			L, F := m.cfg.LatentDim, m.cfg.FrameSamples()
			rng := rand.New(rand.NewPCG(3, 4))
			lat := make([]float32, n*L)
			for i := range lat {
				lat[i] = float32(rng.NormFloat64())
			}
			audio := make([]float32, n*F)
			slots := make([]int, n)
			for i := range slots {
				slots[i] = i
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if i%200 == 199 { // the transformer's positions start over with each chunk
					for _, s := range slots {
						if err := dec.Reset(s); err != nil {
							b.Fatal(err)
						}
					}
				}
				if err := dec.Step(slots, lat, audio); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// stepWeightBytes is the weight bytes one frame step of the backbone reads (the input
// projection, every layer's matrices, the EOS head) and those of the flow head.
func stepWeightBytes(tb testing.TB, m *Model) (backbone, flow int64) {
	tb.Helper()
	size := func(ts ...backend.Tensor) int64 {
		var n int64
		for _, t := range ts {
			if t == nil {
				continue
			}
			rb, err := t.DType().RowSize(int64(t.Cols()))
			if err != nil {
				tb.Fatal(err)
			}
			n += rb * int64(t.Rows())
		}
		return n
	}
	backbone = size(m.inputLinear, m.eosW)
	for i := range m.layers {
		L := &m.layers[i]
		backbone += size(L.q, L.k, L.v, L.o, L.linear1, L.linear2)
	}
	fw := &m.flow
	flow = size(fw.cond.w, fw.input.w, fw.finalShift.w, fw.finalScale.w, fw.out.w)
	for _, b := range fw.blocks {
		flow += size(b.mlp0.w, b.mlp2.w, b.shift.w, b.scale.w, b.gate.w)
	}
	return backbone, flow
}

// BenchmarkFirstChunk: the work between a chunk's text and its first 1,920 samples, stage by
// stage, for one synthesis: the voice state stored (voice-ms), the text pass over reference run
// t5-stream's 29 tokens (text-ms), the first frame step's backbone and EOS head (step-ms: the
// frame step less its flow head), the flow head (flow-ms), and the first Mimi frame from a reset
// decoder (mimi-ms); first-ms is their sum, the first chunk's compute. backbone-GB/s is the
// weight bytes the backbone reads per frame step over step-ms. start-ms is the text pass and the
// first frame step (flow head included) in one pass (FlowLM.Start, as the Synthesizer starts a
// chunk), and first-start-ms the first chunk's compute that way (voice, Start, Mimi).
func BenchmarkFirstChunk(b *testing.B) {
	run, ok := readRuns(b)["t5-stream"]
	if !ok || len(run.Chunks) == 0 {
		b.Skip("no reference run t5-stream")
	}
	toks := [][]int32{run.Chunks[0].TokenIDs}
	for _, dt := range benchDTypes {
		b.Run(dt, func(b *testing.B) {
			m := benchModel(b, dt)
			f, err := m.NewFlowLM(FlowLMConfig{StepTokens: 64, MaxSeqs: 1, KVSlots: 1024})
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			dec, err := m.NewDecoder(1)
			if err != nil {
				b.Fatal(err)
			}
			defer dec.Close()
			voice := refVoice(b, &m.cfg)
			L, F := m.cfg.LatentDim, m.cfg.FrameSamples()
			in, noise, out, eos := make([]float32, L), make([]float32, L), make([]float32, L), make([]float32, 1)
			rng := rand.New(rand.NewPCG(5, 6))
			for i := range noise {
				noise[i] = float32(rng.NormFloat64() * math.Sqrt(0.7))
			}
			audio, slots := make([]float32, F), []int{0}
			s := f.Pool().NewSeq(0)
			seqs := []*kvcache.Seq{s}
			var st [6]time.Duration // voice, text, frame step, flow head, Mimi, Start
			chunk := func() {
				s.Release()
				t0 := time.Now()
				if err := f.SetVoice(s, voice); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := f.Text(seqs, toks); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				for i := range in {
					in[i] = float32(math.NaN())
				}
				if err := f.Step(seqs, in, noise, out, eos); err != nil {
					b.Fatal(err)
				}
				t3 := time.Now()
				// the flow head again, on the rows the step left, timed alone
				vs, fv := f.rows[1], f.flows[1]
				if err := m.be.Write(fv.x, 0, noise); err != nil {
					b.Fatal(err)
				}
				if err := m.flowHead(f.flow, fv, vs.x); err != nil {
					b.Fatal(err)
				}
				t4 := time.Now()
				if err := dec.Reset(0); err != nil {
					b.Fatal(err)
				}
				if err := dec.Step(slots, out, audio); err != nil {
					b.Fatal(err)
				}
				t5 := time.Now()
				st[0] += t1.Sub(t0)
				st[1] += t2.Sub(t1)
				st[2] += t3.Sub(t2) - t4.Sub(t3)
				st[3] += t4.Sub(t3)
				st[4] += t5.Sub(t4)
				s.Release()
				if err := f.SetVoice(s, voice); err != nil {
					b.Fatal(err)
				}
				t6 := time.Now()
				if err := f.Start(seqs, toks, noise, out, eos); err != nil {
					b.Fatal(err)
				}
				st[5] += time.Since(t6)
			}
			chunk() // warm: the weights paged in, the views made
			st = [6]time.Duration{}
			b.ResetTimer()
			for range b.N {
				chunk()
			}
			ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 / float64(b.N) }
			bb, _ := stepWeightBytes(b, m)
			b.ReportMetric(ms(st[0]), "voice-ms")
			b.ReportMetric(ms(st[1]), "text-ms")
			b.ReportMetric(ms(st[2]), "step-ms")
			b.ReportMetric(ms(st[3]), "flow-ms")
			b.ReportMetric(ms(st[4]), "mimi-ms")
			b.ReportMetric(ms(st[0]+st[1]+st[2]+st[3]+st[4]), "first-ms")
			b.ReportMetric(float64(bb)/1e9/(st[2].Seconds()/float64(b.N)), "backbone-GB/s")
			b.ReportMetric(ms(st[5]), "start-ms")
			b.ReportMetric(ms(st[0]+st[5]+st[4]), "first-start-ms")
		})
	}
}
