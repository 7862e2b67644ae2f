package whisper

import (
	"errors"
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/tensor"
)

// DecoderConfig sizes a Decoder.
type DecoderConfig struct {
	StepTokens int // most tokens in one step (prompts plus one token per running sequence)
	MaxSeqs    int // most sequences in one step, and most rows of logits it returns
	KVSlots    int // self-attention cache positions shared by all sequences
	BlockSize  int // cache block size in positions (default 16)
}

// Decoder steps the text decoder for many sequences at once: each sequence (a session's
// hypothesis, or one beam) has its own self-attention cache blocks from Pool and reads the
// cross-attention keys and values of its audio window. One goroutine uses a Decoder at a time.
type Decoder struct {
	m    *Model
	cfg  DecoderConfig
	kv   backend.KV
	pool *kvcache.Pool
	attn backend.Attn

	x, xn, q, k, v, att backend.Tensor // [StepTokens, T]
	pe                  backend.Tensor // [StepTokens, T]
	ff                  backend.Tensor // [StepTokens, 4T]
	h                   backend.Tensor // [MaxSeqs, T]
	logits              backend.Tensor // [MaxSeqs, Vocab]
	scratch             []backend.Tensor

	// captureQ, when set, receives every layer's cross-attention queries (the view of this
	// step's rows) before they attend; word timing reads the alignment heads' from it.
	captureQ func(li int, q backend.Tensor) error

	rec backend.Recording // decode steps recorded where the backend records (see Forward)

	sel    []int32   // the output rows of a ForwardChoose: out, then pick
	picked []float32 // the picked rows' logits, on backends that do not choose (made on first use)

	tok   []*decViews                  // by token count
	out   []*[2]backend.Tensor         // by logit rows: h, logits
	spans map[int64]*[2]backend.Tensor // by start*(StepTokens+1)+count: q, att rows of one sequence
}

type decViews struct{ x, xn, q, k, v, att, pe, ff backend.Tensor }

// NewDecoder makes a decoder with its own self-attention cache.
func (m *Model) NewDecoder(cfg DecoderConfig) (*Decoder, error) {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.StepTokens <= 0 || cfg.MaxSeqs <= 0 || cfg.KVSlots <= 0 || cfg.BlockSize <= 0 || cfg.MaxSeqs > cfg.StepTokens {
		return nil, fmt.Errorf("whisper: invalid decoder config %+v", cfg)
	}
	pool, err := kvcache.NewPool((cfg.KVSlots+cfg.BlockSize-1)/cfg.BlockSize, cfg.BlockSize)
	if err != nil {
		return nil, err
	}
	T := m.TextState
	hd := T / m.TextHead
	d := &Decoder{m: m, cfg: cfg, pool: pool,
		attn:  backend.Attn{NHead: m.TextHead, NKVHead: m.TextHead, HeadDim: hd, Scale: 1 / sqrt32(float32(hd))},
		tok:   make([]*decViews, cfg.StepTokens+1),
		out:   make([]*[2]backend.Tensor, cfg.MaxSeqs+1),
		spans: map[int64]*[2]backend.Tensor{},
	}
	d.kv, err = m.be.NewKV(backend.KVConfig{Layers: m.TextLayer, Slots: pool.Slots(), Width: T, BlockSize: cfg.BlockSize, DType: tensor.F16})
	if err != nil {
		return nil, fmt.Errorf("whisper: decoder cache: %w", err)
	}
	for _, s := range []struct {
		dst        *backend.Tensor
		rows, cols int
	}{
		{&d.x, cfg.StepTokens, T}, {&d.xn, cfg.StepTokens, T}, {&d.q, cfg.StepTokens, T}, {&d.k, cfg.StepTokens, T},
		{&d.v, cfg.StepTokens, T}, {&d.att, cfg.StepTokens, T}, {&d.pe, cfg.StepTokens, T}, {&d.ff, cfg.StepTokens, 4 * T},
		{&d.h, cfg.MaxSeqs, T}, {&d.logits, cfg.MaxSeqs, m.NVocab},
	} {
		t, err := m.be.Alloc(tensor.F32, s.rows, s.cols)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("whisper: decoder scratch: %w", err)
		}
		*s.dst = t
		d.scratch = append(d.scratch, t)
	}
	return d, nil
}

