package cpu

import (
	"github.com/parleyhq/parley/runtime/backend"
)

// The other operations of encoder-decoder models (Whisper): conversions, layer norms and the
// input layout of convolutions.

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

// Im2Col1D: dst[t, c*K+k] = x[t*stride+k-pad, c] (0 outside x) for x [T, C] and
// dst [(T+2*pad-K)/stride+1, C*K] F32.
func (b *Backend) Im2Col1D(dst, x backend.Tensor, kernel, stride, pad int) error {
	d, xt, _, err := b.ops.Im2Col1D(dst, x, kernel, stride, pad)
	if err != nil {
		return err
	}
	return b.ctx.Im2Col1D(d.f32, xt.f32, xt.rows, xt.cols, kernel, stride, pad)
}
