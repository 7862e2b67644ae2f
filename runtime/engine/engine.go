// Package engine puts a model file to work: it opens a GGUF file, builds its tokenizer and binds
// its weights to a backend (Open), and runs one sequence from prompt to stop (Generate), which is
// what `parley generate` and `parley bench` do. A server that steps many sequences at once drives
// llama.Context directly with the same pieces: the KV block pool, the batch builder, a
// decode.Sampler and a decode.Stopper per sequence.
package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
	"github.com/parleyhq/parley/runtime/tokenizer"
)

// Engine is an open model: file, tokenizer and weights on a backend.
type Engine struct {
	File      *gguf.File
	Model     *llama.Model
	Tokenizer *tokenizer.Tokenizer
}

// Open loads the model at path onto be.
func Open(path string, be backend.Backend) (*Engine, error) {
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
	return &Engine{File: f, Model: m, Tokenizer: tok}, nil
}

// Close releases the model and unmaps the file.
func (e *Engine) Close() error {
	return errors.Join(e.Model.Close(), e.File.Close())
}

// ContextOptions size a context for one sequence.
type ContextOptions struct {
	Ctx    int          // positions (prompt plus generated); 0 means the model's training context
	Chunk  int          // prompt tokens per forward step; 0 means 512
	KVType tensor.DType // F16 (as llama.cpp), BF16 (where the backend holds it) or F32
}

// NewContext makes a context for generating one sequence at a time.
func (e *Engine) NewContext(o ContextOptions) (*llama.Context, error) {
	if o.Ctx <= 0 {
		o.Ctx = e.Model.Context
	}
	if o.Chunk <= 0 {
		o.Chunk = 512
	}
	o.Chunk = min(o.Chunk, o.Ctx)
	return e.Model.NewContext(llama.ContextConfig{StepTokens: o.Chunk, MaxSeqs: 1, KVSlots: o.Ctx, KVType: o.KVType})
}

// Request is one generation.
type Request struct {
	Prompt      []int32 // token ids, BOS included if wanted
	MaxTokens   int     // most tokens to generate; 0 means until the context is full
	Sampling    decode.Params
	Stop        []string // stop strings
	IgnoreEOS   bool
	TopLogprobs int // alternatives to report per step (0..20)
}

// Token is one generated token, as passed to the callback. Slices are valid only during it.
type Token struct {
	ID      int32
	Logprob float64               // natural-log probability under the raw logits (when TopLogprobs > 0)
	Top     []decode.TokenLogprob // the TopLogprobs most likely tokens
	Text    []byte                // text released by this token (stop strings held back)
}

// Result summarises a generation.
type Result struct {
	Tokens     []int32
	Text       string
	Reason     decode.StopReason
	PromptTime time.Duration // prompt processing, to the first token's logits
	GenTime    time.Duration // from the first token's logits to the end
}

// ErrPromptTooLong is returned when the prompt does not fit the context.
var ErrPromptTooLong = errors.New("prompt does not fit the context")

