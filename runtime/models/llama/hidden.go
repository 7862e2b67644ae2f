package llama

import (
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
)

// ForwardHidden runs one step of the model over the tokens of b as Forward does, and instead of
// logits writes the final hidden states of the batch rows listed in rows into hidden
// ([len(rows), Dim], row-major): each row after the output norm, the vector the output matrix
// would multiply (llama.cpp's result_norm, which it pools when a decoder model embeds). A
// decoder run as an embedding model (Qwen3-Embedding: last-token pooling) takes the rows its
// pooling reads (pooling.Rows) and pools them (pooling.Reduce, pooling.Normalize). The keys and
// values of every token are stored in the cache, as Forward stores them; rows may list at most
// the context's StepTokens rows.
func (c *Context) ForwardHidden(tokens []int32, b *backend.Batch, rows []int32, hidden []float32) error {
	n := len(tokens)
	m := c.m
	if err := c.checkBatch(n, b); err != nil {
		return err
	}
	switch {
	case len(rows) > c.cfg.StepTokens:
		return fmt.Errorf("llama: %d hidden rows exceed the context's %d", len(rows), c.cfg.StepTokens)
	case len(hidden) != len(rows)*m.Dim:
		return fmt.Errorf("llama: hidden-state buffer holds %d values, want %d", len(hidden), len(rows)*m.Dim)
	}
	if err := m.checkTokens(tokens); err != nil {
		return err
	}
	if err := checkRows("hidden", rows, n); err != nil {
		return err
	}
	vs, err := c.tokViews(n)
	if err != nil {
		return err
	}
	if err := c.compute(tokens, b, vs, nil, nil); err != nil {
		return err
	}
	if len(rows) == 0 {
		return nil
	}
	// The picked rows, normalised, in the first rows of the normalised-stream scratch (free
	// once the last layer has run).
	hv, err := c.tokViews(len(rows))
	if err != nil {
		return err
	}
	be := m.be
	if err := be.GetRows(hv.xn, vs.x, rows); err != nil {
		return err
	}
	if err := be.RMSNorm(hv.xn, hv.xn, m.outNorm, m.NormEps); err != nil {
		return err
	}
	return be.Read(hv.xn, 0, hidden)
}
