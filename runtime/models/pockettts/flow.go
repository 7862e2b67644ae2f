package pockettts

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The flow head: SimpleMLPAdaLN (modules/mlp.py:20-200 at kyutai-labs/pocket-tts 9514983) and
// LSD decoding (models/flow_lm.py:19). From the backbone's output h and a start x0 (noise of
// variance temp), n LSD steps (1 upstream) give the latent: for i < n, s = i/n, t = (i+1)/n,
// x += v(h, s, t, x)/n, where
//
//	y = (te0(s) + te1(t))/2 + cond_embed(h)
//	z = input_proj(x)
//	per block:  shift, scale, gate = adaLN(SiLU(y));  u = LN(z)·(1+scale) + shift
//	            z += gate · mlp2(SiLU(mlp0(u)))
//	final:      shift, scale = adaLN(SiLU(y));  v = out(LN₀(z)·(1+scale) + shift)
//
// with LN's eps 1e-6 (the blocks' affine, the final one not). The time embeddings do not depend
// on h or x: they are computed once, on the host, for the step count.

// flowLNEps is the flow head's LayerNorm epsilon.
const flowLNEps = 1e-6

// flowWeights are the flow head's weights on the backend. The AdaLN projections are split into
// their chunks (rows of the checkpoint's matrix); the scales' biases hold 1+b, so that the
// projection gives 1+scale directly.
type flowWeights struct {
	cond, input linear
	blocks      []flowBlock
	finalShift  linear
	finalScale  linear
	final       []backend.Tensor // finalShift.w, finalScale.w: one MatMuls
	out         linear
	ones, zeros backend.Tensor // [1, w]: the final LayerNorm's (it has no affine)
	time        [2]TimeEmbed   // the checkpoint's, read when a FlowLM computes its time rows
}

type flowBlock struct {
	ln                 norm
	mlp0, mlp2         linear
	shift, scale, gate linear
	ada                []backend.Tensor // shift.w, scale.w, gate.w: one MatMuls
}

// timeEmbed is one time condition on the host (float64), to compute the constant rows.
type timeEmbed struct {
	freqs      []float64 // [freqs]
	w0         []float32 // [w, 2·freqs], widened to float64 as it is read
	b0         []float64 // [w]
	w2         []float32 // [w, w], as w0
	b2         []float64 // [w]
	alpha      []float64 // [w]
	width, nfq int
}

