package llama

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/tensor"
)

// ContextConfig sizes a Context.
type ContextConfig struct {
	StepTokens int          // most tokens in one forward step (prompt chunks plus decode tokens): the step width
	MaxSeqs    int          // most rows of logits one step returns
	KVSlots    int          // total KV-cache positions shared by all sequences
	BlockSize  int          // KV-cache block size in positions (default 16)
	KVType     tensor.DType // F32 (the zero value), F16 (llama.cpp's default) or BF16 (where the backend holds it)
	// SeqContext is the most positions one sequence reaches (0: KVSlots). Beyond the model's
	// original context it chooses LongRoPE's long factors (Config.RoPEFor), as llama.cpp's
	// context size does.
	SeqContext int
}

// Context is the state for running a model: the shared KV cache, its block pool, and scratch
// activations sized for the largest step. One goroutine uses a Context at a time.
type Context struct {
	m    *Model
	cfg  ContextConfig
	kv   backend.KV
	pool *kvcache.Pool
	attn backend.Attn
	rope backend.RoPE // the model's, with the factors for SeqContext

	scratch []backend.Tensor // full-size buffers, closed with the context
	x       backend.Tensor   // [StepTokens, dim] residual stream
	xn      backend.Tensor   // [StepTokens, dim] normalised
	q, att  backend.Tensor   // [StepTokens, heads*headDim]
	k, v    backend.Tensor   // [StepTokens, kvHeads*headDim]
	gate    backend.Tensor   // [StepTokens, ffn]
	up      backend.Tensor   // [StepTokens, ffn]
	h       backend.Tensor   // [MaxSeqs, dim] rows that produce logits
	logits  backend.Tensor   // [MaxSeqs, vocab]

	tok []*tokViews // [StepTokens+1] views for a step of n tokens, made on first use
	out []*outViews // [MaxSeqs+1]

	rows   []int32   // [MaxSeqs] a step's output rows, those with logits then those picked
	picked []float32 // logits of picked rows, for a backend that is not an Argmaxer; made on first use

	rec backend.Recording // decode steps recorded where the backend records (see compute)
}

type tokViews struct {
	x, xn, q, att, k, v, gate, up backend.Tensor

	qkv    [3]backend.Tensor // q, k, v: the destinations of layer.qkv
	gateUp [2]backend.Tensor // gate, up
}
type outViews struct{ h, logits backend.Tensor }

// Limits of a context: tokens in one forward step, sequences in one step, and positions of the KV
// cache (2^24 positions of a 7B model's F16 cache are 8 TiB: the bound is against overflow, not a
// memory budget).
const (
	MaxStepTokens   = 1 << 20
	MaxContextSeqs  = 1 << 16
	MaxContextSlots = 1 << 24
)

