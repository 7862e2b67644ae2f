package bert

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/tensor"
)

// ContextConfig sizes a Context.
type ContextConfig struct {
	StepTokens int // most tokens in one Embed call, all its sequences together
	// Pooling overrides the file's pooling (llama.cpp's --pooling); Unspecified takes the
	// file's, and None where the file has none.
	Pooling pooling.Type
}

// MaxStepTokens bounds ContextConfig.StepTokens, against overflow rather than as a memory budget.
const MaxStepTokens = 1 << 20

// Context is the state for running a model: scratch activations sized for the largest batch and
// the views into them that batches use. One goroutine uses a Context at a time.
type Context struct {
	m    *Model
	cfg  ContextConfig
	pool pooling.Type // resolved
	attn backend.Attn

	scratch []backend.Tensor // full-size buffers, closed with the context
	x       backend.Tensor   // [StepTokens, dim] the hidden states
	h       backend.Tensor   // [StepTokens, dim] position embeddings, then each sublayer's output
	q, att  backend.Tensor   // [StepTokens, heads*headDim]
	k, v    backend.Tensor   // [StepTokens, kvHeads*headDim]
	up      backend.Tensor   // [StepTokens, ffn]

	steps  []*stepViews           // [StepTokens+1] views of the first n rows, made on first use
	seqs   map[[2]int]*seqViews   // views of one sequence's rows {start, count}, made on first use
	pos    []int32                // [StepTokens] each token's position in its sequence
	rows   []int32                // [StepTokens] the rows pooling reads
	host   []float32              // [StepTokens*dim] hidden states read back for pooling
	pooled map[int]backend.Tensor // [k, dim] views of h: the k rows CLS or last pooling reads
}

type stepViews struct {
	x, h, q, k, v, att, up backend.Tensor
	qkv                    [3]backend.Tensor // q, k, v: the destinations of layer.qkv
}

type seqViews struct{ q, k, v, att backend.Tensor }

// maxSeqViews bounds the cache of per-sequence views: past it, Embed drops them all and makes
// the ones it needs again. Batches of recurring shapes (a server's) reuse theirs.
const maxSeqViews = 1 << 14

// NewContext makes a context for m.
func (m *Model) NewContext(cfg ContextConfig) (*Context, error) {
	if cfg.StepTokens <= 0 || cfg.StepTokens > MaxStepTokens {
		return nil, fmt.Errorf("bert: invalid context config %+v (1 to %d tokens a step)", cfg, MaxStepTokens)
	}
	pool := pooling.Resolve(cfg.Pooling, m.Pooling)
	if _, err := pooling.Rows(nil, pool, nil); err != nil {
		return nil, fmt.Errorf("bert: %w", err)
	}
	c := &Context{m: m, cfg: cfg, pool: pool,
		attn:   backend.Attn{NHead: m.Heads, NKVHead: m.KVHeads, HeadDim: m.HeadDim, Scale: 1 / sqrt32(float32(m.HeadDim))},
		steps:  make([]*stepViews, cfg.StepTokens+1),
		seqs:   map[[2]int]*seqViews{},
		pooled: map[int]backend.Tensor{},
		pos:    make([]int32, cfg.StepTokens),
		rows:   make([]int32, 0, cfg.StepTokens),
		host:   make([]float32, cfg.StepTokens*m.Dim),
	}
	qDim, kvDim := m.Heads*m.HeadDim, m.KVHeads*m.HeadDim
	n := cfg.StepTokens
	for _, s := range []struct {
		dst        *backend.Tensor
		rows, cols int
	}{{&c.x, n, m.Dim}, {&c.h, n, m.Dim}, {&c.q, n, qDim}, {&c.att, n, qDim}, {&c.k, n, kvDim}, {&c.v, n, kvDim}, {&c.up, n, m.FFN}} {
		t, err := m.be.Alloc(tensor.F32, s.rows, s.cols)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("bert: scratch: %w", err)
		}
		*s.dst = t
		c.scratch = append(c.scratch, t)
	}
	return c, nil
}

// Model is the model the context runs.
func (c *Context) Model() *Model { return c.m }

// Config is the context's configuration.
func (c *Context) Config() ContextConfig { return c.cfg }

// Pooling is the pooling the context runs: its own, else the file's, else None.
func (c *Context) Pooling() pooling.Type { return c.pool }

