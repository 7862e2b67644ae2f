package models_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/models"
)

func goBackend(t *testing.T) backend.Backend {
	t.Helper()
	be, _, err := backend.New("go", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

// TestProbe: a GGUF language model, a Whisper model and a file that is neither are told apart;
// a file that cannot be read is an error.
func TestProbe(t *testing.T) {
	other := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(other, []byte("not a model at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want models.Kind
	}{
		{sharedtest.Path(t, "models/llm/stories260K-f32.gguf"), models.KindLLM},
		{sharedtest.WhisperRandomModel(t, "tiny.en"), models.KindSpeechRecognition},
		{other, models.KindLLM}, // what OpenLLM refuses with the reason
	} {
		if k, err := models.Probe(c.path); err != nil || k != c.want {
			t.Errorf("%s: %v, %v; want %v", filepath.Base(c.path), k, err, c.want)
		}
	}
	if _, err := models.Probe(filepath.Join(t.TempDir(), "none.gguf")); err == nil {
		t.Error("a missing file probed without an error")
	}
}

// TestOpenLLM: the language model's pieces, its text side round-tripping a prompt, and clear
// refusals of a speech model and of a file that is no model.
func TestOpenLLM(t *testing.T) {
	be := goBackend(t)
	m, err := models.OpenLLM(sharedtest.Path(t, "models/llm/stories260K-f32.gguf"), be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.TrainingContext() != m.Model.Context || m.TrainingContext() <= 0 {
		t.Errorf("training context %d, model's %d", m.TrainingContext(), m.Model.Context)
	}
	if m.ChatTemplate() != "" {
		t.Errorf("stories260K has no chat template, got %q", m.ChatTemplate())
	}
	if m.Params() <= 0 || m.WeightBytes() < 4*m.Params() { // F32
		t.Errorf("%d params in %d bytes", m.Params(), m.WeightBytes())
	}
	x := m.Text()
	ids, err := x.Encode("Once upon a time")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := m.Tokenizer.Encode("Once upon a time", true, true)
	if bos, added := x.BOS(); !slices.Equal(ids, want) || !added || ids[0] != bos {
		t.Errorf("Encode %v, tokenizer %v (BOS %d added %v)", ids, want, bos, added)
	}
	if got := x.Decode(ids); got != "Once upon a time" {
		t.Errorf("Decode %q", got)
	}
	var pieces []byte
	for _, id := range ids[1:] {
		pieces = append(pieces, x.Piece(id)...)
	}
	if string(pieces) != " Once upon a time" {
		t.Errorf("pieces %q", pieces)
	}
	if x.VocabSize() != m.Tokenizer.Vocab().Size || !x.IsEOG(x.EOS()) || x.Token(x.EOS()) == "" || x.Token(-1) != "" {
		t.Errorf("vocabulary %d, EOS %d %q", x.VocabSize(), x.EOS(), x.Token(x.EOS()))
	}

	if _, err := models.OpenLLM(sharedtest.WhisperRandomModel(t, "tiny.en"), be); !errors.Is(err, models.ErrNotLLM) || !strings.Contains(err.Error(), "Whisper") {
		t.Errorf("a Whisper model opened as a language model: %v", err)
	}
	other := filepath.Join(t.TempDir(), "notes.gguf")
	if err := os.WriteFile(other, []byte("not a model at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := models.OpenLLM(other, be); err == nil {
		t.Error("a file that is no model opened")
	}
}

// TestCheck: the headers of a language model and of a Whisper model (ggml and GGUF) pass and
// say their kind; a truncated file, a file of garbage, a missing file fail, without loading
// anything.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	llm := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	whisperGGML := sharedtest.WhisperRandomModel(t, "tiny.en")
	for _, c := range []struct {
		path string
		want models.Kind
	}{{llm, models.KindLLM}, {whisperGGML, models.KindSpeechRecognition}} {
		if k, err := models.Check(c.path); err != nil || k != c.want {
			t.Errorf("%s: %v, %v; want %v", c.path, k, err, c.want)
		}
	}
	cut := func(src string, n int) string {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.Base(src)+".cut")
		if err := os.WriteFile(p, b[:min(n, len(b))], 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	garbage := filepath.Join(dir, "garbage.gguf")
	if err := os.WriteFile(garbage, []byte("GGUF but nothing a GGUF file holds"), 0o644); err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(text, []byte("not a model at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{cut(llm, 4096), cut(llm, 100_000), cut(whisperGGML, 4096), garbage, text, filepath.Join(dir, "missing.gguf")} {
		if k, err := models.Check(p); err == nil {
			t.Errorf("%s: passed as %v", p, k)
		}
	}
}