// NewContext makes a context for m.
func (m *Model) NewContext(cfg ContextConfig) (*Context, error) {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.StepTokens <= 0 || cfg.MaxSeqs <= 0 || cfg.KVSlots <= 0 || cfg.BlockSize <= 0 ||
		cfg.StepTokens > MaxStepTokens || cfg.MaxSeqs > MaxContextSeqs || cfg.KVSlots > MaxContextSlots || cfg.BlockSize > MaxContextSlots ||
		cfg.SeqContext < 0 || cfg.SeqContext > MaxContextSlots {
		return nil, fmt.Errorf("llama: invalid context config %+v (at most %d tokens a step, %d sequences, %d cache positions)", cfg, MaxStepTokens, MaxContextSeqs, MaxContextSlots)
	}
	if cfg.KVType != tensor.F16 && cfg.KVType != tensor.F32 && cfg.KVType != tensor.BF16 {
		return nil, fmt.Errorf("llama: KV cache type %v is not supported (F16, BF16 or F32)", cfg.KVType)
	}
	nBlocks := (cfg.KVSlots + cfg.BlockSize - 1) / cfg.BlockSize
	pool, err := kvcache.NewPool(nBlocks, cfg.BlockSize)
	if err != nil {
		return nil, err
	}
	if cfg.SeqContext == 0 {
		cfg.SeqContext = cfg.KVSlots
	}
	scale := 1 / sqrt32(float32(m.HeadDim))
	if m.AttnScale != 0 { // granite
		scale = m.AttnScale
	}
	c := &Context{m: m, cfg: cfg, pool: pool, rope: m.RoPEFor(cfg.SeqContext),
		attn: backend.Attn{NHead: m.Heads, NKVHead: m.KVHeads, HeadDim: m.HeadDim, Scale: scale},
		tok:  make([]*tokViews, cfg.StepTokens+1),
		out:  make([]*outViews, cfg.MaxSeqs+1),
		rows: make([]int32, 0, cfg.MaxSeqs),
	}
	be := m.be
	c.kv, err = be.NewKV(backend.KVConfig{Layers: m.Layers, Slots: pool.Slots(), Width: m.KVHeads * m.HeadDim, BlockSize: cfg.BlockSize, DType: cfg.KVType})
	if err != nil {
		return nil, fmt.Errorf("llama: KV cache: %w", err)
	}
	qDim, kvDim := m.Heads*m.HeadDim, m.KVHeads*m.HeadDim
	for _, s := range []struct {
		dst        *backend.Tensor
		rows, cols int
	}{
		{&c.x, cfg.StepTokens, m.Dim}, {&c.xn, cfg.StepTokens, m.Dim},
		{&c.q, cfg.StepTokens, qDim}, {&c.att, cfg.StepTokens, qDim},
		{&c.k, cfg.StepTokens, kvDim}, {&c.v, cfg.StepTokens, kvDim},
		{&c.gate, cfg.StepTokens, m.FFN}, {&c.up, cfg.StepTokens, m.FFN},
		{&c.h, cfg.MaxSeqs, m.Dim}, {&c.logits, cfg.MaxSeqs, m.Vocab},
	} {
		t, err := be.Alloc(tensor.F32, s.rows, s.cols)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("llama: scratch: %w", err)
		}
		*s.dst = t
		c.scratch = append(c.scratch, t)
	}
	return c, nil
}

// Pool is the block pool of the context's KV cache: sequences take their blocks from it.
func (c *Context) Pool() *kvcache.Pool { return c.pool }

// Model is the model the context runs.
func (c *Context) Model() *Model { return c.m }

// Config is the context's configuration (with defaults filled in).
func (c *Context) Config() ContextConfig { return c.cfg }

// Close releases the KV cache and scratch buffers.
func (c *Context) Close() error {
	var errs []error
	for _, vs := range c.tok {
		if vs != nil {
			for _, t := range []backend.Tensor{vs.x, vs.xn, vs.q, vs.att, vs.k, vs.v, vs.gate, vs.up} {
				errs = append(errs, t.Close())
			}
		}
	}
	for _, vs := range c.out {
		if vs != nil {
			errs = append(errs, vs.h.Close(), vs.logits.Close())
		}
	}
	c.tok, c.out = nil, nil
	for _, t := range c.scratch {
		errs = append(errs, t.Close())
	}
	c.scratch = nil
	if c.kv != nil {
		errs = append(errs, c.kv.Close())
		c.kv = nil
	}
	return errors.Join(errs...)
}

func (c *Context) tokViews(n int) (*tokViews, error) {
	if vs := c.tok[n]; vs != nil {
		return vs, nil
	}
	vs := &tokViews{}
	be := c.m.be
	for _, p := range []struct {
		dst *backend.Tensor
		src backend.Tensor
	}{{&vs.x, c.x}, {&vs.xn, c.xn}, {&vs.q, c.q}, {&vs.att, c.att}, {&vs.k, c.k}, {&vs.v, c.v}, {&vs.gate, c.gate}, {&vs.up, c.up}} {
		t, err := be.View(p.src, 0, n)
		if err != nil {
			return nil, err
		}
		*p.dst = t
	}
	vs.qkv = [3]backend.Tensor{vs.q, vs.k, vs.v}
	vs.gateUp = [2]backend.Tensor{vs.gate, vs.up}
	c.tok[n] = vs
	return vs, nil
}

