package quant

import "math"

// f16Table maps every binary16 bit pattern to its float32 value; [65536].
var f16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = math.Float32frombits(f16bits(uint16(i)))
	}
	return &t
}()

// F32ToF16 converts f to IEEE 754 binary16, rounding to nearest even, with subnormal results
// where the value is below the smallest normal half. Overflow gives ±Inf; NaN stays NaN (quiet,
// sign and top payload bits kept, as the x86 F16C conversion does).
//
// The rounding is done by the FPU: |f| is first scaled by 2^112 then 2^-110 (overflowing to Inf
// above the half range, and shifting the exponent to where the half's fraction starts), and then
// added to a power of two chosen from f's exponent, so that the float32 addition itself rounds
// the significand to the half's precision (ties to even), subnormals included.
func F32ToF16(f float32) uint16 {
	w := math.Float32bits(f)
	sign := uint16(w>>16) & 0x8000
	w2 := w + w // exponent and fraction without the sign
	if w2 > 0xff000000 {
		return sign | 0x7e00 | uint16(w>>13)&0x3ff // NaN
	}
	base := float32(float32(abs32(f)*0x1p112) * 0x1p-110)
	bias := w2 & 0xff000000
	if bias < 0x71000000 {
		bias = 0x71000000
	}
	base = math.Float32frombits(bias>>1+0x07800000) + base
	bits := math.Float32bits(base)
	return sign | uint16((bits>>13)&0x7c00+bits&0x0fff)
}

// F16ToF32 converts an IEEE 754 binary16 value to float32 exactly.
func F16ToF32(h uint16) float32 { return f16Table[h] }

// f16bits returns the float32 bit pattern of the binary16 value h.
func f16bits(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return sign | 0x7f800000 | man<<13
	case exp != 0:
		return sign | (exp+112)<<23 | man<<13
	case man == 0:
		return sign
	}
	e := uint32(113) // subnormal: normalise the significand
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return sign | e<<23 | (man&0x3ff)<<13
}

// F32ToBF16 converts f to bfloat16 as ggml does: round to nearest even; NaN is kept, made quiet.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 64
	}
	return uint16((u + (0x7fff + (u>>16)&1)) >> 16)
}

// BF16ToF32 converts a bfloat16 value to float32 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// le16 reads a little-endian uint16 from b[0:2].
func le16(b []byte) uint16 { _ = b[1]; return uint16(b[0]) | uint16(b[1])<<8 }

// put16 writes v little-endian to b[0:2].
func put16(b []byte, v uint16) { _ = b[1]; b[0] = byte(v); b[1] = byte(v >> 8) }

// f16at reads the binary16 value at b[0:2] as float32.
func f16at(b []byte) float32 { return f16Table[le16(b)] }
