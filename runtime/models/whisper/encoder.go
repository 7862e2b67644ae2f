package whisper

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Cross holds one audio window's cross-attention keys and values for every decoder layer, computed
// once by the encoder and read by every decoding step and every beam of that window.
type Cross struct {
	k, v []backend.Tensor // [TextLayer] × [AudioCtx, TextState] F16
}

// NewCross allocates cross-attention storage for one window.
func (m *Model) NewCross() (*Cross, error) {
	c := &Cross{}
	for range m.TextLayer {
		for _, dst := range []*[]backend.Tensor{&c.k, &c.v} {
			t, err := m.be.Alloc(tensor.F16, m.AudioCtx, m.TextState)
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("whisper: cross-attention cache: %w", err)
			}
			*dst = append(*dst, t)
		}
	}
	return c, nil
}

// Close releases the cross-attention storage.
func (c *Cross) Close() error {
	var errs []error
	for _, t := range append(c.k, c.v...) {
		errs = append(errs, t.Close())
	}
	c.k, c.v = nil, nil
	return errors.Join(errs...)
}

// ReadCross reads window c's cross-attention keys and values as float32: every decoder layer's
// keys ([AudioCtx, TextState] each), then every layer's values. It is for inspection and tests;
// decoding never reads them back.
func (m *Model) ReadCross(c *Cross) ([]float32, error) {
	t, err := m.be.Alloc(tensor.F32, m.AudioCtx, m.TextState)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	out := make([]float32, 0, 2*len(c.k)*m.AudioCtx*m.TextState)
	for _, src := range append(append([]backend.Tensor(nil), c.k...), c.v...) {
		if err := m.be.Copy(t, src); err != nil {
			return nil, err
		}
		buf := make([]float32, m.AudioCtx*m.TextState)
		if err := m.be.Read(t, 0, buf); err != nil {
			return nil, err
		}
		out = append(out, buf...)
	}
	return out, nil
}

// Encoder runs the audio encoder over up to Windows() windows in one batched call: the matrix
// products, norms and activations run on all the windows' rows at once (weights read once per
// call), the convolutions' padding, the positional embedding and the self-attention stay per
// window. It holds scratch for its windows; one goroutine uses it at a time.
type Encoder struct {
	m    *Model
	nWin int

	// whole scratch, rows for nWin windows
	mel            backend.Tensor // [nWin·3000, mels] time-major
	col1           backend.Tensor // [nWin·3000, 3*mels]
	h1             backend.Tensor // [nWin·3000, S]
	col2           backend.Tensor // [nWin·1500, 3*S]
	x, xn, q, k, v backend.Tensor // [nWin·1500, S]
	att            backend.Tensor // [nWin·1500, S]
	ff             backend.Tensor // [nWin·1500, 4S]
	k16, v16       backend.Tensor // [nWin·1500, S] F16
	attn           backend.Attn

	win []encViews // win[i]: window i's rows
	all []encViews // all[n-1]: the rows of windows 0..n-1

	melT    []float32 // host buffer for one transposed mel window
	pn      int       // windows of the call in progress (Begin … Next), 0 when none
	pStage  int       // its stages run
	pOuts   []*Cross  // its outputs
	scratch []backend.Tensor
	views   []backend.Tensor
	one     [1][]float32
	oneOut  [1]*Cross
}

// encViews are views of the encoder's scratch over some of its windows' rows.
type encViews struct {
	mel, col1, h1, col2, x, xn, q, k, v, att, ff, k16, v16 backend.Tensor
}

// NewEncoder allocates an encoder's scratch for one window.
func (m *Model) NewEncoder() (*Encoder, error) { return m.NewBatchEncoder(1) }

