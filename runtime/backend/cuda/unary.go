//go:build cuda && cgo && !nocgo

package cuda

import (
	"github.com/parleyhq/parley/runtime/backend"
)

// The elementwise functions and gated units.

// GeGLU: dst = gelu(gate) * up elementwise. dst may be gate or up.
func (b *Backend) GeGLU(dst, gate, up backend.Tensor) error {
	d, g, u, err := b.ops.GLU("geglu", dst, gate, up)
	if err != nil {
		return err
	}
	return b.ctx.GeGLU(d.ref(), g.ref(), u.ref(), g.rows*g.cols)
}

// SwiGLU: dst = silu(gate) * up elementwise. dst may be gate (or up).
func (b *Backend) SwiGLU(dst, gate, up backend.Tensor) error {
	d, g, u, err := b.ops.GLU("swiglu", dst, gate, up)
	if err != nil {
		return err
	}
	return b.ctx.SwiGLU(d.ref(), g.ref(), u.ref(), g.rows*g.cols)
}

// GELU (tanh form) elementwise. dst may be x.
func (b *Backend) GELU(dst, x backend.Tensor) error {
	d, xt, err := b.ops.Elementwise("gelu", dst, x)
	if err != nil {
		return err
	}
	return b.ctx.GELU(d.ref(), xt.ref(), xt.rows*xt.cols)
}
