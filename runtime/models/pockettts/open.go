package pockettts

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/safetensors"
	"github.com/parleyhq/parley/runtime/tokenizer/sentencepiece"
)

// TokenizerFile is the name of the SentencePiece model beside upstream's model.safetensors.
const TokenizerFile = "tokenizer.model"

// Open opens a Pocket TTS checkpoint: a GGUF file, or upstream's model.safetensors, whose
// tokenizer is read from tokenizer.model beside it when that file exists. The weights alias the
// memory-mapped file until Close.
func Open(path string) (*Checkpoint, error) {
	isGGUF, err := gguf.IsFile(path)
	if err != nil {
		return nil, fmt.Errorf("pockettts: %w", err)
	}
	if isGGUF {
		f, err := gguf.Open(path)
		if err != nil {
			return nil, err
		}
		ck, err := LoadGGUF(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		ck.closer = f
		return ck, nil
	}
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	w, err := LoadSafetensors(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ck := &Checkpoint{Weights: w, Voices: map[string]*Voice{}, closer: f}
	tp := filepath.Join(filepath.Dir(path), TokenizerFile)
	if _, err := os.Stat(tp); err == nil {
		if ck.Tokenizer, err = sentencepiece.Load(tp); err != nil {
			f.Close()
			return nil, err
		}
		if ck.Tokenizer.Len() != w.Config.Vocab {
			f.Close()
			return nil, fmt.Errorf("pockettts: %s has %d pieces, the model's embedding %d rows", tp, ck.Tokenizer.Len(), w.Config.Vocab+1)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		f.Close()
		return nil, fmt.Errorf("pockettts: %w", err)
	}
	return ck, nil
}

// IsModelFile reports whether the file at path is a Pocket TTS checkpoint: a GGUF file of
// architecture Architecture, or a safetensors file with the FlowLM's text embedding. The error is
// the file's when it cannot be read; a file of neither format is not one, without error.
func IsModelFile(path string) (bool, error) {
	isGGUF, err := gguf.IsFile(path)
	if err != nil {
		return false, err
	}
	if isGGUF {
		f, err := gguf.Open(path)
		if err != nil {
			return false, nil
		}
		defer f.Close()
		return f.Architecture() == Architecture, nil
	}
	f, err := safetensors.Open(path)
	if err != nil {
		if errors.Is(err, safetensors.ErrFormat) {
			return false, nil
		}
		return false, err
	}
	defer f.Close()
	_, ok := f.Tensor("flow_lm.conditioner.embed.weight")
	return ok, nil
}
