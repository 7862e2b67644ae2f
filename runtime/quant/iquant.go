package quant

// Non-linear 4-bit formats (ggml-common.h). Multi-byte fields are little-endian. A 4-bit code
// q does not stand for the integer q but for kvaluesIQ4NL[q], a fixed table of 16 levels
// spaced more closely near zero.
//
//	IQ4_NL [18]:  d f16 | qs[16]
//	              32 elements; x = d*kv[q], q = qs[j]&15 (j<16), qs[j-16]>>4
//	IQ4_XS [136]: d f16 | scales_h u16 | scales_l[4] | qs[128]
//	              8 sub-blocks of 32, each laid out as one IQ4_NL block's qs; x = d*(ls-32)*kv[q],
//	              ls 6-bit: the low 4 bits are nibble ib%2 of scales_l[ib/2], the high 2 bits
//	              bits 2ib..2ib+1 of scales_h
const (
	iq4_NLBytes = 18
	iq4_XSBytes = 136
)

// kvaluesIQ4NL is ggml's kvalues_iq4nl: the level of each 4-bit code.
var kvaluesIQ4NL = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// iq4Pairs maps a code byte to the levels of its two codes as int8 bytes: the low nibble's in
// bits 0-7, the high nibble's in bits 8-15.
var iq4Pairs = func() (t [256]uint16) {
	for i := range t {
		t[i] = uint16(uint8(kvaluesIQ4NL[i&0xf])) | uint16(uint8(kvaluesIQ4NL[i>>4]))<<8
	}
	return t
}()

// scaleIQ4XS returns the 6-bit scale (0..63, to be offset by -32) of IQ4_XS sub-block ib (0..7).
func scaleIQ4XS(ib int, scalesH uint16, scalesL *[4]byte) int32 {
	return int32(scalesL[ib/2]>>(4*(ib%2))&0xf | byte(scalesH>>(2*ib)&3)<<4)
}

// decodeIQ4 writes the 32 values of one group of 16 code bytes, each level times d.
func decodeIQ4(d float32, qs *[16]byte, y *[32]float32) {
	for j, q := range qs {
		y[j] = d * float32(kvaluesIQ4NL[q&0xf])
		y[j+16] = d * float32(kvaluesIQ4NL[q>>4])
	}
}

func dequantIQ4_NL(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qk; b++ {
		x := (*[iq4_NLBytes]byte)(src[b*iq4_NLBytes:])
		decodeIQ4(f16at(x[0:]), (*[16]byte)(x[2:]), (*[qk]float32)(dst[b*qk:]))
	}
}

func dequantIQ4_XS(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qkK; b++ {
		x := (*[iq4_XSBytes]byte)(src[b*iq4_XSBytes:])
		d, h, sl := f16at(x[0:]), le16(x[2:]), (*[4]byte)(x[4:])
		for ib := 0; ib < 8; ib++ {
			dl := d * float32(scaleIQ4XS(ib, h, sl)-32)
			decodeIQ4(dl, (*[16]byte)(x[8+16*ib:]), (*[qk]float32)(dst[b*qkK+32*ib:]))
		}
	}
}

// bestIndexIQ4 is ggml's best_index_int8 over kvaluesIQ4NL: the code whose level is nearest
// to x, the upper one on a tie, found by bisection as ggml does (so NaN gives code 15).
func bestIndexIQ4(x float32) uint8 {
	if x <= float32(kvaluesIQ4NL[0]) {
		return 0
	}
	if x >= float32(kvaluesIQ4NL[15]) {
		return 15
	}
	ml, mu := 0, 15
	for mu-ml > 1 {
		mav := (ml + mu) / 2
		if x < float32(kvaluesIQ4NL[mav]) {
			mu = mav
		} else {
			ml = mav
		}
	}
	if x-float32(kvaluesIQ4NL[mu-1]) < float32(kvaluesIQ4NL[mu])-x {
		return uint8(mu - 1)
	}
	return uint8(mu)
}

