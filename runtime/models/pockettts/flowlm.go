package pockettts

import (
	"errors"
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The FlowLM backbone (models/flow_lm.py:96, modules/transformer.py at kyutai-labs/pocket-tts
// 9514983): 6 pre-norm layers of width 1024, 16 heads of 64 with interleaved RoPE (base 10000)
// and causal attention over a KV cache, an exact-GELU feed-forward network, no biases but the
// norms'; out_norm; the EOS head (Linear 1024→1 with bias) and the flow head on the last position.
// One position counter serves the voice prompt, the text and the frames.

// lmEps is the LayerNorm epsilon of the FlowLM and of Mimi's transformers.
const lmEps = 1e-5

// EOSThreshold is upstream's default: a frame step whose EOS logit is above it ends the chunk
// (after FramesAfterEOS more frames).
const EOSThreshold = -4.0

// FlowLMConfig sizes a FlowLM.
type FlowLMConfig struct {
	StepTokens int // most positions one pass computes; longer text and voice prompts are split
	MaxSeqs    int // most syntheses in one frame step
	KVSlots    int // cache positions shared by all syntheses
	BlockSize  int // cache block size in positions (default 16)
	LSDSteps   int // the flow head's decoding steps (default 1, upstream's)
}

// FlowLM runs the FlowLM for many syntheses at once: each synthesis (a chunk of text) is a
// sequence of the cache (kvcache.Seq, from Pool) holding its voice prompt, its text and its
// frames. One goroutine uses a FlowLM at a time. A scheduler batches the frame steps of running
// syntheses into one Step, and the text passes of new ones into Text.
type FlowLM struct {
	m    *Model
	cfg  FlowLMConfig
	kv   backend.KV
	pool *kvcache.Pool
	bb   kvcache.BatchBuilder
	attn backend.Attn
	rope backend.RoPE

	x, h, q, k, v, att backend.Tensor // [StepTokens, d]
	ff                 backend.Tensor // [StepTokens, ff]
	lat                backend.Tensor // [MaxSeqs, latent]: frame step inputs
	eos                backend.Tensor // [MaxSeqs, 1]
	flow               *flowScratch
	owned              []backend.Tensor

	rows   []*lmViews           // by row count
	flows  []*flowViews         // by row count
	tails  map[int]*lmViews     // the last n of r rows (Start's first-frame rows), by r·(MaxSeqs+1)+n
	bbTail kvcache.BatchBuilder // Start's first-frame rows

	ids  []int32   // a pass's token ids
	in   []float32 // [MaxSeqs*latent] step inputs, BOS substituted
	nan  []float32 // [MaxSeqs*latent] NaNs: the inputs of chunks' first frame steps
	bosX []float32 // [d] the input row of a chunk's first frame step (Start), once computed
}

type lmViews struct {
	x, h, q, k, v, att, ff backend.Tensor
	lat, eos               backend.Tensor   // nil past MaxSeqs rows
	qkv                    []backend.Tensor // q, k, v: one MatMuls
}

// NewFlowLM makes a FlowLM with its own cache.
func (m *Model) NewFlowLM(cfg FlowLMConfig) (*FlowLM, error) {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.LSDSteps == 0 {
		cfg.LSDSteps = 1
	}
	if cfg.StepTokens <= 0 || cfg.MaxSeqs <= 0 || cfg.KVSlots <= 0 || cfg.BlockSize <= 0 || cfg.LSDSteps <= 0 || cfg.LSDSteps > 1000 {
		return nil, fmt.Errorf("pockettts: invalid FlowLM config %+v", cfg)
	}
	pool, err := kvcache.NewPool((cfg.KVSlots+cfg.BlockSize-1)/cfg.BlockSize, cfg.BlockSize)
	if err != nil {
		return nil, err
	}
	c := &m.cfg
	d, hd := c.Dim, c.HeadDim()
	f := &FlowLM{m: m, cfg: cfg, pool: pool,
		attn: backend.Attn{NHead: c.Heads, NKVHead: c.Heads, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))},
		rope: backend.RoPE{Mode: backend.RoPENormal, HeadDim: hd, Dims: hd, Base: float32(c.RoPEBase), FreqScale: 1},
		rows: make([]*lmViews, cfg.StepTokens+1), flows: make([]*flowViews, cfg.MaxSeqs+1),
		in: make([]float32, cfg.MaxSeqs*c.LatentDim), nan: make([]float32, cfg.MaxSeqs*c.LatentDim),
	}
	for i := range f.nan {
		f.nan[i] = float32(math.NaN())
	}
	f.kv, err = m.be.NewKV(backend.KVConfig{Layers: c.Layers, Slots: pool.Slots(), Width: d, BlockSize: cfg.BlockSize, DType: tensor.F32})
	if err != nil {
		return nil, fmt.Errorf("pockettts: FlowLM cache: %w", err)
	}
	keep := func(t backend.Tensor) { f.owned = append(f.owned, t) }
	for _, s := range []struct {
		dst        *backend.Tensor
		rows, cols int
	}{{&f.x, cfg.StepTokens, d}, {&f.h, cfg.StepTokens, d}, {&f.q, cfg.StepTokens, d}, {&f.k, cfg.StepTokens, d},
		{&f.v, cfg.StepTokens, d}, {&f.att, cfg.StepTokens, d}, {&f.ff, cfg.StepTokens, c.FFDim},
		{&f.lat, cfg.MaxSeqs, c.LatentDim}, {&f.eos, cfg.MaxSeqs, 1}} {
		t, err := m.be.Alloc(tensor.F32, s.rows, s.cols)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("pockettts: FlowLM scratch: %w", err)
		}
		keep(t)
		*s.dst = t
	}
	if f.flow, err = newFlowScratch(m, cfg.MaxSeqs, cfg.LSDSteps, keep); err != nil {
		f.Close()
		return nil, fmt.Errorf("pockettts: flow head scratch: %w", err)
	}
	return f, nil
}

