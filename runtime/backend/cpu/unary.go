package cpu

import "github.com/parleyhq/parley/runtime/backend"

// The elementwise functions and gated units.

// GeGLU: dst = gelu(gate) * up elementwise. dst may be gate or up.
func (b *Backend) GeGLU(dst, gate, up backend.Tensor) error {
	d, g, u, err := b.ops.GLU("geglu", dst, gate, up)
	if err != nil {
		return err
	}
	return b.ctx.GeGLU(d.f32, g.f32, u.f32)
}

// SwiGLU: dst = silu(gate) * up elementwise. dst may be gate (or up).
func (b *Backend) SwiGLU(dst, gate, up backend.Tensor) error {
	d, g, u, err := b.ops.GLU("swiglu", dst, gate, up)
	if err != nil {
		return err
	}
	return b.ctx.SwiGLU(d.f32, g.f32, u.f32)
}

// GELU: dst = 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))) element-wise. dst may be x.
func (b *Backend) GELU(dst, x backend.Tensor) error {
	d, xt, err := b.ops.Elementwise("gelu", dst, x)
	if err != nil {
		return err
	}
	return b.ctx.GELU(d.f32, xt.f32)
}
