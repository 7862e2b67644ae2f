package purego

import (
	"github.com/parleyhq/parley/runtime/backend"
)

// The 2-D convolutions' operations: Im2Col2D and DepthwiseConv2D over images [H*W, C], each
// split among the workers by rows of the output image.

// convJob computes Im2Col2D (dw false) or DepthwiseConv2D over output image rows
// [u*chunk, (u+1)*chunk) in unit u.
type convJob struct {
	dw     bool
	g      backend.ConvGeom
	c      int // channels
	ho, wo int
	chunk  int
	x, dst []float32
	wt     []float32 // DepthwiseConv2D: [KH*KW, C] the kernels, tap-major
	b      []float32 // DepthwiseConv2D: [C]
}

func (j *convJob) unit(_, u int) {
	r0 := u * j.chunk
	for oh := r0; oh < min(r0+j.chunk, j.ho); oh++ {
		for ow := 0; ow < j.wo; ow++ {
			if j.dw {
				j.dwPixel(oh, ow)
			} else {
				j.im2colPixel(oh, ow)
			}
		}
	}
}

// im2colPixel writes output row oh*Wout+ow: tap t = kh*KW+kw of channel c at column c*KH*KW+t.
func (j *convJob) im2colPixel(oh, ow int) {
	g, C := j.g, j.c
	taps := g.KH * g.KW
	cols := C * taps
	out := j.dst[(oh*j.wo+ow)*cols : (oh*j.wo+ow+1)*cols]
	for kh := 0; kh < g.KH; kh++ {
		ih := oh*g.SH + kh - g.PH
		for kw := 0; kw < g.KW; kw++ {
			iw := ow*g.SW + kw - g.PW
			t := kh*g.KW + kw
			if ih < 0 || ih >= g.H || iw < 0 || iw >= g.W {
				for c := 0; c < C; c++ {
					out[c*taps+t] = 0
				}
				continue
			}
			src := j.x[(ih*g.W+iw)*C : (ih*g.W+iw+1)*C]
			for c, v := range src {
				out[c*taps+t] = v
			}
		}
	}
}

// dwPixel writes output row oh*Wout+ow: the bias plus each tap inside the image, in tap order,
// summed in float32.
func (j *convJob) dwPixel(oh, ow int) {
	g, C := j.g, j.c
	out := j.dst[(oh*j.wo+ow)*C : (oh*j.wo+ow+1)*C]
	copy(out, j.b[:C])
	for kh := 0; kh < g.KH; kh++ {
		ih := oh*g.SH + kh - g.PH
		if ih < 0 || ih >= g.H {
			continue
		}
		for kw := 0; kw < g.KW; kw++ {
			iw := ow*g.SW + kw - g.PW
			if iw < 0 || iw >= g.W {
				continue
			}
			src := j.x[(ih*g.W+iw)*C : (ih*g.W+iw+1)*C]
			w := j.wt[(kh*g.KW+kw)*C : (kh*g.KW+kw+1)*C]
			for c, v := range src {
				out[c] += w[c] * v
			}
		}
	}
}

// runConv splits j among the workers by output rows, about minParallelElems elements a unit.
func (be *Backend) runConv(j *convJob, rowElems int) {
	if j.ho == 0 || rowElems == 0 {
		*j = convJob{}
		return
	}
	j.chunk = max(1, minParallelElems/rowElems)
	if j.ho*rowElems < minParallelElems {
		j.chunk = j.ho
	}
	be.pool.do(j, (j.ho+j.chunk-1)/j.chunk)
	*j = convJob{}
}

// Im2Col2D lays out the receptive fields of a 2-D convolution of x [H*W, C] as the rows of dst
// [Hout*Wout, C*KH*KW].
func (be *Backend) Im2Col2D(dst, x backend.Tensor, g backend.ConvGeom) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, xt, err := be.ops.Im2Col2D(dst, x, g)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	j := &be.conv
	j.g, j.c, j.x, j.dst = g, xt.cols, xt.f32, d.f32
	j.ho, j.wo = g.Out()
	be.runConv(j, j.wo*d.cols)
	return nil
}

// DepthwiseConv2D convolves each channel of x [H*W, C] with its kernel w [C, KH*KW] and adds
// b [1, C]: dst [Hout*Wout, C].
func (be *Backend) DepthwiseConv2D(dst, x, w, b backend.Tensor, g backend.ConvGeom) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, xt, wt, bt, err := be.ops.DepthwiseConv2D(dst, x, w, b, g)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	C, taps := xt.cols, g.KH*g.KW
	// The kernels tap-major, so that a tap's weights of every channel are contiguous.
	be.convW = grow(be.convW, taps*C)
	for c := 0; c < C; c++ {
		for t := 0; t < taps; t++ {
			be.convW[t*C+c] = wt.f32[c*taps+t]
		}
	}
	j := &be.conv
	j.dw, j.g, j.c, j.x, j.dst, j.wt, j.b = true, g, C, xt.f32, d.f32, be.convW, bt.f32
	j.ho, j.wo = g.Out()
	be.runConv(j, j.wo*C*taps)
	return nil
}
