package tts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/pockettts"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
	"github.com/parleyhq/parley/runtime/tokenizer/sentencepiece"
)

// BenchmarkSpeak: C syntheses submitted at once to a Synthesizer of MaxActive C, on the
// random-weight checkpoint (the real shapes) on the native CPU backend with 2 threads, F32 and
// with the FlowLM transformer's matrices in Q8_0. Each synthesis is reference run t5-stream's
// text with its recorded noise (146 frames, 11.68 s, no EOS with F32 weights). Reported per
// iteration: rtf, the wall time over the audio made by all syntheses (below 1: faster than real
// time); first-ms and first-max-ms, the mean and largest time from submission to a synthesis's
// first frame (80 ms of audio); audio-s, the seconds of audio each synthesis made;
// allocs/frame, the heap allocations of the whole process (callers included) per frame made.
func BenchmarkSpeak(b *testing.B) {
	bs := newBench(b)
	bs.each(b, func(dt string, m *pockettts.Model, ck *pockettts.Checkpoint, voice *pockettts.Voice) {
		for _, c := range []int{1, 4, 8} {
			b.Run(fmt.Sprintf("%s/C=%d", dt, c), func(b *testing.B) {
				tok, meta, noise := bs.tok, bs.meta, bs.noise
				s, err := New(m, tok, Config{Text: ck.Text, MaxActive: c})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				r := Request{Text: meta.Text, Voice: voice, Noise: noise}
				F := float64(s.FrameSamples())
				// warm: the weights paged in, the steps' views made for every batch size
				warm := make([]Request, c)
				for i := range warm {
					warm[i] = Request{Text: "Hello there.", Voice: voice, Temperature: 0}
				}
				var wg sync.WaitGroup
				for _, w := range warm {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := s.Speak(context.Background(), w, func([]float32) error { return nil }); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
				b.ReportAllocs()
				b.ResetTimer()
				var rtf, first, firstMax, audio float64
				var allFrames int
				var ms0, ms1 runtime.MemStats
				runtime.ReadMemStats(&ms0)
				for range b.N {
					var mu sync.Mutex
					var firsts []time.Duration
					frames := 0
					start := time.Now()
					for range c {
						wg.Add(1)
						go func() {
							defer wg.Done()
							n := 0
							err := s.Speak(context.Background(), r, func([]float32) error {
								if n++; n == 1 {
									mu.Lock()
									firsts = append(firsts, time.Since(start))
									mu.Unlock()
								}
								return nil
							})
							if err != nil {
								b.Error(err)
							}
							mu.Lock()
							frames += n
							mu.Unlock()
						}()
					}
					wg.Wait()
					wall := time.Since(start)
					allFrames += frames
					secs := float64(frames) * F / float64(s.SampleRate())
					rtf += wall.Seconds() / secs
					var sum, mx time.Duration
					for _, d := range firsts {
						sum += d
						mx = max(mx, d)
					}
					first += float64(sum.Milliseconds()) / float64(max(len(firsts), 1))
					firstMax += float64(mx.Milliseconds())
					audio += secs / float64(c)
				}
				runtime.ReadMemStats(&ms1)
				n := float64(b.N)
				b.ReportMetric(rtf/n, "rtf")
				b.ReportMetric(first/n, "first-ms")
				b.ReportMetric(firstMax/n, "first-max-ms")
				b.ReportMetric(audio/n, "audio-s")
				b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(max(allFrames, 1)), "allocs/frame")
			})
		}
	})
}