// fitIQ4 is the per-block part of ggml's quantize_row_iq4_nl_impl with no importance weights:
// it fits xb ≈ d*kv[L] with weights xb². It starts from the scale max/-127 (max the value of
// largest magnitude, which that scale maps to the level -127), or max/127 when ntry > 0, and
// takes the least-squares d for the codes nearest that scale gives; then it tries the 2*ntry+1
// scales that map max to -127-ntry..-127+ntry (none for ntry < 0) and keeps the one with the
// best weighted fit. Lb receives the codes of the first fit (the tries only pick the scale).
// For a block whose largest magnitude is below groupMaxEps it returns 0 and leaves Lb as it was.
func fitIQ4(xb *[32]float32, Lb *[32]uint8, ntry int) float32 {
	var weight [32]float32
	var amax, mx float32
	for j, v := range xb {
		weight[j] = float32(v * v)
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	if amax < groupMaxEps {
		return 0
	}
	v0 := float32(kvaluesIQ4NL[0])
	var d float32
	if ntry > 0 {
		d = -mx / v0
	} else {
		d = mx / v0
	}
	id := 1 / d
	var sumqx, sumq2 float32
	for j, v := range xb {
		l := bestIndexIQ4(float32(id * v))
		Lb[j] = l
		q, w := float32(kvaluesIQ4NL[l]), weight[j]
		sumqx += float32(w * q * v)
		sumq2 += float32(w * q * q)
	}
	d = sumqx / sumq2
	best := d * sumqx
	for itry := -ntry; itry <= ntry; itry++ {
		id = float32(itry+int(kvaluesIQ4NL[0])) / mx
		sumqx, sumq2 = 0, 0
		for j, v := range xb {
			q, w := float32(kvaluesIQ4NL[bestIndexIQ4(float32(id*v))]), weight[j]
			sumqx += float32(w * q * v)
			sumq2 += float32(w * q * q)
		}
		if sumq2 > 0 && float32(sumqx*sumqx) > float32(best*sumq2) {
			d = sumqx / sumq2
			best = d * sumqx
		}
	}
	return d
}

// packIQ4 writes 32 codes as one group of 16 bytes: code j in the low nibble of byte j, code
// j+16 in its high nibble.
func packIQ4(L *[32]uint8, qs *[16]byte) {
	for j := range qs {
		qs[j] = L[j] | L[j+16]<<4
	}
}

// quantIQ4_NL is ggml's quantize_row_iq4_nl_ref: one fit per block with no search (ntry -1),
// its scale stored as d. (llama.cpp's file quantiser calls the same fit with a search over 15
// scales instead, so files it writes may differ in the scale and codes of some blocks.)
//
// A block whose largest magnitude is below groupMaxEps gets d = 0 and the codes of the
// previous block, because ggml does not clear its code buffer between blocks; they decode to
// zeros all the same. The first block of a call starts from codes 0 (ggml's are undefined).
func quantIQ4_NL(src []float32, dst []byte) {
	var L [32]uint8
	for b := 0; b < len(src)/qk; b++ {
		x := (*[qk]float32)(src[b*qk:])
		y := (*[iq4_NLBytes]byte)(dst[b*iq4_NLBytes:])
		put16(y[0:], F32ToF16(fitIQ4(x, &L, -1)))
		packIQ4(&L, (*[16]byte)(y[2:]))
	}
}

// quantIQ4_XS is ggml's quantize_row_iq4_xs_ref (quantize_row_iq4_nl_impl over 256 elements,
// with no importance weights and a search over 15 scales per sub-block): each sub-block's
// fitted scale is expressed as a signed 6-bit multiple l of d = -max/32, max the fitted scale of
// largest magnitude, and its codes are chosen again as the levels nearest x/(d*l).
func quantIQ4_XS(src []float32, dst []byte) {
	var (
		L      [qkK]uint8
		scales [8]float32
	)
	for b := 0; b < len(src)/qkK; b++ {
		x := (*[qkK]float32)(src[b*qkK:])
		y := (*[iq4_XSBytes]byte)(dst[b*iq4_XSBytes:])
		var maxScale, amaxScale float32
		for ib := range scales {
			scales[ib] = fitIQ4((*[32]float32)(x[32*ib:]), (*[32]uint8)(L[32*ib:]), 7)
			if a := abs32(scales[ib]); a > amaxScale {
				amaxScale, maxScale = a, scales[ib]
			}
		}
		// maxScale 0 gives d = -0, stored as the binary16 -0, as in ggml.
		d := -maxScale / 32
		put16(y[0:], F32ToF16(d))
		id := recip(d)
		var h uint16
		sl := (*[4]byte)(y[4:])
		*sl = [4]byte{}
		for ib := 0; ib < 8; ib++ {
			l := clampI(nearestInt(float32(id*scales[ib])), -32, 31)
			idl := recip(d * float32(l))
			xb := (*[32]float32)(x[32*ib:])
			Lb := (*[32]uint8)(L[32*ib:])
			for j, v := range xb {
				Lb[j] = bestIndexIQ4(float32(idl * v))
			}
			u := uint8(l + 32)
			sl[ib/2] |= (u & 0xf) << (4 * (ib % 2))
			h |= uint16(u>>4) << (2 * ib)
			packIQ4(Lb, (*[16]byte)(y[8+16*ib:]))
		}
		put16(y[2:], h)
	}
}