func f64s(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// at is the embedding of time t: [cos(t·f), sin(t·f)] → Linear → SiLU → Linear → the RMS norm
// upstream's time embedding ends with, x·alpha/sqrt(eps + var(x)) with the unbiased variance
// (eps 1e-5; x not centred).
func (te *timeEmbed) at(t float64) []float64 {
	e := make([]float64, 2*te.nfq)
	for i, f := range te.freqs {
		a := float64(float32(t) * float32(f)) // upstream multiplies in float32
		e[i], e[te.nfq+i] = math.Cos(a), math.Sin(a)
	}
	lin := func(w []float32, b, x []float64, rows int) []float64 {
		y := make([]float64, rows)
		for r := range y {
			s := b[r]
			for c, v := range x {
				s += float64(w[r*len(x)+c]) * v
			}
			y[r] = s
		}
		return y
	}
	h := lin(te.w0, te.b0, e, te.width)
	for i, v := range h {
		h[i] = v / (1 + math.Exp(-v))
	}
	y := lin(te.w2, te.b2, h, te.width)
	mean := 0.0
	for _, v := range y {
		mean += v
	}
	mean /= float64(len(y))
	vr := 0.0
	for _, v := range y {
		vr += (v - mean) * (v - mean)
	}
	vr /= float64(len(y) - 1)
	r := 1 / math.Sqrt(1e-5+vr)
	for i := range y {
		y[i] *= te.alpha[i] * r
	}
	return y
}

// hostTimeEmbed reads te (its weights widened to float64; width w, nfq frequencies).
func hostTimeEmbed(te *TimeEmbed, w, nfq int) timeEmbed {
	return timeEmbed{freqs: f64s(te.Freqs.Float32s()), w0: te.MLP0.W.Float32s(), b0: f64s(te.MLP0.B.Float32s()),
		w2: te.MLP2.W.Float32s(), b2: f64s(te.MLP2.B.Float32s()), alpha: f64s(te.Alpha.Float32s()),
		width: w, nfq: nfq}
}

// timeRows returns, for n LSD steps, each step's (te0(i/n) + te1((i+1)/n))/2. The time
// embedding's weights are read from the checkpoint for the call (a FlowLM computes its rows once)
// rather than kept, and their file pages given back.
func (m *Model) timeRows(n int) [][]float32 {
	fw := &m.flow
	var te [2]timeEmbed
	for i := range te {
		te[i] = hostTimeEmbed(&fw.time[i], m.cfg.FlowDim, m.cfg.FlowFreqs)
		m.copied(fw.time[i].MLP0.W)
		m.copied(fw.time[i].MLP2.W)
	}
	rows := make([][]float32, n)
	for i := range rows {
		a, b := te[0].at(float64(i)/float64(n)), te[1].at(float64(i+1)/float64(n))
		rows[i] = make([]float32, len(a))
		for j := range a {
			rows[i][j] = float32((a[j] + b[j]) / 2)
		}
	}
	return rows
}

func (m *Model) loadFlow(l *loader, f *FlowHead) error {
	fw := &m.flow
	w := m.cfg.FlowDim
	fw.time = f.TimeEmbed
	fw.cond = l.linear(f.CondEmbed)
	fw.input = l.linear(f.InputProj)
	for _, rb := range f.ResBlocks {
		fw.blocks = append(fw.blocks, flowBlock{
			ln: l.norm(rb.InLN), mlp0: l.linear(rb.MLP0), mlp2: l.linear(rb.MLP2),
			shift: linear{l.matrix(rb.AdaLN.W, 0, w, w), l.rowPart(rb.AdaLN.B, 0, w, 0)},
			scale: linear{l.matrix(rb.AdaLN.W, w, w, w), l.rowPart(rb.AdaLN.B, w, w, 1)},
			gate:  linear{l.matrix(rb.AdaLN.W, 2*w, w, w), l.rowPart(rb.AdaLN.B, 2*w, w, 0)},
		})
	}
	fw.finalShift = linear{l.matrix(f.FinalAdaLN.W, 0, w, w), l.rowPart(f.FinalAdaLN.B, 0, w, 0)}
	fw.finalScale = linear{l.matrix(f.FinalAdaLN.W, w, w, w), l.rowPart(f.FinalAdaLN.B, w, w, 1)}
	fw.final = []backend.Tensor{fw.finalShift.w, fw.finalScale.w}
	for i := range fw.blocks {
		b := &fw.blocks[i]
		b.ada = []backend.Tensor{b.shift.w, b.scale.w, b.gate.w}
	}
	fw.out = l.linear(f.FinalProj)
	ones := make([]float32, w)
	for i := range ones {
		ones[i] = 1
	}
	fw.ones = l.f32(ones, 1, w)
	fw.zeros = l.f32(make([]float32, w), 1, w)
	return l.err
}

// flowScratch is the flow head's work space for up to MaxSeqs rows, and views of it by rows.
type flowScratch struct {
	x, v                          backend.Tensor // [rows, latent]: x (x0, then the latent), velocity
	c, y, sy, z, u, a, sh, sc, gt backend.Tensor // [rows, w]
	time                          []backend.Tensor
}

// flowViews are views of a flowScratch for one row count.
type flowViews struct {
	x, v                          backend.Tensor
	c, y, sy, z, u, a, sh, sc, gt backend.Tensor
	ada3, ada2                    []backend.Tensor // sh, sc, gt and sh, sc: MatMuls destinations
}

func newFlowScratch(m *Model, rows, steps int, keep func(backend.Tensor)) (*flowScratch, error) {
	fs := &flowScratch{}
	w, l := m.cfg.FlowDim, m.cfg.LatentDim
	for _, s := range []struct {
		dst  *backend.Tensor
		cols int
	}{{&fs.x, l}, {&fs.v, l}, {&fs.c, w}, {&fs.y, w}, {&fs.sy, w}, {&fs.z, w}, {&fs.u, w}, {&fs.a, w}, {&fs.sh, w}, {&fs.sc, w}, {&fs.gt, w}} {
		t, err := m.be.Alloc(tensor.F32, rows, s.cols)
		if err != nil {
			return nil, err
		}
		keep(t)
		*s.dst = t
	}
	for _, r := range m.timeRows(steps) {
		t, err := m.be.Load(tensor.F32, 1, w, f32Data(r))
		if err != nil {
			return nil, err
		}
		keep(t)
		fs.time = append(fs.time, t)
	}
	return fs, nil
}

func (fs *flowScratch) views(be backend.Backend, n int, keep func(backend.Tensor)) (*flowViews, error) {
	fv := &flowViews{}
	for _, p := range []struct {
		dst *backend.Tensor
		src backend.Tensor
	}{{&fv.x, fs.x}, {&fv.v, fs.v}, {&fv.c, fs.c}, {&fv.y, fs.y}, {&fv.sy, fs.sy}, {&fv.z, fs.z}, {&fv.u, fs.u},
		{&fv.a, fs.a}, {&fv.sh, fs.sh}, {&fv.sc, fs.sc}, {&fv.gt, fs.gt}} {
		t, err := be.View(p.src, 0, n)
		if err != nil {
			return nil, err
		}
		keep(t)
		*p.dst = t
	}
	fv.ada3, fv.ada2 = []backend.Tensor{fv.sh, fv.sc, fv.gt}, []backend.Tensor{fv.sh, fv.sc}
	return fv, nil
}

// ops is a sequence of backend calls that stops at the first error.
type ops struct {
	be  backend.Backend
	err error
}

func (o *ops) linear(dst, x backend.Tensor, l linear) {
	if o.err != nil {
		return
	}
	if o.err = o.be.MatMul(dst, x, l.w); o.err == nil && l.b != nil {
		o.err = o.be.AddRows(dst, dst, l.b)
	}
}

func (o *ops) do(err error) {
	if o.err == nil {
		o.err = err
	}
}

// flowHead runs the flow head over the rows of h [n, d]: fv.x holds x0 [n, latent] on entry and
// the latent on return.
func (m *Model) flowHead(fs *flowScratch, fv *flowViews, h backend.Tensor) error {
	fw := &m.flow
	be := m.be
	o := &ops{be: be}
	o.linear(fv.c, h, fw.cond)
	steps := len(fs.time)
	for i := range steps {
		if o.err != nil {
			break
		}
		o.do(be.AddRows(fv.y, fv.c, fs.time[i]))
		o.do(be.Unary(fv.sy, fv.y, tensor.SiLU))
		o.linear(fv.z, fv.x, fw.input)
		for _, b := range fw.blocks {
			if o.err != nil {
				break
			}
			o.do(backend.MatMuls(be, fv.ada3, fv.sy, b.ada))
			o.do(be.AddRows(fv.sh, fv.sh, b.shift.b))
			o.do(be.AddRows(fv.sc, fv.sc, b.scale.b))
			o.do(be.AddRows(fv.gt, fv.gt, b.gate.b))
			o.do(be.LayerNorm(fv.u, fv.z, b.ln.w, b.ln.b, flowLNEps))
			o.do(be.Mul(fv.u, fv.u, fv.sc))
			o.do(be.AddRows(fv.u, fv.u, fv.sh))
			o.linear(fv.a, fv.u, b.mlp0)
			o.do(be.Unary(fv.a, fv.a, tensor.SiLU))
			o.linear(fv.u, fv.a, b.mlp2)
			o.do(be.Mul(fv.u, fv.u, fv.gt))
			o.do(be.AddRows(fv.z, fv.z, fv.u))
		}
		o.do(backend.MatMuls(be, fv.ada2, fv.sy, fw.final))
		o.do(be.AddRows(fv.sh, fv.sh, fw.finalShift.b))
		o.do(be.AddRows(fv.sc, fv.sc, fw.finalScale.b))
		o.do(be.LayerNorm(fv.u, fv.z, fw.ones, fw.zeros, flowLNEps))
		o.do(be.Mul(fv.u, fv.u, fv.sc))
		o.do(be.AddRows(fv.u, fv.u, fv.sh))
		o.linear(fv.v, fv.u, fw.out)
		if steps > 1 {
			o.do(be.Scale(fv.v, fv.v, 1/float32(steps)))
		}
		o.do(be.AddRows(fv.x, fv.x, fv.v))
	}
	if o.err != nil {
		return fmt.Errorf("pockettts: flow head: %w", o.err)
	}
	return nil
}