// Close releases the scratch buffers and their views.
func (c *Context) Close() error {
	var errs []error
	for _, vs := range c.steps {
		if vs != nil {
			for _, t := range []backend.Tensor{vs.x, vs.h, vs.q, vs.k, vs.v, vs.att, vs.up} {
				errs = append(errs, t.Close())
			}
		}
	}
	c.steps = nil
	errs = append(errs, c.dropViews())
	for _, t := range c.scratch {
		errs = append(errs, t.Close())
	}
	c.scratch = nil
	return errors.Join(errs...)
}

// dropViews closes the per-sequence and pooling views.
func (c *Context) dropViews() error {
	var errs []error
	for k, vs := range c.seqs {
		errs = append(errs, vs.q.Close(), vs.k.Close(), vs.v.Close(), vs.att.Close())
		delete(c.seqs, k)
	}
	for k, t := range c.pooled {
		errs = append(errs, t.Close())
		delete(c.pooled, k)
	}
	return errors.Join(errs...)
}

func (c *Context) stepViews(n int) (*stepViews, error) {
	if vs := c.steps[n]; vs != nil {
		return vs, nil
	}
	vs := &stepViews{}
	for _, p := range []struct {
		dst *backend.Tensor
		src backend.Tensor
	}{{&vs.x, c.x}, {&vs.h, c.h}, {&vs.q, c.q}, {&vs.k, c.k}, {&vs.v, c.v}, {&vs.att, c.att}, {&vs.up, c.up}} {
		t, err := c.m.be.View(p.src, 0, n)
		if err != nil {
			return nil, err
		}
		*p.dst = t
	}
	vs.qkv = [3]backend.Tensor{vs.q, vs.k, vs.v}
	c.steps[n] = vs
	return vs, nil
}

func (c *Context) seqViews(start, count int) (*seqViews, error) {
	key := [2]int{start, count}
	if vs := c.seqs[key]; vs != nil {
		return vs, nil
	}
	vs := &seqViews{}
	for _, p := range []struct {
		dst *backend.Tensor
		src backend.Tensor
	}{{&vs.q, c.q}, {&vs.k, c.k}, {&vs.v, c.v}, {&vs.att, c.att}} {
		t, err := c.m.be.View(p.src, start, count)
		if err != nil {
			return nil, err
		}
		*p.dst = t
	}
	c.seqs[key] = vs
	return vs, nil
}

func (c *Context) pooledView(k int) (backend.Tensor, error) {
	if t := c.pooled[k]; t != nil {
		return t, nil
	}
	t, err := c.m.be.View(c.h, 0, k)
	if err != nil {
		return nil, err
	}
	c.pooled[k] = t
	return t, nil
}

// Embed runs the encoder over a batch of sequences and writes their embeddings into out: tokens
// holds the sequences one after another, lens[s] tokens for sequence s, each attending to its
// own tokens only. Each sequence's hidden states are pooled as the context's Pooling says (one
// row per sequence; with None, one row per token) and each row normalised with norm (llama.cpp's
// --embd-normalize; pooling.NormEuclidean is its default). out holds
// pooling.Count(Pooling(), lens) rows of Dim values.
func (c *Context) Embed(tokens []int32, lens []int, norm pooling.Norm, out []float32) error {
	m := c.m
	n := len(tokens)
	switch {
	case n == 0:
		return errors.New("bert: empty batch")
	case n > c.cfg.StepTokens:
		return fmt.Errorf("bert: %d tokens in one batch exceed the context's %d", n, c.cfg.StepTokens)
	case norm < pooling.NormNone:
		return fmt.Errorf("bert: normalisation %d (want -1 none, 0 max-abs, 1 taxicab, 2 euclidean or p > 2)", int(norm))
	}
	total := 0
	for s, l := range lens {
		if l <= 0 || l > m.Positions {
			return fmt.Errorf("bert: sequence %d has %d tokens (1 to the model's %d positions)", s, l, m.Positions)
		}
		if total += l; total > n {
			break
		}
	}
	if total != n {
		return fmt.Errorf("bert: sequence lengths add up to %d tokens or more, for a batch of %d", total, n)
	}
	if want := pooling.Count(c.pool, lens) * m.Dim; len(out) != want {
		return fmt.Errorf("bert: output buffer holds %d values, want %d", len(out), want)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= m.Vocab {
			return fmt.Errorf("bert: token id %d is outside the vocabulary of %d", t, m.Vocab)
		}
	}
	i := 0
	for _, l := range lens {
		for p := range l {
			c.pos[i] = int32(p)
			i++
		}
	}
	if len(c.seqs) > maxSeqViews {
		if err := c.dropViews(); err != nil {
			return err
		}
	}
	vs, err := c.stepViews(n)
	if err != nil {
		return err
	}
	if err := c.encode(tokens, lens, vs); err != nil {
		return err
	}
	be := m.be
	if c.rows, err = pooling.Rows(c.rows[:0], c.pool, lens); err != nil {
		return fmt.Errorf("bert: %w", err)
	}
	hidden := c.host[:len(c.rows)*m.Dim]
	if c.pool == pooling.CLS || c.pool == pooling.Last {
		pv, err := c.pooledView(len(c.rows))
		if err != nil {
			return err
		}
		if err := be.GetRows(pv, vs.x, c.rows); err != nil {
			return err
		}
		if err := be.Read(pv, 0, hidden); err != nil {
			return err
		}
	} else if err := be.Read(vs.x, 0, hidden); err != nil {
		return err
	}
	if err := pooling.Reduce(out, hidden, m.Dim, c.pool, lens); err != nil {
		return fmt.Errorf("bert: %w", err)
	}
	return pooling.Normalize(out, m.Dim, norm)
}

