package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/hub"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/tensor"
)

// kvTypeUsage is the help of the --kv-type flags.
const kvTypeUsage = "KV cache type: f16, bf16 or f32"

// parseKVType reads a --kv-type value.
func parseKVType(s string) (tensor.DType, error) {
	kv, err := tensor.ParseDType(s)
	if err != nil || (kv != tensor.F16 && kv != tensor.BF16 && kv != tensor.F32) {
		return 0, usagef("--kv-type %q: want f16, bf16 or f32", s)
	}
	return kv, nil
}

// backendFlags are the flags every model-running command shares.
type backendFlags struct {
	fs      *flags
	name    *string
	threads *int
}

func addBackendFlags(fs *flags) backendFlags {
	bf := backendFlags{
		fs:      fs,
		name:    fs.String("backend", "", "compute backend: "+strings.Join(append(backend.Names(), "auto"), ", ")+" (default auto)"),
		threads: fs.Int("t", 0, "CPU threads (0: one per core)"),
	}
	fs.alias("t", "threads")
	return bf
}

// check reports the flags' command-line mistakes: a negative thread count, or a backend name
// (from --backend or $PARLEY_BACKEND) that this build does not have. A named backend that fails
// to start is not a mistake in the command line; open reports it.
func (bf backendFlags) check() error {
	if *bf.threads < 0 {
		src := ""
		if from := bf.fs.from("t"); from != "-t" {
			src = " (from " + from + ")"
		}
		return usagef("-t %d%s: thread count must not be negative", *bf.threads, src)
	}
	name := backend.Choose(*bf.name)
	if name == "auto" || slices.Contains(backend.Names(), name) {
		return nil
	}
	from := bf.fs.from("backend")
	if why := backend.NotBuilt(name); why != "" {
		return usagef("%s %q: %s", from, name, why)
	}
	return usagef("%s %q: unknown backend (have %s)", from, name, strings.Join(append(backend.Names(), "auto"), ", "))
}

func (bf backendFlags) open(e *env) (backend.Backend, error) {
	return bf.start(func(n string) { fmt.Fprintln(e.stderr, "parley:", n) })
}

// start starts the backend the flags choose, passing each note (why "auto" skipped a backend)
// to note.
func (bf backendFlags) start(note func(string)) (backend.Backend, error) {
	if err := bf.check(); err != nil {
		return nil, err
	}
	name := backend.Choose(*bf.name)
	b, notes, err := backend.New(name, backend.Options{Threads: *bf.threads})
	for _, n := range notes {
		note(n)
	}
	return b, err
}

// openModel starts the backend and loads the language model at path onto it.
func openModel(e *env, bf backendFlags, path string) (*models.LLM, backend.Backend, error) {
	if path == "" {
		return nil, nil, usagef("-m MODEL is required")
	}
	return openOn(e, bf, path, func(p string, b backend.Backend) (*models.LLM, error) {
		m, err := models.OpenLLM(p, b)
		return m, takenBy(err)
	})
}

// takenBy adds to an error of a speech recognition model given for a language model the command
// that takes it.
func takenBy(err error) error {
	if errors.Is(err, models.ErrNotLLM) {
		return fmt.Errorf("%w: parley transcribe takes it", err)
	}
	return err
}

// openWhisper opens the backend the flags choose and the Whisper model at path (a file or an
// hf:// name) on it.
func openWhisper(e *env, bf backendFlags, path string) (*whisper.Model, backend.Backend, error) {
	return openOn(e, bf, path, func(p string, b backend.Backend) (*whisper.Model, error) { return whisper.Open(b, p) })
}

// openOn resolves path (a file or an hf:// name), starts the backend the flags choose and opens
// the model on it with open; the backend is closed again if that fails.
func openOn[M any](e *env, bf backendFlags, path string, open func(string, backend.Backend) (M, error)) (M, backend.Backend, error) {
	var none M
	if err := bf.check(); err != nil { // before a download
		return none, nil, err
	}
	path, err := resolveModel(e, path)
	if err != nil {
		return none, nil, err
	}
	b, err := bf.open(e)
	if err != nil {
		return none, nil, err
	}
	m, err := open(path, b)
	if err != nil {
		b.Close()
		return none, nil, err
	}
	return m, b, nil
}

// resolveModel returns the local path of a model file: path itself, or for
// hf://owner/repo[@rev]/file the file downloaded once into the cache ($PARLEY_CACHE), with a
// progress bar on stderr.
func resolveModel(e *env, path string) (string, error) {
	if !hub.IsRemote(path) {
		return path, nil
	}
	if err := hub.CheckName(path); err != nil {
		return "", usageError{err}
	}
	return hub.Resolve(context.Background(), path, hub.Options{Progress: e.stderr})
}

// multiFlag collects a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }
func (m *multiFlag) repeatable()        {}

// biasFlag collects --logit-bias ID=BIAS flags.
type biasFlag map[int32]float32

func (b biasFlag) String() string { return fmt.Sprint(map[int32]float32(b)) }
func (b biasFlag) repeatable()    {}
func (b biasFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("want TOKEN_ID=BIAS, got %q", s)
	}
	id, err := strconv.ParseInt(strings.TrimSpace(k), 10, 32)
	if err != nil {
		return fmt.Errorf("token id %q: %v", k, err)
	}
	bias, err := strconv.ParseFloat(strings.TrimSpace(v), 32)
	if err != nil {
		return fmt.Errorf("bias %q: %v", v, err)
	}
	b[int32(id)] = float32(bias)
	return nil
}

// isTerminal reports whether w is a terminal (a character device), where a redrawn line belongs.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