// Pool is the block pool of the FlowLM's cache: a synthesis is a sequence of it.
func (f *FlowLM) Pool() *kvcache.Pool { return f.pool }

// Config is the configuration with defaults filled in.
func (f *FlowLM) Config() FlowLMConfig { return f.cfg }

// Close releases the cache and scratch.
func (f *FlowLM) Close() error {
	var errs []error
	for i := len(f.owned) - 1; i >= 0; i-- {
		errs = append(errs, f.owned[i].Close())
	}
	f.owned, f.rows, f.flows, f.tails = nil, nil, nil, nil
	if f.kv != nil {
		errs = append(errs, f.kv.Close())
		f.kv = nil
	}
	return errors.Join(errs...)
}

func (f *FlowLM) views(n int) (*lmViews, error) {
	if vs := f.rows[n]; vs != nil {
		return vs, nil
	}
	vs := &lmViews{}
	ps := []struct {
		dst *backend.Tensor
		src backend.Tensor
	}{{&vs.x, f.x}, {&vs.h, f.h}, {&vs.q, f.q}, {&vs.k, f.k}, {&vs.v, f.v}, {&vs.att, f.att}, {&vs.ff, f.ff}}
	if n <= f.cfg.MaxSeqs {
		ps = append(ps, []struct {
			dst *backend.Tensor
			src backend.Tensor
		}{{&vs.lat, f.lat}, {&vs.eos, f.eos}}...)
	}
	for _, p := range ps {
		t, err := f.m.be.View(p.src, 0, n)
		if err != nil {
			return nil, err
		}
		f.owned = append(f.owned, t)
		*p.dst = t
	}
	vs.qkv = []backend.Tensor{vs.q, vs.k, vs.v}
	f.rows[n] = vs
	return vs, nil
}

// tailViews are views of the last n of r rows of the pass scratch (no lat, eos or qkv).
func (f *FlowLM) tailViews(r, n int) (*lmViews, error) {
	key := r*(f.cfg.MaxSeqs+1) + n
	if vs := f.tails[key]; vs != nil {
		return vs, nil
	}
	vs := &lmViews{}
	for _, p := range []struct {
		dst *backend.Tensor
		src backend.Tensor
	}{{&vs.x, f.x}, {&vs.h, f.h}, {&vs.q, f.q}, {&vs.att, f.att}, {&vs.ff, f.ff}} {
		t, err := f.m.be.View(p.src, r-n, n)
		if err != nil {
			return nil, err
		}
		f.owned = append(f.owned, t)
		*p.dst = t
	}
	if f.tails == nil {
		f.tails = map[int]*lmViews{}
	}
	f.tails[key] = vs
	return vs, nil
}

func (f *FlowLM) flowViews(n int) (*flowViews, error) {
	if fv := f.flows[n]; fv != nil {
		return fv, nil
	}
	fv, err := f.flow.views(f.m.be, n, func(t backend.Tensor) { f.owned = append(f.owned, t) })
	if err != nil {
		return nil, err
	}
	f.flows[n] = fv
	return fv, nil
}

