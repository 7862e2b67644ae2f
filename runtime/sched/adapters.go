package sched

import (
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
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
