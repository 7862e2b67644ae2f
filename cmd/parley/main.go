// Command parley runs LLaMA-family GGUF models and Whisper speech recognition: generate text,
// transcribe audio, tokenize, inspect model files,
// benchmark, and make synthetic models for speed work.
//
//	parley generate -m MODEL -p PROMPT [-n N] [--temp T] [--json]
//	parley tokenize -m MODEL [--no-bos] [--no-parse-special] (TEXT | -)
//	parley inspect MODEL (GGUF or whisper.cpp ggml)
//	parley bench -m MODEL [-p 512] [-n 128] [-t THREADS] [--json]   (or a Whisper model [--audio FILE])
//	parley synth --shape 15M|110M|1B --type f32|f16|q8_0|q4_0|q4_k|... -o FILE
//	parley transcribe -m WHISPER_MODEL [--beam N] [--language L] [--output-format F] [--json] [--output-dir DIR] FILE...
//	parley convert -o OUT [--type q8_0] [--format gguf|ggml] WHISPER_MODEL.bin
//	parley version   (or parley --version)
//
// Every command takes --help. The commands that run a model (generate, bench, serve, transcribe)
// also take --backend go|cpu|auto and -t THREADS; tokenize, inspect, synth and convert only read
// or write files and take neither. Every flag of every command is also read from its environment
// variable, PARLEY_ and its long name in upper case with '_' for '-' (flags.go).
//
// Exit status: 0 on success, 2 for a command-line mistake (an unknown flag, command, backend or
// language, a value out of range), 1 for a failure while running (a missing or corrupt file, a
// backend that does not start).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
)

// env is what a command reads and writes; tests substitute buffers.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

type command struct {
	summary string
	run     func(e *env, args []string) error
}

var commands = map[string]command{
	"generate":   {"generate text from a prompt", runGenerate},
	"tokenize":   {"print the token ids of a text as JSON", runTokenize},
	"inspect":    {"print a model file's metadata and tensor table", runInspect},
	"bench":      {"measure prompt-processing and generation speed", runBench},
	"synth":      {"write a GGUF model with random weights in a real shape", runSynth},
	"serve":      {"serve models over an OpenAI-compatible HTTP API", runServe},
	"transcribe": {"transcribe audio files with a Whisper model", runTranscribe},
	"convert":    {"write a whisper.cpp model as GGUF or ggml, optionally quantised", runConvert},
	"version":    {"print the version, the build and the processor and GPUs this binary sees", runVersion},
}

// usageError is a command-line mistake: exit status 2, as flag does.
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

func (u usageError) Unwrap() error { return u.error }

// reportedError is an error the command has written to its log already (a JSON record):
// run prints nothing more.
type reportedError struct{ error }

func (r reportedError) Unwrap() error { return r.error }

func main() {
	os.Exit(run(&env{os.Stdin, os.Stdout, os.Stderr}, os.Args[1:]))
}

func run(e *env, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(e.stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args[0] = "version"
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "parley: unknown command %q\n\n", args[0])
		usage(e.stderr)
		return 2
	}
	err := c.run(e, args[1:])
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, new(reportedError)): // logged already
		if errors.As(err, new(usageError)) {
			return 2
		}
		return 1
	case errors.As(err, new(usageError)):
		fmt.Fprintf(e.stderr, "parley %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(e.stderr, "parley %s: %v\n", args[0], err)
		return 1
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: parley COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'parley COMMAND --help' for a command's flags.")
}