// Generate runs req on c (which must have no other sequence in flight) and calls emit, if not
// nil, for every generated token. It stops at an end-of-generation token (unless IgnoreEOS), a
// stop string, MaxTokens, a full context, or when ctx is done (returning ctx.Err() with the
// partial result: Reason decode.StopCancelled, its text including what a possible stop string held
// back, its times so far).
func (e *Engine) Generate(ctx context.Context, c *llama.Context, req Request, emit func(*Token) error) (*Result, error) {
	m := c.Model()
	nCtx := c.Pool().Slots()
	if len(req.Prompt) == 0 {
		return nil, errors.New("empty prompt")
	}
	if len(req.Prompt) >= nCtx {
		return nil, fmt.Errorf("%w: %d prompt tokens, context of %d", ErrPromptTooLong, len(req.Prompt), nCtx)
	}
	if req.MaxTokens < 0 {
		return nil, fmt.Errorf("negative token limit %d", req.MaxTokens)
	}
	req.Sampling.TopLogprobs = req.TopLogprobs
	sampler, err := decode.NewSampler(req.Sampling, m.Vocab)
	if err != nil {
		return nil, err
	}
	if err := sampler.AcceptPrompt(req.Prompt); err != nil {
		return nil, err
	}
	tk := e.Tokenizer
	sc := decode.StopConfig{VocabSize: m.Vocab, Stop: req.Stop, MaxTokens: req.MaxTokens}
	if !req.IgnoreEOS {
		sc.IsEOG = tk.Vocab().IsEOG
	}
	stopper, err := decode.NewStopper(sc)
	if err != nil {
		return nil, err
	}
	seq := c.Pool().NewSeq(nCtx)
	defer seq.Release()
	var bb kvcache.BatchBuilder
	logits := make([]float32, m.Vocab)
	top := make([]decode.TokenLogprob, 0, decode.MaxTopLogprobs)
	out := []int32{0}
	res := &Result{}
	var text []byte

	// Where the backend can, the next token is chosen where the logits are, as the server's
	// scheduler chooses it (on a GPU only its id leaves the device): the argmax of a greedy
	// sampler without bias or penalties (backend.Argmaxer), the draw of a sampling one
	// (backend.Drawer). Log-probabilities need the logits here.
	be := m.Backend()
	_, argmaxer := be.(backend.Argmaxer)
	_, drawer := be.(backend.Drawer)
	draw, drawable := sampler.Drawable()
	pick := req.TopLogprobs == 0 && sampler.ArgmaxOnly() && argmaxer
	drawn := req.TopLogprobs == 0 && drawable && drawer
	var draws []backend.Draw // nil: the argmax
	if drawn {
		draws = []backend.Draw{draw}
	}
	next := []int32{-1}

	step := func(toks []int32, want bool) error {
		if err := seq.Reserve(len(toks)); err != nil {
			return err
		}
		bb.Reset()
		if err := bb.Add(seq, len(toks)); err != nil {
			return err
		}
		var err error
		switch {
		case !want:
			err = c.Forward(toks, bb.Batch(), nil, nil)
		case pick || drawn:
			out[0] = int32(len(toks) - 1)
			if drawn {
				draws[0].Random = sampler.NextRandom()
			}
			err = c.ForwardDraw(toks, bb.Batch(), nil, nil, out, draws, next)
		default:
			out[0] = int32(len(toks) - 1)
			err = c.Forward(toks, bb.Batch(), out, logits)
		}
		if err != nil {
			return err
		}
		return seq.Advance(len(toks))
	}
	// token returns the next token: the one chosen by the backend, or sampled from the logits.
	token := func() (int32, error) {
		if !pick && !drawn {
			return sampler.Sample(logits)
		}
		if next[0] < 0 {
			return -1, backend.ErrNoArgmax
		}
		return next[0], nil
	}

	start := time.Now()
	chunk := c.Config().StepTokens
	for p := req.Prompt; len(p) > 0; {
		if err := ctx.Err(); err != nil {
			res.PromptTime, res.Reason = time.Since(start), decode.StopCancelled
			return res, err
		}
		n := min(chunk, len(p))
		if err := step(p[:n], n == len(p)); err != nil {
			return nil, err
		}
		p = p[n:]
	}
	res.PromptTime = time.Since(start)
	start = time.Now()
	tok := &Token{}
	for {
		id, err := token()
		if err != nil {
			return nil, err
		}
		if err := sampler.Accept(id); err != nil {
			return nil, err
		}
		tok.ID = id
		if req.TopLogprobs > 0 {
			tok.Logprob, top = decode.Logprobs(logits, id, req.TopLogprobs, top[:0])
		}
		tok.Top = top
		released, reason := stopper.PushBytes(id, tk.Piece(id))
		if reason != decode.StopEOS {
			res.Tokens = append(res.Tokens, id)
		}
		text = append(text, released...)
		tok.Text = released
		if emit != nil && (reason != decode.StopEOS || len(released) > 0) {
			if err := emit(tok); err != nil {
				return res, err
			}
		}
		if reason != decode.NotStopped {
			res.Reason = reason
			break
		}
		if seq.Len()+1 >= nCtx {
			tok.Text = stopper.Finish()
			text = append(text, tok.Text...)
			res.Reason = decode.StopLength
			if emit != nil && len(tok.Text) > 0 {
				tok.ID, tok.Top = -1, nil
				if err := emit(tok); err != nil {
					return res, err
				}
			}
			break
		}
		if err := ctx.Err(); err != nil {
			tok.Text = stopper.Finish()
			if emit != nil && len(tok.Text) > 0 {
				tok.ID, tok.Top = -1, nil
				emit(tok)
			}
			res.Text, res.Reason, res.GenTime = string(append(text, tok.Text...)), decode.StopCancelled, time.Since(start)
			return res, err
		}
		if err := step([]int32{id}, true); err != nil {
			return nil, err
		}
	}
	res.GenTime = time.Since(start)
	res.Text = string(text)
	return res, nil
}
