package whisper_test

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/tensor"
)

// synthModel writes a random-weight F16 model in a real shape (speed does not depend on the
// values) from the header, filters and vocabulary of a shared vocabulary-only file.
func synthModel(tb testing.TB, shape ggml.Shape, vocabFile string) string {
	tb.Helper()
	return synthModelType(tb, shape, vocabFile, tensor.F16)
}

// synthModelType is synthModel with matrices of type dt.
func synthModelType(tb testing.TB, shape ggml.Shape, vocabFile string, dt tensor.DType) string {
	tb.Helper()
	src, err := ggml.Open(sharedtest.Path(tb, "models/asr/for-tests-ggml-"+vocabFile+".bin"))
	if err != nil {
		tb.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(tb.TempDir(), shape.Name+"-"+dt.String()+".bin")
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if err := ggml.Synth(w, src, shape, dt, 1); err != nil {
		tb.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	return path
}

func benchBackend(b *testing.B) backend.Backend {
	be, _, err := backend.New(backend.Choose(""), backend.Options{Threads: 2})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return be
}

var benchShapes = []struct {
	shape ggml.Shape
	vocab string
}{{ggml.Tiny, "tiny.en"}, {ggml.Base, "base.en"}}

// BenchmarkEncoder reports the time to encode one 30-second window, alone (windows=1) and in
// batched calls of 4 windows.
func BenchmarkEncoder(b *testing.B) {
	for _, s := range benchShapes {
		for _, n := range []int{1, 4} {
			b.Run(fmt.Sprintf("%s/windows=%d", s.shape.Name, n), func(b *testing.B) {
				m, err := whisper.Open(benchBackend(b), synthModel(b, s.shape, s.vocab))
				if err != nil {
					b.Fatal(err)
				}
				defer m.Close()
				enc, err := m.NewBatchEncoder(n)
				if err != nil {
					b.Fatal(err)
				}
				defer enc.Close()
				mels, outs := make([][]float32, n), make([]*whisper.Cross, n)
				for i := range n {
					if outs[i], err = m.NewCross(); err != nil {
						b.Fatal(err)
					}
					defer outs[i].Close()
					mels[i] = make([]float32, m.Mels*whisper.WindowFrames)
					for k := range mels[i] {
						mels[i][k] = float32((k+i)%97) / 97
					}
				}
				b.ResetTimer()
				for range b.N {
					if err := enc.EncodeBatch(mels, outs); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N*n), "ms/window")
			})
		}
	}
}

// BenchmarkDecodeStep reports one decoder step of 1 and 8 sequences (one token each, at
// context 64 to 127, each against its own encoded window as separate transcriptions do): the
// batched forward up to the logits, sampling not included.
func BenchmarkDecodeStep(b *testing.B) {
	for _, s := range benchShapes {
		for _, n := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/seqs=%d", s.shape.Name, n), func(b *testing.B) {
				m, err := whisper.Open(benchBackend(b), synthModel(b, s.shape, s.vocab))
				if err != nil {
					b.Fatal(err)
				}
				defer m.Close()
				enc, err := m.NewEncoder()
				if err != nil {
					b.Fatal(err)
				}
				defer enc.Close()
				crosses := make([]*whisper.Cross, n)
				mel := make([]float32, m.Mels*whisper.WindowFrames)
				for i := range crosses {
					if crosses[i], err = m.NewCross(); err != nil {
						b.Fatal(err)
					}
					defer crosses[i].Close()
					for k := range mel {
						mel[k] = float32((k*7919+i*31)%1000)/1000 - 0.5
					}
					if err := enc.Encode(mel, crosses[i], nil); err != nil {
						b.Fatal(err)
					}
				}
				dec, err := m.NewDecoder(whisper.DecoderConfig{StepTokens: 64 * n, MaxSeqs: n, KVSlots: 128 * n, BlockSize: 1})
				if err != nil {
					b.Fatal(err)
				}
				defer dec.Close()
				seqs := make([]*kvcache.Seq, n)
				for i := range seqs {
					seqs[i] = dec.Pool().NewSeq(128)
				}
				var bb kvcache.BatchBuilder
				toks, rows := make([]int32, 64*n), make([]int32, n)
				logits := make([]float32, n*m.NVocab)
				fill := func() { // every sequence back to 64 positions of context
					bb.Reset()
					for i, sq := range seqs {
						sq.Truncate(0)
						_ = sq.Reserve(64)
						_ = bb.Add(sq, 64)
						rows[i] = int32(64*i + 63)
					}
					for i := range toks {
						toks[i] = int32(50257 + i%3)
					}
					if err := dec.Forward(toks, bb.Batch(), crosses, rows, logits); err != nil {
						b.Fatal(err)
					}
					for _, sq := range seqs {
						_ = sq.Advance(64)
					}
				}
				fill()
				for i := range rows {
					rows[i] = int32(i)
				}
				b.ResetTimer()
				for range b.N {
					if seqs[0].Len() == 128 {
						b.StopTimer()
						fill()
						for i := range rows {
							rows[i] = int32(i)
						}
						b.StartTimer()
					}
					bb.Reset()
					for _, sq := range seqs {
						_ = sq.Reserve(1)
						_ = bb.Add(sq, 1)
					}
					if err := dec.Forward(toks[:n], bb.Batch(), crosses, rows, logits); err != nil {
						b.Fatal(err)
					}
					for _, sq := range seqs {
						_ = sq.Advance(1)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/step")
			})
		}
	}
}