// NewBatchEncoder allocates an encoder's scratch for up to windows windows per call (about 40 MB
// a window for tiny, 55 MB for base).
func (m *Model) NewBatchEncoder(windows int) (*Encoder, error) {
	if windows < 1 || windows > 64 {
		return nil, fmt.Errorf("whisper: %d encoder windows per call, want 1..64", windows)
	}
	S, n := m.AudioState, m.AudioCtx
	e := &Encoder{m: m, nWin: windows, melT: make([]float32, WindowFrames*m.Mels),
		attn: backend.Attn{NHead: m.AudioHead, NKVHead: m.AudioHead, HeadDim: S / m.AudioHead, Scale: 1 / sqrt32(float32(S/m.AudioHead))}}
	type spec struct {
		dst        *backend.Tensor
		dt         tensor.DType
		rows, cols int // per window
		view       func(v *encViews) *backend.Tensor
	}
	specs := []spec{
		{&e.mel, tensor.F32, WindowFrames, m.Mels, func(v *encViews) *backend.Tensor { return &v.mel }},
		{&e.col1, tensor.F32, WindowFrames, 3 * m.Mels, func(v *encViews) *backend.Tensor { return &v.col1 }},
		{&e.h1, tensor.F32, WindowFrames, S, func(v *encViews) *backend.Tensor { return &v.h1 }},
		{&e.col2, tensor.F32, n, 3 * S, func(v *encViews) *backend.Tensor { return &v.col2 }},
		{&e.x, tensor.F32, n, S, func(v *encViews) *backend.Tensor { return &v.x }},
		{&e.xn, tensor.F32, n, S, func(v *encViews) *backend.Tensor { return &v.xn }},
		{&e.q, tensor.F32, n, S, func(v *encViews) *backend.Tensor { return &v.q }},
		{&e.k, tensor.F32, n, S, func(v *encViews) *backend.Tensor { return &v.k }},
		{&e.v, tensor.F32, n, S, func(v *encViews) *backend.Tensor { return &v.v }},
		{&e.att, tensor.F32, n, S, func(v *encViews) *backend.Tensor { return &v.att }},
		{&e.ff, tensor.F32, n, 4 * S, func(v *encViews) *backend.Tensor { return &v.ff }},
		{&e.k16, tensor.F16, n, S, func(v *encViews) *backend.Tensor { return &v.k16 }},
		{&e.v16, tensor.F16, n, S, func(v *encViews) *backend.Tensor { return &v.v16 }},
	}
	e.win, e.all = make([]encViews, windows), make([]encViews, windows)
	for _, s := range specs {
		t, err := m.be.Alloc(s.dt, windows*s.rows, s.cols)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("whisper: encoder scratch: %w", err)
		}
		*s.dst = t
		e.scratch = append(e.scratch, t)
		for i := range windows {
			for _, w := range []struct {
				v          *encViews
				row0, rows int
			}{{&e.win[i], i * s.rows, s.rows}, {&e.all[i], 0, (i + 1) * s.rows}} {
				if windows == 1 {
					*s.view(w.v) = t
					continue
				}
				vt, err := m.be.View(t, w.row0, w.rows)
				if err != nil {
					e.Close()
					return nil, fmt.Errorf("whisper: encoder scratch: %w", err)
				}
				*s.view(w.v) = vt
				e.views = append(e.views, vt)
			}
		}
	}
	return e, nil
}

// Windows is the most windows one call encodes.
func (e *Encoder) Windows() int { return e.nWin }

// Close releases the encoder's scratch.
func (e *Encoder) Close() error {
	var errs []error
	for _, t := range append(e.views, e.scratch...) {
		errs = append(errs, t.Close())
	}
	e.scratch, e.views = nil, nil
	return errors.Join(errs...)
}

// Encode runs the encoder over one window's log-mel mel ([Mels, 3000], row = mel bin, as the
// features are computed) and stores the cross-attention keys and values of every decoder layer
// in out. When encOut is not nil it receives the encoder output [1500, S].
func (e *Encoder) Encode(mel []float32, out *Cross, encOut []float32) error {
	m := e.m
	if encOut != nil && len(encOut) != m.AudioCtx*m.AudioState {
		return fmt.Errorf("whisper: encoder output buffer holds %d values, want %d", len(encOut), m.AudioCtx*m.AudioState)
	}
	e.one[0], e.oneOut[0] = mel, out
	err := e.EncodeBatch(e.one[:], e.oneOut[:])
	e.one[0], e.oneOut[0] = nil, nil
	if err != nil || encOut == nil {
		return err
	}
	return m.be.Read(e.win[0].x, 0, encOut)
}

