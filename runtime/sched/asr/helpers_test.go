package asr

import (
	"context"
	"os"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/models/whisper"
)

// testModel opens the random-weight Whisper model name ("tiny.en", "tiny"; see
// sharedtest.WhisperRandomModel) on the default backend, closed when t ends.
func testModel(t *testing.T, name string) *whisper.Model {
	t.Helper()
	be, _, err := backend.New(backend.Choose(""), backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	m, err := whisper.Open(be, sharedtest.WhisperRandomModel(t, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// testWAV reads a shared recording as 16 kHz samples.
func testWAV(t *testing.T, utt string) []float32 {
	t.Helper()
	b, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/"+utt+".wav"))
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := audio.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newJob is a transcription with p under ctx, neither prepared nor queued.
func newJob(ctx context.Context, p Params) *job {
	j := &job{p: p, lang: -1}
	j.start(ctx)
	return j
}
