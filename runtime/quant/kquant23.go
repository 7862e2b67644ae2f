package quant

// Low-bit K-quant 256-element super-block formats (ggml-common.h). Multi-byte fields are
// little-endian.
//
//	Q2_K [84]:  scales[16] | qs[64] | d f16 | dmin f16
//	            16 sub-blocks of 16; x = d*sc*q - dmin*m, q 2-bit, sc the low and m the high
//	            nibble of scales[j]
//	Q3_K [110]: hmask[32] | qs[64] | scales[12] | d f16
//	            16 sub-blocks of 16; x = d*(sc-32)*(q-4), q = 2 low bits from qs and a third
//	            from hmask, sc 6-bit (packing: scaleK3)
//
// In both, qs holds two halves of 128 elements in 32 bytes each: element 32*r+l of a half is
// bits 2r..2r+1 of byte l. In Q3_K, bit r+4h of hmask[l] is the high bit of that element of
// half h.
const (
	q2_KBytes = 84
	q3_KBytes = 110
)

// scaleK3 returns the 6-bit scale (0..63, to be offset by -32) of Q3_K sub-block j (0..15)
// from the 12 packed bytes: the low 4 bits are the low nibble of q[j] (j<8) or the high
// nibble of q[j-8], the high 2 bits are bits 2*(j/4)..2*(j/4)+1 of q[8+j%4].
func scaleK3(j int, q *[12]byte) int32 {
	var lo byte
	if j < 8 {
		lo = q[j] & 0xf
	} else {
		lo = q[j-8] >> 4
	}
	return int32(lo | (q[8+j%4]>>(2*(j/4))&3)<<4)
}

// unpackScalesK3 expands the 12 packed bytes of Q3_K into the 16 signed scales (sc-32).
func unpackScalesK3(q *[12]byte) (sc [16]int32) {
	for j := range sc {
		sc[j] = scaleK3(j, q) - 32
	}
	return sc
}

func dequantQ2_K(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qkK; b++ {
		x := (*[q2_KBytes]byte)(src[b*q2_KBytes:])
		y := (*[qkK]float32)(dst[b*qkK:])
		d, dmin := f16at(x[80:]), f16at(x[82:])
		for h := 0; h < 2; h++ {
			q := (*[32]byte)(x[16+32*h:])
			for r := 0; r < 4; r++ {
				shift := uint(2 * r)
				for k := 0; k < 2; k++ {
					sc := x[8*h+2*r+k]
					dl, ml := d*float32(sc&0xf), dmin*float32(sc>>4)
					o := (*[16]float32)(y[128*h+32*r+16*k:])
					for l := 0; l < 16; l++ {
						o[l] = float32(dl*float32(q[16*k+l]>>shift&3)) - ml
					}
				}
			}
		}
	}
}

func dequantQ3_K(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qkK; b++ {
		x := (*[q3_KBytes]byte)(src[b*q3_KBytes:])
		y := (*[qkK]float32)(dst[b*qkK:])
		dAll := f16at(x[108:])
		hm := (*[32]byte)(x[0:])
		sc := unpackScalesK3((*[12]byte)(x[96:]))
		for h := 0; h < 2; h++ {
			q := (*[32]byte)(x[32+32*h:])
			for r := 0; r < 4; r++ {
				shift := uint(2 * r)
				m := byte(1) << uint(4*h+r)
				for k := 0; k < 2; k++ {
					dl := dAll * float32(sc[8*h+2*r+k])
					o := (*[16]float32)(y[128*h+32*r+16*k:])
					for l := 0; l < 16; l++ {
						v := int32(q[16*k+l] >> shift & 3)
						if hm[16*k+l]&m == 0 {
							v -= 4
						}
						o[l] = dl * float32(v)
					}
				}
			}
		}
	}
}

// packQ2 writes 256 2-bit levels (each 0..3) into qs as Q2_K and Q3_K store them: element
// 128h+32r+l goes to bits 2r..2r+1 of qs[32h+l].
func packQ2(L *[qkK]uint8, qs *[64]byte) {
	for h := 0; h < 2; h++ {
		Lh := (*[128]uint8)(L[128*h:])
		for l := 0; l < 32; l++ {
			qs[32*h+l] = Lh[l] | Lh[l+32]<<2 | Lh[l+64]<<4 | Lh[l+96]<<6
		}
	}
}