// EncodeBatch encodes len(mels) windows (1..Windows()) in one call: window i's log-mel mels[i]
// ([Mels, 3000]) gives the cross-attention keys and values in outs[i]. Each window's result is
// the one Encode gives it alone.
func (e *Encoder) EncodeBatch(mels [][]float32, outs []*Cross) error {
	if err := e.Begin(mels, outs); err != nil {
		return err
	}
	for {
		if done, err := e.Next(); err != nil || done {
			return err
		}
	}
}

// Stages is the number of Next calls that complete a call begun by Begin: the convolutional
// stem, each transformer block, then the output norm with the cross-attention projections.
// Each costs about as much as a block.
func (e *Encoder) Stages() int { return len(e.m.enc) + 2 }

// Begin starts encoding len(mels) windows as EncodeBatch does, stage by stage: it checks the
// arguments and loads the features, and each Next runs one stage, so that a caller can run
// other work on the same backend between stages (the scheduler steps its decoders). Until Next
// reports the call complete, the encoder keeps outs (not a copy): an entry set to nil meanwhile
// is skipped, its window computed but not stored. Begin abandons any call in progress.
func (e *Encoder) Begin(mels [][]float32, outs []*Cross) error {
	m, be := e.m, e.m.be
	e.pn, e.pOuts = 0, nil
	n := len(mels)
	if n < 1 || n > e.nWin || len(outs) != n {
		return fmt.Errorf("whisper: %d windows and %d outputs for an encoder of %d windows", n, len(outs), e.nWin)
	}
	for i, mel := range mels {
		if len(mel) != m.Mels*WindowFrames {
			return fmt.Errorf("whisper: mel window has %d values, want %d×%d", len(mel), m.Mels, WindowFrames)
		}
		if outs[i] == nil || len(outs[i].k) != m.TextLayer {
			return errors.New("whisper: Encode needs a Cross made by this model")
		}
	}
	for i, mel := range mels {
		for b := 0; b < m.Mels; b++ { // [mels, frames] → [frames, mels]
			row := mel[b*WindowFrames : (b+1)*WindowFrames]
			for t, v := range row {
				e.melT[t*m.Mels+b] = v
			}
		}
		if err := be.Write(e.mel, i*WindowFrames, e.melT); err != nil {
			return err
		}
	}
	e.pn, e.pStage, e.pOuts = n, 0, outs
	return nil
}

// Next runs the next stage of the call begun by Begin and reports whether the call is complete
// (the windows' keys and values stored). After an error, or once complete, the call is over and
// Next fails until the next Begin.
func (e *Encoder) Next() (done bool, err error) {
	m, n := e.m, e.pn
	if n == 0 {
		return false, errors.New("whisper: encoder Next without Begin")
	}
	a, win := &e.all[n-1], e.win[:n]
	st := e.pStage
	e.pStage++
	switch {
	case st == 0:
		if err = e.conv(a, win); err != nil {
			err = fmt.Errorf("whisper: encoder conv: %w", err)
		}
	case st <= len(m.enc):
		if err = e.layer(&m.enc[st-1], a, win); err != nil {
			err = fmt.Errorf("whisper: encoder layer %d: %w", st-1, err)
		}
	default:
		err, done = e.project(a), true
	}
	if err != nil || done {
		e.pn, e.pOuts = 0, nil
	}
	return done && err == nil, err
}

// project runs the output norm and every decoder layer's cross-attention projections over a.x,
// storing each window's keys and values in its entry of the call's outputs.
func (e *Encoder) project(a *encViews) error {
	m, be := e.m, e.m.be
	if err := be.LayerNorm(a.x, a.x, m.encLnW, m.encLnB, normEps); err != nil {
		return err
	}
	for li := range m.dec {
		c := &m.dec[li].cross
		if err := be.MatMul(a.k, a.x, c.k); err != nil {
			return err
		}
		if err := be.MatMul(a.v, a.x, c.v); err != nil {
			return err
		}
		if err := be.AddRows(a.v, a.v, c.vb); err != nil {
			return err
		}
		for i, out := range e.pOuts {
			if out == nil {
				continue
			}
			if err := be.Copy(out.k[li], e.win[i].k); err != nil {
				return err
			}
			if err := be.Copy(out.v[li], e.win[i].v); err != nil {
				return err
			}
		}
	}
	return nil
}