// BenchmarkFirstChunk: the wall time from Speak to the first frame's audio (first-ms: the
// voice state stored, the text pass, the first frame step and the first Mimi frame, and the
// step loop's hand-offs), one synthesis at a time on an idle Synthesizer of MaxActive 1, F32 and
// Q8_0 as BenchmarkSpeak. The text is reference run t5-stream's (one chunk of 29 tokens); each
// synthesis stops at its first frame, and the next starts once the loop is idle again.
// runtime/models/pockettts's BenchmarkFirstChunk times the stages one by one.
func BenchmarkFirstChunk(b *testing.B) {
	bs := newBench(b)
	errFirst := errors.New("first frame")
	bs.each(b, func(dt string, m *pockettts.Model, ck *pockettts.Checkpoint, voice *pockettts.Voice) {
		b.Run(dt, func(b *testing.B) {
			s, err := New(m, bs.tok, Config{Text: ck.Text, MaxActive: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			r := Request{Text: bs.meta.Text, Voice: voice, Temperature: DefaultTemperature, Seed: 1}
			var start time.Time
			var first time.Duration
			emit := func([]float32) error {
				first += time.Since(start)
				return errFirst
			}
			idle := func() { // the stopped synthesis reaped, no step under way
				for steps := s.Stats().Steps; ; steps = s.Stats().Steps {
					time.Sleep(20 * time.Millisecond)
					if s.Stats().Steps == steps {
						return
					}
				}
			}
			speak := func() {
				start = time.Now()
				if err := s.Speak(context.Background(), r, emit); !errors.Is(err, errFirst) {
					b.Fatalf("Speak: %v", err)
				}
			}
			speak() // warm
			idle()
			first = 0
			b.ResetTimer()
			for range b.N {
				speak()
				b.StopTimer()
				idle()
				b.StartTimer()
			}
			b.ReportMetric(first.Seconds()*1e3/float64(b.N), "first-ms")
		})
	})
}

// BenchmarkDecoderOverlap: one synthesis at a time of reference run t5-stream's text with its
// recorded noise (146 frames, 11.68 s), F32 and Q8_0, on three Synthesizers in turn, every
// iteration running each once: "serial" decodes each frame after its FlowLM step on one native
// CPU backend of 2 threads; "overlap" runs the FlowLM on a backend of 1 thread and the Mimi
// decoder on a goroutine and backend of 1 thread of its own (Config.Decoder), frame i decoded
// while frame i+1's FlowLM step runs; "overlap21" the same with the FlowLM's backend of 2
// threads. Reported for each: rtf (wall time over audio time) and first-ms (submission to the
// first frame).
func BenchmarkDecoderOverlap(b *testing.B) {
	bs := newBench(b)
	one, other := sharedtest.Backend(b, "cpu", 1), sharedtest.Backend(b, "cpu", 1)
	modes := []string{"serial", "overlap", "overlap21"}
	bs.each(b, func(dt string, m *pockettts.Model, ck *pockettts.Checkpoint, voice *pockettts.Voice) {
		m1, err := pockettts.New(one, ck.Weights)
		if err != nil {
			b.Fatal(err)
		}
		defer m1.Close()
		dec, err := pockettts.New(other, ck.Weights)
		if err != nil {
			b.Fatal(err)
		}
		defer dec.Close()
		var ss []*Synthesizer
		for _, c := range []Config{{MaxActive: 1}, {MaxActive: 1, Decoder: dec}, {MaxActive: 1, Decoder: dec}} {
			fm := m
			if c.Decoder != nil && len(ss) == 1 {
				fm = m1
			}
			c.Text = ck.Text
			s, err := New(fm, bs.tok, c)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ss = append(ss, s)
		}
		b.Run(dt, func(b *testing.B) {
			r := Request{Text: bs.meta.Text, Voice: voice, Noise: bs.noise}
			speak := func(s *Synthesizer, r Request) (rtf, first float64) {
				frames := 0
				start := time.Now()
				err := s.Speak(context.Background(), r, func([]float32) error {
					if frames++; frames == 1 {
						first = time.Since(start).Seconds() * 1e3
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				audio := float64(frames*s.FrameSamples()) / float64(s.SampleRate())
				return time.Since(start).Seconds() / audio, first
			}
			for _, s := range ss { // warm
				speak(s, Request{Text: "Hello there.", Voice: voice, Temperature: 0})
			}
			rtf, first := make([]float64, len(ss)), make([]float64, len(ss))
			b.ResetTimer()
			for range b.N {
				for i, s := range ss {
					x, f := speak(s, r)
					rtf[i] += x
					first[i] += f
				}
			}
			for i, name := range modes {
				b.ReportMetric(rtf[i]/float64(b.N), "rtf-"+name)
				b.ReportMetric(first[i]/float64(b.N), "first-ms-"+name)
			}
		})
	})
}

// bench is what the benchmarks share: reference run t5-stream's text and recorded noise, the
// reference tokenizer and the native CPU backend with 2 threads.
type bench struct {
	meta struct {
		Text string `json:"text"`
	}
	noise []float32
	tok   pockettts.Tokenizer
	be    backend.Backend
	ref   string
}

func newBench(b *testing.B) *bench {
	bs := &bench{ref: sharedtest.Path(b, "reference/tts")}
	mb, err := os.ReadFile(filepath.Join(bs.ref, "t5-stream", "meta.json"))
	if err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(mb, &bs.meta); err != nil {
		b.Fatal(err)
	}
	bs.noise = readArray(b, filepath.Join(bs.ref, "t5-stream", "noise.npy"))
	if bs.tok, err = sentencepiece.Load(filepath.Join(bs.ref, "tokenizer", "random-unigram-4000.model")); err != nil {
		b.Fatal(err)
	}
	bs.be = sharedtest.Backend(b, "cpu", 2)
	return bs
}

// each runs fn with the random-weight checkpoint's model in F32 and with the FlowLM
// transformer's matrices in Q8_0, and the reference voice.
func (bs *bench) each(b *testing.B, fn func(dt string, m *pockettts.Model, ck *pockettts.Checkpoint, voice *pockettts.Voice)) {
	for _, dt := range []string{"f32", "q8_0"} {
		ck, err := pockettts.Open(sharedtest.PocketTTSRandomWeights(b))
		if err != nil {
			b.Fatal(err)
		}
		if dt == "q8_0" {
			quantizeFlowLM(b, ck.Weights)
		}
		m, err := pockettts.New(bs.be, ck.Weights)
		if err != nil {
			ck.Close()
			b.Fatal(err)
		}
		cfg := m.Config()
		voice, err := pockettts.LoadVoice(filepath.Join(bs.ref, "voice", "voice_state.safetensors"), &cfg)
		if err == nil {
			fn(dt, m, ck, voice)
		}
		m.Close()
		ck.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
}

// quantizeFlowLM converts the FlowLM transformer's matrices of w to Q8_0 in place, as a Q8_0
// GGUF checkpoint holds them.
func quantizeFlowLM(tb testing.TB, w *pockettts.Weights) {
	tb.Helper()
	for _, t := range w.All() {
		if !strings.HasPrefix(t.Name, "flow_lm.transformer.layers.") || t.DType == tensor.Q8_0 {
			continue
		}
		switch {
		case strings.HasSuffix(t.Name, ".self_attn.in_proj.weight"), strings.HasSuffix(t.Name, ".self_attn.out_proj.weight"),
			strings.HasSuffix(t.Name, ".linear1.weight"), strings.HasSuffix(t.Name, ".linear2.weight"):
		default:
			continue
		}
		data, err := quant.QuantizeRows(tensor.Q8_0, t.Float32s(), t.Shape[len(t.Shape)-1])
		if err != nil {
			tb.Fatal(err)
		}
		t.Data, t.DType = data, tensor.Q8_0
	}
}