// Pool is the block pool of the decoder's self-attention cache.
func (d *Decoder) Pool() *kvcache.Pool { return d.pool }

// Config is the decoder's configuration with defaults filled in.
func (d *Decoder) Config() DecoderConfig { return d.cfg }

// Model is the model the decoder runs.
func (d *Decoder) Model() *Model { return d.m }

// Close releases the cache and scratch.
func (d *Decoder) Close() error {
	var errs []error
	for _, vs := range d.tok {
		if vs != nil {
			for _, t := range []backend.Tensor{vs.x, vs.xn, vs.q, vs.k, vs.v, vs.att, vs.pe, vs.ff} {
				errs = append(errs, t.Close())
			}
		}
	}
	for _, vs := range d.out {
		if vs != nil {
			errs = append(errs, vs[0].Close(), vs[1].Close())
		}
	}
	for _, vs := range d.spans {
		errs = append(errs, vs[0].Close(), vs[1].Close())
	}
	d.tok, d.out, d.spans = nil, nil, nil
	for _, t := range d.scratch {
		errs = append(errs, t.Close())
	}
	d.scratch = nil
	if d.kv != nil {
		errs = append(errs, d.kv.Close())
		d.kv = nil
	}
	return errors.Join(errs...)
}

func (d *Decoder) tokViews(n int) (*decViews, error) {
	if vs := d.tok[n]; vs != nil {
		return vs, nil
	}
	vs := &decViews{}
	for _, p := range []struct {
		dst *backend.Tensor
		src backend.Tensor
	}{{&vs.x, d.x}, {&vs.xn, d.xn}, {&vs.q, d.q}, {&vs.k, d.k}, {&vs.v, d.v}, {&vs.att, d.att}, {&vs.pe, d.pe}, {&vs.ff, d.ff}} {
		t, err := d.m.be.View(p.src, 0, n)
		if err != nil {
			return nil, err
		}
		*p.dst = t
	}
	d.tok[n] = vs
	return vs, nil
}

func (d *Decoder) outViews(n int) (*[2]backend.Tensor, error) {
	if vs := d.out[n]; vs != nil {
		return vs, nil
	}
	h, err := d.m.be.View(d.h, 0, n)
	if err != nil {
		return nil, err
	}
	lg, err := d.m.be.View(d.logits, 0, n)
	if err != nil {
		return nil, err
	}
	vs := &[2]backend.Tensor{h, lg}
	d.out[n] = vs
	return vs, nil
}

// span returns views of rows start..start+count-1 of q and att.
func (d *Decoder) span(start, count int) (*[2]backend.Tensor, error) {
	key := int64(start)*int64(d.cfg.StepTokens+1) + int64(count)
	if vs, ok := d.spans[key]; ok {
		return vs, nil
	}
	q, err := d.m.be.View(d.q, start, count)
	if err != nil {
		return nil, err
	}
	a, err := d.m.be.View(d.att, start, count)
	if err != nil {
		return nil, err
	}
	vs := &[2]backend.Tensor{q, a}
	d.spans[key] = vs
	return vs, nil
}

// Forward runs one decoder step over the tokens of b: tokens[i] at position b.Pos[i] of its
// sequence, stored in cache slot b.Slot[i]. Sequence s of b (b.Seqs[s]) attends to the audio
// window cross[s]. The next-token logits of the batch rows listed in out are written to logits
// ([len(out), Vocab], row-major), unscaled and unsuppressed.
func (d *Decoder) Forward(tokens []int32, b *backend.Batch, cross []*Cross, out []int32, logits []float32) error {
	return d.ForwardChoose(tokens, b, cross, out, logits, nil, nil, nil, 1, nil, nil, nil)
}