// conv runs the convolutional stem: two 3-wide convolutions (the second with stride 2), each
// followed by GELU, then adds the positional embedding. Result in a.x, [1500, S] a window.
func (e *Encoder) conv(a *encViews, win []encViews) error {
	m, be := e.m, e.m.be
	for i := range win {
		if err := be.Im2Col1D(win[i].col1, win[i].mel, 3, 1, 1); err != nil {
			return err
		}
	}
	if err := be.MatMul(a.h1, a.col1, m.conv1w); err != nil {
		return err
	}
	if err := be.AddRows(a.h1, a.h1, m.conv1b); err != nil {
		return err
	}
	if err := be.GELU(a.h1, a.h1); err != nil {
		return err
	}
	for i := range win {
		if err := be.Im2Col1D(win[i].col2, win[i].h1, 3, 2, 1); err != nil {
			return err
		}
	}
	if err := be.MatMul(a.x, a.col2, m.conv2w); err != nil {
		return err
	}
	if err := be.AddRows(a.x, a.x, m.conv2b); err != nil {
		return err
	}
	if err := be.GELU(a.x, a.x); err != nil {
		return err
	}
	for i := range win {
		if err := be.AddRows(win[i].x, win[i].x, m.encPE); err != nil {
			return err
		}
	}
	return nil
}

// layer runs one encoder block on a.x in place, attention per window:
//
//	x += Wo · attention(Wq·ln(x), Wk·ln(x), Wv·ln(x))
//	x += W2 · gelu(W0·ln(x))
func (e *Encoder) layer(l *encLayer, a *encViews, win []encViews) error {
	be := e.m.be
	w := &l.attn
	if err := be.LayerNorm(a.xn, a.x, w.lnW, w.lnB, normEps); err != nil {
		return err
	}
	if err := linear(be, a.q, a.xn, w.q, w.qb); err != nil {
		return err
	}
	if err := linear(be, a.k, a.xn, w.k, nil); err != nil {
		return err
	}
	if err := linear(be, a.v, a.xn, w.v, w.vb); err != nil {
		return err
	}
	if err := be.Copy(a.k16, a.k); err != nil {
		return err
	}
	if err := be.Copy(a.v16, a.v); err != nil {
		return err
	}
	for i := range win {
		if err := be.FullAttention(win[i].att, win[i].q, win[i].k16, win[i].v16, e.attn); err != nil {
			return err
		}
	}
	if err := linear(be, a.xn, a.att, w.o, w.ob); err != nil {
		return err
	}
	if err := be.AddRows(a.x, a.x, a.xn); err != nil {
		return err
	}
	return mlp(be, &l.mlp, a.x, a.xn, a.ff)
}

// linear: dst = x·wᵀ (+ bias).
func linear(be backend.Backend, dst, x, w, bias backend.Tensor) error {
	if err := be.MatMul(dst, x, w); err != nil {
		return err
	}
	if bias == nil {
		return nil
	}
	return be.AddRows(dst, dst, bias)
}

// mlp: x += W2 · gelu(W0·ln(x) + b0) + b2, with xn [n, d] and ff [n, 4d] as scratch.
func mlp(be backend.Backend, w *mlpW, x, xn, ff backend.Tensor) error {
	if err := be.LayerNorm(xn, x, w.lnW, w.lnB, normEps); err != nil {
		return err
	}
	if err := linear(be, ff, xn, w.w0, w.b0); err != nil {
		return err
	}
	if err := be.GELU(ff, ff); err != nil {
		return err
	}
	if err := linear(be, xn, ff, w.w2, w.b2); err != nil {
		return err
	}
	return be.AddRows(x, x, xn)
}
