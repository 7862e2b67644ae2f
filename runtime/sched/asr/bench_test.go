package asr_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// recordings returns up to n shared recordings (sorted by name) and their total duration.
func recordings(tb testing.TB, n int) ([][]float32, float64) {
	tb.Helper()
	mf, err := os.ReadFile(sharedtest.Path(tb, "data/asr/manifest.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	var files []string
	for _, line := range splitLines(mf) {
		var e struct{ File string }
		if json.Unmarshal(line, &e) == nil && e.File != "" {
			files = append(files, e.File)
		}
	}
	sort.Strings(files)
	var out [][]float32
	var secs float64
	for _, f := range files[:min(n, len(files))] {
		b, err := os.ReadFile(filepath.Join(sharedtest.Dir(tb), "data/asr", f))
		if err != nil {
			tb.Fatal(err)
		}
		s, _, err := audio.Decode(b)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, s)
		secs += float64(len(s)) / whisper.SampleRate
	}
	return out, secs
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != '\n' {
			i++
		}
		out = append(out, b[:i])
		if i < len(b) {
			i++
		}
		b = b[i:]
	}
	return out
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

// BenchmarkTranscribe transcribes 12 shared recordings one after another, greedy and with beam 5
// (English, no timestamps, no fallback: whisper-cli -l en -nt -nf), and reports the real-time
// factor (processing time / audio time). Random weights never end a window early: each window
// decodes the full 220 tokens, as whisper.cpp does with the same files.
func BenchmarkTranscribe(b *testing.B) {
	recs, secs := recordings(b, 12)
	for _, s := range benchShapes {
		for _, beam := range []int{1, 5} {
			name := s.shape.Name + "/greedy"
			if beam > 1 {
				name = s.shape.Name + "/beam5"
			}
			b.Run(name, func(b *testing.B) {
				m, err := whisper.Open(benchBackend(b), synthModel(b, s.shape, s.vocab))
				if err != nil {
					b.Fatal(err)
				}
				defer m.Close()
				eng := newWhisper(b, m)
				defer eng.Close()
				p := asr.DefaultParams()
				p.Language, p.NoTimestamps, p.TemperatureInc, p.BeamSize, p.BestOf = "en", true, 0, beam, beam
				b.ResetTimer()
				for range b.N {
					for _, r := range recs {
						if _, err := eng.Transcribe(context.Background(), r, p, nil); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)/secs, "RTF")
				b.ReportMetric(secs, "audio-s")
			})
		}
	}
}

// BenchmarkConcurrent transcribes 8 recordings at once through one scheduler (their decoder steps
// batched) and reports the aggregate speed-up over transcribing them one after another: with
// one window encoded per step (speedup), and with up to 8 windows in one encoder call
// (speedup-enc8). For the eight at once, one window a call, it also reports the median step
// that decoded, and the longest wait of a decoding transcription for its next token (the
// longest step that decoded after a step that decoded), which encoder work in the same steps
// sets.
func BenchmarkConcurrent(b *testing.B) {
	recs, secs := recordings(b, 8)
	s := benchShapes[0]
	m, err := whisper.Open(benchBackend(b), synthModel(b, s.shape, s.vocab))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	p := asr.DefaultParams()
	p.Language, p.NoTimestamps, p.TemperatureInc = "en", true, 0
	// Steps that decoded, eight at once, one window a call: all of them, and those that followed
	// a step that decoded (a transcription was decoding, and waited for this step's token).
	var steps, waits []time.Duration
	run := func(active, encodeBatch int) time.Duration {
		cfg := asr.Config{MaxActive: active, MaxQueue: len(recs), EncodeBatch: encodeBatch}
		if active == 8 && encodeBatch == 1 {
			prev := 0
			cfg.OnStep = func(d time.Duration, seqs, _ int) {
				if seqs > 0 {
					steps = append(steps, d)
					if prev > 0 {
						waits = append(waits, d)
					}
				}
				prev = seqs
			}
		}
		eng, err := asr.NewWhisper(m, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer eng.Close()
		start := time.Now()
		var wg sync.WaitGroup
		for _, r := range recs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := eng.Transcribe(context.Background(), r, p, nil); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	var one, eight, eightEnc time.Duration
	for range b.N {
		one += run(1, 1)
		eight += run(8, 1)
		eightEnc += run(8, 8)
	}
	b.ReportMetric(one.Seconds()/eight.Seconds(), "speedup")
	b.ReportMetric(one.Seconds()/eightEnc.Seconds(), "speedup-enc8")
	b.ReportMetric(secs*float64(b.N)/eight.Seconds(), "audio-s/s")
	if len(steps) > 0 && len(waits) > 0 {
		slices.Sort(steps)
		slices.Sort(waits)
		b.ReportMetric(float64(steps[len(steps)/2].Microseconds())/1000, "ms/decode-step")
		b.ReportMetric(float64(waits[len(waits)-1].Microseconds())/1000, "ms/longest-wait")
	}
}
