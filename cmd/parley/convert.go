package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/hub"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/parakeet"
	"github.com/parleyhq/parley/runtime/models/pockettts"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/tensor"
	"github.com/parleyhq/parley/runtime/tokenizer/sentencepiece"
)

func runConvert(e *env, args []string) error {
	fs := newFlags(e, "convert", "-o OUT [--type TYPE] [--format gguf|ggml] [--name NAME] [--tokenizer TOKENIZER.model] [--voice NAME=FILE]... MODEL")
	out := fs.String("o", "", "output file (required)")
	name := fs.String("name", "", "general.name of the output, Whisper and Parakeet (default: the input's file name)")
	typ := fs.String("type", "", "quantise the matrices to this type: Whisper's to q8_0, q5_1, q5_0, q4_1, q4_0, f16 or f32 as whisper.cpp's quantize tool does, Pocket TTS's step matrices to q8_0 or q4_k; Parakeet's keep theirs (default: keep them)")
	format := fs.String("format", "gguf", "output format: gguf, or ggml (whisper.cpp's; Whisper and Parakeet)")
	tokPath := fs.String("tokenizer", "", "Pocket TTS: the SentencePiece model to embed (default: tokenizer.model beside the checkpoint)")
	var voiceArgs multiFlag
	fs.Var(&voiceArgs, "voice", "Pocket TTS: embed the voice state FILE (safetensors) as voice NAME (NAME=FILE, repeatable)")
	fs.alias("o", "output")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one model file (Whisper or Parakeet ggml, Pocket TTS safetensors or GGUF), got %d arguments", len(pos))
	}
	if *out == "" {
		return usagef("-o OUT is required")
	}
	if *format != "gguf" && *format != "ggml" {
		return usagef("--format %q: want gguf or ggml", *format)
	}
	if *name == "" {
		*name = strings.TrimSuffix(filepath.Base(pos[0]), filepath.Ext(pos[0]))
	}
	// A local file of another family than Whisper's is converted by its own package; anything
	// else (a name to download, a file of no known family) goes to Whisper's reader, which says
	// why it cannot.
	if !hub.IsRemote(pos[0]) {
		kind, err := models.Probe(pos[0])
		if err != nil {
			return err
		}
		family := ""
		if kind == models.KindSpeechRecognition {
			if family, err = models.SpeechFamily(pos[0]); err != nil {
				return err
			}
		}
		switch {
		case kind == models.KindSpeechSynthesis:
			return convertPocketTTS(e, pos[0], *out, *typ, *format, *tokPath, voiceArgs)
		case family == models.FamilyParakeet:
			return convertParakeet(e, pos[0], *out, *name, *typ, *format)
		}
	}
	if *tokPath != "" || len(voiceArgs) > 0 {
		return usagef("--tokenizer and --voice are for Pocket TTS checkpoints; %s is not one", pos[0])
	}
	var dt tensor.DType
	if *typ != "" {
		if dt, err = tensor.ParseDType(*typ); err != nil {
			return usageError{err}
		}
		// Before the model is opened (or downloaded).
		if _, ok := ggml.FTypeOf(dt); !ok {
			return usagef("--type %s: %v is not a type whisper.cpp loads: want q8_0, q5_1, q5_0, q4_1, q4_0, f16 or f32", *typ, dt)
		}
	}
	path, err := resolveModel(e, pos[0])
	if err != nil {
		return err
	}
	f, err := ggml.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	src := *f // the same file, with its matrices quantised when --type asks for it
	if *typ != "" {
		if src.HParams, src.Tensors, err = whisper.QuantizeGGML(f, dt); err != nil {
			return fmt.Errorf("%s: %w", pos[0], err)
		}
	}
	var w io.WriterTo
	if *format == "ggml" {
		w = ggmlWriter{&src}
	} else if w, err = whisper.ConvertGGML(&src, *name); err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	if err := writeFile(*out, w); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "wrote %s: %d tensors\n", *out, len(f.Tensors))
	return nil
}