// kvSink receives each layer's keys (rotated) and values [n, d] of a pass, as they are stored.
type kvSink func(layer int, k, v backend.Tensor) error

// forward runs the layers over vs.x (the pass's input rows, batch b), leaving out_norm's output
// in vs.x. With full false it stops once the last layer's keys and values are stored: a pass
// whose outputs are discarded needs only the cache. stage prefixes the layer-0 trace.
func (f *FlowLM) forward(vs *lmViews, b *backend.Batch, full bool, stage string, sink kvSink) error {
	m := f.m
	be := m.be
	if m.Trace != nil {
		full = true
	}
	o := &ops{be: be}
	last := len(m.layers) - 1
	for li := range m.layers {
		L := &m.layers[li]
		o.do(be.LayerNorm(vs.h, vs.x, L.norm1.w, L.norm1.b, lmEps))
		o.do(backend.MatMuls(be, vs.qkv, vs.h, L.qkv))
		o.do(be.Rope(vs.q, m.cfg.Heads, f.rope, b))
		o.do(be.Rope(vs.k, m.cfg.Heads, f.rope, b))
		o.do(be.StoreKV(f.kv, li, vs.k, vs.v, b))
		if sink != nil && o.err == nil {
			o.do(sink(li, vs.k, vs.v))
		}
		if li == last && !full {
			break
		}
		f.mix(o, vs, b, li)
		if li == 0 && o.err == nil && m.Trace != nil {
			o.do(m.trace(stage+"_layer0", vs.x))
		}
		if o.err != nil {
			break
		}
	}
	if full {
		o.do(be.LayerNorm(vs.x, vs.x, m.outNorm.w, m.outNorm.b, lmEps))
	}
	return o.err
}

// mix runs the rest of layer li over vs's rows once their keys and values are stored: attention,
// the output projection, the feed-forward network and both residual additions.
func (f *FlowLM) mix(o *ops, vs *lmViews, b *backend.Batch, li int) {
	be := f.m.be
	L := &f.m.layers[li]
	o.do(be.Attention(vs.att, vs.q, f.kv, li, f.attn, b))
	o.do(be.MatMul(vs.h, vs.att, L.o))
	o.do(be.AddRows(vs.x, vs.x, vs.h))
	o.do(be.LayerNorm(vs.h, vs.x, L.norm2.w, L.norm2.b, lmEps))
	o.do(be.MatMul(vs.ff, vs.h, L.linear1))
	o.do(be.Unary(vs.ff, vs.ff, tensor.GELUErf))
	o.do(be.MatMul(vs.h, vs.ff, L.linear2))
	o.do(be.AddRows(vs.x, vs.x, vs.h))
}

// piece is rows [from, to) of sequence seq's input in one pass.
type piece struct{ seq, from, to int }

// passes splits the inputs of several sequences (lens[i] rows each) into passes of at most
// StepTokens rows, in order, and calls run for each pass with its pieces.
func (f *FlowLM) passes(lens []int, run func(ps []piece, rows int) error) error {
	var ps []piece
	rows := 0
	for i, n := range lens {
		for from := 0; from < n; {
			take := min(n-from, f.cfg.StepTokens-rows)
			ps = append(ps, piece{i, from, from + take})
			rows += take
			from += take
			if rows == f.cfg.StepTokens {
				if err := run(ps, rows); err != nil {
					return err
				}
				ps, rows = ps[:0], 0
			}
		}
	}
	if rows > 0 {
		return run(ps, rows)
	}
	return nil
}

// batch reserves the pieces' positions and builds their batch.
func (f *FlowLM) batch(seqs []*kvcache.Seq, ps []piece) (*backend.Batch, error) {
	f.bb.Reset()
	for _, p := range ps {
		s := seqs[p.seq]
		if err := s.Reserve(p.to - p.from); err != nil {
			return nil, fmt.Errorf("pockettts: FlowLM cache: %w", err)
		}
		if err := f.bb.Add(s, p.to-p.from); err != nil {
			return nil, err
		}
	}
	return f.bb.Batch(), nil
}

func (f *FlowLM) advance(seqs []*kvcache.Seq, ps []piece) error {
	for _, p := range ps {
		if err := seqs[p.seq].Advance(p.to - p.from); err != nil {
			return err
		}
	}
	return nil
}