func quantQ2_K(src []float32, dst []byte) {
	var (
		L            [qkK]uint8
		laux         [16]uint8
		weights      [16]float32
		scales, mins [16]float32
	)
	for b := 0; b < len(src)/qkK; b++ {
		x := (*[qkK]float32)(src[b*qkK:])
		y := (*[q2_KBytes]byte)(dst[b*q2_KBytes:])
		// Subtracting the minimum keeps every scale positive.
		var maxScale, maxMin float32
		for j := 0; j < 16; j++ {
			xs := x[16*j : 16*j+16]
			for l, v := range xs {
				weights[l] = abs32(v)
			}
			scales[j], mins[j] = makeQKX2(3, xs, weights[:], L[16*j:16*j+16], laux[:], -0.5, 0.1, 15, true)
			if scales[j] > maxScale {
				maxScale = scales[j]
			}
			if mins[j] > maxMin {
				maxMin = mins[j]
			}
		}
		ysc := (*[16]byte)(y[0:])
		if maxScale > 0 {
			iscale := 15 / maxScale
			for j := range ysc {
				ysc[j] = byte(nearestInt(iscale * scales[j]))
			}
			put16(y[80:], F32ToF16(maxScale/15))
		} else {
			*ysc = [16]byte{}
			put16(y[80:], F32ToF16(0))
		}
		if maxMin > 0 {
			iscale := 15 / maxMin
			for j := range ysc {
				ysc[j] |= byte(nearestInt(iscale*mins[j]) << 4)
			}
			put16(y[82:], F32ToF16(maxMin/15))
		} else {
			put16(y[82:], F32ToF16(0))
		}
		dAll, mAll := f16at(y[80:]), f16at(y[82:])
		for j := 0; j < 16; j++ {
			d := dAll * float32(ysc[j]&0xf)
			if d == 0 {
				continue
			}
			dm := mAll * float32(ysc[j]>>4)
			for ii := 0; ii < 16; ii++ {
				L[16*j+ii] = uint8(clampI(nearestInt((x[16*j+ii]+dm)/d), 0, 3))
			}
		}
		packQ2(&L, (*[64]byte)(y[16:]))
	}
}

// makeQ3 is ggml's make_q3_quants with do_rmse set: it fits x ≈ scale*(L-nmax) with L in
// [0, 2*nmax-1], starting from scale max/-nmax and then moving single levels while that
// improves the x²-weighted fit (at most 5 passes). x, L: [n].
func makeQ3(nmax int32, x []float32, L []int8) float32 {
	L = L[:len(x)]
	mx, amax := maxAbs(x)
	if amax < groupMaxEps {
		clear(L)
		return 0
	}
	iscale := float32(-nmax) / mx
	var sumlx, suml2 float32
	for i, v := range x {
		l := clampI(nearestInt(iscale*v), -nmax, nmax-1)
		L[i] = int8(l)
		w := float32(v * v)
		fl := float32(l)
		sumlx += float32(float32(w*v) * fl)
		suml2 += float32(float32(w*fl) * fl)
	}
	for itry := 0; itry < 5; itry++ {
		changed := false
		for i, v := range x {
			w := float32(v * v)
			fl := float32(L[i])
			slx := sumlx - float32(float32(w*v)*fl)
			if slx > 0 {
				sl2 := suml2 - float32(float32(w*fl)*fl)
				newL := clampI(nearestInt(float32(v*sl2)/slx), -nmax, nmax-1)
				if newL != int32(L[i]) {
					fn := float32(newL)
					slx += float32(float32(w*v) * fn)
					sl2 += float32(float32(w*fn) * fn)
					if sl2 > 0 && float32(float32(slx*slx)*suml2) > float32(float32(sumlx*sumlx)*sl2) {
						L[i] = int8(newL)
						sumlx, suml2 = slx, sl2
						changed = true
					}
				}
			}
		}
		if !changed {
			break
		}
	}
	for i := range L {
		L[i] += int8(nmax)
	}
	return sumlx / suml2
}

func quantQ3_K(src []float32, dst []byte) {
	var (
		L      [qkK]int8
		U      [qkK]uint8
		scales [16]float32
	)
	for b := 0; b < len(src)/qkK; b++ {
		x := (*[qkK]float32)(src[b*qkK:])
		y := (*[q3_KBytes]byte)(dst[b*q3_KBytes:])
		var maxScale, amax float32
		for j := 0; j < 16; j++ {
			scales[j] = makeQ3(4, x[16*j:16*j+16], L[16*j:16*j+16])
			if a := abs32(scales[j]); a > amax {
				amax, maxScale = a, scales[j]
			}
		}
		ysc := (*[12]byte)(y[96:])
		*ysc = [12]byte{}
		if maxScale != 0 {
			iscale := -32 / maxScale
			for j := 0; j < 16; j++ {
				l := uint8(int8(clampI(int32(int8(nearestInt(iscale*scales[j]))), -32, 31)) + 32)
				if j < 8 {
					ysc[j] = l & 0xf
				} else {
					ysc[j-8] |= (l & 0xf) << 4
				}
				ysc[8+j%4] |= (l >> 4) << (2 * (j / 4))
			}
			put16(y[108:], F32ToF16(1/iscale))
		} else {
			put16(y[108:], F32ToF16(0))
		}
		dAll := f16at(y[108:])
		for j := 0; j < 16; j++ {
			d := dAll * float32(scaleK3(j, ysc)-32)
			if d == 0 {
				continue
			}
			for ii := 0; ii < 16; ii++ {
				L[16*j+ii] = int8(clampI(nearestInt(x[16*j+ii]/d), -4, 3) + 4)
			}
		}
		// The third bit of element j goes to bit j/32 of hmask[j%32]; qs keeps the low two.
		hm := (*[32]byte)(y[0:])
		*hm = [32]byte{}
		for j, l := range L {
			v := uint8(l)
			if v > 3 {
				hm[j%32] |= 1 << (j / 32)
				v -= 4
			}
			U[j] = v
		}
		packQ2(&U, (*[64]byte)(y[32:]))
	}
}
