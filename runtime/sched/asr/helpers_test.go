package asr

import (
	"context"
	"errors"
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

// prepare sets j up over samples as submit and the first pass of its features do, in the
// caller's goroutine and before j is queued: a recording of up to 60 s then has all of its
// features, and its transcription can be stepped by hand with no goroutine computing them.
func (e *Whisper) prepare(j *job, samples []float32) error {
	if err := e.setup(j); err != nil {
		return err
	}
	j.feat = e.newFeatures(audio.Samples(samples))
	j.feat.scan(func() bool { return false })
	ok, n, loud, err := j.feat.scanDone()
	if !ok {
		return errors.New("asr: the first pass over the audio did not end")
	}
	e.plan(j, n, loud, err)
	return err
}

// gateSilence turns the silence gate on for j over samples, its audio (as plan does with what
// the first pass found).
func (j *job) gateSilence(samples []float32) {
	var l loudHops
	l.add(samples)
	j.loud = l.bits
	if j.loud == nil {
		j.loud = []uint64{}
	}
	j.skipSilence()
}