// SetVoice stores voice v as the first positions of s, an empty sequence: every synthesis starts
// from a copy of the voice state.
func (f *FlowLM) SetVoice(s *kvcache.Seq, v *Voice) error {
	c := &f.m.cfg
	d := c.Dim
	if s.Len() != 0 {
		return fmt.Errorf("pockettts: a voice goes into an empty sequence (this one holds %d positions)", s.Len())
	}
	if len(v.Layers) != c.Layers {
		return fmt.Errorf("pockettts: the voice has %d layers, the model %d", len(v.Layers), c.Layers)
	}
	for i, l := range v.Layers {
		if len(l.K) != v.Positions*d || len(l.V) != v.Positions*d {
			return fmt.Errorf("pockettts: voice layer %d holds %d keys and %d values, want %d·%d", i, len(l.K), len(l.V), v.Positions, d)
		}
	}
	seqs := []*kvcache.Seq{s}
	return f.passes([]int{v.Positions}, func(ps []piece, n int) error {
		b, err := f.batch(seqs, ps)
		if err != nil {
			return err
		}
		vs, err := f.views(n)
		if err != nil {
			return err
		}
		p := ps[0]
		for li, l := range v.Layers {
			if err := f.m.be.Write(vs.k, 0, l.K[p.from*d:p.to*d]); err != nil {
				return err
			}
			if err := f.m.be.Write(vs.v, 0, l.V[p.from*d:p.to*d]); err != nil {
				return err
			}
			if err := f.m.be.StoreKV(f.kv, li, vs.k, vs.v, b); err != nil {
				return err
			}
		}
		return f.advance(seqs, ps)
	})
}

// Text runs the text pass of each sequence: tokens[i] (ids below the vocabulary size) follow the
// positions seqs[i] holds (its voice). Upstream discards the pass's outputs; only the cache is
// kept.
func (f *FlowLM) Text(seqs []*kvcache.Seq, tokens [][]int32) error {
	if len(tokens) != len(seqs) {
		return fmt.Errorf("pockettts: %d token lists for %d sequences", len(tokens), len(seqs))
	}
	lens := make([]int, len(seqs))
	for i, tk := range tokens {
		for _, id := range tk {
			if id < 0 || int(id) >= f.m.cfg.Vocab {
				return fmt.Errorf("pockettts: token id %d outside the vocabulary of %d", id, f.m.cfg.Vocab)
			}
		}
		lens[i] = len(tk)
	}
	be := f.m.be
	return f.passes(lens, func(ps []piece, n int) error {
		b, err := f.batch(seqs, ps)
		if err != nil {
			return err
		}
		vs, err := f.views(n)
		if err != nil {
			return err
		}
		f.ids = f.ids[:0]
		for _, p := range ps {
			f.ids = append(f.ids, tokens[p.seq][p.from:p.to]...)
		}
		if err := be.GetRows(vs.x, f.m.embed, f.ids); err != nil {
			return err
		}
		if err := f.m.trace("text_emb", vs.x); err != nil {
			return err
		}
		if err := f.forward(vs, b, false, "text", nil); err != nil {
			return fmt.Errorf("pockettts: text pass: %w", err)
		}
		if err := f.m.trace("text_backbone", vs.x); err != nil {
			return err
		}
		return f.advance(seqs, ps)
	})
}

