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

// Encoder runs the audio encoder. It holds scratch for one window; one goroutine uses it at a time.
type Encoder struct {
	m *Model

	mel            backend.Tensor // [3000, mels] time-major
	col1           backend.Tensor // [3000, 3*mels]
	h1             backend.Tensor // [3000, S]
	col2           backend.Tensor // [1500, 3*S]
	x, xn, q, k, v backend.Tensor // [1500, S]
	att            backend.Tensor // [1500, S]
	ff             backend.Tensor // [1500, 4S]
	k16, v16       backend.Tensor // [1500, S] F16
	attn           backend.Attn

	melT    []float32 // host buffer for the transposed mel
	scratch []backend.Tensor
}

// NewEncoder allocates an encoder's scratch.
func (m *Model) NewEncoder() (*Encoder, error) {
	S, n := m.AudioState, m.AudioCtx
	e := &Encoder{m: m, melT: make([]float32, WindowFrames*m.Mels),
		attn: backend.Attn{NHead: m.AudioHead, NKVHead: m.AudioHead, HeadDim: S / m.AudioHead, Scale: 1 / sqrt32(float32(S/m.AudioHead))}}
	for _, s := range []struct {
		dst        *backend.Tensor
		dt         tensor.DType
		rows, cols int
	}{
		{&e.mel, tensor.F32, WindowFrames, m.Mels}, {&e.col1, tensor.F32, WindowFrames, 3 * m.Mels},
		{&e.h1, tensor.F32, WindowFrames, S}, {&e.col2, tensor.F32, n, 3 * S},
		{&e.x, tensor.F32, n, S}, {&e.xn, tensor.F32, n, S}, {&e.q, tensor.F32, n, S},
		{&e.k, tensor.F32, n, S}, {&e.v, tensor.F32, n, S}, {&e.att, tensor.F32, n, S},
		{&e.ff, tensor.F32, n, 4 * S}, {&e.k16, tensor.F16, n, S}, {&e.v16, tensor.F16, n, S},
	} {
		t, err := m.be.Alloc(s.dt, s.rows, s.cols)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("whisper: encoder scratch: %w", err)
		}
		*s.dst = t
		e.scratch = append(e.scratch, t)
	}
	return e, nil
}

// Close releases the encoder's scratch.
func (e *Encoder) Close() error {
	var errs []error
	for _, t := range e.scratch {
		errs = append(errs, t.Close())
	}
	e.scratch = nil
	return errors.Join(errs...)
}

// Encode runs the encoder over one window's log-mel mel ([Mels, 3000], row = mel bin, as the
// features are computed) and stores the cross-attention keys and values of every decoder layer
// in out. When encOut is not nil it receives the encoder output [1500, S].
func (e *Encoder) Encode(mel []float32, out *Cross, encOut []float32) error {
	m, be := e.m, e.m.be
	if len(mel) != m.Mels*WindowFrames {
		return fmt.Errorf("whisper: mel window has %d values, want %d×%d", len(mel), m.Mels, WindowFrames)
	}
	if out == nil || len(out.k) != m.TextLayer {
		return errors.New("whisper: Encode needs a Cross made by this model")
	}
	if encOut != nil && len(encOut) != m.AudioCtx*m.AudioState {
		return fmt.Errorf("whisper: encoder output buffer holds %d values, want %d", len(encOut), m.AudioCtx*m.AudioState)
	}
	for b := 0; b < m.Mels; b++ { // [mels, frames] → [frames, mels]
		row := mel[b*WindowFrames : (b+1)*WindowFrames]
		for t, v := range row {
			e.melT[t*m.Mels+b] = v
		}
	}
	if err := be.Write(e.mel, 0, e.melT); err != nil {
		return err
	}
	if err := e.conv(); err != nil {
		return fmt.Errorf("whisper: encoder conv: %w", err)
	}
	for li := range m.enc {
		if err := e.layer(&m.enc[li]); err != nil {
			return fmt.Errorf("whisper: encoder layer %d: %w", li, err)
		}
	}
	if err := be.LayerNorm(e.x, e.x, m.encLnW, m.encLnB, normEps); err != nil {
		return err
	}
	for li := range m.dec {
		c := &m.dec[li].cross
		if err := be.MatMul(e.k, e.x, c.k); err != nil {
			return err
		}
		if err := be.Copy(out.k[li], e.k); err != nil {
			return err
		}
		if err := be.MatMul(e.v, e.x, c.v); err != nil {
			return err
		}
		if err := be.AddRows(e.v, e.v, c.vb); err != nil {
			return err
		}
		if err := be.Copy(out.v[li], e.v); err != nil {
			return err
		}
	}
	if encOut != nil {
		return be.Read(e.x, 0, encOut)
	}
	return nil
}

// conv runs the convolutional stem: two 3-wide convolutions (the second with stride 2), each
// followed by GELU, then adds the positional embedding. Result in e.x [1500, S].
func (e *Encoder) conv() error {
	m, be := e.m, e.m.be
	if err := be.Im2Col1D(e.col1, e.mel, 3, 1, 1); err != nil {
		return err
	}
	if err := be.MatMul(e.h1, e.col1, m.conv1w); err != nil {
		return err
	}
	if err := be.AddRows(e.h1, e.h1, m.conv1b); err != nil {
		return err
	}
	if err := be.GELU(e.h1, e.h1); err != nil {
		return err
	}
	if err := be.Im2Col1D(e.col2, e.h1, 3, 2, 1); err != nil {
		return err
	}
	if err := be.MatMul(e.x, e.col2, m.conv2w); err != nil {
		return err
	}
	if err := be.AddRows(e.x, e.x, m.conv2b); err != nil {
		return err
	}
	if err := be.GELU(e.x, e.x); err != nil {
		return err
	}
	return be.AddRows(e.x, e.x, m.encPE)
}

// layer runs one encoder block on e.x in place:
//
//	x += Wo · attention(Wq·ln(x), Wk·ln(x), Wv·ln(x))
//	x += W2 · gelu(W0·ln(x))
func (e *Encoder) layer(l *encLayer) error {
	be := e.m.be
	a := &l.attn
	if err := be.LayerNorm(e.xn, e.x, a.lnW, a.lnB, normEps); err != nil {
		return err
	}
	if err := linear(be, e.q, e.xn, a.q, a.qb); err != nil {
		return err
	}
	if err := linear(be, e.k, e.xn, a.k, nil); err != nil {
		return err
	}
	if err := linear(be, e.v, e.xn, a.v, a.vb); err != nil {
		return err
	}
	if err := be.Copy(e.k16, e.k); err != nil {
		return err
	}
	if err := be.Copy(e.v16, e.v); err != nil {
		return err
	}
	if err := be.FullAttention(e.att, e.q, e.k16, e.v16, e.attn); err != nil {
		return err
	}
	if err := linear(be, e.xn, e.att, a.o, a.ob); err != nil {
		return err
	}
	if err := be.AddRows(e.x, e.x, e.xn); err != nil {
		return err
	}
	return mlp(be, &l.mlp, e.x, e.xn, e.ff)
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