// TestDecodeStepAllocs checks that a steady-state decoder step (one token for each of several
// sequences) allocates nothing.
func TestDecodeStepAllocs(t *testing.T) {
	if whisper.RaceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) { decodeStepAllocs(t, be) })
	}
}

func decodeStepAllocs(t *testing.T, be backend.Backend) {
	m, err := whisper.Open(be, synthModel(t, ggml.Shape{Name: "mini", State: 64, Head: 2, AudioLayer: 1, TextLayer: 2}, "tiny.en"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cross, _ := m.NewCross()
	defer cross.Close()
	dec, err := m.NewDecoder(whisper.DecoderConfig{StepTokens: 8, MaxSeqs: 4, KVSlots: 448 * 4, BlockSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	seqs := make([]*kvcache.Seq, 3)
	crosses := []*whisper.Cross{cross, cross, cross}
	for i := range seqs {
		seqs[i] = dec.Pool().NewSeq(448)
	}
	var bb kvcache.BatchBuilder
	toks := []int32{50257, 50257, 50257}
	out := []int32{0, 1, 2}
	logits := make([]float32, 3*m.NVocab)
	step := func() {
		bb.Reset()
		for _, s := range seqs {
			if err := s.Reserve(1); err != nil {
				t.Fatal(err)
			}
			if err := bb.Add(s, 1); err != nil {
				t.Fatal(err)
			}
		}
		if err := dec.Forward(toks, bb.Batch(), crosses, out, logits); err != nil {
			t.Fatal(err)
		}
		for _, s := range seqs {
			_ = s.Advance(1)
		}
	}
	for range 64 { // scratch that grows with the context length reaches its size
		step()
	}
	if a := testing.AllocsPerRun(20, step); a != 0 {
		t.Errorf("%v allocations per decoder step, want 0", a)
	}
}

// TestQuantizedModels loads small random-weight models whose matrices are F32, F16, Q8_0, Q5_1
// and Q4_0 (the types whisper.cpp's files use) and checks that they run and agree with the F32
// model's encoder output and logits. The models share a seed, so they hold the same values up to
// each type's rounding. Bounds are on the rms error relative to the rms output: a weight's
// rounding error has rms step/sqrt(12), about 0.06% (F16), 0.6% (Q8_0: step ≈ 2.5σ/127 for
// Gaussian blocks of 32), 5% (Q5_1: range/31) and 9% (Q4_0: 2.5σ/8) of the weights' σ, and it
// reaches the outputs through several products in sequence, with the activations rounded to 8
// bits as well for quantised weights. Measured: 0.07%, 1.8-2.0%, 10%, 23-30%; the bounds are
// about 1.7 times that.
func TestQuantizedModels(t *testing.T) {
	if whisper.RaceEnabled {
		t.Skip("runs without the race detector")
	}
	shape := ggml.Shape{Name: "mini", State: 64, Head: 2, AudioLayer: 2, TextLayer: 2}
	tol := map[tensor.DType]float64{tensor.F16: 0.0015, tensor.Q8_0: 0.035, tensor.Q5_1: 0.17, tensor.Q4_0: 0.5}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			run := func(dt tensor.DType) ([]float32, []float32) {
				m, err := whisper.Open(be, synthModelType(t, shape, "tiny.en", dt))
				if err != nil {
					t.Fatalf("%v: %v", dt, err)
				}
				defer m.Close()
				enc, _ := m.NewEncoder()
				defer enc.Close()
				cross, _ := m.NewCross()
				defer cross.Close()
				mel := make([]float32, m.Mels*whisper.WindowFrames)
				for i := range mel {
					mel[i] = float32((i*7919)%1000)/1000 - 0.5
				}
				out := make([]float32, m.AudioCtx*m.AudioState)
				if err := enc.Encode(mel, cross, out); err != nil {
					t.Fatalf("%v: %v", dt, err)
				}
				dec, _ := m.NewDecoder(whisper.DecoderConfig{StepTokens: 4, MaxSeqs: 1, KVSlots: 16, BlockSize: 1})
				defer dec.Close()
				seq := dec.Pool().NewSeq(4)
				_ = seq.Reserve(2)
				var bb kvcache.BatchBuilder
				_ = bb.Add(seq, 2)
				lg := make([]float32, m.NVocab)
				if err := dec.Forward([]int32{50257, 50362}, bb.Batch(), []*whisper.Cross{cross}, []int32{1}, lg); err != nil {
					t.Fatalf("%v: %v", dt, err)
				}
				return out, lg
			}
			refEnc, refLg := run(tensor.F32)
			for _, dt := range []tensor.DType{tensor.F16, tensor.Q8_0, tensor.Q5_1, tensor.Q4_0} {
				enc, lg := run(dt)
				de, dl := relRMS(enc, refEnc), relRMS(lg, refLg)
				t.Logf("%v: relative rms error encoder %.3g, logits %.3g", dt, de, dl)
				if de > tol[dt] || dl > tol[dt] || math.IsNaN(de+dl) {
					t.Errorf("%v: relative rms error %.3g (encoder) / %.3g (logits) against F32, bound %.3g", dt, de, dl, tol[dt])
				}
			}
		})
	}
}

// relRMS is the rms of got-want over the rms of want.
func relRMS(got, want []float32) float64 {
	var e, w float64
	for i := range want {
		d := float64(got[i] - want[i])
		e += d * d
		w += float64(want[i]) * float64(want[i])
	}
	return math.Sqrt(e / w)
}