func (c *Context) outViews(n int) (*outViews, error) {
	if vs := c.out[n]; vs != nil {
		return vs, nil
	}
	h, err := c.m.be.View(c.h, 0, n)
	if err != nil {
		return nil, err
	}
	lg, err := c.m.be.View(c.logits, 0, n)
	if err != nil {
		return nil, err
	}
	vs := &outViews{h, lg}
	c.out[n] = vs
	return vs, nil
}

// Forward runs one step of the model over the tokens of b (tokens[i] at b.Pos[i], stored in KV
// slot b.Slot[i]) and writes the next-token logits of the tokens whose batch indexes are listed
// in out into logits ([len(out), vocab], row-major). The keys and values of every token are
// stored in the cache; the caller advances its sequences afterwards.
func (c *Context) Forward(tokens []int32, b *backend.Batch, out []int32, logits []float32) error {
	return c.ForwardPick(tokens, b, out, logits, nil, nil)
}

// ForwardPick is Forward that also finds the next token of the batch rows listed in pick as the
// argmax of their logits without handing those logits over: ids[i] for row pick[i], as
// backend.Argmaxer defines it (-1 for a row with a NaN or +Inf or nothing above -Inf). On a
// backend that is an Argmaxer the argmax runs where the logits are (on a GPU only the ids leave
// the device); on others the rows are read and searched here. Rows in out get their logits as
// Forward gives them; out and pick together hold at most MaxSeqs rows.
func (c *Context) ForwardPick(tokens []int32, b *backend.Batch, out []int32, logits []float32, pick, ids []int32) error {
	return c.ForwardDraw(tokens, b, out, logits, pick, nil, ids)
}

// ForwardDraw is ForwardPick with a choice per picked row: draws[i] says how the token of row
// pick[i] is chosen (backend.Draw: the argmax where its Temperature is 0, else a draw from the
// row's top-k and top-p candidates); draws nil picks every row's argmax. On a backend that is a
// backend.Drawer the choice is made where the logits are (on a GPU only the ids leave the
// device); on others the rows are read and chosen here (backend.DrawRows). ids[i] is -1 for a
// row with a NaN or +Inf or nothing above -Inf.
func (c *Context) ForwardDraw(tokens []int32, b *backend.Batch, out []int32, logits []float32, pick []int32, draws []backend.Draw, ids []int32) error {
	n := len(tokens)
	m := c.m
	nout := len(out) + len(pick)
	if err := c.checkBatch(n, b); err != nil {
		return err
	}
	switch {
	case nout > c.cfg.MaxSeqs:
		return fmt.Errorf("llama: %d output rows exceed the context's %d", nout, c.cfg.MaxSeqs)
	case len(logits) != len(out)*m.Vocab:
		return fmt.Errorf("llama: logits buffer holds %d values, want %d", len(logits), len(out)*m.Vocab)
	case len(ids) != len(pick):
		return fmt.Errorf("llama: %d ids for %d picked rows", len(ids), len(pick))
	case draws != nil && len(draws) != len(pick):
		return fmt.Errorf("llama: %d draws for %d picked rows", len(draws), len(pick))
	}
	if err := backend.CheckDraws(draws); err != nil {
		return fmt.Errorf("llama: %w", err)
	}
	if err := m.checkTokens(tokens); err != nil {
		return err
	}
	if err := checkRows("output", out, n); err != nil {
		return err
	}
	if err := checkRows("output", pick, n); err != nil {
		return err
	}
	vs, err := c.tokViews(n)
	if err != nil {
		return err
	}
	var ov *outViews
	rows := out
	if nout > 0 {
		if ov, err = c.outViews(nout); err != nil {
			return err
		}
		if len(pick) > 0 {
			rows = append(append(c.rows[:0], out...), pick...)
		}
	}
	if err := c.compute(tokens, b, vs, ov, rows); err != nil {
		return err
	}
	if nout == 0 {
		return nil
	}
	be := m.be
	if len(out) > 0 {
		if err := be.Read(ov.logits, 0, logits); err != nil {
			return err
		}
	}
	if len(pick) == 0 {
		return nil
	}
	if draws == nil {
		if am, ok := be.(backend.Argmaxer); ok {
			return am.Argmax(ov.logits, len(out), ids)
		}
	} else if dr, ok := be.(backend.Drawer); ok {
		return dr.Draw(ov.logits, len(out), draws, ids)
	}
	if c.picked == nil {
		c.picked = make([]float32, c.cfg.MaxSeqs*m.Vocab)
	}
	lg := c.picked[:len(pick)*m.Vocab]
	if err := be.Read(ov.logits, len(out), lg); err != nil {
		return err
	}
	if draws == nil {
		return backend.ArgmaxRows(lg, m.Vocab, ids)
	}
	return backend.DrawRows(lg, m.Vocab, draws, ids)
}

