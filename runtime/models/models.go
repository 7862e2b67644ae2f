// Package models is the one entry point to model files: Probe says what kind of model a file
// holds, and OpenLLM opens a language model with everything the scheduler (runtime/sched), the
// server (runtime/server) and the command line need of it: the weights bound to a backend, the
// tokenizer, the chat template and the training context. The families under it compute
// (runtime/models/llama, runtime/models/whisper); this package only decides which family a file
// is for and puts the family's pieces together. Speech recognition models are opened by their
// family (whisper.Open).
package models

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/tokenizer"
)

// Kind is what a model file holds.
type Kind int

// Kinds of model.
const (
	KindLLM               Kind = iota + 1 // a language model (GGUF): OpenLLM opens it
	KindSpeechRecognition                 // Whisper (whisper.cpp's ggml file, or GGUF of architecture whisper): whisper.Open opens it
)

func (k Kind) String() string {
	switch k {
	case KindLLM:
		return "language model"
	case KindSpeechRecognition:
		return "speech recognition model"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Probe reads the head of the file at path and says what kind of model it holds: a speech
// recognition model (whisper.IsModelFile), else a language model, which is all a file that is
// neither can be taken for (OpenLLM then says why it cannot be opened). The error is the file's
// when it cannot be read.
func Probe(path string) (Kind, error) {
	speech, err := whisper.IsModelFile(path)
	if err != nil {
		return 0, err
	}
	if speech {
		return KindSpeechRecognition, nil
	}
	return KindLLM, nil
}

// Check reads the header of the model file at path, as the reader that will open it reads it
// (a whisper.cpp ggml file's hyper-parameters, vocabulary and tensor table; a GGUF file's
// metadata and tensor table, every tensor within the file), without loading any weight, and
// says what kind of model it holds. A program that serves several files checks them all this
// way before it starts, so that a corrupt or truncated one is refused at once.
func Check(path string) (Kind, error) {
	kind, err := Probe(path)
	if err != nil {
		return 0, err
	}
	if isGGML, err := ggml.IsFile(path); err != nil {
		return 0, err
	} else if isGGML {
		f, err := ggml.Open(path)
		if err != nil {
			return 0, err
		}
		return kind, f.Close()
	}
	f, err := gguf.Open(path)
	if err != nil {
		return 0, err
	}
	return kind, f.Close()
}

// LLM is an open language model: its GGUF file, weights on a backend and tokenizer.
type LLM struct {
	Model     *llama.Model         // the weights, bound to the backend OpenLLM was given
	Tokenizer *tokenizer.Tokenizer // the file's vocabulary
	file      *gguf.File
	text      *Text
}

// ErrNotLLM is what OpenLLM and CheckLLM return, wrapped, for a speech recognition model.
var ErrNotLLM = errors.New("not a language model")

// CheckLLM returns an error wrapping ErrNotLLM when the file at path holds a speech recognition
// model; nil otherwise, also when the file cannot be read (the reader that opens it says why).
func CheckLLM(path string) error {
	if k, _ := Probe(path); k == KindSpeechRecognition {
		return fmt.Errorf("%s is a Whisper speech-recognition model, %w", path, ErrNotLLM)
	}
	return nil
}

// OpenLLM opens the language model at path on be; a speech recognition model is refused
// (CheckLLM).
func OpenLLM(path string, be backend.Backend) (*LLM, error) {
	if err := CheckLLM(path); err != nil {
		return nil, err
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := llama.Load(f, be)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	tok, err := tokenizer.New(f)
	if err != nil {
		m.Close()
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if tok.Vocab().Size > m.Vocab {
		m.Close()
		f.Close()
		return nil, fmt.Errorf("%s: tokenizer has %d tokens but the model only %d embeddings", path, tok.Vocab().Size, m.Vocab)
	}
	return &LLM{Model: m, Tokenizer: tok, file: f, text: NewText(tok)}, nil
}

// Close releases the weights and unmaps the file.
func (l *LLM) Close() error {
	return errors.Join(l.Model.Close(), l.file.Close())
}

// Text is the model's tokenizer as the scheduler and the server use it.
func (l *LLM) Text() *Text { return l.text }

// ChatTemplate is the source of the model's chat template (tokenizer.chat_template, Jinja); ""
// when the file has none.
func (l *LLM) ChatTemplate() string {
	s, _ := l.file.String("tokenizer.chat_template")
	return s
}

// TrainingContext is the positions the model was trained on (its llama.Model.Context), the
// default context of a sequence.
func (l *LLM) TrainingContext() int { return l.Model.Context }

// Params is the number of weights in the file.
func (l *LLM) Params() int64 {
	var n int64
	for _, t := range l.file.Tensors {
		p := int64(1)
		for _, d := range t.Shape {
			p *= d
		}
		n += p
	}
	return n
}

// WeightBytes is the size of the file's tensors.
func (l *LLM) WeightBytes() int64 {
	var n int64
	for _, t := range l.file.Tensors {
		n += t.Size
	}
	return n
}

// Text is a language model's tokenizer as the scheduler (sched.Text) and the server
// (server.Tokenizer) use it: prompts encoded as the vocabulary says, tokens decoded to the bytes
// they stand for.
type Text struct {
	t *tokenizer.Tokenizer
	v *tokenizer.Vocab
}

// NewText wraps t.
func NewText(t *tokenizer.Tokenizer) *Text { return &Text{t: t, v: t.Vocab()} }

// Encode tokenizes a prompt: BOS (and EOS) where the vocabulary adds them, the text of special
// tokens read as those tokens.
func (x *Text) Encode(text string) ([]int32, error) { return x.t.Encode(text, true, true) }

// Decode is the text of ids, as a detokeniser writes it (SentencePiece's leading space dropped).
func (x *Text) Decode(ids []int32) string { return x.t.Decode(ids) }

// Piece is the bytes id stands for (shared; not to be modified).
func (x *Text) Piece(id int32) []byte { return x.t.Piece(id) }

// IsEOG reports whether id ends generation.
func (x *Text) IsEOG(id int32) bool { return x.v.IsEOG(id) }

// VocabSize is the number of tokens.
func (x *Text) VocabSize() int { return x.v.Size }

// BOS is the begin-of-sequence token (tokenizer.NoToken: none), and whether Encode puts it first.
func (x *Text) BOS() (id int32, added bool) { return x.v.BOS, x.v.AddBOS }

// EOS is the end-of-sequence token (tokenizer.NoToken: none).
func (x *Text) EOS() int32 { return x.v.EOS }

// Token is the vocabulary's text of id ("<s>" for a SentencePiece BOS); "" outside the vocabulary.
func (x *Text) Token(id int32) string { return x.v.Token(id) }
