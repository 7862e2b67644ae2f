package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/parleyhq/parley/internal/npy"
	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/pockettts"
	"github.com/parleyhq/parley/runtime/sched/tts"
	"github.com/parleyhq/parley/runtime/server"
	"github.com/parleyhq/parley/runtime/tokenizer/sentencepiece"
)

// speakHelp follows the flags in `parley speak -h`.
const speakHelp = `
TEXT is spoken with VOICE: the name of a voice the checkpoint holds, a voice-state safetensors
file (upstream's export_model_state format, as its predefined voices are published), or an
audio file (WAV, FLAC, MP3, Ogg) whose speaker is cloned. TEXT "-" reads the text from standard
input. The audio is 16-bit mono PCM at the model's sample rate (24 kHz), as a WAV file, a FLAC
file (--format flac) or the bare samples (--format pcm); -o - writes it to standard output (not
a terminal).
`

// runSpeak synthesises speech with a Pocket TTS checkpoint.
func runSpeak(e *env, args []string) error {
	fs := newFlags(e, "speak", "-m MODEL --voice VOICE [flags] (TEXT | -)")
	fs.Usage = func() {
		fs.printUsage()
		fmt.Fprint(e.stderr, speakHelp)
	}
	bf := addBackendFlags(fs)
	model := fs.String("m", "", "Pocket TTS checkpoint: upstream's model.safetensors (tokenizer.model beside it) or GGUF")
	tokPath := fs.String("tokenizer", "", "SentencePiece tokenizer.model (default: the checkpoint's, or tokenizer.model beside it)")
	voiceArg := fs.String("voice", "", "a voice `NAME` in the checkpoint, a voice-state .safetensors file, or an audio file to clone")
	out := fs.String("o", "-", "output `FILE` (- for standard output)")
	format := fs.String("format", "wav", "output format: wav, flac, pcm (16-bit little-endian mono)")
	decThreads := fs.Int("tts-decoder-threads", 0, decoderThreadsUsage)
	temp := fs.Float64("temperature", tts.DefaultTemperature, "variance of the flow head's starting noise (0: deterministic)")
	seed := fs.Uint64("seed", 0, "seed of the sampling noise")
	noisePath := fs.String("noise", "", "the flow head's x0 of every frame step, a float32 .npy of rows of 32 (recorded noise, for comparing with a reference; replaces --temperature and --seed)")
	fs.alias("m", "model")
	fs.alias("o", "output")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if err := bf.check(); err != nil {
		return err
	}
	switch {
	case *model == "":
		return usagef("-m MODEL is required")
	case *voiceArg == "":
		return usagef("--voice VOICE is required")
	case len(pos) == 0:
		return usagef("no text given (TEXT, or - to read standard input)")
	case len(pos) > 1:
		return usagef("%d texts given: quote the text as one argument", len(pos))
	case *format != "wav" && *format != "flac" && *format != "pcm":
		return usagef("--format %q: want wav, flac or pcm", *format)
	case !(*temp >= 0) || math.IsInf(*temp, 0):
		return usagef("--temperature %v: want a finite value of at least 0", *temp)
	}
	if *out == "-" && isTerminal(e.stdout) {
		return usagef("the audio would go to a terminal: give -o FILE, or redirect standard output")
	}
	text := pos[0]
	if text == "-" {
		b, err := io.ReadAll(e.stdin)
		if err != nil {
			return err
		}
		text = string(b)
	}
	var noise []float32
	if *noisePath != "" {
		a, err := npy.ReadFile(*noisePath)
		if err != nil {
			return fmt.Errorf("--noise: %w", err)
		}
		if _, cols := a.Rows(); cols != 32 || len(a.Shape) != 2 {
			return fmt.Errorf("--noise: %s has shape %v, want [steps, 32]", *noisePath, a.Shape)
		}
		noise = a.Data
	}

	path, err := resolveModel(e, *model)
	if err != nil {
		return err
	}
	ck, tok, err := openSpeechCheckpoint(path, *tokPath)
	if err != nil {
		return err
	}
	defer ck.Close()
	if _, err := pockettts.SplitText(tok, text, ck.Text); err != nil { // before the model loads
		return err
	}
	b, err := bf.open(e)
	if err != nil {
		return err
	}
	defer b.Close()
	m, err := pockettts.New(b, ck.Weights)
	if err != nil {
		return err
	}
	defer m.Close()
	sc := tts.Config{Text: ck.Text, MaxActive: 1} // one synthesis: one slot of cache
	if *decThreads < 0 {
		return usagef("--tts-decoder-threads must be 0 to 1024")
	}
	if *decThreads > 0 {
		dm, closeDec, err := decoderModel(b, ck.Weights, *decThreads)
		if err != nil {
			return err
		}
		defer closeDec()
		sc.Decoder = dm
	}
	s, err := tts.New(m, tok, sc)
	if err != nil {
		return err
	}
	defer s.Close()
	voice, err := speakVoice(s, ck, m.Config(), *voiceArg)
	if err != nil {
		return err
	}
	pcm := []byte{}
	r := tts.Request{Text: text, Voice: voice, Temperature: *temp, Seed: *seed, Noise: noise}
	if err := s.Speak(context.Background(), r, func(a []float32) error {
		pcm = audio.FloatToPCM16(pcm, a)
		return nil
	}); err != nil {
		return err
	}
	data := pcm
	switch *format {
	case "wav":
		h, err := audio.WAVHeader(int64(len(pcm)/2), s.SampleRate())
		if err != nil {
			return err
		}
		data = append(h, pcm...)
	case "flac":
		enc, err := audio.NewFLACEncoder(s.SampleRate(), s.FrameSamples())
		if err != nil {
			return err
		}
		frames, err := enc.Append(nil, pcm)
		if err != nil {
			return err
		}
		frames = enc.Flush(frames)
		h, err := enc.Header(enc.Samples(), enc.MD5())
		if err != nil {
			return err
		}
		data = append(h, frames...)
	}
	if *out == "-" {
		_, err = e.stdout.Write(data)
		return err
	}
	return os.WriteFile(*out, data, 0o644)
}