// encode computes the hidden states of the batch's tokens into vs.x:
//
//	x = LayerNorm(tok_embd[token] + token_types[0] + position_embd[pos])
//
// then every layer (post-norm):
//
//	x = LayerNorm(x + Wo·attention(Wq·x+bq, Wk·x+bk, Wv·x+bv) + bo)
//	x = LayerNorm(x + Wdown·gelu(Wup·x+bup) + bdown)
//
// attending within each sequence over all of its tokens.
func (c *Context) encode(tokens []int32, lens []int, vs *stepViews) error {
	m, be := c.m, c.m.be
	if err := be.GetRows(vs.x, m.tokEmbd, tokens); err != nil {
		return err
	}
	if err := be.AddRows(vs.x, vs.x, m.typeRow); err != nil {
		return err
	}
	if err := be.GetRows(vs.h, m.posEmbd, c.pos[:len(tokens)]); err != nil {
		return err
	}
	if err := be.AddRows(vs.x, vs.h, vs.x); err != nil {
		return err
	}
	if err := be.LayerNorm(vs.x, vs.x, m.embNorm, m.embNormB, m.NormEps); err != nil {
		return err
	}
	for li := range m.layers {
		if err := c.layer(&m.layers[li], lens, vs); err != nil {
			return fmt.Errorf("bert: layer %d: %w", li, err)
		}
	}
	return nil
}

func (c *Context) layer(l *layer, lens []int, vs *stepViews) error {
	m, be := c.m, c.m.be
	if err := backend.MatMuls(be, vs.qkv[:], vs.x, l.qkv[:]); err != nil {
		return err
	}
	for _, p := range [3]struct{ dst, bias backend.Tensor }{{vs.q, l.bq}, {vs.k, l.bk}, {vs.v, l.bv}} {
		if err := be.AddRows(p.dst, p.dst, p.bias); err != nil {
			return err
		}
	}
	start := 0
	for _, n := range lens {
		sv, err := c.seqViews(start, n)
		if err != nil {
			return err
		}
		if err := be.FullAttention(sv.att, sv.q, sv.k, sv.v, c.attn); err != nil {
			return err
		}
		start += n
	}
	if err := be.MatMul(vs.h, vs.att, l.wo); err != nil {
		return err
	}
	if err := be.AddRows(vs.h, vs.h, l.bo); err != nil {
		return err
	}
	if err := be.AddRows(vs.h, vs.h, vs.x); err != nil {
		return err
	}
	if err := be.LayerNorm(vs.h, vs.h, l.attnNorm, l.attnNormB, m.NormEps); err != nil {
		return err
	}
	if err := be.MatMul(vs.up, vs.h, l.wUp); err != nil {
		return err
	}
	if err := be.AddRows(vs.up, vs.up, l.bUp); err != nil {
		return err
	}
	if err := be.GELU(vs.up, vs.up); err != nil {
		return err
	}
	if err := be.MatMul(vs.x, vs.up, l.wDown); err != nil {
		return err
	}
	if err := be.AddRows(vs.x, vs.x, l.bDown); err != nil {
		return err
	}
	if err := be.AddRows(vs.x, vs.x, vs.h); err != nil {
		return err
	}
	return be.LayerNorm(vs.x, vs.x, l.outNorm, l.outNormB, m.NormEps)
}
