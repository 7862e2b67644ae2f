package cpu

import (
	"fmt"
	"math"
)

// ConvGeom is the geometry of a 2-D convolution over an image of H rows of W pixels, which a
// slice [H*W, C] holds pixel by pixel: a KH×KW kernel at strides SH, SW over the image padded
// with PH rows of zeros above and below and PW columns left and right (pl_conv_geom).
type ConvGeom struct {
	H, W, KH, KW, SH, SW, PH, PW int
}

// out checks g as the kernels do and returns the output image's rows and columns.
func (g ConvGeom) out(op string) (ho, wo int, err error) {
	const lim = 1 << 24
	for _, v := range [...]int{g.H, g.W, g.KH, g.KW, g.SH, g.SW} {
		if v < 1 || v > lim {
			return 0, 0, fmt.Errorf("cpu: %s: geometry %+v", op, g)
		}
	}
	if g.PH < 0 || g.PW < 0 || g.PH > lim || g.PW > lim || int64(g.H)*int64(g.W) > math.MaxInt32 ||
		int64(g.KH)*int64(g.KW) > 1<<16 || g.H+2*g.PH < g.KH || g.W+2*g.PW < g.KW {
		return 0, 0, fmt.Errorf("cpu: %s: geometry %+v", op, g)
	}
	return (g.H+2*g.PH-g.KH)/g.SH + 1, (g.W+2*g.PW-g.KW)/g.SW + 1, nil
}

// RelPos describes relative-position attention heads (pl_relpos_cfg): NHead heads of HeadDim,
// scores scaled by Scale, Window 0 for whole clips or the largest distance attended to.
type RelPos struct {
	NHead, HeadDim int
	Scale          float32
	Window         int
}