// openSpeechCheckpoint opens the Pocket TTS checkpoint at path with its tokenizer: the
// SentencePiece model at tokPath when given, else the checkpoint's own (or the one beside it).
func openSpeechCheckpoint(path, tokPath string) (*pockettts.Checkpoint, pockettts.Tokenizer, error) {
	ck, err := pockettts.Open(path)
	if err != nil {
		return nil, nil, err
	}
	var tok pockettts.Tokenizer
	if ck.Tokenizer != nil {
		tok = ck.Tokenizer
	}
	if tokPath != "" {
		t, err := sentencepiece.Load(tokPath)
		if err != nil {
			ck.Close()
			return nil, nil, err
		}
		if t.Len() != ck.Weights.Config.Vocab {
			ck.Close()
			return nil, nil, fmt.Errorf("%s has %d pieces, the model's vocabulary %d", tokPath, t.Len(), ck.Weights.Config.Vocab)
		}
		tok = t
	}
	if tok == nil {
		ck.Close()
		return nil, nil, fmt.Errorf("%s has no tokenizer and there is no %s beside it: give --tokenizer", path, pockettts.TokenizerFile)
	}
	return ck, tok, nil
}

// speakVoice resolves --voice: a voice of the checkpoint, a voice-state file, or audio to clone.
func speakVoice(s *tts.Synthesizer, ck *pockettts.Checkpoint, cfg pockettts.Config, arg string) (*pockettts.Voice, error) {
	if v, ok := ck.Voices[arg]; ok {
		return v, nil
	}
	data, err := os.ReadFile(arg)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !strings.ContainsAny(arg, `/\.`) {
			names := make([]string, 0, len(ck.Voices))
			for n := range ck.Voices {
				names = append(names, n)
			}
			sort.Strings(names)
			have := "it has none"
			if len(names) > 0 {
				have = "it has " + strings.Join(names, ", ")
			}
			return nil, fmt.Errorf("--voice %q: no such voice in the checkpoint (%s) and no such file", arg, have)
		}
		return nil, fmt.Errorf("--voice: %w", err)
	}
	if strings.EqualFold(filepath.Ext(arg), ".safetensors") {
		return pockettts.LoadVoice(arg, &cfg)
	}
	// Decoded at the prompt's own rate and resampled once, straight to the model's.
	prompt, _, err := audio.DecodeWith(data, audio.Options{SampleRate: cfg.SampleRate})
	if err != nil {
		return nil, fmt.Errorf("--voice %s: %w", arg, err)
	}
	return s.CloneVoice(prompt)
}

