// Package schedtest holds what the scheduler is checked against: Generate, the plainest way to
// generate one sequence over a llama.Context (prompt chunks, then one token a step sampled from
// the logits, nothing batched, shared, cached or chosen on the device), whose tokens and text a
// greedy request must reproduce exactly however the scheduler batches it.
package schedtest

import (
	"fmt"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/sched"
)

// Result is one generated sequence.
type Result struct {
	Tokens []int32 // the tokens generated, an end-of-generation token left out
	Text   string
	Reason decode.StopReason
}

// Generate feeds prompt to c (which must hold no sequence) in chunks of c's step width and
// samples up to maxTokens tokens with p, one a step, stopping as the scheduler does at an
// end-of-generation token of text, at maxTokens (StopLength) or when the context is full
// (StopLength too).
func Generate(c *llama.Context, text sched.Text, prompt []int32, maxTokens int, p decode.Params) (*Result, error) {
	vocab := c.Model().Vocab
	slots := c.Pool().Slots()
	if len(prompt) == 0 || len(prompt) >= slots {
		return nil, fmt.Errorf("schedtest: %d prompt tokens for a context of %d", len(prompt), slots)
	}
	smp, err := decode.NewSampler(p, vocab)
	if err != nil {
		return nil, err
	}
	if err := smp.AcceptPrompt(prompt); err != nil {
		return nil, err
	}
	stp, err := decode.NewStopper(decode.StopConfig{VocabSize: vocab, IsEOG: text.IsEOG, MaxTokens: maxTokens})
	if err != nil {
		return nil, err
	}
	seq := c.Pool().NewSeq(slots)
	defer seq.Release()
	var bb kvcache.BatchBuilder
	logits := make([]float32, vocab)
	step := func(toks []int32, last bool) error {
		if err := seq.Reserve(len(toks)); err != nil {
			return err
		}
		bb.Reset()
		if err := bb.Add(seq, len(toks)); err != nil {
			return err
		}
		var out []int32
		var lg []float32
		if last {
			out, lg = []int32{int32(len(toks) - 1)}, logits
		}
		if err := c.Forward(toks, bb.Batch(), out, lg); err != nil {
			return err
		}
		return seq.Advance(len(toks))
	}
	for rest := prompt; len(rest) > 0; {
		n := min(c.Config().StepTokens, len(rest))
		if err := step(rest[:n], n == len(rest)); err != nil {
			return nil, err
		}
		rest = rest[n:]
	}
	res := &Result{}
	var out []byte
	for {
		id, err := smp.Sample(logits)
		if err != nil {
			return nil, err
		}
		if err := smp.Accept(id); err != nil {
			return nil, err
		}
		released, reason := stp.PushBytes(id, text.Piece(id))
		out = append(out, released...)
		if reason != decode.StopEOS {
			res.Tokens = append(res.Tokens, id)
		}
		if reason != decode.NotStopped {
			res.Text, res.Reason = string(out), reason
			return res, nil
		}
		if seq.Len()+1 >= slots {
			res.Text, res.Reason = string(append(out, stp.Finish()...)), decode.StopLength
			return res, nil
		}
		if err := step([]int32{id}, true); err != nil {
			return nil, err
		}
	}
}
