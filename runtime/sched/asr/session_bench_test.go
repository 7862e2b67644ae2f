package asr

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/tensor"
)

// BenchmarkStream streams recordings through a live session over a real scheduler (tiny shape,
// random weights: speed does not depend on the values) in 100 ms chunks, as fast as the session
// takes them, with the real clock: a transcription that takes longer than the 1 s step makes the
// next one wait for as much audio, as it would live. It reports
//   - partial-s: audio seconds between consecutive hypotheses (the partial-result cadence),
//   - pass-ms: the mean time of one pass over the buffer (how late a partial is),
//   - final-ms: audio end to final text (the last pass at Commit, endpointing not counted),
//   - xRT: processing time over audio time (below 1: keeps up with live audio).
func BenchmarkStream(b *testing.B) {
	src, err := ggml.Open(sharedtest.Path(b, "models/asr/for-tests-ggml-tiny.en.bin"))
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "tiny.bin")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	if err := ggml.Synth(w, src, ggml.Tiny, tensor.F16, 1); err != nil {
		b.Fatal(err)
	}
	w.Flush()
	f.Close()
	src.Close()
	be, _, err := backend.New(backend.Choose(""), backend.Options{Threads: 2})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	m, err := whisper.Open(be, path)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	eng, err := NewWhisper(m, Config{MaxActive: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	data, err := os.ReadFile(sharedtest.Path(b, "data/asr/wav/jfk.wav"))
	if err != nil {
		b.Fatal(err)
	}
	pcm, _, err := audio.Decode(data)
	if err != nil {
		b.Fatal(err)
	}
	p := DefaultParams()
	p.Language, p.TemperatureInc = "en", 0
	var partials, passes int
	var busy, final time.Duration
	for range b.N {
		s, err := NewSession(eng, SessionConfig{Params: p, Silence: -1})
		if err != nil {
			b.Fatal(err)
		}
		const chunk = SampleRate / 10
		for i := 0; i < len(pcm); i += chunk {
			evs, err := s.Write(context.Background(), pcm[i:min(i+chunk, len(pcm))])
			if err != nil {
				b.Fatal(err)
			}
			for _, e := range evs {
				if e.Type == "partial" {
					partials++
				}
			}
		}
		start := time.Now()
		if _, err := s.Commit(context.Background()); err != nil {
			b.Fatal(err)
		}
		final += time.Since(start)
		st := s.Stats()
		passes += st.Transcriptions
		busy += st.Busy
	}
	secs := float64(len(pcm)) / SampleRate * float64(b.N)
	b.ReportMetric(secs/float64(max(partials, 1)), "partial-s")
	b.ReportMetric(float64(busy.Milliseconds())/float64(max(passes, 1)), "pass-ms")
	b.ReportMetric(float64(final.Milliseconds())/float64(b.N), "final-ms")
	b.ReportMetric(busy.Seconds()/secs, "xRT")
}
