//go:build !cgo || nocgo

package cpu

// Im2Col2D lays out the receptive fields of a 2-D convolution.
func (c *Context) Im2Col2D(dst, x []float32, ch int, g ConvGeom) error { return ErrNotBuilt }

// DepthwiseConv2D convolves each channel with a kernel of its own.
func (c *Context) DepthwiseConv2D(dst, x, w, b []float32, ch int, g ConvGeom) error {
	return ErrNotBuilt
}

// RelPosAttention is self-attention with relative positions within each clip.
func (c *Context) RelPosAttention(dst, q, k, v, p []float32, pRows int, u, bv []float32, clips []int32, a RelPos) error {
	return ErrNotBuilt
}

// LSTMCell is one step of LSTM cells after their gates' products.
func (c *Context) LSTMCell(h, cs, gates []float32, n, p int) error { return ErrNotBuilt }
