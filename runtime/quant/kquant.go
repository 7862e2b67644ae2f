package quant

import (
	"encoding/binary"
	"math"
)

// K-quant 256-element super-block formats (ggml-common.h). Multi-byte fields are little-endian.
//
//	Q4_K [144]: d f16 | dmin f16 | scales[12] | qs[128]
//	            8 sub-blocks of 32; x = d*sc*q - dmin*m, sc and m 6-bit (packing: scaleMinK4)
//	Q5_K [176]: d f16 | dmin f16 | scales[12] | qh[32] | qs[128]   as Q4_K with a 5th bit in qh
//	Q6_K [210]: ql[128] | qh[64] | scales[16] int8 | d f16
//	            16 sub-blocks of 16; x = d*sc*(q-32), q = 4 low bits from ql, 2 high from qh
//	Q8_K [292]: d f32 | qs[256] int8 | bsums[16] int16 (sum of each 16 qs)
const (
	qkK       = 256
	q4_KBytes = 144
	q5_KBytes = 176
	q6_KBytes = 210
	q8_KBytes = 292
)

// groupMaxEps is ggml's threshold below which a group counts as all zeros.
const groupMaxEps = 1e-15

// nearestInt rounds f to the nearest integer, ties to even, valid for |f| <= 4194303, by the
// same float trick as ggml (adding 1.5*2^23 and reading the low mantissa bits).
func nearestInt(f float32) int32 {
	val := float32(f) + 12582912 // float32() keeps f rounded: no FMA with a preceding product
	return int32(math.Float32bits(val)&0x007fffff) - 0x00400000
}

func clampI(v, lo, hi int32) int32 { return max(lo, min(hi, v)) }

// scaleMinK4 returns the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes:
// j<4: sc = q[j]&63, m = q[j+4]&63; j>=4: low 4 bits from q[j+4], high 2 bits from the top
// bits of q[j-4] (scale) and q[j] (min).
func scaleMinK4(j int, q *[12]byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// makeQKX2 is ggml's make_qkx2_quants: it fits x ≈ scale*L - theMin with L in [0, nmax],
// minimising the weighted squared (or absolute, useMad) error over a grid of nstep+1 trial
// scales. x, weights, L, laux: [n].
func makeQKX2(nmax int32, x, weights []float32, L, laux []uint8, rmin, rdelta float32, nstep int, useMad bool) (scale, theMin float32) {
	n := len(x)
	weights, L, laux = weights[:n], L[:n], laux[:n]
	mn, mx := x[0], x[0]
	sumW := weights[0]
	sumX := float32(sumW * x[0])
	for i := 1; i < n; i++ {
		if x[i] < mn {
			mn = x[i]
		}
		if x[i] > mx {
			mx = x[i]
		}
		w := weights[i]
		sumW += w
		sumX += float32(w * x[i])
	}
	if mn > 0 {
		mn = 0
	}
	if mx == mn {
		for i := range L {
			L[i] = 0
		}
		return 0, -mn
	}
	iscale := float32(nmax) / (mx - mn)
	scale = 1 / iscale
	var bestError float32
	for i := range x {
		l := nearestInt(iscale * (x[i] - mn))
		L[i] = uint8(clampI(l, 0, nmax))
		diff := float32(scale*float32(L[i])) + mn - x[i]
		if useMad {
			diff = abs32(diff)
		} else {
			diff = float32(diff * diff)
		}
		bestError += float32(weights[i] * diff)
	}
	if nstep < 1 {
		return scale, -mn
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + float32(nmax)) / (mx - mn)
		var sumL, sumL2, sumXL float32
		for i := range x {
			l := clampI(nearestInt(iscale*(x[i]-mn)), 0, nmax)
			laux[i] = uint8(l)
			fl := float32(l)
			wl := float32(weights[i] * fl)
			sumL += wl
			sumL2 += float32(wl * fl)
			sumXL += float32(wl * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var curError float32
			for i := range x {
				diff := float32(thisScale*float32(laux[i])) + thisMin - x[i]
				if useMad {
					diff = abs32(diff)
				} else {
					diff = float32(diff * diff)
				}
				curError += float32(weights[i] * diff)
			}
			if curError < bestError {
				copy(L, laux)
				bestError = curError
				scale = thisScale
				mn = thisMin
			}
		}
	}
	return scale, -mn
}

// maxAbs returns the element of x with the largest magnitude (the first of equals) and that
// magnitude, as ggml's quantisers find them.
func maxAbs(x []float32) (mx, amax float32) {
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	return mx, amax
}

// makeQX is ggml's make_qx_quants with rmse_type 1 and no importance weights: it fits
// x ≈ scale*(L-nmax) with L in [0, 2*nmax-1], weighting each element by x², trying 19 scales
// around nmax/max. x, L: [n].
func makeQX(nmax int32, x []float32, L []int8) float32 {
	L = L[:len(x)]
	mx, amax := maxAbs(x)
	if amax < groupMaxEps {
		clear(L)
		return 0
	}
	fnmax := float32(nmax)
	iscale := -fnmax / mx
	var sumlx, suml2 float32
	for i, v := range x {
		l := clampI(nearestInt(iscale*v), -nmax, nmax-1)
		L[i] = int8(l + nmax)
		w := float32(v * v)
		fl := float32(l)
		sumlx += float32(float32(w*v) * fl)
		suml2 += float32(float32(w*fl) * fl)
	}
	var scale float32
	if suml2 != 0 {
		scale = sumlx / suml2
	}
	best := float32(scale * sumlx)
	for is := int32(-9); is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(fnmax + float32(0.1*float32(is))) / mx
		sumlx, suml2 = 0, 0
		for _, v := range x {
			l := clampI(nearestInt(iscale*v), -nmax, nmax-1)
			w := float32(v * v)
			fl := float32(l)
			sumlx += float32(float32(w*v) * fl)
			suml2 += float32(float32(w*fl) * fl)
		}
		if suml2 > 0 && float32(sumlx*sumlx) > float32(best*suml2) {
			for i, v := range x {
				L[i] = int8(nmax + clampI(nearestInt(iscale*v), -nmax, nmax-1))
			}
			scale = sumlx / suml2
			best = float32(scale * sumlx)
		}
	}
	return scale
}

