package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/sched/asr"
	wtok "github.com/parleyhq/parley/runtime/tokenizer/whisper"
)

// transcribeHelp follows the flags in `parley transcribe -h`.
const transcribeHelp = `
Each FILE's transcript goes to standard output. With several FILEs, text is printed after a
line "==> FILE <==" for each, and --json prints one JSON object a line (JSON Lines) with a
"file" member; srt and vtt need --output-dir. --output-dir DIR writes each FILE's transcript to
DIR/NAME.txt, .srt, .vtt or .json instead (NAME: FILE's name without its extension), creating
DIR; it never overwrites an input. A FILE that cannot be read or transcribed is reported on
standard error and the others are transcribed; the exit status is then 1.
`

// runTranscribe transcribes audio files with a speech recognition model (Whisper, Parakeet).
func runTranscribe(e *env, args []string) error {
	fs := newFlags(e, "transcribe", "-m MODEL [flags] FILE...")
	fs.Usage = func() {
		fs.printUsage()
		fmt.Fprint(e.stderr, transcribeHelp)
	}
	bf := addBackendFlags(fs)
	model := fs.String("m", "", "Whisper or Parakeet model file (whisper.cpp ggml, or GGUF), or hf://owner/repo[@rev]/file")
	def := asr.DefaultParams()
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
	asJSON := fs.Bool("json", false, `print {"text", "segments", "tokens":[{"id","p","plog"}]} per file (Parakeet's tokens also "frame", "duration")`)
	fs.alias("m", "model")
	outDir := fs.String("output-dir", "", "write each FILE's transcript to `DIR`/NAME.txt (.srt, .vtt, .json), NAME being FILE's name without its extension")
	pos, err := fs.parse(args)
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
	kind := *format
	if *asJSON {
		kind = "json"
	}
	several := len(pos) > 1
	if several && *outDir == "" && (kind == "srt" || kind == "vtt") {
		return usagef("--output-format %s with several files would run their subtitles together: give --output-dir DIR to write one file each", kind)
	}
	var outs []string
	if *outDir != "" {
		if outs, err = outputPaths(*outDir, pos, kind); err != nil {
			return err
		}
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
	// A local Whisper file's language is checked before the model loads; Parakeet takes none.
	if l := p.Language; l != "" && l != "auto" {
		if family, _ := models.SpeechFamily(*model); family != models.FamilyParakeet {
			if _, ok := wtok.LanguageIndex(l); !ok {
				return usagef("--language %q: unknown language; want a code such as en, de or zh, an English name such as german, or auto", l)
			}
		}
	}
	eng, be, err := openOn(e, bf, *model, func(p string, b backend.Backend) (*models.Recognizer, error) {
		return models.OpenRecognizer(p, b, asr.Config{MaxActive: 1})
	})
	if err != nil {
		return err
	}
	defer be.Close()
	defer eng.Close()
	// What the model cannot do is a mistake in the command line too: say so before any file.
	if m := eng.Whisper; m != nil {
		if _, err := eng.ResolveLanguage(p.Language); err != nil {
			if !m.Multilingual() {
				return usagef("--language %q: %s is an English-only model; leave out --language (or give en), or use a multilingual model", p.Language, *model)
			}
			return usagef("--language %q: %s does not know this language", p.Language, *model)
		}
		if p.Translate && !m.Multilingual() {
			return usagef("--translate: %s is an English-only model and cannot translate; use a multilingual model", *model)
		}
	} else if p.Translate {
		return usagef("--translate: %s is a %s model and cannot translate", *model, eng.Family)
	}
	if *outDir != "" {
		if err := os.MkdirAll(*outDir, 0o755); err != nil {
			return err
		}
	}
	failed, printed := 0, 0
	for i, path := range pos {
		err := func() error {
			res, err := transcribeFile(eng, path, p)
			if err != nil {
				return err
			}
			file := ""
			if several && kind == "json" && outs == nil {
				file = path
			}
			out, err := renderTranscript(res, kind, file)
			if err != nil {
				return err
			}
			if outs != nil {
				return os.WriteFile(outs[i], out, 0o644)
			}
			if several && kind == "txt" {
				sep := ""
				if printed > 0 {
					sep = "\n"
				}
				out = append([]byte(fmt.Sprintf("%s==> %s <==\n", sep, path)), out...)
			}
			printed++
			_, err = e.stdout.Write(out)
			return err
		}()
		if err == nil {
			continue
		}
		var pe *os.PathError
		if errors.As(err, &pe) && pe.Path == path {
			err = pe.Err // "FILE: no such file or directory", not "FILE: open FILE: ..."
		}
		if !several {
			return fmt.Errorf("%s: %w", path, err)
		}
		fmt.Fprintf(e.stderr, "parley transcribe: %s: %v\n", path, err)
		failed++
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d files failed", failed, len(pos))
	}
	return nil
}

// transcribeFile reads, decodes and transcribes the audio file at path.
func transcribeFile(eng asr.Recognizer, path string, p asr.Params) (*asr.Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	samples, _, err := audio.Decode(data)
	if err != nil {
		return nil, err
	}
	return eng.Transcribe(context.Background(), samples, p, nil)
}

// outputPaths are the files --output-dir dir writes the transcripts of inputs to, in format kind
// (txt, srt, vtt or json, also their extension). Two inputs of one name, and an output that
// is an input, are command-line mistakes.
func outputPaths(dir string, inputs []string, kind string) ([]string, error) {
	outs := make([]string, len(inputs))
	from := map[string]string{}
	for i, in := range inputs {
		base := filepath.Base(in)
		name := strings.TrimSuffix(base, filepath.Ext(base))
		if name == "" { // ".wav"
			name = base
		}
		outs[i] = filepath.Join(dir, name+"."+kind)
		if prev, ok := from[outs[i]]; ok {
			return nil, usagef("--output-dir: %s and %s would both be written to %s; rename one, or transcribe them separately", prev, in, outs[i])
		}
		from[outs[i]] = in
		for _, other := range inputs {
			if sameFile(outs[i], other) {
				return nil, usagef("--output-dir: the transcript of %s would overwrite the input %s; give another directory", in, other)
			}
		}
	}
	return outs, nil
}

// sameFile reports whether paths a and b name one file: the same path, or (where both exist)
// links to one file.
func sameFile(a, b string) bool {
	aa, err1 := filepath.Abs(a)
	bb, err2 := filepath.Abs(b)
	if err1 == nil && err2 == nil && aa == bb {
		return true
	}
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// withoutHTTP is a parameter error from the asr package without its HTTP wording ("bad
// request: "), which serve answers with and the command line has no use for.
func withoutHTTP(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok && errors.Is(err, asr.ErrBadRequest) {
		for _, e := range j.Unwrap() {
			if e != asr.ErrBadRequest {
				return e
			}
		}
	}
	return err
}

// renderTranscript is res in format kind (txt, srt, vtt or json); file, if not empty, is the
// "file" member of the JSON. Times in JSON are to the millisecond (asr.RoundTime).
func renderTranscript(res *asr.Result, kind, file string) ([]byte, error) {
	switch kind {
	case "srt":
		return []byte(res.SRT()), nil
	case "vtt":
		return []byte(res.VTT()), nil
	case "json":
		// A transducer's tokens also carry their encoder frame and duration (frames advanced);
		// a Whisper token has none.
		type tok struct {
			ID       int32   `json:"id"`
			Frame    *int32  `json:"frame,omitempty"`
			Duration *int32  `json:"duration,omitempty"`
			P        float32 `json:"p"`
			PLog     float32 `json:"plog"`
		}
		out := struct {
			File     string        `json:"file,omitempty"`
			Text     string        `json:"text"`
			Language string        `json:"language"`
			Segments []asr.Segment `json:"segments"`
			Tokens   []tok         `json:"tokens"`
		}{File: file, Text: res.Text, Language: res.Language, Segments: make([]asr.Segment, len(res.Segments)), Tokens: []tok{}}
		for i, s := range res.Segments {
			out.Segments[i] = s.Rounded()
			for _, t := range s.Tokens {
				o := tok{ID: t.ID, P: t.P, PLog: t.PLog}
				if t.HasFrame {
					o.Frame, o.Duration = &t.Frame, &t.Duration
				}
				out.Tokens = append(out.Tokens, o)
			}
		}
		b, err := json.Marshal(out)
		return append(b, '\n'), err
	}
	return []byte(strings.TrimSpace(res.Text) + "\n"), nil
}
