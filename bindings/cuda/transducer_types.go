package cuda

// ConvGeom is the geometry of a 2-D convolution over an image of H rows of W pixels, held
// pixel by pixel as [H*W, C]: a KH×KW kernel at strides SH, SW, zero padding PH rows above and
// below and PW columns left and right (plc_conv_geom).
type ConvGeom struct {
	H, W, KH, KW, SH, SW, PH, PW int
}

// RelPos describes relative-position attention heads (plc_relpos_cfg): NHead heads of HeadDim
// (at most 1024), scores scaled by Scale, Window 0 for whole clips or the largest distance
// attended to.
type RelPos struct {
	NHead, HeadDim int
	Scale          float32
	Window         int
}
