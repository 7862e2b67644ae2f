package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/models/whisper"
)

func runConvert(e *env, args []string) error {
	fs := newFlags(e, "convert", "-o OUT.gguf [--name NAME] WHISPER_MODEL.bin")
	out := fs.String("o", "", "output GGUF file (required)")
	name := fs.String("name", "", "general.name of the output (default: the input's file name)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one whisper.cpp model file, got %d arguments", len(pos))
	}
	if *out == "" {
		return usagef("-o OUT.gguf is required")
	}
	if *name == "" {
		*name = strings.TrimSuffix(filepath.Base(pos[0]), filepath.Ext(pos[0]))
	}
	f, err := ggml.Open(pos[0])
	if err != nil {
		return err
	}
	defer f.Close()
	w, err := whisper.ConvertGGML(f, *name)
	if err != nil {
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