// maxRecordedStep is the largest step compute records (backend.Recorder): decode steps, whose
// many small operations cost more to start than to run. Larger steps are bound by their
// products.
const maxRecordedStep = 64

// compute runs the step's operations up to the logits of rows (ov nil: none); a decode step is
// recorded and run as one unit where the backend records (backend.Recording).
func (c *Context) compute(tokens []int32, b *backend.Batch, vs *tokViews, ov *outViews, rows []int32) error {
	if len(tokens) > maxRecordedStep {
		return c.ops(tokens, b, vs, ov, rows)
	}
	return c.rec.Run(c.m.be, func() error { return c.ops(tokens, b, vs, ov, rows) })
}

// ops calls the step's operations: the embeddings of tokens, every layer, and for rows the
// output norm and matrix into ov.logits.
func (c *Context) ops(tokens []int32, b *backend.Batch, vs *tokViews, ov *outViews, rows []int32) error {
	m := c.m
	be := m.be
	if err := be.GetRows(vs.x, m.tokEmbd, tokens); err != nil {
		return err
	}
	if m.EmbedScale != 0 {
		if err := be.Scale(vs.x, vs.x, m.EmbedScale); err != nil {
			return err
		}
	}
	for li := range m.layers {
		l := &m.layers[li]
		if err := c.layer(li, l, vs, b); err != nil {
			return fmt.Errorf("llama: layer %d: %w", li, err)
		}
	}
	if ov == nil {
		return nil
	}
	if err := be.GetRows(ov.h, vs.x, rows); err != nil {
		return err
	}
	if err := be.RMSNorm(ov.h, ov.h, m.outNorm, m.NormEps); err != nil {
		return err
	}
	if err := be.MatMul(ov.logits, ov.h, m.output); err != nil {
		return err
	}
	if err := addBias(be, ov.logits, m.outBias); err != nil {
		return err
	}
	if m.LogitScale != 0 {
		return be.Scale(ov.logits, ov.logits, 1/m.LogitScale)
	}
	return nil
}

