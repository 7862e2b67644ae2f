package asr

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestPrompt checks the start-of-transcript sequence as whisper.cpp builds it: the initial prompt
// after <|startofprev|> (dropped at temperatures of 0.5 and above), then <|startoftranscript|>,
// the language, the task, and <|notimestamps|> when asked.
func TestPrompt(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a hand-stepped recogniser has no goroutine of its own; the full run checks it")
	}
	m := testModel(t, "tiny")
	e := manualWhisper(t, m, Config{MaxActive: 1})
	defer func() { e.dec.Close(); e.enc.Close() }()
	tk := e.tok
	de, ok := tk.LangID("de")
	if !ok {
		t.Fatal("no German token")
	}
	p := DefaultParams()
	p.Language, p.Translate, p.InitialPrompt = "de", true, " Hello world"
	j := newJob(context.Background(), p)
	if err := e.prepare(j, make([]float32, SampleRate)); err != nil {
		t.Fatal(err)
	}
	e.setupPrompt(j)
	e.attempt(j)
	want := append(append([]int32{tk.Prev}, tk.Encode(" Hello world")...), tk.SOT, de, tk.Translate)
	if !slices.Equal(j.prompt, want) {
		t.Errorf("prompt %v, want %v", j.prompt, want)
	}
	j.tempIdx = 3 // temperature 0.6: no previous text
	e.attempt(j)
	if want := []int32{tk.SOT, de, tk.Translate}; !slices.Equal(j.prompt, want) {
		t.Errorf("prompt at temperature %.1f: %v, want %v", j.temps[j.tempIdx], j.prompt, want)
	}
	p.Translate, p.NoTimestamps, p.InitialPrompt = false, true, ""
	j = newJob(context.Background(), p)
	if err := e.prepare(j, make([]float32, SampleRate)); err != nil {
		t.Fatal(err)
	}
	e.setupPrompt(j)
	e.attempt(j)
	if want := []int32{tk.SOT, de, tk.Transcribe, tk.NoTimestamps}; !slices.Equal(j.prompt, want) {
		t.Errorf("prompt %v, want %v", j.prompt, want)
	}
	p.Language = "xx"
	if err := e.prepare(newJob(context.Background(), p), make([]float32, SampleRate)); !errors.Is(err, ErrBadRequest) {
		t.Errorf("unknown language: %v, want a bad request", err)
	}
}
