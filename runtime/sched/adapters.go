package sched

import (
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/bert"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/pooling"
)

// LlamaModel adapts a *llama.Context to Model.
type LlamaModel struct {
	c     *llama.Context
	vocab int
	cfg   llama.ContextConfig
}

// NewLlamaModel wraps c. The scheduler owns c's block pool from then on.
func NewLlamaModel(c *llama.Context) *LlamaModel {
	return &LlamaModel{c: c, vocab: c.Model().Vocab, cfg: c.Config()}
}

// Forward runs one batched step (llama.Context.Forward).
func (m *LlamaModel) Forward(tokens []int32, b *backend.Batch, out []int32, logits []float32) error {
	return m.c.Forward(tokens, b, out, logits)
}

// ForwardPick runs one batched step and finds the argmax of the rows in pick
// (llama.Context.ForwardPick).
func (m *LlamaModel) ForwardPick(tokens []int32, b *backend.Batch, out []int32, logits []float32, pick, ids []int32) error {
	return m.c.ForwardPick(tokens, b, out, logits, pick, ids)
}

// ForwardDraw runs one batched step and chooses the tokens of the rows in pick as draws says
// (llama.Context.ForwardDraw).
func (m *LlamaModel) ForwardDraw(tokens []int32, b *backend.Batch, out []int32, logits []float32, pick []int32, draws []backend.Draw, ids []int32) error {
	return m.c.ForwardDraw(tokens, b, out, logits, pick, draws, ids)
}

// DrawsWhereLogitsAre reports whether the context's backend draws tokens where the logits are
// (backend.Drawer).
func (m *LlamaModel) DrawsWhereLogitsAre() bool {
	_, ok := m.c.Model().Backend().(backend.Drawer)
	return ok
}

// Pool is the context's KV block pool.
func (m *LlamaModel) Pool() *kvcache.Pool { return m.c.Pool() }

// Vocab is the number of logits per row.
func (m *LlamaModel) Vocab() int { return m.vocab }

// StepTokens is the most tokens one step takes.
func (m *LlamaModel) StepTokens() int { return m.cfg.StepTokens }

// MaxSeqs is the most logit rows one step returns.
func (m *LlamaModel) MaxSeqs() int { return m.cfg.MaxSeqs }

// Context is the model's training context, a sensible Config.MaxContext.
func (m *LlamaModel) Context() int { return m.c.Model().Context }

// EncoderEmbedModel adapts a *bert.Context to EmbedModel: its pooling (one row per sequence),
// normalised to unit Euclidean length as llama.cpp's embeddings are.
type EncoderEmbedModel struct{ c *bert.Context }

// NewEncoderEmbedModel wraps c, which must pool (not pooling.None or Rank).
func NewEncoderEmbedModel(c *bert.Context) (*EncoderEmbedModel, error) {
	if p := c.Pooling(); p != pooling.Mean && p != pooling.CLS && p != pooling.Last {
		return nil, fmt.Errorf("sched: an embedding model must pool its tokens to one row (mean, cls or last), not %s", p)
	}
	return &EncoderEmbedModel{c: c}, nil
}

// Embed runs the encoder over the batch (bert.Context.Embed).
func (m *EncoderEmbedModel) Embed(tokens []int32, lens []int, out []float32) error {
	return m.c.Embed(tokens, lens, pooling.NormEuclidean, out)
}

// Dim is the model's width.
func (m *EncoderEmbedModel) Dim() int { return m.c.Model().Dim }

// StepTokens is the context's step width.
func (m *EncoderEmbedModel) StepTokens() int { return m.c.Config().StepTokens }

// MaxTokens is the model's positions, or the step width when smaller.
func (m *EncoderEmbedModel) MaxTokens() int { return min(m.c.Model().Positions, m.StepTokens()) }

// DecoderEmbedModel runs a *llama.Context as an embedder: each step feeds every sequence whole
// into fresh cache blocks (released after it), reads the final hidden states of the rows its
// pooling needs (llama.Context.ForwardHidden), pools them and normalises each to unit Euclidean
// length, as llama.cpp embeds with a decoder (Qwen3-Embedding: last-token pooling).
type DecoderEmbedModel struct {
	c      *llama.Context
	pool   pooling.Type
	bb     kvcache.BatchBuilder
	seqs   []*kvcache.Seq
	rows   []int32
	hidden []float32
}

// NewDecoderEmbedModel wraps c, whose block pool it owns from now on, pooling with p (Mean, CLS
// or Last).
func NewDecoderEmbedModel(c *llama.Context, p pooling.Type) (*DecoderEmbedModel, error) {
	if p != pooling.Mean && p != pooling.CLS && p != pooling.Last {
		return nil, fmt.Errorf("sched: an embedding model must pool its tokens to one row (mean, cls or last), not %s", p)
	}
	return &DecoderEmbedModel{c: c, pool: p}, nil
}

// Embed feeds the batch and pools each sequence.
func (m *DecoderEmbedModel) Embed(tokens []int32, lens []int, out []float32) error {
	dim := m.c.Model().Dim
	if len(lens) > m.c.Config().MaxSeqs {
		return fmt.Errorf("sched: %d sequences in one step, the context takes %d", len(lens), m.c.Config().MaxSeqs)
	}
	defer func() {
		for _, s := range m.seqs {
			s.Release()
		}
		clear(m.seqs)
		m.seqs = m.seqs[:0]
	}()
	m.bb.Reset()
	for _, l := range lens {
		s := m.c.Pool().NewSeq(l)
		m.seqs = append(m.seqs, s)
		if err := s.Reserve(l); err != nil {
			return fmt.Errorf("sched: embedding step: %w", err)
		}
		if err := m.bb.Add(s, l); err != nil {
			return err
		}
	}
	var err error
	if m.rows, err = pooling.Rows(m.rows[:0], m.pool, lens); err != nil {
		return err
	}
	if need := len(m.rows) * dim; cap(m.hidden) < need {
		m.hidden = make([]float32, need)
	}
	hidden := m.hidden[:len(m.rows)*dim]
	if err := m.c.ForwardHidden(tokens, m.bb.Batch(), m.rows, hidden); err != nil {
		return err
	}
	if err := pooling.Reduce(out, hidden, dim, m.pool, lens); err != nil {
		return err
	}
	return pooling.Normalize(out, dim, pooling.NormEuclidean)
}

// Dim is the model's width.
func (m *DecoderEmbedModel) Dim() int { return m.c.Model().Dim }

// StepTokens is the context's step width, or its cache when smaller.
func (m *DecoderEmbedModel) StepTokens() int { return min(m.c.Config().StepTokens, m.c.Pool().Slots()) }

// MaxTokens is the model's training context, or the step width when smaller.
func (m *DecoderEmbedModel) MaxTokens() int { return min(m.c.Model().Context, m.StepTokens()) }
