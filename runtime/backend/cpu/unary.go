package cpu

import (
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The elementwise functions and gated units: one native call each (pl_unary, pl_glu), the
// function passed down as it is.

// Unary: dst = f(x) elementwise. dst may be x.
func (b *Backend) Unary(dst, x backend.Tensor, f backend.Func) error {
	return b.unary("unary", dst, x, f)
}

// GELU: dst = gelu(x) elementwise, the tanh form (Unary with tensor.GELU). dst may be x.
func (b *Backend) GELU(dst, x backend.Tensor) error { return b.unary("gelu", dst, x, tensor.GELU) }

func (b *Backend) unary(op string, dst, x backend.Tensor, f backend.Func) error {
	d, xt, err := b.ops.Unary(op, dst, x, f)
	if err != nil {
		return err
	}
	return b.ctx.Unary(d.f32, xt.f32, f)
}

// GLU: dst = f(gate) * up elementwise. dst may be gate or up.
func (b *Backend) GLU(dst, gate, up backend.Tensor, f backend.Func) error {
	return b.glu("glu", dst, gate, up, f)
}

// SwiGLU: dst = silu(gate) * up elementwise (GLU with tensor.SiLU). dst may be gate or up.
func (b *Backend) SwiGLU(dst, gate, up backend.Tensor) error {
	return b.glu("swiglu", dst, gate, up, tensor.SiLU)
}

// GeGLU: dst = gelu(gate) * up elementwise (GLU with tensor.GELU). dst may be gate or up.
func (b *Backend) GeGLU(dst, gate, up backend.Tensor) error {
	return b.glu("geglu", dst, gate, up, tensor.GELU)
}

func (b *Backend) glu(op string, dst, gate, up backend.Tensor, f backend.Func) error {
	d, g, u, err := b.ops.GLU(op, dst, gate, up, f)
	if err != nil {
		return err
	}
	return b.ctx.GLU(d.f32, g.f32, u.f32, f)
}