func sqrt32(v float32) float32 { return float32(math.Sqrt(float64(v))) }

// quantKMins runs the shared part of the Q4_K and Q5_K reference quantizers for one super-block:
// per-sub-block scale/min fits, their 6-bit packing into scales, the f16 super-scales, and the
// final levels L (0..nmax). x, L: [256].
func quantKMins(x *[qkK]float32, nmax int32, rmin float32, nstep int, hdr *[4]byte, scales *[12]byte, L *[qkK]uint8) {
	var (
		weights  [32]float32
		laux     [32]uint8
		sc, mins [8]float32
		maxScale float32
		maxMin   float32
	)
	for j := 0; j < 8; j++ {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		avX := sqrt32(sumX2 / 32)
		for l, v := range xs {
			weights[l] = avX + abs32(v)
		}
		sc[j], mins[j] = makeQKX2(nmax, xs, weights[:], L[32*j:32*j+32], laux[:], rmin, 0.1, nstep, false)
		if sc[j] > maxScale {
			maxScale = sc[j]
		}
		if mins[j] > maxMin {
			maxMin = mins[j]
		}
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	*scales = [12]byte{}
	for j := 0; j < 8; j++ {
		ls := min(63, uint8(nearestInt(invScale*sc[j])))
		lm := min(63, uint8(nearestInt(invMin*mins[j])))
		if j < 4 {
			scales[j] = ls
			scales[j+4] = lm
		} else {
			scales[j+4] = ls&0xf | (lm&0xf)<<4
			scales[j-4] |= (ls >> 4) << 6
			scales[j] |= (lm >> 4) << 6
		}
	}
	put16(hdr[0:], F32ToF16(maxScale/63))
	put16(hdr[2:], F32ToF16(maxMin/63))
	dAll, mAll := f16at(hdr[0:]), f16at(hdr[2:])
	for j := 0; j < 8; j++ {
		s, m := scaleMinK4(j, scales)
		d := dAll * float32(s)
		if d == 0 {
			continue
		}
		dm := mAll * float32(m)
		for ii := 0; ii < 32; ii++ {
			L[32*j+ii] = uint8(clampI(nearestInt((x[32*j+ii]+dm)/d), 0, nmax))
		}
	}
}

func quantQ4_K(src []float32, dst []byte) {
	var L [qkK]uint8
	for b := 0; b < len(src)/qkK; b++ {
		x := (*[qkK]float32)(src[b*qkK:])
		y := (*[q4_KBytes]byte)(dst[b*q4_KBytes:])
		quantKMins(x, 15, -1, 20, (*[4]byte)(y[0:]), (*[12]byte)(y[4:]), &L)
		q := y[16:]
		for j := 0; j < qkK; j += 64 {
			for l := 0; l < 32; l++ {
				q[l] = L[j+l] | L[j+l+32]<<4
			}
			q = q[32:]
		}
	}
}

func dequantQ4_K(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qkK; b++ {
		x := (*[q4_KBytes]byte)(src[b*q4_KBytes:])
		y := (*[qkK]float32)(dst[b*qkK:])
		d, dmin := f16at(x[0:]), f16at(x[2:])
		scales := (*[12]byte)(x[4:])
		for c := 0; c < 4; c++ {
			s0, m0 := scaleMinK4(2*c, scales)
			s1, m1 := scaleMinK4(2*c+1, scales)
			d0, dm0 := d*float32(s0), dmin*float32(m0)
			d1, dm1 := d*float32(s1), dmin*float32(m1)
			q := (*[32]byte)(x[16+32*c:])
			o := (*[64]float32)(y[64*c:])
			for l := 0; l < 32; l++ {
				o[l] = float32(d0*float32(q[l]&0xf)) - dm0
				o[l+32] = float32(d1*float32(q[l]>>4)) - dm1
			}
		}
	}
}

func quantQ5_K(src []float32, dst []byte) {
	var L [qkK]uint8
	for b := 0; b < len(src)/qkK; b++ {
		x := (*[qkK]float32)(src[b*qkK:])
		y := (*[q5_KBytes]byte)(dst[b*q5_KBytes:])
		quantKMins(x, 31, -0.5, 15, (*[4]byte)(y[0:]), (*[12]byte)(y[4:]), &L)
		qh := (*[32]byte)(y[16:])
		*qh = [32]byte{}
		ql := y[48:]
		m1, m2 := uint8(1), uint8(2)
		for n := 0; n < qkK; n += 64 {
			for j := 0; j < 32; j++ {
				l1, l2 := L[n+j], L[n+j+32]
				if l1 > 15 {
					l1 -= 16
					qh[j] |= m1
				}
				if l2 > 15 {
					l2 -= 16
					qh[j] |= m2
				}
				ql[j] = l1 | l2<<4
			}
			m1 <<= 2
			m2 <<= 2
			ql = ql[32:]
		}
	}
}

func dequantQ5_K(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qkK; b++ {
		x := (*[q5_KBytes]byte)(src[b*q5_KBytes:])
		y := (*[qkK]float32)(dst[b*qkK:])
		d, dmin := f16at(x[0:]), f16at(x[2:])
		scales := (*[12]byte)(x[4:])
		qh := (*[32]byte)(x[16:])
		for c := 0; c < 4; c++ {
			s0, m0 := scaleMinK4(2*c, scales)
			s1, m1 := scaleMinK4(2*c+1, scales)
			d0, dm0 := d*float32(s0), dmin*float32(m0)
			d1, dm1 := d*float32(s1), dmin*float32(m1)
			q := (*[32]byte)(x[48+32*c:])
			o := (*[64]float32)(y[64*c:])
			u0, u1 := uint(2*c), uint(2*c+1)
			for l := 0; l < 32; l++ {
				o[l] = float32(d0*float32(q[l]&0xf|(qh[l]>>u0&1)<<4)) - dm0
				o[l+32] = float32(d1*float32(q[l]>>4|(qh[l]>>u1&1)<<4)) - dm1
			}
		}
	}
}

func quantQ6_K(src []float32, dst []byte) {
	var L [qkK]int8
	var scales [16]float32
	for b := 0; b < len(src)/qkK; b++ {
		x := (*[qkK]float32)(src[b*qkK:])
		y := (*[q6_KBytes]byte)(dst[b*q6_KBytes:])
		var maxScale, maxAbsScale float32
		for ib := 0; ib < 16; ib++ {
			s := makeQX(32, x[16*ib:16*ib+16], L[16*ib:16*ib+16])
			scales[ib] = s
			if a := abs32(s); a > maxAbsScale {
				maxAbsScale, maxScale = a, s
			}
		}
		if maxAbsScale < groupMaxEps {
			*y = [q6_KBytes]byte{}
			continue
		}
		iscale := -128 / maxScale
		put16(y[208:], F32ToF16(1/iscale))
		ysc := (*[16]byte)(y[192:])
		for ib := 0; ib < 16; ib++ {
			ysc[ib] = byte(int8(min(127, nearestInt(iscale*scales[ib]))))
		}
		dAll := f16at(y[208:])
		for j := 0; j < 16; j++ {
			d := dAll * float32(int8(ysc[j]))
			if d == 0 {
				continue
			}
			for ii := 0; ii < 16; ii++ {
				L[16*j+ii] = int8(clampI(nearestInt(x[16*j+ii]/d), -32, 31) + 32)
			}
		}
		for h := 0; h < 2; h++ {
			ql := (*[64]byte)(y[64*h:])
			qh := (*[32]byte)(y[128+32*h:])
			Lh := (*[128]int8)(L[128*h:])
			for l := 0; l < 32; l++ {
				a, b, c, e := uint8(Lh[l]), uint8(Lh[l+32]), uint8(Lh[l+64]), uint8(Lh[l+96])
				ql[l] = a&0xf | (c&0xf)<<4
				ql[l+32] = b&0xf | (e&0xf)<<4
				qh[l] = a>>4 | (b>>4)<<2 | (c>>4)<<4 | (e>>4)<<6
			}
		}
	}
}

func dequantQ6_K(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qkK; b++ {
		x := (*[q6_KBytes]byte)(src[b*q6_KBytes:])
		y := (*[qkK]float32)(dst[b*qkK:])
		d := f16at(x[208:])
		for h := 0; h < 2; h++ {
			ql := (*[64]byte)(x[64*h:])
			qh := (*[32]byte)(x[128+32*h:])
			sc := (*[8]byte)(x[192+8*h:])
			o := (*[128]float32)(y[128*h:])
			for l := 0; l < 32; l++ {
				is := l / 16
				q1 := int32(ql[l]&0xf|(qh[l]&3)<<4) - 32
				q2 := int32(ql[l+32]&0xf|(qh[l]>>2&3)<<4) - 32
				q3 := int32(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
				q4 := int32(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
				o[l] = d * float32(int8(sc[is])) * float32(q1)
				o[l+32] = d * float32(int8(sc[is+2])) * float32(q2)
				o[l+64] = d * float32(int8(sc[is+4])) * float32(q3)
				o[l+96] = d * float32(int8(sc[is+6])) * float32(q4)
			}
		}
	}
}

func quantQ8_K(src []float32, dst []byte) {
	for b := 0; b < len(src)/qkK; b++ {
		x := (*[qkK]float32)(src[b*qkK:])
		y := (*[q8_KBytes]byte)(dst[b*q8_KBytes:])
		mx, amax := maxAbs(x[:])
		if amax == 0 {
			*y = [q8_KBytes]byte{}
			continue
		}
		iscale := -127 / mx
		qs := (*[qkK]byte)(y[4:])
		for g := 0; g < 16; g++ {
			xs := (*[16]float32)(x[16*g:])
			q := (*[16]byte)(qs[16*g:])
			var sum int32
			for j, v := range xs {
				l := min(127, nearestInt(iscale*v))
				q[j] = byte(int8(l))
				sum += int32(int8(l))
			}
			binary.LittleEndian.PutUint16(y[260+2*g:], uint16(int16(sum)))
		}
		binary.LittleEndian.PutUint32(y[0:], math.Float32bits(1/iscale))
	}
}

func dequantQ8_K(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qkK; b++ {
		x := (*[q8_KBytes]byte)(src[b*q8_KBytes:])
		y := (*[qkK]float32)(dst[b*qkK:])
		d := math.Float32frombits(binary.LittleEndian.Uint32(x[0:]))
		for j := range y {
			y[j] = d * float32(int8(x[4+j]))
		}
	}
}