// Voice runs the voice prompt pass (prompt [P, d] row-major: the BOS vector, where the model has
// one, then the conditioning of each prompt frame) on a sequence of its own, and returns the
// cache it leaves: the voice state. The sequence is released after.
func (f *FlowLM) Voice(prompt []float32) (*Voice, error) {
	c := &f.m.cfg
	d := c.Dim
	if len(prompt) == 0 || len(prompt)%d != 0 {
		return nil, fmt.Errorf("pockettts: a voice prompt of %d values is not whole rows of %d", len(prompt), d)
	}
	rows := len(prompt) / d
	v := &Voice{Positions: rows, Layers: make([]VoiceLayer, c.Layers)}
	for i := range v.Layers {
		v.Layers[i] = VoiceLayer{K: make([]float32, rows*d), V: make([]float32, rows*d)}
	}
	s := f.pool.NewSeq(rows)
	defer s.Release()
	seqs := []*kvcache.Seq{s}
	be := f.m.be
	err := f.passes([]int{rows}, func(ps []piece, n int) error {
		b, err := f.batch(seqs, ps)
		if err != nil {
			return err
		}
		vs, err := f.views(n)
		if err != nil {
			return err
		}
		p := ps[0]
		if err := be.Write(vs.x, 0, prompt[p.from*d:p.to*d]); err != nil {
			return err
		}
		sink := func(li int, k, val backend.Tensor) error {
			if err := be.Read(k, 0, v.Layers[li].K[p.from*d:p.to*d]); err != nil {
				return err
			}
			return be.Read(val, 0, v.Layers[li].V[p.from*d:p.to*d])
		}
		if err := f.forward(vs, b, false, "voice", sink); err != nil {
			return fmt.Errorf("pockettts: voice prompt pass: %w", err)
		}
		return f.advance(seqs, ps)
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// Step runs one frame step of each sequence: in[i*L:(i+1)*L] (L = LatentDim) is the latent the
// step reads, the previous step's output, or NaNs for the first step of a chunk (upstream
// replaces NaN elements with the BOS embedding); noise[i*L:(i+1)*L] is the flow head's x0
// (z·√temp; zeros for temperature 0). The latent (normalised; the next step's input) goes into
// out[i*L:], the EOS logit into eos[i]. Each sequence advances by one position.
func (f *FlowLM) Step(seqs []*kvcache.Seq, in, noise, out, eos []float32) error {
	n, L := len(seqs), f.m.cfg.LatentDim
	if n == 0 {
		return nil
	}
	if n > f.cfg.MaxSeqs {
		return fmt.Errorf("pockettts: a frame step of %d sequences exceeds the FlowLM's %d", n, f.cfg.MaxSeqs)
	}
	if len(in) != n*L || len(noise) != n*L || len(out) != n*L || len(eos) != n {
		return fmt.Errorf("pockettts: frame step of %d sequences: %d inputs, %d noise, %d outputs and %d EOS values (want %d, %d, %d, %d)",
			n, len(in), len(noise), len(out), len(eos), n*L, n*L, n*L, n)
	}
	f.bb.Reset()
	for _, s := range seqs {
		if err := s.Reserve(1); err != nil {
			return fmt.Errorf("pockettts: FlowLM cache: %w", err)
		}
		if err := f.bb.Add(s, 1); err != nil {
			return err
		}
	}
	b := f.bb.Batch()
	vs, err := f.views(n)
	if err != nil {
		return err
	}
	fv, err := f.flowViews(n)
	if err != nil {
		return err
	}
	be, m := f.m.be, f.m
	x := f.in[:n*L]
	for i, v := range in {
		if v != v {
			v = m.bosEmb[i%L]
		}
		x[i] = v
	}
	o := &ops{be: be}
	o.do(be.Write(vs.lat, 0, x))
	o.do(be.MatMul(vs.x, vs.lat, m.inputLinear))
	if o.err == nil {
		o.do(f.forward(vs, b, true, "step", nil))
	}
	if o.err == nil {
		o.do(m.trace("backbone", vs.x))
	}
	return f.heads(o, vs.x, vs.eos, fv, noise, out, eos, seqs, "frame step")
}

// heads ends a frame step: the EOS head and the flow head over the backbone's output x (a row a
// sequence; eosT its EOS logits' scratch) make each sequence's EOS logit into eos and its latent
// into out, from noise, and each sequence advances by the frame. what names the step in errors.
func (f *FlowLM) heads(o *ops, x, eosT backend.Tensor, fv *flowViews, noise, out, eos []float32, seqs []*kvcache.Seq, what string) error {
	be, m := f.m.be, f.m
	o.do(be.MatMul(eosT, x, m.eosW))
	o.do(be.Write(fv.x, 0, noise))
	if o.err == nil {
		o.do(m.flowHead(f.flow, fv, x))
	}
	o.do(be.Read(fv.x, 0, out))
	o.do(be.Read(eosT, 0, eos))
	if o.err != nil {
		return fmt.Errorf("pockettts: %s: %w", what, o.err)
	}
	for i := range eos {
		eos[i] += m.eosB
	}
	for _, s := range seqs {
		if err := s.Advance(1); err != nil {
			return err
		}
	}
	return nil
}

// Start runs the text pass of each sequence and its chunk's first frame step, as Text(seqs,
// tokens) and then Step(seqs, NaNs, noise, out, eos) would, in one pass over the backbone's
// weights: the text rows of every sequence, then the row of each one's first frame (the BOS
// input); the last layer's attention and feed-forward network run over the first-frame rows
// only (upstream discards the text's outputs), and so do the EOS head and the flow head. Where
// the rows do not fit one pass (StepTokens) or a trace is set, it calls Text and Step. On error
// the sequences are left part way: release them.
func (f *FlowLM) Start(seqs []*kvcache.Seq, tokens [][]int32, noise, out, eos []float32) error {
	n, L := len(seqs), f.m.cfg.LatentDim
	if len(tokens) != n {
		return fmt.Errorf("pockettts: %d token lists for %d sequences", len(tokens), n)
	}
	if n == 0 {
		return nil
	}
	if n > f.cfg.MaxSeqs {
		return fmt.Errorf("pockettts: a frame step of %d sequences exceeds the FlowLM's %d", n, f.cfg.MaxSeqs)
	}
	if len(noise) != n*L || len(out) != n*L || len(eos) != n {
		return fmt.Errorf("pockettts: start of %d sequences: %d noise, %d outputs and %d EOS values (want %d, %d, %d)",
			n, len(noise), len(out), len(eos), n*L, n*L, n)
	}
	rows := 0
	for _, tk := range tokens {
		for _, id := range tk {
			if id < 0 || int(id) >= f.m.cfg.Vocab {
				return fmt.Errorf("pockettts: token id %d outside the vocabulary of %d", id, f.m.cfg.Vocab)
			}
		}
		rows += len(tk) + 1
	}
	if rows > f.cfg.StepTokens || f.m.Trace != nil {
		if err := f.Text(seqs, tokens); err != nil {
			return err
		}
		return f.Step(seqs, f.nan[:n*L], noise, out, eos)
	}
	if f.bosX == nil {
		if err := f.bosRow(); err != nil {
			return err
		}
	}
	be, m := f.m.be, f.m
	// Batch order: every sequence's text, then every sequence's first frame. A sequence is
	// advanced past its text before its frame's row joins, at the next position.
	f.bb.Reset()
	f.ids = f.ids[:0]
	for i, s := range seqs {
		if err := s.Reserve(len(tokens[i]) + 1); err != nil {
			return fmt.Errorf("pockettts: FlowLM cache: %w", err)
		}
		if len(tokens[i]) == 0 {
			continue
		}
		if err := f.bb.Add(s, len(tokens[i])); err != nil {
			return err
		}
		f.ids = append(f.ids, tokens[i]...)
	}
	for i, s := range seqs {
		if err := s.Advance(len(tokens[i])); err != nil {
			return err
		}
	}
	f.bbTail.Reset()
	for _, s := range seqs {
		if err := f.bb.Add(s, 1); err != nil {
			return err
		}
		if err := f.bbTail.Add(s, 1); err != nil {
			return err
		}
		f.ids = append(f.ids, 0) // the frame's row, written below
	}
	b, bt := f.bb.Batch(), f.bbTail.Batch()
	vs, err := f.views(rows)
	if err != nil {
		return err
	}
	vt, err := f.tailViews(rows, n)
	if err != nil {
		return err
	}
	vn, err := f.views(n)
	if err != nil {
		return err
	}
	fv, err := f.flowViews(n)
	if err != nil {
		return err
	}
	o := &ops{be: be}
	o.do(be.GetRows(vs.x, m.embed, f.ids))
	for i := range n {
		o.do(be.Write(vs.x, rows-n+i, f.bosX))
	}
	if o.err == nil {
		o.do(f.forward(vs, b, false, "start", nil))
	}
	if o.err == nil {
		f.mix(o, vt, bt, len(m.layers)-1)
	}
	o.do(be.LayerNorm(vt.x, vt.x, m.outNorm.w, m.outNorm.b, lmEps))
	return f.heads(o, vt.x, vn.eos, fv, noise, out, eos, seqs, "text pass and first frame step")
}

// bosRow computes the input row of a chunk's first frame step, the BOS embedding through the
// input projection, as Step computes it for one sequence.
func (f *FlowLM) bosRow() error {
	vs, err := f.views(1)
	if err != nil {
		return err
	}
	be := f.m.be
	x := make([]float32, f.m.cfg.Dim)
	o := &ops{be: be}
	o.do(be.Write(vs.lat, 0, f.m.bosEmb))
	o.do(be.MatMul(vs.x, vs.lat, f.m.inputLinear))
	o.do(be.Read(vs.x, 0, x))
	if o.err != nil {
		return fmt.Errorf("pockettts: the first frame's input: %w", o.err)
	}
	f.bosX = x
	return nil
}
