//go:build cuda && cgo && !nocgo

package cuda

import (
	"github.com/parleyhq/parley/runtime/backend"
)

// The other operations of encoder-decoder models (Whisper): conversions, layer norms and the
// input layout of convolutions.

// Copy converts src into dst elementwise: F32 to F16, F16 to F32, or a copy of one float type.
func (b *Backend) Copy(dst, src backend.Tensor) error {
	d, s, err := b.ops.Copy(dst, src)
	if err != nil {
		return err
	}
	if d.buf == s.buf && d.off == s.off { // dst is src
		return nil
	}
	return b.ctx.Copy(d.ref(), d.dt, s.ref(), s.dt, s.rows*s.cols)
}

// LayerNorm: dst[i,:] = (x[i,:]-mean)/sqrt(var+eps)*w[0,:] + bias[0,:]. dst may be x.
func (b *Backend) LayerNorm(dst, x, w, bias backend.Tensor, eps float32) error {
	d, xt, wt, bt, err := b.ops.LayerNorm(dst, x, w, bias, eps)
	if err != nil {
		return err
	}
	return b.ctx.LayerNorm(d.ref(), xt.ref(), wt.ref(), bt.ref(), xt.rows, xt.cols, eps)
}

// Im2Col1D lays out the receptive fields of a 1-D convolution of x [T, C] as rows of dst
// [Tout, C*kernel].
func (b *Backend) Im2Col1D(dst, x backend.Tensor, kernel, stride, pad int) error {
	d, xt, tout, err := b.ops.Im2Col1D(dst, x, kernel, stride, pad)
	if err != nil {
		return err
	}
	return b.ctx.Im2Col1D(d.ref(), xt.ref(), xt.rows, xt.cols, kernel, stride, pad, tout)
}
