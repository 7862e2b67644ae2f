package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/models/whisper"
	wtok "github.com/parleyhq/parley/runtime/tokenizer/whisper"
)

// runTranscribe transcribes audio files with a Whisper model.
func runTranscribe(e *env, args []string) error {
	fs := newFlags(e, "transcribe", "-m MODEL [flags] FILE...")
	bf := addBackendFlags(fs)
	model := fs.String("m", "", "Whisper model file (whisper.cpp ggml, or GGUF), or hf://owner/repo[@rev]/file")
	def := whisper.DefaultParams()
	beam := fs.Int("beam", 1, "beam size (1: greedy)")
	bestOf := fs.Int("best-of", def.BestOf, "candidates sampled at temperatures above 0")
	lang := fs.String("language", "", "spoken language code, e.g. en (default: detect; English-only models: en)")
	translate := fs.Bool("translate", false, "translate to English")
	noTS := fs.Bool("no-timestamps", false, "decode without timestamps")
	wordTS := fs.Bool("word-timestamps", false, "time every token (and word) by cross-attention alignment (dynamic time warping)")
	noFallback := fs.Bool("no-fallback", false, "do not decode failed windows again at higher temperatures")
	temp := fs.Float64("temperature", 0, "initial temperature")
	prompt := fs.String("prompt", "", "initial prompt")
	format := fs.String("output-format", "txt", "output format: txt, srt, vtt, json")
	asJSON := fs.Bool("json", false, `print {"text", "segments", "tokens":[{"id","p","plog"}]} per file`)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("no audio file given")
	}
	if *model == "" {
		return usagef("-m MODEL is required")
	}
	switch *format {
	case "txt", "srt", "vtt", "json":
	default:
		return usagef("--output-format %q: want txt, srt, vtt or json", *format)
	}
	p := def
	p.BeamSize, p.BestOf, p.Language, p.Translate, p.NoTimestamps = *beam, *bestOf, *lang, *translate, *noTS
	p.Temperature, p.InitialPrompt, p.WordTimestamps = float32(*temp), *prompt, *wordTS
	if *noFallback {
		p.TemperatureInc = 0
	}
	if err := p.Validate(); err != nil {
		return usageError{withoutHTTP(err)}
	}
	if l := p.Language; l != "" && l != "auto" {
		if _, ok := wtok.LanguageIndex(l); !ok {
			return usagef("--language %q: unknown language; want a code such as en, de or zh, an English name such as german, or auto", l)
		}
	}
	m, be, err := openWhisper(e, bf, *model)
	if err != nil {
		return err
	}
	defer be.Close()
	defer m.Close()
	eng, err := whisper.NewEngine(m, whisper.EngineConfig{MaxActive: 1})
	if err != nil {
		return err
	}
	defer eng.Close()
	// What the model cannot do is a mistake in the command line too: say so before any file.
	if _, _, err := eng.ResolveLanguage(p.Language); err != nil {
		if !m.Multilingual() {
			return usagef("--language %q: %s is an English-only model; leave out --language (or give en), or use a multilingual model", p.Language, *model)
		}
		return usagef("--language %q: %s does not know this language", p.Language, *model)
	}
	if p.Translate && !m.Multilingual() {
		return usagef("--translate: %s is an English-only model and cannot translate; use a multilingual model", *model)
	}
	for _, path := range pos {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		samples, _, err := audio.Decode(data)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		res, err := eng.Transcribe(context.Background(), samples, p, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := printTranscript(e, res, *format, *asJSON); err != nil {
			return err
		}
	}
	return nil
}

// withoutHTTP is a parameter error from the whisper package without its HTTP wording ("bad
// request: "), which serve answers with and the command line has no use for.
func withoutHTTP(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok && errors.Is(err, whisper.ErrBadRequest) {
		for _, e := range j.Unwrap() {
			if e != whisper.ErrBadRequest {
				return e
			}
		}
	}
	return err
}

func printTranscript(e *env, res *whisper.Result, format string, asJSON bool) error {
	if asJSON || format == "json" {
		type tok struct {
			ID   int32   `json:"id"`
			P    float32 `json:"p"`
			PLog float32 `json:"plog"`
		}
		out := struct {
			Text     string            `json:"text"`
			Language string            `json:"language"`
			Segments []whisper.Segment `json:"segments"`
			Tokens   []tok             `json:"tokens"`
		}{Text: res.Text, Language: res.Language, Segments: res.Segments, Tokens: []tok{}}
		for _, s := range res.Segments {
			for _, t := range s.Tokens {
				out.Tokens = append(out.Tokens, tok{t.ID, t.P, t.PLog})
			}
		}
		enc := json.NewEncoder(e.stdout)
		return enc.Encode(out)
	}
	switch format {
	case "srt":
		_, err := fmt.Fprint(e.stdout, res.SRT())
		return err
	case "vtt":
		_, err := fmt.Fprint(e.stdout, res.VTT())
		return err
	}
	_, err := fmt.Fprintln(e.stdout, strings.TrimSpace(res.Text))
	return err
}
