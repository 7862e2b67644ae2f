package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/bert"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// synthTypes are the weight types llama.Synth writes.
var synthTypes = []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"}

func runSynth(e *env, args []string) error {
	fs := newFlags(e, "synth", "--shape 15M|110M|1B --type TYPE -o FILE [--arch ARCH] [--seed N]\n       parley synth --arch bert --shape bge-small|minilm --type TYPE -o FILE [--vocab FILE] [--seed N]")
	shape := fs.String("shape", "15M", "model shape: "+strings.Join(llama.ShapeNames(), ", ")+"; bert: "+strings.Join(bert.ShapeNames(), ", ")+" (bert's default: bge-small)")
	arch := fs.String("arch", "llama", "architecture: "+strings.Join(llama.SynthArches, ", ")+", bert")
	vocab := fs.String("vocab", "", "bert: GGUF file whose tokenizer the model gets (default: a synthetic WordPiece vocabulary)")
	typ := fs.String("type", "f32", "weight type: "+strings.Join(synthTypes, ", "))
	out := fs.String("o", "", "output file (required)")
	seed := fs.Uint64("seed", 1, "random seed")
	fs.alias("o", "output")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("unexpected arguments %q", pos)
	}
	if *out == "" {
		return usagef("-o FILE is required")
	}
	if *arch == "bert" {
		s := "bge-small"
		if fs.isSet("shape") {
			s = *shape
		}
		return synthBERT(e, s, *typ, *out, *vocab, *seed)
	}
	if *vocab != "" {
		return usagef("--vocab is for --arch bert")
	}
	s, ok := llama.Shapes[strings.ToUpper(*shape)]
	if !ok {
		return usagef("unknown shape %q (have %s)", *shape, strings.Join(llama.ShapeNames(), ", "))
	}
	if !slices.Contains(llama.SynthArches, *arch) {
		return usagef("--arch %q: want one of %s", *arch, strings.Join(llama.SynthArches, ", "))
	}
	s.Arch = *arch
	if !slices.Contains(synthTypes, strings.ToLower(*typ)) {
		return usagef("--type %q: want one of %s", *typ, strings.Join(synthTypes, ", "))
	}
	dt, err := tensor.ParseDType(*typ)
	if err != nil {
		return err
	}
	w, err := llama.Synth(s, dt, *seed)
	if err != nil {
		return err
	}
	if err := w.WriteFile(*out); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "wrote %s: %s shape, %s, %v weights\n", *out, s.Name, *arch, dt)
	return nil
}

// synthBERT writes a bert model of a bert.Shapes geometry.
func synthBERT(e *env, shape, typ, out, vocabPath string, seed uint64) error {
	s, ok := bert.Shapes[strings.ToLower(shape)]
	if !ok {
		return usagef("unknown bert shape %q (have %s)", shape, strings.Join(bert.ShapeNames(), ", "))
	}
	dt, err := tensor.ParseDType(typ)
	if err != nil || !slices.Contains(bert.SynthTypes, dt) {
		return usagef("--type %q: bert takes one of %v", typ, bert.SynthTypes)
	}
	var vocab *gguf.File
	if vocabPath != "" {
		if vocab, err = gguf.Open(vocabPath); err != nil {
			return err
		}
		defer vocab.Close()
	}
	w, err := bert.Synth(s, dt, seed, vocab)
	if err != nil {
		return err
	}
	if err := w.WriteFile(out); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "wrote %s: %s shape, bert, %v weights\n", out, s.Name, dt)
	return nil
}
