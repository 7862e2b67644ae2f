package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/tensor"
)

func runConvert(e *env, args []string) error {
	fs := newFlags(e, "convert", "-o OUT [--type q8_0|q5_1|q5_0|q4_1|q4_0|f16|f32] [--format gguf|ggml] [--name NAME] WHISPER_MODEL.bin")
	out := fs.String("o", "", "output file (required)")
	name := fs.String("name", "", "general.name of the output (default: the input's file name)")
	typ := fs.String("type", "", "quantise the matrices to this type, as whisper.cpp's quantize tool does (default: keep them)")
	format := fs.String("format", "gguf", "output format: gguf, or ggml (whisper.cpp's)")
	fs.alias("o", "output")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one whisper.cpp model file, got %d arguments", len(pos))
	}
	if *out == "" {
		return usagef("-o OUT is required")
	}
	if *format != "gguf" && *format != "ggml" {
		return usagef("--format %q: want gguf or ggml", *format)
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
	if *name == "" {
		*name = strings.TrimSuffix(filepath.Base(pos[0]), filepath.Ext(pos[0]))
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
	// Write beside the output and rename: os.Create on the output would truncate the input when
	// they are the same file (its mapping then reads the bytes being written, or faults), and a
	// failed write would leave a partial file under the output's name.
	tmp, err := os.CreateTemp(filepath.Dir(*out), filepath.Base(*out)+".*.tmp")
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
	if err := os.Rename(tmp.Name(), *out); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	fmt.Fprintf(e.stderr, "wrote %s: %d tensors\n", *out, len(f.Tensors))
	return nil
}

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
