package models_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// TestSpeechFamily: a Parakeet ggml file (whose magic is Whisper's) is told from a Whisper one,
// both are speech recognition models, Check reads Parakeet's header with Parakeet's reader (and
// refuses a truncated file), and OpenLLM names the family it refuses.
func TestSpeechFamily(t *testing.T) {
	pk, wh := sharedtest.ParakeetRandomModel(t, "small", false), sharedtest.WhisperRandomModel(t, "tiny.en")
	other := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(other, []byte("not a model at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{pk, models.FamilyParakeet}, {wh, models.FamilyWhisper}, {other, ""},
		{sharedtest.Path(t, "models/llm/stories260K-f32.gguf"), ""},
	} {
		if f, err := models.SpeechFamily(c.path); err != nil || f != c.want {
			t.Errorf("%s: %q, %v; want %q", filepath.Base(c.path), f, err, c.want)
		}
	}
	if k, err := models.Probe(pk); err != nil || k != models.KindSpeechRecognition {
		t.Errorf("Probe(Parakeet): %v, %v", k, err)
	}
	if k, err := models.Check(pk); err != nil || k != models.KindSpeechRecognition {
		t.Errorf("Check(Parakeet): %v, %v", k, err)
	}
	b, err := os.ReadFile(pk)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(t.TempDir(), "parakeet.cut")
	if err := os.WriteFile(cut, b[:len(b)-1000], 0o644); err != nil {
		t.Fatal(err)
	}
	if k, err := models.Check(cut); err == nil {
		t.Errorf("a truncated Parakeet file passed as %v", k)
	}
	if _, err := models.OpenLLM(pk, goBackend(t)); !errors.Is(err, models.ErrNotLLM) || !strings.Contains(err.Error(), "Parakeet") {
		t.Errorf("OpenLLM(Parakeet): %v", err)
	}
	if _, err := models.OpenRecognizer(other, goBackend(t), asr.Config{}); err == nil {
		t.Error("OpenRecognizer opened a file that is no model")
	}
}

// TestOpenRecognizer opens the Parakeet model as a recogniser and transcribes a second of a
// sawtooth-like signal with it; the Whisper model opens as one too.
func TestOpenRecognizer(t *testing.T) {
	be := goBackend(t)
	r, err := models.OpenRecognizer(sharedtest.ParakeetRandomModel(t, "small", false), be, asr.Config{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r.Family != models.FamilyParakeet || r.Whisper != nil || r.Multilingual() {
		t.Errorf("Parakeet: family %q, Whisper %v, multilingual %v", r.Family, r.Whisper, r.Multilingual())
	}
	pcm := make([]float32, 16000)
	for i := range pcm {
		pcm[i] = float32((i*7919)%201-100) / 400
	}
	res, err := r.Transcribe(context.Background(), pcm, asr.DefaultParams(), nil)
	if err != nil || res.Duration != 1 {
		t.Errorf("Parakeet transcription: %+v, %v", res, err)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	w, err := models.OpenRecognizer(sharedtest.WhisperRandomModel(t, "tiny.en"), be, asr.Config{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	if w.Family != models.FamilyWhisper || w.Whisper == nil {
		t.Errorf("Whisper: family %q", w.Family)
	}
	if err := w.Close(); err != nil {
		t.Error(err)
	}
}