// ForwardChoose is Forward that also chooses the tokens of the batch rows listed in pick:
// choices[i] says how row pick[i]'s logits are filtered (backend.Choice; drop is the list its
// Drop ranges index), and its k most probable tokens after filtering go to ids[i*k:(i+1)*k] and
// logp[i*k:(i+1)*k], the rest of what was found to rows[i]. On a backend that is a
// backend.Chooser the choice is made where the logits are (on a GPU only the chosen tokens leave
// the device); on others the rows are read and chosen here (backend.ChooseRows). out and pick
// together list at most MaxSeqs rows.
func (d *Decoder) ForwardChoose(tokens []int32, b *backend.Batch, cross []*Cross, out []int32, logits []float32,
	pick []int32, choices []backend.Choice, drop []int32, k int, rows []backend.Chosen, ids []int32, logp []float32) error {
	n := len(tokens)
	m := d.m
	nout := len(out) + len(pick)
	switch {
	case n == 0:
		return errors.New("whisper: empty batch")
	case n > d.cfg.StepTokens:
		return fmt.Errorf("whisper: %d tokens in one step exceed the decoder's %d", n, d.cfg.StepTokens)
	case len(b.Pos) != n || len(b.Slot) != n:
		return fmt.Errorf("whisper: batch describes %d positions and %d slots for %d tokens", len(b.Pos), len(b.Slot), n)
	case len(cross) != len(b.Seqs):
		return fmt.Errorf("whisper: %d cross-attention windows for %d sequences", len(cross), len(b.Seqs))
	case nout > d.cfg.MaxSeqs:
		return fmt.Errorf("whisper: %d logit rows exceed the decoder's %d", nout, d.cfg.MaxSeqs)
	case len(logits) != len(out)*m.NVocab:
		return fmt.Errorf("whisper: logits buffer holds %d values, want %d", len(logits), len(out)*m.NVocab)
	case len(choices) != len(pick) || len(rows) != len(pick) || len(ids) != len(pick)*k || len(logp) != len(pick)*k:
		return fmt.Errorf("whisper: %d choices, %d row reports, %d ids and %d log-probabilities for %d picked rows of %d tokens",
			len(choices), len(rows), len(ids), len(logp), len(pick), k)
	}
	if len(pick) > 0 {
		if err := backend.CheckChoices(choices, drop, m.NVocab, k); err != nil {
			return fmt.Errorf("whisper: %w", err)
		}
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= m.NVocab {
			return fmt.Errorf("whisper: token id %d is outside the vocabulary of %d", t, m.NVocab)
		}
	}
	for _, p := range b.Pos {
		if p < 0 || int(p) >= m.TextCtx {
			return fmt.Errorf("whisper: position %d is outside the decoder's context of %d", p, m.TextCtx)
		}
	}
	for i, c := range cross {
		if c == nil || len(c.k) != m.TextLayer {
			return fmt.Errorf("whisper: sequence %d has no cross-attention window", i)
		}
	}
	for _, rs := range [][]int32{out, pick} {
		for _, i := range rs {
			if i < 0 || int(i) >= n {
				return fmt.Errorf("whisper: output row %d is outside the batch of %d", i, n)
			}
		}
	}
	vs, err := d.tokViews(n)
	if err != nil {
		return err
	}
	var ov *[2]backend.Tensor
	sel := out
	if nout > 0 {
		if ov, err = d.outViews(nout); err != nil {
			return err
		}
		if len(pick) > 0 {
			sel = append(append(d.sel[:0], out...), pick...)
			d.sel = sel
		}
	}
	// A decode step (its many small operations cost more to start than to run) is recorded and
	// run as one unit where the backend records, except while word timing reads the queries.
	if n > recordStepTokens || d.captureQ != nil {
		err = d.ops(tokens, b, cross, vs, sel, ov)
	} else {
		err = d.rec.Run(m.be, func() error { return d.ops(tokens, b, cross, vs, sel, ov) })
	}
	if err != nil || ov == nil {
		return err
	}
	be := m.be
	if len(out) > 0 {
		if err := be.Read(ov[1], 0, logits); err != nil {
			return err
		}
	}
	if len(pick) == 0 {
		return nil
	}
	if ch, ok := be.(backend.Chooser); ok {
		return ch.Choose(ov[1], len(out), choices, drop, k, rows, ids, logp)
	}
	if d.picked == nil {
		d.picked = make([]float32, d.cfg.MaxSeqs*m.NVocab)
	}
	lg := d.picked[:len(pick)*m.NVocab]
	if err := be.Read(ov[1], len(out), lg); err != nil {
		return err
	}
	return backend.ChooseRows(lg, m.NVocab, choices, drop, k, rows, ids, logp)
}

