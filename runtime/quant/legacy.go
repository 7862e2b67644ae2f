package quant

import "math"

// Legacy 32-element block formats (ggml-common.h). Multi-byte fields are little-endian.
//
//	Q4_0 [18]: d f16 | qs[16]                    x = d*(q-8), q = qs[j]&15 (j<16), qs[j-16]>>4
//	Q4_1 [20]: d f16 | m f16 | qs[16]            x = d*q + m
//	Q5_0 [22]: d f16 | qh u32 | qs[16]           x = d*(q-16), q = nibble | (qh>>j&1)<<4
//	Q5_1 [24]: d f16 | m f16 | qh u32 | qs[16]   x = d*q + m (q as Q5_0)
//	Q8_0 [34]: d f16 | qs[32] int8               x = d*q
//	Q8_1 [36]: d f16 | s f16 | qs[32]            x = d*q, s = d*sum(q)
const (
	qk         = 32
	q4_0Bytes  = 18
	q4_1Bytes  = 20
	q5_0Bytes  = 22
	q5_1Bytes  = 24
	q8_0Bytes  = 34
	q8_1Bytes  = 36
	float32Max = math.MaxFloat32
)

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// absMaxSigned returns the largest |v| in x and the v with that magnitude (first one wins).
func absMaxSigned(x []float32) (amax, vmax float32) {
	for _, v := range x {
		if a := abs32(v); amax < a {
			amax, vmax = a, v
		}
	}
	return amax, vmax
}

