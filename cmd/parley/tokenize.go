package main

import (
	"encoding/json"
	"io"

	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/tokenizer"
)

func runTokenize(e *env, args []string) error {
	fs := newFlags(e, "tokenize", "-m MODEL [--no-bos] [--no-parse-special] (TEXT | -)")
	model := fs.String("m", "", "model or vocabulary file (GGUF)")
	noBOS := fs.Bool("no-bos", false, "do not add BOS/EOS as the vocabulary says")
	noSpecial := fs.Bool("no-parse-special", false, "treat special-token text (e.g. <s>) as plain text")
	fs.alias("m", "model")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if *model == "" {
		return usagef("-m MODEL is required")
	}
	if len(pos) != 1 {
		return usagef("want one TEXT argument (or - for standard input), got %d", len(pos))
	}
	text := pos[0]
	if text == "-" {
		b, err := io.ReadAll(io.LimitReader(e.stdin, 64<<20))
		if err != nil {
			return err
		}
		text = string(b)
	}
	path, err := resolveModel(e, *model)
	if err != nil {
		return err
	}
	if err := models.CheckLLM(path); err != nil {
		return takenBy(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tok, err := tokenizer.New(f)
	if err != nil {
		return err
	}
	ids, err := tok.Encode(text, !*noBOS, !*noSpecial)
	if err != nil {
		return err
	}
	if ids == nil {
		ids = []int32{}
	}
	return json.NewEncoder(e.stdout).Encode(ids)
}
