package cpu

import (
	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
)

// The operations of encoder-decoder models (Whisper).

// Copy converts src into dst (same shape): F32 to F16 (round to nearest even), F16 to F32, or a
// copy between tensors of one type.
func (b *Backend) Copy(dst, src backend.Tensor) error {
	d, s, err := b.ops.Copy(dst, src)
	if err != nil {
		return err
	}
	return b.ctx.Convert(d.data, d.dt, s.data, s.dt, s.rows*s.cols)
}

// LayerNorm: dst[i,:] = (x[i,:] - mean) / sqrt(var + eps) * w[0,:] + b[0,:] over each row's
// mean and biased variance; w, b [1, d] F32. dst may be x.
func (b *Backend) LayerNorm(dst, x, w, bias backend.Tensor, eps float32) error {
	d, xt, wt, bt, err := b.ops.LayerNorm(dst, x, w, bias, eps)
	if err != nil {
		return err
	}
	return b.ctx.LayerNorm(d.f32, xt.f32, wt.f32, bt.f32, xt.rows, xt.cols, eps)
}

// GELU: dst = 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))) element-wise. dst may be x.
func (b *Backend) GELU(dst, x backend.Tensor) error {
	d, xt, err := b.ops.Elementwise("gelu", dst, x)
	if err != nil {
		return err
	}
	return b.ctx.GELU(d.f32, xt.f32)
}

// Im2Col1D: dst[t, c*K+k] = x[t*stride+k-pad, c] (0 outside x) for x [T, C] and
// dst [(T+2*pad-K)/stride+1, C*K] F32.
func (b *Backend) Im2Col1D(dst, x backend.Tensor, kernel, stride, pad int) error {
	d, xt, _, err := b.ops.Im2Col1D(dst, x, kernel, stride, pad)
	if err != nil {
		return err
	}
	return b.ctx.Im2Col1D(d.f32, xt.f32, xt.rows, xt.cols, kernel, stride, pad)
}

// FullAttention computes attention of q [n, NHead*HeadDim] over every row of k and v
// ([m, NKVHead*HeadDim], both F32 or both F16) into dst (same shape as q, overlapping none of
// them).
func (b *Backend) FullAttention(dst, q, k, v backend.Tensor, a backend.Attn) error {
	d, qt, kt, vt, err := b.ops.FullAttention(dst, q, k, v, a)
	if err != nil {
		return err
	}
	return b.ctx.FullAttention(d.f32, qt.f32, qt.rows, kt.data, vt.data, kt.dt, kt.rows,
		cpu.Attn{NHead: a.NHead, NKVHead: a.NKVHead, HeadDim: a.HeadDim, Scale: a.Scale})
}