// convertPocketTTS writes the Pocket TTS checkpoint at in (upstream's safetensors, or GGUF) as
// GGUF with its tokenizer and voices, the matrices a frame step reads quantised when typ is q8_0
// or q4_k (pockettts.Weights.Quantize).
func convertPocketTTS(e *env, in, out, typ, format, tokPath string, voiceArgs []string) error {
	if format != "gguf" {
		return usagef("--format %s: Pocket TTS converts to gguf only", format)
	}
	var dt tensor.DType
	if typ != "" {
		var err error
		if dt, err = tensor.ParseDType(typ); err != nil || !slices.Contains(pockettts.QuantTypes, dt) {
			return usagef("--type %s: Pocket TTS quantises to q8_0 or q4_k only (q8_0: the FlowLM transformer's, the flow head's and the Mimi decoder transformer's matrices; q4_k: the FlowLM transformer's to q4_k, those others to q8_0; the rest keeps the checkpoint's types)", typ)
		}
	}
	voiceFiles := map[string]string{}
	for _, a := range voiceArgs {
		vname, file, ok := strings.Cut(a, "=")
		if !ok || vname == "" || file == "" {
			return usagef("--voice %q: want NAME=FILE", a)
		}
		voiceFiles[vname] = file
	}
	ck, err := pockettts.Open(in)
	if err != nil {
		return err
	}
	defer ck.Close()
	tok := ck.Tokenizer
	if tokPath != "" {
		if tok, err = sentencepiece.Load(tokPath); err != nil {
			return err
		}
	}
	if tok == nil {
		return usagef("%s has no tokenizer and there is no %s beside it: give --tokenizer", in, pockettts.TokenizerFile)
	}
	cfg := ck.Weights.Config
	voices := maps.Clone(ck.Voices)
	if voices == nil {
		voices = map[string]*pockettts.Voice{}
	}
	for vname, file := range voiceFiles {
		v, err := pockettts.LoadVoice(file, &cfg)
		if err != nil {
			return fmt.Errorf("--voice %s: %w", vname, err)
		}
		voices[vname] = v
	}
	quantised := 0
	if typ != "" {
		if quantised, err = ck.Weights.Quantize(dt); err != nil {
			return err
		}
	}
	w := writerToFunc(func(w io.Writer) (int64, error) {
		cw := &countingWriter{w: w}
		err := pockettts.WriteGGUF(cw, ck.Weights, tok, voices, ck.Text)
		return cw.n, err
	})
	if err := writeFile(out, w); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "wrote %s: Pocket TTS, %d tensors (%d quantised), %d voices\n", out, len(ck.Weights.All()), quantised, len(voices))
	return nil
}

// convertParakeet writes the Parakeet model at in (whisper.cpp's ggml form, or GGUF) as GGUF
// or ggml; the tensors keep their types.
func convertParakeet(e *env, in, out, name, typ, format string) error {
	if typ != "" {
		return usagef("--type %s: Parakeet models convert with their tensors' types kept (quantise with whisper.cpp's parakeet-quantize)", typ)
	}
	f, err := parakeet.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	var w io.WriterTo
	if format == "ggml" {
		w = writerToFunc(func(w io.Writer) (int64, error) {
			cw := &countingWriter{w: w}
			err := parakeet.WriteGGML(cw, f)
			return cw.n, err
		})
	} else if w, err = parakeet.ConvertGGML(f, name); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if err := writeFile(out, w); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "wrote %s: Parakeet, %d tensors\n", out, len(f.Tensors))
	return nil
}

// writeFile writes w's bytes as the file out: beside it, then renamed. os.Create on the output
// would truncate the input when they are the same file (its mapping then reads the bytes being
// written, or faults), and a failed write would leave a partial file under the output's name.
func writeFile(out string, w io.WriterTo) error {
	tmp, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".*.tmp")
	if err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil { // CreateTemp's 0600 would hide the model from a server run as another user
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if _, err := w.WriteTo(tmp); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

type writerToFunc func(io.Writer) (int64, error)

func (f writerToFunc) WriteTo(w io.Writer) (int64, error) { return f(w) }

// ggmlWriter writes a model as a whisper.cpp ggml file.
type ggmlWriter struct{ f *ggml.File }

func (g ggmlWriter) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	err := ggml.Write(cw, g.f.HParams, g.f.Filters, g.f.Vocab, g.f.Tensors)
	return cw.n, err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
