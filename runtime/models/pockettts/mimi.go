package pockettts

import (
	"errors"
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The Mimi codec's streaming parts (models/mimi.py:89, modules/seanet.py, modules/conv.py:36,118,
// modules/transformer.py at kyutai-labs/pocket-tts 9514983), each run over consecutive spans of
// a signal with its state kept per slot (one slot per synthesis):
//
//   - a causal convolution keeps the last K-stride input rows and convolves them with the new
//     rows, without padding (StreamingConv1d): Im2Col1D over [state; input], MatMul;
//   - a transposed convolution of kernel 2·stride (every one in SEANet) is a causal convolution
//     of kernel 2 over its input (rows t-1 and t), whose product [T, stride·Cout] read as
//     [T·stride, Cout] rows (Reshape) is the output: the tail upstream carries to the next call
//     is this convolution's state, its last input row, so nothing is ever emitted late;
//   - the transformer (pre-norm, LayerScale on both branches, exact GELU, interleaved RoPE at the
//     200 Hz step index) attends causally within a window of the last MimiContext steps: each
//     query is a sequence of its own in the attention batch, whose block table (blocks of one
//     slot) lists the cache slots of its window, in a ring of slots per synthesis.

// mimiWeights are the codec's weights on the backend.
type mimiWeights struct {
	embStd, embMean backend.Tensor // [1, latent]
	quantizer       backend.Tensor // [m, latent]
	upLo, upHi      backend.Tensor // [stride, m]: the depthwise upsampling's kernel taps k and stride+k
	decLayers       []mimiLayer
	decIn           convW
	dec             []decStageW
	decOut          convW

	// The voice encoder's, loaded by the first clone (Model.loadClone).
	encIn      convW
	enc        []encStageW
	encOut     convW
	encLayers  []mimiLayer
	downsample convW
}

type mimiLayer struct {
	norm1, norm2     norm
	q, k, v, o       backend.Tensor // [m, m]
	linear1, linear2 backend.Tensor
	scale1, scale2   backend.Tensor // [1, m]
	qkv              []backend.Tensor
}

// convW is a convolution's weights: w [Cout', Cin·K] (Im2Col1D's column order), b [1, Cout] or nil.
type convW struct {
	w, b                 backend.Tensor
	cin, cout, k, stride int
	tr                   int // transposed: the stride it upsamples by (w is the kernel-2 form), else 0
}

type resW struct{ c1, c2 convW }

type decStageW struct {
	up  convW
	res resW
}

type encStageW struct {
	res  resW
	down convW
}

func (l *loader) conv(c Conv) convW {
	if l.err != nil {
		return convW{}
	}
	out, in, k := c.W.Shape[0], c.W.Shape[1], c.W.Shape[2]
	if k < c.Stride {
		l.err = fmt.Errorf("pockettts: %s: kernel %d is shorter than the stride %d", c.W.Name, k, c.Stride)
		return convW{}
	}
	return convW{w: l.whole(c.W, in*k), b: l.row(c.B, 0), cin: in, cout: out, k: k, stride: c.Stride}
}

// convTr lays out a ConvTranspose1d's weight W [Cin, Cout, 2r] as the kernel-2 convolution
// W2 [r·Cout, 2·Cin] whose output row t holds output steps t·r .. t·r+r-1:
// W2[k·Cout+o, c·2+j] = W[c, o, k + r·(1-j)] (j = 0 reads input row t-1, j = 1 row t).
func (l *loader) convTr(c ConvTr) convW {
	if l.err != nil {
		return convW{}
	}
	in, out, k := c.W.Shape[0], c.W.Shape[1], c.W.Shape[2]
	r := c.Stride
	if k != 2*r {
		l.err = fmt.Errorf("pockettts: %s: a transposed convolution of kernel %d and stride %d (only kernel 2·stride is streamed)", c.W.Name, k, r)
		return convW{}
	}
	w := c.W.Float32s()
	l.m.copied(c.W)
	w2 := make([]float32, r*out*2*in)
	for kk := range r {
		for o := range out {
			row := w2[(kk*out+o)*2*in:]
			for ci := range in {
				row[ci*2] = w[(ci*out+o)*k+kk+r]
				row[ci*2+1] = w[(ci*out+o)*k+kk]
			}
		}
	}
	return convW{w: l.f32(w2, r*out, 2*in), b: l.row(c.B, 0), cin: in, cout: out, k: 2, stride: 1, tr: r}
}

func (l *loader) mimiLayers(ls []MimiLayer, m int) []mimiLayer {
	var out []mimiLayer
	for _, ly := range ls {
		out = append(out, mimiLayer{
			norm1: l.norm(ly.Norm1), norm2: l.norm(ly.Norm2),
			q: l.matrix(ly.InProj, 0, m, m), k: l.matrix(ly.InProj, m, m, m), v: l.matrix(ly.InProj, 2*m, m, m),
			o: l.whole(ly.OutProj, m), linear1: l.whole(ly.Linear1, m), linear2: l.whole(ly.Linear2, ly.Linear2.Shape[1]),
			scale1: l.row(ly.Scale1, 0), scale2: l.row(ly.Scale2, 0),
		})
		L := &out[len(out)-1]
		L.qkv = []backend.Tensor{L.q, L.k, L.v}
	}
	return out
}

func (m *Model) loadMimi(l *loader, w *Weights) error {
	c := &m.cfg
	mw := &m.mimi
	mm := &w.Mimi
	mw.embStd = l.row(w.EmbStd, 0)
	mw.embMean = l.row(w.EmbMean, 0)
	mw.quantizer = l.whole(mm.QuantizerProj, c.LatentDim)
	// Depthwise upsampling W [m, 1, 2s]: tap k of channel c multiplies the frame's row, tap s+k
	// the previous frame's, into output step k.
	s := c.UpsampleStride
	uw := mm.Upsample.W.Float32s()
	m.copied(mm.Upsample.W)
	lo, hi := make([]float32, s*c.MimiDim), make([]float32, s*c.MimiDim)
	for ch := range c.MimiDim {
		for k := range s {
			lo[k*c.MimiDim+ch] = uw[ch*2*s+k]
			hi[k*c.MimiDim+ch] = uw[ch*2*s+s+k]
		}
	}
	mw.upLo, mw.upHi = l.f32(lo, s, c.MimiDim), l.f32(hi, s, c.MimiDim)
	mw.decLayers = l.mimiLayers(mm.DecoderLayers, c.MimiDim)
	mw.decIn = l.conv(mm.DecoderIn)
	for _, st := range mm.Decoder {
		mw.dec = append(mw.dec, decStageW{up: l.convTr(st.Up), res: resW{l.conv(st.Res.Conv1), l.conv(st.Res.Conv2)}})
	}
	mw.decOut = l.conv(mm.DecoderOut)
	return l.err
}

// alloc makes the F32 tensors of a runner, closed with it.
type allocs struct {
	be    backend.Backend
	owned []backend.Tensor
	err   error
}

func (a *allocs) keep(t backend.Tensor) backend.Tensor {
	a.owned = append(a.owned, t)
	return t
}

func (a *allocs) f32(rows, cols int) backend.Tensor {
	if a.err != nil {
		return nil
	}
	t, err := a.be.Alloc(tensor.F32, rows, cols)
	if err != nil {
		a.err = err
		return nil
	}
	return a.keep(t)
}

func (a *allocs) view(t backend.Tensor, row0, rows int) backend.Tensor {
	if a.err != nil {
		return nil
	}
	v, err := a.be.View(t, row0, rows)
	if err != nil {
		a.err = err
		return nil
	}
	return a.keep(v)
}

func (a *allocs) reshape(t backend.Tensor, rows, cols int) backend.Tensor {
	if a.err != nil {
		return nil
	}
	v, err := a.be.Reshape(t, rows, cols)
	if err != nil {
		a.err = err
		return nil
	}
	return a.keep(v)
}

func (a *allocs) close() error {
	var errs []error
	for i := len(a.owned) - 1; i >= 0; i-- {
		errs = append(errs, a.owned[i].Close())
	}
	a.owned = nil
	return errors.Join(errs...)
}

// sconv is a causal convolution run over spans of t input rows of up to P signals at once (a
// step's positions), keeping the last keep = K-stride input rows of each slot between calls.
// Position i's span goes into ins[i] (rows keep.. of its segment of buf); run convolves the
// spans of n positions with one matrix product and leaves position i's output in outs[i]
// ([t/stride, Cout]; [t·r, Cout] for a transposed convolution), all n contiguous in outN[n].
// in and out are position 0's, for one signal.
type sconv struct {
	w       convW
	t, keep int
	ins     []backend.Tensor // by position: its span's rows of buf
	segs    []backend.Tensor // by position: its kept rows and span, [keep+t, Cin]
	heads   []backend.Tensor // by position: its kept rows
	tails   []backend.Tensor // by position: its span's last keep rows
	inN     []backend.Tensor // by count, when keep is 0: the spans of n positions, contiguous
	cols    []backend.Tensor // by position: [t/stride, Cin·K]; nil for a kernel of 1
	colsN   []backend.Tensor // by count
	prodN   []backend.Tensor // by count: [n·t/stride, Cout']
	outN    []backend.Tensor // by count: prodN, or its [n·t·r, Cout] rows for a transposed convolution
	outs    []backend.Tensor // by position
	in, out backend.Tensor
	state   []backend.Tensor // by slot
	one     []int            // run1's slot list
}

func newSConv(a *allocs, w convW, t, slots int) *sconv {
	c := &sconv{w: w, t: t, keep: w.k - w.stride, one: make([]int, 1)}
	if a.err != nil {
		return c
	}
	if t%w.stride != 0 {
		a.err = fmt.Errorf("pockettts: a span of %d steps for a convolution of stride %d", t, w.stride)
		return c
	}
	tOut := t / w.stride
	seg := c.keep + t
	buf := a.f32(slots*seg, w.cin)
	if c.keep > 0 {
		st := a.f32(slots*c.keep, w.cin)
		for s := range slots {
			c.state = append(c.state, a.view(st, s*c.keep, c.keep))
		}
	}
	outCols, outRows := w.cout, tOut
	if w.tr > 0 {
		outCols, outRows = w.tr*w.cout, tOut*w.tr
	}
	var cols backend.Tensor
	if w.k > 1 {
		cols = a.f32(slots*tOut, w.cin*w.k)
	}
	prod := a.f32(slots*tOut, outCols)
	out := prod
	if w.tr > 0 {
		out = a.reshape(prod, slots*outRows, w.cout)
	}
	c.inN, c.colsN, c.prodN, c.outN = make([]backend.Tensor, slots+1), make([]backend.Tensor, slots+1), make([]backend.Tensor, slots+1), make([]backend.Tensor, slots+1)
	for i := range slots {
		c.segs = append(c.segs, a.view(buf, i*seg, seg))
		c.ins = append(c.ins, a.view(buf, i*seg+c.keep, t))
		if c.keep > 0 {
			c.heads = append(c.heads, a.view(buf, i*seg, c.keep))
			c.tails = append(c.tails, a.view(buf, i*seg+t, c.keep))
		}
		if cols != nil {
			c.cols = append(c.cols, a.view(cols, i*tOut, tOut))
		}
		c.outs = append(c.outs, a.view(out, i*outRows, outRows))
		n := i + 1
		if c.keep == 0 {
			c.inN[n] = a.view(buf, 0, n*t)
		}
		if cols != nil {
			c.colsN[n] = a.view(cols, 0, n*tOut)
		}
		c.prodN[n] = a.view(prod, 0, n*tOut)
		c.outN[n] = a.view(out, 0, n*outRows)
	}
	if a.err == nil {
		c.in, c.out = c.ins[0], c.outs[0]
	}
	return c
}

// fill writes the spans of n positions: ELU (or, without elu, a copy) of x, whose rows xs[i] are
// position i's and xN all n positions' (contiguous).
func (c *sconv) fill(be backend.Backend, n int, xN backend.Tensor, xs []backend.Tensor, elu bool) error {
	if c.keep == 0 {
		if elu {
			return be.Unary(c.inN[n], xN, tensor.ELU)
		}
		return be.Copy(c.inN[n], xN)
	}
	for i := range n {
		var err error
		if elu {
			err = be.Unary(c.ins[i], xs[i], tensor.ELU)
		} else {
			err = be.Copy(c.ins[i], xs[i])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// run convolves, for each position i, slot slots[i]'s kept rows and the span in ins[i] into
// outs[i], and keeps the span's last rows. With first, the kept rows are instead replicas of the
// span's first row (replicate padding).
func (c *sconv) run(be backend.Backend, slots []int, first bool) error {
	n := len(slots)
	o := &ops{be: be}
	for i, s := range slots {
		if c.keep > 0 {
			if first {
				if c.keep > len(replicaIDs) {
					return fmt.Errorf("pockettts: replicate padding of %d rows", c.keep)
				}
				o.do(be.GetRows(c.heads[i], c.ins[i], replicaIDs[:c.keep]))
			} else {
				o.do(be.Copy(c.heads[i], c.state[s]))
			}
		}
		if c.cols != nil {
			o.do(be.Im2Col1D(c.cols[i], c.segs[i], c.w.k, c.w.stride, 0))
		}
	}
	if c.cols != nil {
		o.do(be.MatMul(c.prodN[n], c.colsN[n], c.w.w))
	} else {
		o.do(be.MatMul(c.prodN[n], c.inN[n], c.w.w))
	}
	if c.w.b != nil {
		o.do(be.AddRows(c.outN[n], c.outN[n], c.w.b))
	}
	if c.keep > 0 {
		for i, s := range slots {
			o.do(be.Copy(c.state[s], c.tails[i]))
		}
	}
	return o.err
}

// run1 is run for one signal, in position 0.
func (c *sconv) run1(be backend.Backend, slot int, first bool) error {
	c.one[0] = slot
	return c.run(be, c.one, first)
}

// replicaIDs are the row ids of replicate padding: the first row, repeated.
var replicaIDs [64]int32

// reset zeroes slot's kept rows.
func (c *sconv) reset(be backend.Backend, slot int, zeros []float32) error {
	if c.keep == 0 {
		return nil
	}
	return be.Write(c.state[slot], 0, zeros[:c.keep*c.w.cin])
}

// res is SEANet's residual unit over spans of t rows: x += c2(ELU(c1(ELU(x)))).
type res struct{ c1, c2 *sconv }

func newRes(a *allocs, w resW, t, slots int) res {
	return res{newSConv(a, w.c1, t, slots), newSConv(a, w.c2, t, slots)}
}

// run runs the unit over the spans of len(slots) positions, x's rows xs[i] position i's and xN
// all of them, in place.
func (r res) run(be backend.Backend, slots []int, xN backend.Tensor, xs []backend.Tensor) error {
	n := len(slots)
	o := &ops{be: be}
	o.do(r.c1.fill(be, n, xN, xs, true))
	if o.err == nil {
		o.do(r.c1.run(be, slots, false))
	}
	o.do(r.c2.fill(be, n, r.c1.outN[n], r.c1.outs, true))
	if o.err == nil {
		o.do(r.c2.run(be, slots, false))
	}
	o.do(be.AddRows(xN, xN, r.c2.outN[n]))
	return o.err
}

// mimiTransformer runs a Mimi transformer over spans of t steps of up to slots signals at once,
// each signal's keys and values in a ring of t+MimiContext cache slots of its own.
type mimiTransformer struct {
	m       *Model
	layers  []mimiLayer
	t       int
	ring    int
	window  int
	kv      backend.KV
	attn    backend.Attn
	rope    backend.RoPE
	scratch []backend.Tensor // x, h, q, k, v, att [slots·t, m]; ff [slots·t, ff]
	views   [][7]backend.Tensor
	qkv     [][]backend.Tensor // by slot count: views q, k, v
	pos     []int              // per slot: the next step's position
	tables  []int32
	batch   backend.Batch
}

func newMimiTransformer(a *allocs, m *Model, layers []mimiLayer, t, slots int) (*mimiTransformer, error) {
	c := &m.cfg
	hd := c.MimiDim / c.MimiHeads
	mt := &mimiTransformer{m: m, layers: layers, t: t, window: c.MimiContext, ring: c.MimiContext + t,
		attn:   backend.Attn{NHead: c.MimiHeads, NKVHead: c.MimiHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))},
		rope:   backend.RoPE{Mode: backend.RoPENormal, HeadDim: hd, Dims: hd, Base: float32(c.RoPEBase), FreqScale: 1},
		pos:    make([]int, slots),
		tables: make([]int32, slots*t*c.MimiContext),
	}
	var err error
	mt.kv, err = m.be.NewKV(backend.KVConfig{Layers: len(layers), Slots: slots * mt.ring, Width: c.MimiDim, BlockSize: 1, DType: tensor.F32})
	if err != nil {
		return nil, err
	}
	rows := slots * t
	for i := range 7 {
		cols := c.MimiDim
		if i == 6 {
			cols = c.MimiFFDim
		}
		mt.scratch = append(mt.scratch, a.f32(rows, cols))
	}
	mt.views = make([][7]backend.Tensor, slots+1)
	mt.qkv = make([][]backend.Tensor, slots+1)
	for n := 1; n <= slots; n++ {
		for i, s := range mt.scratch {
			mt.views[n][i] = a.view(s, 0, n*t)
		}
		mt.qkv[n] = []backend.Tensor{mt.views[n][2], mt.views[n][3], mt.views[n][4]}
	}
	mt.batch.Pos = make([]int32, 0, rows)
	mt.batch.Slot = make([]int32, 0, rows)
	mt.batch.Seqs = make([]backend.Seq, 0, rows)
	return mt, a.err
}

func (mt *mimiTransformer) close() error {
	if mt == nil || mt.kv == nil {
		return nil
	}
	err := mt.kv.Close()
	mt.kv = nil
	return err
}

// input is the transformer's input and output rows for n slots: [n·t, m].
func (mt *mimiTransformer) input(n int) backend.Tensor { return mt.views[n][0] }

// step runs the layers over input(len(slots)): the next t steps of each slot's signal, slot by
// slot, in place.
func (mt *mimiTransformer) step(slots []int, stage string) error {
	n := len(slots)
	b := &mt.batch
	b.Pos, b.Slot, b.Seqs = b.Pos[:0], b.Slot[:0], b.Seqs[:0]
	w := mt.window
	for i, s := range slots {
		base := int32(s * mt.ring)
		for j := range mt.t {
			p := mt.pos[s] + j
			r := i*mt.t + j
			b.Pos = append(b.Pos, int32(p))
			b.Slot = append(b.Slot, base+int32(p%mt.ring))
			ctx := min(p+1, w)
			tab := mt.tables[r*w : r*w+ctx]
			for q := range tab {
				tab[q] = base + int32((p-ctx+1+q)%mt.ring)
			}
			b.Seqs = append(b.Seqs, backend.Seq{Start: r, Count: 1, CtxLen: ctx, Blocks: tab})
		}
	}
	vs := &mt.views[n]
	x, h, q, k, v, att, ff := vs[0], vs[1], vs[2], vs[3], vs[4], vs[5], vs[6]
	be := mt.m.be
	heads := mt.m.cfg.MimiHeads
	o := &ops{be: be}
	for li := range mt.layers {
		L := &mt.layers[li]
		o.do(be.LayerNorm(h, x, L.norm1.w, L.norm1.b, lmEps))
		o.do(backend.MatMuls(be, mt.qkv[n], h, L.qkv))
		o.do(be.Rope(q, heads, mt.rope, b))
		o.do(be.Rope(k, heads, mt.rope, b))
		o.do(be.StoreKV(mt.kv, li, k, v, b))
		o.do(be.Attention(att, q, mt.kv, li, mt.attn, b))
		o.do(be.MatMul(h, att, L.o))
		o.do(be.Mul(h, h, L.scale1))
		o.do(be.AddRows(x, x, h))
		o.do(be.LayerNorm(h, x, L.norm2.w, L.norm2.b, lmEps))
		o.do(be.MatMul(ff, h, L.linear1))
		o.do(be.Unary(ff, ff, tensor.GELUErf))
		o.do(be.MatMul(h, ff, L.linear2))
		o.do(be.Mul(h, h, L.scale2))
		o.do(be.AddRows(x, x, h))
	}
	if o.err != nil {
		return fmt.Errorf("pockettts: Mimi transformer: %w", o.err)
	}
	for _, s := range slots {
		mt.pos[s] += mt.t
	}
	return mt.m.trace(stage, x)
}

// Decoder is the streaming Mimi decoder for up to a number of syntheses at once, each in a slot
// of its own: every latent frame becomes FrameSamples samples at once, final when returned. One
// goroutine uses a Decoder at a time.
type Decoder struct {
	m     *Model
	slots int
	a     *allocs
	tr    *mimiTransformer

	lat, z, q backend.Tensor   // [slots, latent], [slots, latent], [slots, m]
	latN, zN  []backend.Tensor // by row count
	qN        []backend.Tensor
	qRow      []backend.Tensor // row i of q
	qPrev     []backend.Tensor // per slot: the previous frame's quantizer row [1, m]
	upA, upB  backend.Tensor   // [stride, m]
	xRow      []backend.Tensor // rows i·stride.. of the transformer's input
	in        *sconv
	stages    []decStage
	out       *sconv
	zeros     []float32
}

type decStage struct {
	up  *sconv
	res res
}

// NewDecoder makes a decoder of slots slots, each reset.
func (m *Model) NewDecoder(slots int) (*Decoder, error) {
	c := &m.cfg
	if slots <= 0 || slots > 1<<16 {
		return nil, fmt.Errorf("pockettts: a decoder of %d slots", slots)
	}
	a := &allocs{be: m.be}
	d := &Decoder{m: m, slots: slots, a: a}
	t := c.UpsampleStride
	var err error
	if d.tr, err = newMimiTransformer(a, m, m.mimi.decLayers, t, slots); err != nil {
		d.Close()
		return nil, fmt.Errorf("pockettts: decoder: %w", err)
	}
	d.lat, d.z, d.q = a.f32(slots, c.LatentDim), a.f32(slots, c.LatentDim), a.f32(slots, c.MimiDim)
	qp := a.f32(slots, c.MimiDim)
	d.latN, d.zN, d.qN = make([]backend.Tensor, slots+1), make([]backend.Tensor, slots+1), make([]backend.Tensor, slots+1)
	for n := 1; n <= slots; n++ {
		d.latN[n], d.zN[n], d.qN[n] = a.view(d.lat, 0, n), a.view(d.z, 0, n), a.view(d.q, 0, n)
	}
	x := d.tr.input(slots)
	for i := range slots {
		d.qRow = append(d.qRow, a.view(d.q, i, 1))
		d.qPrev = append(d.qPrev, a.view(qp, i, 1))
		d.xRow = append(d.xRow, a.view(x, i*t, t))
	}
	d.upA, d.upB = a.f32(t, c.MimiDim), a.f32(t, c.MimiDim)
	d.in = newSConv(a, m.mimi.decIn, t, slots)
	span := t
	for _, st := range m.mimi.dec {
		up := newSConv(a, st.up, span, slots)
		span *= st.up.tr
		d.stages = append(d.stages, decStage{up: up, res: newRes(a, st.res, span, slots)})
	}
	d.out = newSConv(a, m.mimi.decOut, span, slots)
	if a.err == nil && span != c.FrameSamples() {
		a.err = fmt.Errorf("pockettts: the decoder makes %d samples a frame, the configuration %d", span, c.FrameSamples())
	}
	if a.err != nil {
		d.Close()
		return nil, fmt.Errorf("pockettts: decoder: %w", a.err)
	}
	zeros := c.MimiDim
	for _, sc := range d.convs() {
		zeros = max(zeros, sc.keep*sc.w.cin)
	}
	d.zeros = make([]float32, zeros)
	for s := range slots {
		if err := d.Reset(s); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
}

// convs lists the decoder's convolutions.
func (d *Decoder) convs() []*sconv {
	cs := []*sconv{d.in, d.out}
	for _, st := range d.stages {
		cs = append(cs, st.up, st.res.c1, st.res.c2)
	}
	return cs
}

// Slots is the number of syntheses the decoder holds.
func (d *Decoder) Slots() int { return d.slots }

// Close releases the decoder's state and scratch.
func (d *Decoder) Close() error {
	return errors.Join(d.tr.close(), d.a.close())
}

// Reset starts a new signal in slot: upstream's fresh decoder state (zeros, position 0).
func (d *Decoder) Reset(slot int) error {
	if slot < 0 || slot >= d.slots {
		return fmt.Errorf("pockettts: decoder slot %d outside its %d", slot, d.slots)
	}
	be := d.m.be
	errs := []error{be.Write(d.qPrev[slot], 0, d.zeros[:d.m.cfg.MimiDim])}
	for _, sc := range d.convs() {
		errs = append(errs, sc.reset(be, slot, d.zeros))
	}
	d.tr.pos[slot] = 0
	return errors.Join(errs...)
}

// Step decodes one latent frame of each slot: latents[i*L:(i+1)*L] (normalised, as the FlowLM
// emits them) of slots[i], into audio[i*F:(i+1)*F] (F = FrameSamples, 24 kHz, unclamped).
func (d *Decoder) Step(slots []int, latents, audio []float32) error {
	c := &d.m.cfg
	n, L, F := len(slots), c.LatentDim, c.FrameSamples()
	if n == 0 {
		return nil
	}
	if n > d.slots || len(latents) != n*L || len(audio) != n*F {
		return fmt.Errorf("pockettts: decoder step of %d slots with %d latent values and room for %d samples", n, len(latents), len(audio))
	}
	for i, s := range slots {
		if s < 0 || s >= d.slots {
			return fmt.Errorf("pockettts: decoder slot %d outside its %d", s, d.slots)
		}
		for _, e := range slots[:i] {
			if e == s {
				return fmt.Errorf("pockettts: decoder slot %d twice in one step", s)
			}
		}
	}
	be, m := d.m.be, d.m
	mw := &m.mimi
	o := &ops{be: be}
	o.do(be.Write(d.latN[n], 0, latents))
	o.do(be.Mul(d.zN[n], d.latN[n], mw.embStd))
	o.do(be.AddRows(d.zN[n], d.zN[n], mw.embMean))
	if o.err == nil {
		o.do(m.trace("mimi_in", d.zN[n]))
	}
	o.do(be.MatMul(d.qN[n], d.zN[n], mw.quantizer))
	if o.err == nil {
		o.do(m.trace("quantizer", d.qN[n]))
	}
	// Depthwise upsampling: output step k = W[k]·q + W[stride+k]·q_prev.
	for i, s := range slots {
		o.do(be.Mul(d.upA, mw.upLo, d.qRow[i]))
		o.do(be.Mul(d.upB, mw.upHi, d.qPrev[s]))
		o.do(be.AddRows(d.xRow[i], d.upA, d.upB))
		o.do(be.Copy(d.qPrev[s], d.qRow[i]))
	}
	if o.err == nil {
		o.do(m.trace("upsample", d.tr.input(n)))
	}
	if o.err == nil {
		o.do(d.tr.step(slots, "dec_transformer"))
	}
	// SEANet: each convolution's matrix product, and the elementwise work where the rows are
	// contiguous, over every position at once; the kept rows slot by slot.
	if o.err == nil {
		o.do(d.in.fill(be, n, d.tr.input(n), d.xRow, false))
	}
	if o.err == nil {
		o.do(d.in.run(be, slots, false))
	}
	cv := d.in
	for _, st := range d.stages {
		if o.err == nil {
			o.do(st.up.fill(be, n, cv.outN[n], cv.outs, true))
		}
		if o.err == nil {
			o.do(st.up.run(be, slots, false))
		}
		cv = st.up
		if o.err == nil {
			o.do(st.res.run(be, slots, cv.outN[n], cv.outs))
		}
	}
	if o.err == nil {
		o.do(d.out.fill(be, n, cv.outN[n], cv.outs, true))
	}
	if o.err == nil {
		o.do(d.out.run(be, slots, false))
	}
	if o.err == nil {
		o.do(m.trace("audio", d.out.outN[n]))
	}
	o.do(be.Read(d.out.outN[n], 0, audio[:n*F]))
	if o.err != nil {
		return fmt.Errorf("pockettts: decoder: %w", o.err)
	}
	return nil
}

// encoderFrames is the span of the voice encoder: latent frames a call encodes.
const encoderFrames = 4

// VoicePrompt encodes a voice prompt (mono audio at SampleRate, in [-1, 1]) with the Mimi
// encoder into the rows of the FlowLM's voice prompt [P, d]: the model's BOS vector (where it
// has one), then the speaker projection of each 80 ms of audio (the audio is zero-padded to whole
// frames, as upstream pads it). The encoder runs over spans of encoderFrames frames, its state
// carried from one to the next as in the decoder: all of it is causal.
func (m *Model) VoicePrompt(audio []float32) ([]float32, error) {
	c := &m.cfg
	if !c.Encoder {
		return nil, fmt.Errorf("pockettts: the checkpoint has no Mimi encoder (voice cloning)")
	}
	if len(audio) == 0 {
		return nil, fmt.Errorf("pockettts: an empty voice prompt")
	}
	if err := m.loadClone(); err != nil {
		return nil, err
	}
	defer m.releaseClone()
	F := c.FrameSamples()
	frames := (len(audio) + F - 1) / F
	span := encoderFrames * F
	a := &allocs{be: m.be}
	defer a.close()
	mw := &m.mimi
	in := newSConv(a, mw.encIn, span, 1)
	t := span
	var stages []struct {
		res  res
		down *sconv
	}
	for _, st := range mw.enc {
		r := newRes(a, st.res, t, 1)
		down := newSConv(a, st.down, t, 1)
		t /= st.down.stride
		stages = append(stages, struct {
			res  res
			down *sconv
		}{r, down})
	}
	out := newSConv(a, mw.encOut, t, 1)
	tr, err := newMimiTransformer(a, m, mw.encLayers, t, 1)
	if err != nil {
		return nil, fmt.Errorf("pockettts: voice encoder: %w", err)
	}
	defer tr.close()
	down := newSConv(a, mw.downsample, t, 1)
	cond := a.f32(encoderFrames, c.Dim)
	if a.err != nil {
		return nil, fmt.Errorf("pockettts: voice encoder: %w", a.err)
	}
	d := c.Dim
	prompt := make([]float32, 0, (frames+1)*d)
	prompt = append(prompt, m.bosVoice...)
	be := m.be
	chunk := make([]float32, span)
	slot0 := []int{0}
	rows := make([]float32, encoderFrames*d)
	for f0 := 0; f0 < frames; f0 += encoderFrames {
		clear(chunk[copy(chunk, audio[min(f0*F, len(audio)):]):])
		o := &ops{be: be}
		o.do(be.Write(in.in, 0, chunk))
		if o.err == nil {
			o.do(in.run1(be, 0, false))
		}
		prev := in
		for _, st := range stages {
			if o.err == nil {
				o.do(st.res.run(be, slot0, prev.outN[1], prev.outs))
			}
			o.do(be.Unary(st.down.in, prev.out, tensor.ELU))
			if o.err == nil {
				o.do(st.down.run1(be, 0, false))
			}
			prev = st.down
		}
		x := prev.out
		o.do(be.Unary(out.in, x, tensor.ELU))
		if o.err == nil {
			o.do(out.run1(be, 0, false))
		}
		if o.err == nil {
			o.do(m.trace("enc_seanet", out.out))
		}
		o.do(be.Copy(tr.input(1), out.out))
		if o.err == nil {
			o.do(tr.step([]int{0}, "enc_transformer"))
		}
		o.do(be.Copy(down.in, tr.input(1)))
		if o.err == nil {
			o.do(down.run1(be, 0, f0 == 0))
		}
		if o.err == nil {
			o.do(m.trace("latent", down.out))
		}
		o.do(be.MatMul(cond, down.out, m.speakerProj))
		if o.err == nil {
			o.do(m.trace("conditioning", cond))
		}
		o.do(be.Read(cond, 0, rows))
		if o.err != nil {
			return nil, fmt.Errorf("pockettts: voice encoder: %w", o.err)
		}
		prompt = append(prompt, rows[:min(encoderFrames, frames-f0)*d]...)
	}
	return prompt, nil
}

// CloneVoice makes the voice state of a voice prompt (mono audio at SampleRate): the Mimi
// encoder, the speaker projection and the FlowLM's pass over the prompt.
func (f *FlowLM) CloneVoice(audio []float32) (*Voice, error) {
	prompt, err := f.m.VoicePrompt(audio)
	if err != nil {
		return nil, err
	}
	return f.Voice(prompt)
}
