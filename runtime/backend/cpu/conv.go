package cpu

import (
	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
)

// The 2-D convolutions' operations over images [H*W, C].

func geom(g backend.ConvGeom) cpu.ConvGeom {
	return cpu.ConvGeom{H: g.H, W: g.W, KH: g.KH, KW: g.KW, SH: g.SH, SW: g.SW, PH: g.PH, PW: g.PW}
}

// Im2Col2D lays out the receptive fields of a 2-D convolution of x [H*W, C] as the rows of dst
// [Hout*Wout, C*KH*KW].
func (b *Backend) Im2Col2D(dst, x backend.Tensor, g backend.ConvGeom) error {
	d, xt, err := b.ops.Im2Col2D(dst, x, g)
	if err != nil {
		return err
	}
	return b.ctx.Im2Col2D(d.f32, xt.f32, xt.cols, geom(g))
}

// DepthwiseConv2D convolves each channel of x [H*W, C] with its kernel w [C, KH*KW] and adds
// bias [1, C]: dst [Hout*Wout, C].
func (b *Backend) DepthwiseConv2D(dst, x, w, bias backend.Tensor, g backend.ConvGeom) error {
	d, xt, wt, bt, err := b.ops.DepthwiseConv2D(dst, x, w, bias, g)
	if err != nil {
		return err
	}
	return b.ctx.DepthwiseConv2D(d.f32, xt.f32, wt.f32, bt.f32, xt.cols, geom(g))
}