// minMax returns the smallest and largest values of x (±MaxFloat32 bounds, as ggml starts).
func minMax(x []float32) (lo, hi float32) {
	lo, hi = float32Max, -float32Max
	for _, v := range x {
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	return lo, hi
}

func recip(d float32) float32 {
	if d != 0 {
		return 1 / d
	}
	return 0
}

func quantQ4_0(src []float32, dst []byte) {
	for b := 0; b < len(src)/qk; b++ {
		x := (*[qk]float32)(src[b*qk:])
		y := (*[q4_0Bytes]byte)(dst[b*q4_0Bytes:])
		_, vmax := absMaxSigned(x[:])
		d := vmax / -8
		id := recip(d)
		put16(y[0:], F32ToF16(d))
		for j := 0; j < 16; j++ {
			// float32() keeps each product rounded on its own, as in C, so no FMA is formed.
			x0 := int32(float32(x[j]*id) + 8.5)
			x1 := int32(float32(x[j+16]*id) + 8.5)
			y[2+j] = byte(min(15, int32(int8(x0)))) | byte(min(15, int32(int8(x1))))<<4
		}
	}
}

func dequantQ4_0(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qk; b++ {
		x := (*[q4_0Bytes]byte)(src[b*q4_0Bytes:])
		y := (*[qk]float32)(dst[b*qk:])
		d := f16at(x[0:])
		for j := 0; j < 16; j++ {
			q := x[2+j]
			y[j] = float32(int32(q&15)-8) * d
			y[j+16] = float32(int32(q>>4)-8) * d
		}
	}
}

func quantQ4_1(src []float32, dst []byte) {
	for b := 0; b < len(src)/qk; b++ {
		x := (*[qk]float32)(src[b*qk:])
		y := (*[q4_1Bytes]byte)(dst[b*q4_1Bytes:])
		mn, mx := minMax(x[:])
		d := (mx - mn) / 15
		id := recip(d)
		put16(y[0:], F32ToF16(d))
		put16(y[2:], F32ToF16(mn))
		for j := 0; j < 16; j++ {
			x0 := int32(float32((x[j]-mn)*id) + 0.5)
			x1 := int32(float32((x[j+16]-mn)*id) + 0.5)
			y[4+j] = byte(min(15, int32(int8(x0)))) | byte(min(15, int32(int8(x1))))<<4
		}
	}
}

func dequantQ4_1(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qk; b++ {
		x := (*[q4_1Bytes]byte)(src[b*q4_1Bytes:])
		y := (*[qk]float32)(dst[b*qk:])
		d, m := f16at(x[0:]), f16at(x[2:])
		for j := 0; j < 16; j++ {
			q := x[4+j]
			y[j] = float32(float32(q&15)*d) + m
			y[j+16] = float32(float32(q>>4)*d) + m
		}
	}
}

func quantQ5_0(src []float32, dst []byte) {
	for b := 0; b < len(src)/qk; b++ {
		x := (*[qk]float32)(src[b*qk:])
		y := (*[q5_0Bytes]byte)(dst[b*q5_0Bytes:])
		_, vmax := absMaxSigned(x[:])
		d := vmax / -16
		id := recip(d)
		put16(y[0:], F32ToF16(d))
		var qh uint32
		for j := 0; j < 16; j++ {
			x0 := uint32(byte(min(31, int32(int8(int32(float32(x[j]*id)+16.5))))))
			x1 := uint32(byte(min(31, int32(int8(int32(float32(x[j+16]*id)+16.5))))))
			y[6+j] = byte(x0&15) | byte(x1&15)<<4
			qh |= (x0 >> 4 & 1) << j
			qh |= (x1 >> 4 & 1) << (j + 16)
		}
		y[2], y[3], y[4], y[5] = byte(qh), byte(qh>>8), byte(qh>>16), byte(qh>>24)
	}
}

func dequantQ5_0(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qk; b++ {
		x := (*[q5_0Bytes]byte)(src[b*q5_0Bytes:])
		y := (*[qk]float32)(dst[b*qk:])
		d := f16at(x[0:])
		qh := uint32(x[2]) | uint32(x[3])<<8 | uint32(x[4])<<16 | uint32(x[5])<<24
		for j := 0; j < 16; j++ {
			q := x[6+j]
			h0 := int32(qh>>j&1) << 4
			h1 := int32(qh>>(j+16)&1) << 4
			y[j] = float32((int32(q&15)|h0)-16) * d
			y[j+16] = float32((int32(q>>4)|h1)-16) * d
		}
	}
}

func quantQ5_1(src []float32, dst []byte) {
	for b := 0; b < len(src)/qk; b++ {
		x := (*[qk]float32)(src[b*qk:])
		y := (*[q5_1Bytes]byte)(dst[b*q5_1Bytes:])
		mn, mx := minMax(x[:])
		d := (mx - mn) / 31
		id := recip(d)
		put16(y[0:], F32ToF16(d))
		put16(y[2:], F32ToF16(mn))
		var qh uint32
		for j := 0; j < 16; j++ {
			x0 := uint32(byte(int32(float32((x[j]-mn)*id) + 0.5)))
			x1 := uint32(byte(int32(float32((x[j+16]-mn)*id) + 0.5)))
			y[8+j] = byte(x0&15) | byte(x1&15)<<4
			qh |= (x0 >> 4 & 1) << j
			qh |= (x1 >> 4 & 1) << (j + 16)
		}
		y[4], y[5], y[6], y[7] = byte(qh), byte(qh>>8), byte(qh>>16), byte(qh>>24)
	}
}

func dequantQ5_1(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qk; b++ {
		x := (*[q5_1Bytes]byte)(src[b*q5_1Bytes:])
		y := (*[qk]float32)(dst[b*qk:])
		d, m := f16at(x[0:]), f16at(x[2:])
		qh := uint32(x[4]) | uint32(x[5])<<8 | uint32(x[6])<<16 | uint32(x[7])<<24
		for j := 0; j < 16; j++ {
			q := x[8+j]
			h0 := uint32(qh>>j&1) << 4
			h1 := uint32(qh>>(j+16)&1) << 4
			y[j] = float32(float32(uint32(q&15)|h0)*d) + m
			y[j+16] = float32(float32(uint32(q>>4)|h1)*d) + m
		}
	}
}

// roundAway rounds half away from zero, as C's roundf: in float64, v ± 0.5 is exact for every
// float32 v below 2^29 in magnitude, and truncation then gives roundf's result.
func roundAway(v float32) int32 {
	f := float64(v)
	return int32(f + math.Copysign(0.5, f))
}

// quantQ8Block writes round(x/d) into qs and returns d = amax/127 and sum(qs).
func quantQ8Block(x *[qk]float32, qs *[qk]byte) (d float32, sum int32) {
	var amax float32
	for _, v := range x {
		if a := abs32(v); !(amax > a) { // C's MAX(amax, a), NaN included
			amax = a
		}
	}
	d = amax / 127
	id := recip(d)
	for j, v := range x {
		q := int8(roundAway(v * id))
		qs[j] = byte(q)
		sum += int32(q)
	}
	return d, sum
}

func quantQ8_0(src []float32, dst []byte) {
	for b := 0; b < len(src)/qk; b++ {
		y := (*[q8_0Bytes]byte)(dst[b*q8_0Bytes:])
		d, _ := quantQ8Block((*[qk]float32)(src[b*qk:]), (*[qk]byte)(y[2:]))
		put16(y[0:], F32ToF16(d))
	}
}

func dequantQ8_0(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qk; b++ {
		x := (*[q8_0Bytes]byte)(src[b*q8_0Bytes:])
		y := (*[qk]float32)(dst[b*qk:])
		d := f16at(x[0:])
		for j := range y {
			y[j] = float32(int8(x[2+j])) * d
		}
	}
}

func quantQ8_1(src []float32, dst []byte) {
	for b := 0; b < len(src)/qk; b++ {
		y := (*[q8_1Bytes]byte)(dst[b*q8_1Bytes:])
		d, sum := quantQ8Block((*[qk]float32)(src[b*qk:]), (*[qk]byte)(y[4:]))
		put16(y[0:], F32ToF16(d))
		put16(y[2:], F32ToF16(float32(sum)*d))
	}
}

func dequantQ8_1(src []byte, dst []float32) {
	for b := 0; b < len(dst)/qk; b++ {
		x := (*[q8_1Bytes]byte)(src[b*q8_1Bytes:])
		y := (*[qk]float32)(dst[b*qk:])
		d := f16at(x[0:])
		for j := range y {
			y[j] = float32(int8(x[4+j])) * d
		}
	}
}