// recordStepTokens is the largest step Forward records (backend.Recorder).
const recordStepTokens = 64

// ops calls the operations of a step: the embeddings, every layer, and for the rows out the
// final norm and the output matrix into ov[1] (ov nil: none).
func (d *Decoder) ops(tokens []int32, b *backend.Batch, cross []*Cross, vs *decViews, out []int32, ov *[2]backend.Tensor) error {
	m := d.m
	be := m.be
	if err := be.GetRows(vs.x, m.tokEmbd, tokens); err != nil {
		return err
	}
	if err := be.GetRows(vs.pe, m.decPE, b.Pos); err != nil {
		return err
	}
	if err := be.AddRows(vs.x, vs.x, vs.pe); err != nil {
		return err
	}
	for li := range m.dec {
		if err := d.layer(li, vs, b, cross); err != nil {
			return fmt.Errorf("whisper: decoder layer %d: %w", li, err)
		}
	}
	if ov == nil {
		return nil
	}
	if err := be.GetRows(ov[0], vs.x, out); err != nil {
		return err
	}
	if err := be.LayerNorm(ov[0], ov[0], m.decLnW, m.decLnB, normEps); err != nil {
		return err
	}
	return be.MatMul(ov[1], ov[0], m.tokEmbd)
}

// layer runs one decoder block on vs.x in place: causal self-attention over the sequence's cache,
// cross-attention over its audio window, then the MLP.
func (d *Decoder) layer(li int, vs *decViews, b *backend.Batch, cross []*Cross) error {
	be := d.m.be
	l := &d.m.dec[li]
	a := &l.attn
	if err := be.LayerNorm(vs.xn, vs.x, a.lnW, a.lnB, normEps); err != nil {
		return err
	}
	if err := linear(be, vs.q, vs.xn, a.q, a.qb); err != nil {
		return err
	}
	if err := linear(be, vs.k, vs.xn, a.k, nil); err != nil {
		return err
	}
	if err := linear(be, vs.v, vs.xn, a.v, a.vb); err != nil {
		return err
	}
	if err := be.StoreKV(d.kv, li, vs.k, vs.v, b); err != nil {
		return err
	}
	if err := be.Attention(vs.att, vs.q, d.kv, li, d.attn, b); err != nil {
		return err
	}
	if err := linear(be, vs.xn, vs.att, a.o, a.ob); err != nil {
		return err
	}
	if err := be.AddRows(vs.x, vs.x, vs.xn); err != nil {
		return err
	}

	c := &l.cross
	if err := be.LayerNorm(vs.xn, vs.x, c.lnW, c.lnB, normEps); err != nil {
		return err
	}
	if err := linear(be, vs.q, vs.xn, c.q, c.qb); err != nil {
		return err
	}
	if d.captureQ != nil {
		if err := d.captureQ(li, vs.q); err != nil {
			return err
		}
	}
	// Consecutive sequences over the same window (the beams or samples of one transcription)
	// attend together: one pass over the window's keys and values for all their rows.
	for s := 0; s < len(b.Seqs); {
		start, count := b.Seqs[s].Start, b.Seqs[s].Count
		e := s + 1
		for e < len(b.Seqs) && cross[e] == cross[s] && b.Seqs[e].Start == start+count {
			count += b.Seqs[e].Count
			e++
		}
		sp, err := d.span(start, count)
		if err != nil {
			return err
		}
		if err := be.FullAttention(sp[1], sp[0], cross[s].k[li], cross[s].v[li], d.attn); err != nil {
			return err
		}
		s = e
	}
	if err := linear(be, vs.xn, vs.att, c.o, c.ob); err != nil {
		return err
	}
	if err := be.AddRows(vs.x, vs.x, vs.xn); err != nil {
		return err
	}
	return mlp(be, &l.mlp, vs.x, vs.xn, vs.ff)
}

func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }
