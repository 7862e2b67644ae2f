//go:build cuda && cgo && !nocgo

package cuda

import (
	bcuda "github.com/parleyhq/parley/bindings/cuda"
	"github.com/parleyhq/parley/runtime/backend"
)

// The row-wise operations of a transformer layer: residual sums, norms, scaling, rotary embedding.

// AddRows: dst[i,:] = a[i,:] + bias[i or 0,:]. dst may be a.
func (b *Backend) AddRows(dst, a, bias backend.Tensor) error {
	d, at, bt, err := b.ops.AddRows(dst, a, bias)
	if err != nil {
		return err
	}
	return b.ctx.AddRows(d.ref(), at.ref(), bt.ref(), at.rows, at.cols, bt.rows)
}

// RMSNorm: dst[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * w[0,:]; a w narrower than x
// normalises groups of its width apart (see backend.Backend). dst may be x.
func (b *Backend) RMSNorm(dst, x, w backend.Tensor, eps float32) error {
	d, xt, wt, err := b.ops.RMSNorm(dst, x, w, eps)
	if err != nil {
		return err
	}
	if xt.cols == 0 {
		return nil
	}
	// rows of x in groups of w's width: [n, h*g] as [n*h, g]
	return b.ctx.RMSNorm(d.ref(), xt.ref(), wt.ref(), xt.rows*(xt.cols/wt.cols), wt.cols, eps)
}

// Scale: dst = x * s elementwise. dst may be x.
func (b *Backend) Scale(dst, x backend.Tensor, s float32) error {
	d, xt, err := b.ops.Scale(dst, x, s)
	if err != nil {
		return err
	}
	return b.ctx.Scale(d.ref(), xt.ref(), s, xt.rows*xt.cols)
}

// Rope rotates x [n, nHead*HeadDim] in place, token i at position bt.Pos[i].
func (b *Backend) Rope(x backend.Tensor, nHead int, r backend.RoPE, bt *backend.Batch) error {
	xt, err := b.ops.Rope(x, nHead, r, bt)
	if err != nil {
		return err
	}
	return b.ctx.Rope(xt.ref(), xt.rows, nHead, bcuda.RoPE{NeoX: r.Mode == backend.RoPENeoX, HeadDim: r.HeadDim, Dims: r.Dims,
		Base: r.Base, FreqScale: r.FreqScale, Factors: r.Factors, AttnFactor: r.AttnFactor,
		ExtFactor: r.ExtFactor, CorrDims: r.CorrDims}, bt.Pos)
}
