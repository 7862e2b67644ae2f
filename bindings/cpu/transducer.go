//go:build cgo && !nocgo

package cpu

// #include "parley.h"
import "C"

import (
	"fmt"
	"math"
	"unsafe"
)

// The operations of convolutional encoders and transducers (native/cpu/conv.c, relpos.c,
// lstm.c).

// transducerArgs are the argument structs of these operations, kept in the Context (a pointer to
// a local passed to C would make it escape).
type transducerArgs struct {
	geom C.pl_conv_geom
	rp   C.pl_relpos_cfg
}

func (c *Context) setGeom(g ConvGeom) *C.pl_conv_geom {
	c.tr.geom = C.pl_conv_geom{h: C.int64_t(g.H), w: C.int64_t(g.W), kh: C.int64_t(g.KH), kw: C.int64_t(g.KW),
		sh: C.int64_t(g.SH), sw: C.int64_t(g.SW), ph: C.int64_t(g.PH), pw: C.int64_t(g.PW)}
	return &c.tr.geom
}

// Im2Col2D lays out the receptive fields of a 2-D convolution of x [H*W, ch] as the rows of dst
// [Hout*Wout, ch*KH*KW] (see pl_im2col_2d); dst must not overlap x.
func (c *Context) Im2Col2D(dst, x []float32, ch int, g ConvGeom) error {
	const op = "im2col 2d"
	ho, wo, err := g.out(op)
	if err != nil {
		return err
	}
	if ch < 0 || ch > math.MaxInt32/(g.KH*g.KW) {
		return fmt.Errorf("cpu: %s: %d channels", op, ch)
	}
	xn, dn := mul(g.H*g.W, ch), mul(ho*wo, ch*g.KH*g.KW)
	if err := need(op, "x", len(x), xn); err != nil {
		return err
	}
	if err := need(op, "dst", len(dst), dn); err != nil {
		return err
	}
	if ch == 0 {
		return nil
	}
	if overlap(unsafe.Pointer(&dst[0]), 4*dn, unsafe.Pointer(&x[0]), 4*xn) {
		return fmt.Errorf("cpu: %s: dst overlaps x", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_im2col_2d(c.c, f32p(dst), f32p(x), C.int64_t(ch), c.setGeom(g)); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// DepthwiseConv2D convolves each channel of x [H*W, ch] with its kernel w [ch, KH*KW] and adds
// b [ch]: dst [Hout*Wout, ch] (see pl_depthwise_conv_2d); dst must not overlap x, w or b.
func (c *Context) DepthwiseConv2D(dst, x, w, b []float32, ch int, g ConvGeom) error {
	const op = "depthwise conv 2d"
	ho, wo, err := g.out(op)
	if err != nil {
		return err
	}
	if ch < 0 || ch > math.MaxInt32 {
		return fmt.Errorf("cpu: %s: %d channels", op, ch)
	}
	xn, dn, wn := mul(g.H*g.W, ch), mul(ho*wo, ch), mul(ch, g.KH*g.KW)
	for _, s := range []struct {
		what      string
		have, req int
	}{{"x", len(x), xn}, {"dst", len(dst), dn}, {"w", len(w), wn}, {"b", len(b), ch}} {
		if err := need(op, s.what, s.have, s.req); err != nil {
			return err
		}
	}
	if ch == 0 {
		return nil
	}
	dp := unsafe.Pointer(&dst[0])
	if overlap(dp, 4*dn, unsafe.Pointer(&x[0]), 4*xn) || overlap(dp, 4*dn, unsafe.Pointer(&w[0]), 4*wn) ||
		overlap(dp, 4*dn, unsafe.Pointer(&b[0]), 4*ch) {
		return fmt.Errorf("cpu: %s: dst overlaps x, w or b", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_depthwise_conv_2d(c.c, f32p(dst), f32p(x), f32p(w), f32p(b), C.int64_t(ch), c.setGeom(g)); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// RelPosAttention is self-attention with relative positions within each of the clips (see
// pl_relpos_attention): q, k, v, dst [n, NHead*HeadDim] with n the clips' rows together,
// p [pRows, NHead*HeadDim] (pRows odd, (pRows-1)/2 covering every distance attended to),
// u and bv [NHead*HeadDim]. dst must not overlap an input.
func (c *Context) RelPosAttention(dst, q, k, v, p []float32, pRows int, u, bv []float32, clips []int32, a RelPos) error {
	const op = "relpos attention"
	if a.NHead <= 0 || a.HeadDim <= 0 || a.NHead > math.MaxInt32/a.HeadDim || a.Window < 0 || a.Window > math.MaxInt32 ||
		math.IsNaN(float64(a.Scale)) || math.IsInf(float64(a.Scale), 0) {
		return fmt.Errorf("cpu: %s: %d heads of %d, scale %v, window %d", op, a.NHead, a.HeadDim, a.Scale, a.Window)
	}
	width := a.NHead * a.HeadDim
	n, longest := 0, 0
	for i, cl := range clips {
		if cl < 1 || int(cl) > math.MaxInt32-n {
			return fmt.Errorf("cpu: %s: clip %d has %d rows", op, i, cl)
		}
		n += int(cl)
		longest = max(longest, int(cl))
	}
	reach := longest - 1
	if a.Window > 0 {
		reach = min(reach, a.Window)
	}
	if pRows < 1 || pRows%2 != 1 || (pRows-1)/2 < reach {
		return fmt.Errorf("cpu: %s: %d position rows for distances up to %d", op, pRows, reach)
	}
	rn := mul(n, width)
	for _, s := range []struct {
		what      string
		have, req int
	}{{"q", len(q), rn}, {"k", len(k), rn}, {"v", len(v), rn}, {"dst", len(dst), rn}, {"p", len(p), mul(pRows, width)},
		{"u", len(u), width}, {"bv", len(bv), width}} {
		if err := need(op, s.what, s.have, s.req); err != nil {
			return err
		}
	}
	if n == 0 {
		return nil
	}
	dp := unsafe.Pointer(&dst[0])
	for _, in := range []struct {
		s []float32
		n int
	}{{q, rn}, {k, rn}, {v, rn}, {p, pRows * width}, {u, width}, {bv, width}} {
		if overlap(dp, 4*rn, unsafe.Pointer(&in.s[0]), 4*in.n) {
			return fmt.Errorf("cpu: %s: dst overlaps an input", op)
		}
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.tr.rp = C.pl_relpos_cfg{n_head: C.int32_t(a.NHead), head_dim: C.int32_t(a.HeadDim), scale: C.float(a.Scale), window: C.int32_t(a.Window)}
	st := C.pl_relpos_attention(c.c, f32p(dst), f32p(q), f32p(k), f32p(v), f32p(p), C.int64_t(pRows), f32p(u), f32p(bv),
		i32p(clips), C.int64_t(len(clips)), &c.tr.rp)
	if st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}

// LSTMCell: for each of the n rows of gates [n, 4p] in blocks [i, f, o, g], c = σ(f)·c +
// σ(i)·tanh(g) and h = σ(o)·tanh(c) (see pl_lstm_cell); c and h [n, p]; no two overlap.
func (c *Context) LSTMCell(h, cs, gates []float32, n, p int) error {
	const op = "lstm cell"
	if n < 0 || p < 0 {
		return fmt.Errorf("cpu: %s: %d rows of %d", op, n, p)
	}
	sn, gn := mul(n, p), mul(n, mul(4, p))
	for _, s := range []struct {
		what      string
		have, req int
	}{{"h", len(h), sn}, {"c", len(cs), sn}, {"gates", len(gates), gn}} {
		if err := need(op, s.what, s.have, s.req); err != nil {
			return err
		}
	}
	if sn == 0 {
		return nil
	}
	hp, cp, gp := unsafe.Pointer(&h[0]), unsafe.Pointer(&cs[0]), unsafe.Pointer(&gates[0])
	if overlap(hp, 4*sn, cp, 4*sn) || overlap(hp, 4*sn, gp, 4*gn) || overlap(cp, 4*sn, gp, 4*gn) {
		return fmt.Errorf("cpu: %s: h, c and gates must not overlap", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_lstm_cell(c.c, f32p(h), f32p(cs), f32p(gates), C.int64_t(n), C.int64_t(p)); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}
