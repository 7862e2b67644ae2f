package asr_test

import (
	"bufio"
	"os"
	"path/filepath"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/sched/asr"
	"github.com/parleyhq/parley/runtime/tensor"
)

// backendsUnderTest starts every backend this build has that runs here (see sharedtest.Backends).
func backendsUnderTest(t *testing.T) []backend.Backend { return sharedtest.Backends(t, 2) }

// newWhisper starts a Whisper scheduler over m that decodes one transcription at a time; the
// caller closes it (before m).
func newWhisper(t testing.TB, m *whisper.Model) *asr.Whisper {
	t.Helper()
	eng, err := asr.NewWhisper(m, asr.Config{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// openModel opens the random-weight Whisper model name (sharedtest.WhisperRandomModel) on be,
// closed when t ends.
func openModel(t *testing.T, be backend.Backend, name string) *whisper.Model {
	t.Helper()
	m, err := whisper.Open(be, sharedtest.WhisperRandomModel(t, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

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
