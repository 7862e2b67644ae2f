//go:build cuda && cgo && !nocgo

package cuda

// #include "parley_cuda.h"
import "C"

import (
	"fmt"
	"math"
)

// The operations of convolutional encoders and transducers (native/cuda/conv.cu, relpos.cu,
// lstm.cu). Shapes are checked here as the kernels check them; the kernels refuse the rest.

// geom converts g, checked, and returns the output image's size.
func (g ConvGeom) geom(op string) (C.plc_conv_geom, int, int, error) {
	const lim = 1 << 24
	bad := g.PH < 0 || g.PW < 0 || g.PH > lim || g.PW > lim
	for _, v := range [...]int{g.H, g.W, g.KH, g.KW, g.SH, g.SW} {
		bad = bad || v < 1 || v > lim
	}
	if bad || int64(g.H)*int64(g.W) > math.MaxInt32 || int64(g.KH)*int64(g.KW) > 1<<16 || g.H+2*g.PH < g.KH || g.W+2*g.PW < g.KW {
		return C.plc_conv_geom{}, 0, 0, fmt.Errorf("cuda: %s: geometry %+v", op, g)
	}
	cg := C.plc_conv_geom{h: C.int64_t(g.H), w: C.int64_t(g.W), kh: C.int64_t(g.KH), kw: C.int64_t(g.KW),
		sh: C.int64_t(g.SH), sw: C.int64_t(g.SW), ph: C.int64_t(g.PH), pw: C.int64_t(g.PW)}
	return cg, (g.H+2*g.PH-g.KH)/g.SH + 1, (g.W+2*g.PW-g.KW)/g.SW + 1, nil
}

// Im2Col2D lays out the receptive fields of a 2-D convolution of x [H*W, ch] F32 as the rows of
// dst [Hout*Wout, ch*KH*KW].
func (c *Context) Im2Col2D(dst, x Ref, ch int, g ConvGeom) error {
	const op = "im2col 2d"
	cg, ho, wo, err := g.geom(op)
	if err != nil {
		return err
	}
	if ch < 0 || ch > math.MaxInt32/(g.KH*g.KW) {
		return fmt.Errorf("cuda: %s: %d channels", op, ch)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(ho, wo, ch, g.KH, g.KW, 4))
	if err != nil {
		return err
	}
	xp, err := x.at(c, op, "x", mul(g.H, g.W, ch, 4))
	if err != nil {
		return err
	}
	c.geomArg = cg
	return c.status(op, C.plc_im2col_2d(c.c, fp(dp), fp(xp), C.int64_t(ch), &c.geomArg))
}

// DepthwiseConv2D convolves each channel of x [H*W, ch] F32 with its kernel w [ch, KH*KW] and
// adds b [ch]: dst [Hout*Wout, ch].
func (c *Context) DepthwiseConv2D(dst, x, w, b Ref, ch int, g ConvGeom) error {
	const op = "depthwise conv 2d"
	cg, ho, wo, err := g.geom(op)
	if err != nil {
		return err
	}
	if ch < 0 || ch > math.MaxInt32 {
		return fmt.Errorf("cuda: %s: %d channels", op, ch)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(ho, wo, ch, 4))
	if err != nil {
		return err
	}
	xp, err := x.at(c, op, "x", mul(g.H, g.W, ch, 4))
	if err != nil {
		return err
	}
	wp, err := w.at(c, op, "w", mul(ch, g.KH, g.KW, 4))
	if err != nil {
		return err
	}
	bp, err := b.at(c, op, "b", mul(ch, 4))
	if err != nil {
		return err
	}
	c.geomArg = cg
	return c.status(op, C.plc_depthwise_conv_2d(c.c, fp(dp), fp(xp), fp(wp), fp(bp), C.int64_t(ch), &c.geomArg))
}

// RelPosAttention is self-attention with relative positions within each of the clips: q, k, v,
// dst [n, NHead*HeadDim] F32 with n the clips' rows together, p [pRows, NHead*HeadDim] (pRows
// odd), u and bv [NHead*HeadDim].
func (c *Context) RelPosAttention(dst, q, k, v, p Ref, pRows int, u, bv Ref, clips []int32, a RelPos) error {
	const op = "relpos attention"
	if a.NHead <= 0 || a.HeadDim <= 0 || a.NHead > math.MaxInt32/a.HeadDim || a.Window < 0 || a.Window > math.MaxInt32 {
		return fmt.Errorf("cuda: %s: %d heads of %d, window %d", op, a.NHead, a.HeadDim, a.Window)
	}
	width, n := a.NHead*a.HeadDim, 0
	for i, cl := range clips {
		if cl < 1 || int(cl) > math.MaxInt32-n {
			return fmt.Errorf("cuda: %s: clip %d has %d rows", op, i, cl)
		}
		n += int(cl)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	var ptr [7]*C.float
	for i, r := range []struct {
		what string
		ref  Ref
		size int
	}{{"dst", dst, mul(n, width, 4)}, {"q", q, mul(n, width, 4)}, {"k", k, mul(n, width, 4)}, {"v", v, mul(n, width, 4)},
		{"p", p, mul(pRows, width, 4)}, {"u", u, mul(width, 4)}, {"bv", bv, mul(width, 4)}} {
		addr, err := r.ref.at(c, op, r.what, r.size)
		if err != nil {
			return err
		}
		ptr[i] = fp(addr)
	}
	c.relPosArg = C.plc_relpos_cfg{n_head: C.int32_t(a.NHead), head_dim: C.int32_t(a.HeadDim), scale: C.float(a.Scale), window: C.int32_t(a.Window)}
	return c.status(op, C.plc_relpos_attention(c.c, ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], C.int64_t(pRows), ptr[5], ptr[6],
		i32p(clips), C.int64_t(len(clips)), &c.relPosArg))
}

// LSTMCell: for each of the n rows of gates [n, 4p] F32 in blocks [i, f, o, g], c = σ(f)·c +
// σ(i)·tanh(g) and h = σ(o)·tanh(c); c and h [n, p].
func (c *Context) LSTMCell(h, cs, gates Ref, n, p int) error {
	const op = "lstm cell"
	if n < 0 || p < 0 {
		return fmt.Errorf("cuda: %s: %d rows of %d", op, n, p)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	hp, err := h.at(c, op, "h", mul(n, p, 4))
	if err != nil {
		return err
	}
	cp, err := cs.at(c, op, "c", mul(n, p, 4))
	if err != nil {
		return err
	}
	gp, err := gates.at(c, op, "gates", mul(n, 4, p, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_lstm_cell(c.c, fp(hp), fp(cp), fp(gp), C.int64_t(n), C.int64_t(p)))
}