// layer runs one transformer block on the residual stream vs.x in place:
//
//	x += Wo · attention(rope(Wq·norm(x)), rope(Wk·norm(x)), Wv·norm(x))
//	x += Wdown · (silu(Wgate·norm(x)) * Wup·norm(x))
//
// with the biases a file has added after their products, and for qwen3 each head of the queries
// and keys RMS-normalised (its own weights) before the rotation. The variants: olmo2 normalises
// the queries and keys whole, and each block's output instead of its input (PostNorm); smollm3
// leaves every fourth layer unrotated (NoRoPE); granite scales each block's output
// (ResidualScale); gemma gates with gelu (GeGLU).
func (c *Context) layer(li int, l *layer, vs *tokViews, b *backend.Batch) error {
	m, be := c.m, c.m.be
	in := vs.xn // what the projections read: the normalised stream, or with PostNorm the stream
	if m.PostNorm {
		in = vs.x
	} else if err := be.RMSNorm(vs.xn, vs.x, l.attnNorm, m.NormEps); err != nil {
		return err
	}
	if err := backend.MatMuls(be, vs.qkv[:], in, l.qkv[:]); err != nil {
		return err
	}
	for _, p := range [3]struct{ dst, bias backend.Tensor }{{vs.q, l.bq}, {vs.k, l.bk}, {vs.v, l.bv}} {
		if p.bias != nil {
			if err := be.AddRows(p.dst, p.dst, p.bias); err != nil {
				return err
			}
		}
	}
	if l.qNorm != nil { // per head: [n, heads*headDim] in groups of headDim (olmo2: whole)
		if err := be.RMSNorm(vs.q, vs.q, l.qNorm, m.NormEps); err != nil {
			return err
		}
		if err := be.RMSNorm(vs.k, vs.k, l.kNorm, m.NormEps); err != nil {
			return err
		}
	}
	if m.NoRoPE == 0 || (li+1)%m.NoRoPE != 0 {
		if err := be.Rope(vs.q, m.Heads, c.rope, b); err != nil {
			return err
		}
		if err := be.Rope(vs.k, m.KVHeads, c.rope, b); err != nil {
			return err
		}
	}
	if err := be.StoreKV(c.kv, li, vs.k, vs.v, b); err != nil {
		return err
	}
	if err := be.Attention(vs.att, vs.q, c.kv, li, c.attn, b); err != nil {
		return err
	}
	if err := be.MatMul(vs.xn, vs.att, l.wo); err != nil {
		return err
	}
	if err := addBias(be, vs.xn, l.bo); err != nil {
		return err
	}
	if m.PostNorm {
		if err := be.RMSNorm(vs.xn, vs.xn, l.attnNorm, m.NormEps); err != nil {
			return err
		}
	}
	if m.ResidualScale != 0 {
		if err := be.Scale(vs.xn, vs.xn, m.ResidualScale); err != nil {
			return err
		}
	}
	if err := be.AddRows(vs.x, vs.x, vs.xn); err != nil {
		return err
	}
	if m.PostNorm {
		in = vs.x
	} else if err := be.RMSNorm(vs.xn, vs.x, l.ffnNorm, m.NormEps); err != nil {
		return err
	}
	if err := backend.MatMuls(be, vs.gateUp[:], in, l.gateUp[:]); err != nil {
		return err
	}
	if err := addBias(be, vs.gate, l.bGate); err != nil {
		return err
	}
	if err := addBias(be, vs.up, l.bUp); err != nil {
		return err
	}
	act := be.SwiGLU
	if m.GeGLU {
		act = be.GeGLU
	}
	if err := act(vs.gate, vs.gate, vs.up); err != nil {
		return err
	}
	if err := be.MatMul(vs.xn, vs.gate, l.wDown); err != nil {
		return err
	}
	if err := addBias(be, vs.xn, l.bDown); err != nil {
		return err
	}
	if m.PostNorm {
		if err := be.RMSNorm(vs.xn, vs.xn, l.ffnNorm, m.NormEps); err != nil {
			return err
		}
	}
	if m.ResidualScale != 0 {
		if err := be.Scale(vs.xn, vs.xn, m.ResidualScale); err != nil {
			return err
		}
	}
	return be.AddRows(vs.x, vs.x, vs.xn)
}

// addBias adds bias ([1, cols]) to every row of x; nothing when bias is nil.
func addBias(be backend.Backend, x, bias backend.Tensor) error {
	if bias == nil {
		return nil
	}
	return be.AddRows(x, x, bias)
}

// checkTokens checks that every id of tokens is in the vocabulary.
func (m *Model) checkTokens(tokens []int32) error {
	for _, t := range tokens {
		if t < 0 || int(t) >= m.Vocab {
			return fmt.Errorf("llama: token id %d is outside the vocabulary of %d", t, m.Vocab)
		}
	}
	return nil
}

// checkRows checks that every row of rows (what they are for: "output", "hidden") is in a batch
// of n tokens.
func checkRows(what string, rows []int32, n int) error {
	for _, i := range rows {
		if i < 0 || int(i) >= n {
			return fmt.Errorf("llama: %s row %d is outside the batch of %d", what, i, n)
		}
	}
	return nil
}

// checkBatch checks that a step of n tokens is not empty, fits the context and that b describes
// n tokens.
func (c *Context) checkBatch(n int, b *backend.Batch) error {
	switch {
	case n == 0:
		return errors.New("llama: empty batch")
	case n > c.cfg.StepTokens:
		return fmt.Errorf("llama: %d tokens in one step exceed the context's %d", n, c.cfg.StepTokens)
	case len(b.Pos) != n || len(b.Slot) != n:
		return fmt.Errorf("llama: batch describes %d positions and %d slots for %d tokens", len(b.Pos), len(b.Slot), n)
	}
	return nil
}
