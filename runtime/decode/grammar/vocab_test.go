package grammar

import (
	"sync"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/tokenizer"
)

var vocabCache sync.Map // path → *Vocab

// sharedVocab indexes the vocabulary of a GGUF file under ../shared (rel), skipping t when it is
// absent: each token's detokenised piece, end-of-generation tokens from the tokenizer.
func sharedVocab(t testing.TB, rel string) *Vocab {
	t.Helper()
	path := sharedtest.Path(t, rel)
	if v, ok := vocabCache.Load(path); ok {
		return v.(*Vocab)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.New(f)
	if err != nil {
		t.Fatal(err)
	}
	n := tok.Vocab().Size
	pieces := make([][]byte, n)
	for id := range n {
		pieces[id] = tok.Piece(int32(id))
	}
	v, err := NewVocab(pieces, tok.Vocab().EOG())
	if err != nil {
		t.Fatal(err)
	}
	vocabCache.Store(path, v)
	return v
}

// Vocabularies the tests run against: SentencePiece with byte fallback (32,000), and byte-level
// BPE (100,000 and more).
const (
	vocabLlama    = "models/vocab/ggml-vocab-llama-spm.gguf"
	vocabDeepseek = "models/vocab/ggml-vocab-deepseek-llm.gguf"
)