// openSynth opens the Pocket TTS checkpoint at path on be for serving, with the checkpoint's
// voices and the voice-state files of voiceArgs (NAME=FILE each), batched and queued as sc says;
// with no voices, requests speak with voices uploaded to /v1/audio/voices. close releases it all.
func openSynth(be backend.Backend, path string, voiceArgs []string, sc tts.Config, decoderThreads int) (ss servedSynth, close func(), err error) {
	ck, err := pockettts.Open(path)
	if err != nil {
		return servedSynth{}, nil, err
	}
	var closers []func()
	close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	closers = append(closers, func() { ck.Close() })
	defer func() {
		if err != nil {
			close()
		}
	}()
	if ck.Tokenizer == nil {
		return servedSynth{}, nil, fmt.Errorf("%s has no tokenizer and there is no %s beside it", path, pockettts.TokenizerFile)
	}
	voices := map[string]*pockettts.Voice{}
	for n, v := range ck.Voices {
		voices[n] = v
	}
	cfg := ck.Weights.Config
	for _, a := range voiceArgs {
		name, file, ok := strings.Cut(a, "=")
		if !ok || name == "" || file == "" {
			return servedSynth{}, nil, usagef("--tts-voice %q: want NAME=FILE", a)
		}
		v, err := pockettts.LoadVoice(file, &cfg)
		if err != nil {
			return servedSynth{}, nil, err
		}
		voices[name] = v
	}
	m, err := pockettts.New(be, ck.Weights)
	if err != nil {
		return servedSynth{}, nil, err
	}
	closers = append(closers, func() { m.Close() })
	if decoderThreads > 0 {
		dm, closeDec, err := decoderModel(be, ck.Weights, decoderThreads)
		if err != nil {
			return servedSynth{}, nil, err
		}
		closers = append(closers, closeDec)
		sc.Decoder = dm
	}
	sc.Text, sc.Voices = ck.Text, voices
	s, err := tts.New(m, ck.Tokenizer, sc)
	if err != nil {
		return servedSynth{}, nil, err
	}
	closers = append(closers, func() { s.Close() })
	return servedSynth{s, cfg}, close, nil
}

// servedSynth is a Synthesizer as the server takes it: a server.Speaker that also clones voices
// (server.VoiceCloner), keeps them in files (server.VoiceStorer) and counts the text tokens of an
// input (server.TokenCounter).
type servedSynth struct {
	*tts.Synthesizer
	cfg pockettts.Config
}

func (s servedSynth) WriteVoice(w io.Writer, v server.ClonedVoice) error {
	c, ok := v.(clonedVoice)
	if !ok {
		return fmt.Errorf("a voice of type %T is not Pocket TTS's", v)
	}
	return c.v.WriteSafetensors(w, &s.cfg)
}

func (s servedSynth) ReadVoice(path string) (server.ClonedVoice, error) {
	v, err := pockettts.LoadVoice(path, &s.cfg)
	if err != nil {
		return nil, err
	}
	return clonedVoice{v}, nil
}

func (s servedSynth) CloneVoice(prompt []float32) (server.ClonedVoice, error) {
	v, err := s.Synthesizer.CloneVoice(prompt)
	if err != nil {
		return nil, err
	}
	return clonedVoice{v}, nil
}

func (s servedSynth) CountTokens(text string) (int, error) {
	chunks, err := s.Chunks(text)
	n := 0
	for _, c := range chunks {
		n += len(c.Tokens)
	}
	return n, err
}

// clonedVoice is a voice state made from a prompt.
type clonedVoice struct{ v *pockettts.Voice }

func (c clonedVoice) Apply(r *tts.Request) { r.Voice, r.VoiceName = c.v, "" }
func (c clonedVoice) Bytes() int           { return c.v.Bytes() }

// decoderThreadsUsage is --tts-decoder-threads's help.
const decoderThreadsUsage = "run Pocket TTS's Mimi decoder on a backend of its own with `N` threads, frame i decoded while frame i+1's FlowLM step runs (a second copy of the decoder's weights; pays where cores are free beside --threads; 0: decode after each step, on the model's backend)"

// decoderModel loads w again on a new backend of be's kind with threads threads, for
// tts.Config.Decoder: the synthesizer's Mimi decoder then runs there, beside its FlowLM steps.
// close releases the model and the backend.
func decoderModel(be backend.Backend, w *pockettts.Weights, threads int) (m *pockettts.Model, close func(), err error) {
	if threads > 1024 {
		return nil, nil, usagef("--tts-decoder-threads %d: want 0 to 1024", threads)
	}
	db, _, err := backend.New(be.Name(), backend.Options{Threads: threads})
	if err != nil {
		return nil, nil, fmt.Errorf("the decoder's backend: %w", err)
	}
	if m, err = pockettts.New(db, w); err != nil {
		db.Close()
		return nil, nil, err
	}
	return m, func() { m.Close(); db.Close() }, nil
}
