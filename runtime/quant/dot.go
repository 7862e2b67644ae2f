package quant

import (
	"encoding/binary"
	"math"
)

// Each exported kernel checks its arguments once per row and hands a block count to the
// implementation chosen at init (pure Go, or assembly where the CPU allows). A kernel called
// with n not a whole number of blocks, or with w or x shorter than n elements need, returns
// NaN. Bytes past those needed are not read.

var nan32 = float32(math.NaN())

// rowBlocks returns n/bs if n is a non-negative multiple of bs and w, x hold nb blocks of
// wsz and xsz bytes.
func rowBlocks(n, bs, wsz, xsz int, w, x []byte) (int, bool) {
	if n < 0 || n%bs != 0 {
		return 0, false
	}
	nb := n / bs
	if nb > len(w)/wsz || nb > len(x)/xsz {
		return 0, false
	}
	return nb, true
}

// Implementations: element count (F32/F16/BF16) or block count (others), checked inputs.
var (
	dotF32Impl   = dotF32Go
	dotF16Impl   = dotF16Go
	dotQ8_0Impl  = dotQ8_0Go
	dotQ4_0Impl  = dotQ4_0Go
	dotQ4_KImpl  = dotQ4_KGo
	dotQ6_KImpl  = dotQ6_KGo
	dotBF16Impl  = dotBF16Go
	dotQ4_1Impl  = dotQ4_1Go
	dotQ5_0Impl  = dotQ5_0Go
	dotQ5_1Impl  = dotQ5_1Go
	dotQ5_KImpl  = dotQ5_KGo
	dotKernelSet = "go"
)

func dotF32(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, 1, 4, 4, w, x)
	if !ok {
		return nan32
	}
	return dotF32Impl(nb, w, x)
}

func dotF16(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, 1, 2, 2, w, x)
	if !ok {
		return nan32
	}
	return dotF16Impl(nb, w, x)
}

func dotBF16(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, 1, 2, 2, w, x)
	if !ok {
		return nan32
	}
	return dotBF16Impl(nb, w, x)
}

func dotQ4_0(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, q4_0Bytes, q8_0Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ4_0Impl(nb, w, x)
}

func dotQ4_1(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, q4_1Bytes, q8_1Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ4_1Impl(nb, w, x)
}

func dotQ5_0(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, q5_0Bytes, q8_0Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ5_0Impl(nb, w, x)
}

func dotQ5_1(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, q5_1Bytes, q8_1Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ5_1Impl(nb, w, x)
}

func dotQ8_0(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, q8_0Bytes, q8_0Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ8_0Impl(nb, w, x)
}

func dotQ4_K(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qkK, q4_KBytes, q8_KBytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ4_KImpl(nb, w, x)
}

func dotQ5_K(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qkK, q5_KBytes, q8_KBytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ5_KImpl(nb, w, x)
}

func dotQ6_K(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qkK, q6_KBytes, q8_KBytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ6_KImpl(nb, w, x)
}

// i8 reinterprets a byte as a signed 8-bit integer widened to int32.
func i8(b byte) int32 { return int32(int8(b)) }

// sumI8 returns the sum of 32 signed bytes.
func sumI8(q *[32]byte) int32 {
	var s int32
	for i := 0; i < 32; i += 4 {
		s += i8(q[i]) + i8(q[i+1]) + i8(q[i+2]) + i8(q[i+3])
	}
	return s
}

// Legacy formats: per block, an integer dot of 32 quants, then one float scale.

func dotQ8_0Go(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q8_0Bytes]byte)(w[b*q8_0Bytes:])
		xb := (*[q8_0Bytes]byte)(x[b*q8_0Bytes:])
		var s0, s1 int32
		for j := 2; j < q8_0Bytes; j += 4 {
			s0 += i8(wb[j])*i8(xb[j]) + i8(wb[j+1])*i8(xb[j+1])
			s1 += i8(wb[j+2])*i8(xb[j+2]) + i8(wb[j+3])*i8(xb[j+3])
		}
		sum += float32(s0+s1) * (f16at(wb[0:]) * f16at(xb[0:]))
	}
	return sum
}

// nib4 returns sum_j (q[j]&15)*y[j] + (q[j]>>4)*y[j+16] over one 16-byte nibble array.
func nib4(q *[16]byte, y *[32]byte) int32 {
	var s0, s1 int32
	for j := 0; j < 16; j += 2 {
		a, b := q[j], q[j+1]
		s0 += int32(a&15)*i8(y[j]) + int32(b&15)*i8(y[j+1])
		s1 += int32(a>>4)*i8(y[j+16]) + int32(b>>4)*i8(y[j+17])
	}
	return s0 + s1
}

func dotQ4_0Go(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q4_0Bytes]byte)(w[b*q4_0Bytes:])
		xb := (*[q8_0Bytes]byte)(x[b*q8_0Bytes:])
		ys := (*[32]byte)(xb[2:])
		s := nib4((*[16]byte)(wb[2:]), ys) - 8*sumI8(ys)
		sum += float32(s) * (f16at(wb[0:]) * f16at(xb[0:]))
	}
	return sum
}

func dotQ4_1Go(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q4_1Bytes]byte)(w[b*q4_1Bytes:])
		xb := (*[q8_1Bytes]byte)(x[b*q8_1Bytes:])
		s := nib4((*[16]byte)(wb[4:]), (*[32]byte)(xb[4:]))
		sum += float32(s)*(f16at(wb[0:])*f16at(xb[0:])) + f16at(wb[2:])*f16at(xb[2:])
	}
	return sum
}

// hbits returns sum of y[j] over the set bits j of qh.
func hbits(qh uint32, y *[32]byte) int32 {
	var s int32
	for j := 0; j < 32; j += 4 {
		s += int32(qh>>j&1)*i8(y[j]) + int32(qh>>(j+1)&1)*i8(y[j+1]) +
			int32(qh>>(j+2)&1)*i8(y[j+2]) + int32(qh>>(j+3)&1)*i8(y[j+3])
	}
	return s
}

func dotQ5_0Go(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q5_0Bytes]byte)(w[b*q5_0Bytes:])
		xb := (*[q8_0Bytes]byte)(x[b*q8_0Bytes:])
		ys := (*[32]byte)(xb[2:])
		qh := binary.LittleEndian.Uint32(wb[2:])
		s := nib4((*[16]byte)(wb[6:]), ys) + 16*hbits(qh, ys) - 16*sumI8(ys)
		sum += float32(s) * (f16at(wb[0:]) * f16at(xb[0:]))
	}
	return sum
}

func dotQ5_1Go(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q5_1Bytes]byte)(w[b*q5_1Bytes:])
		xb := (*[q8_1Bytes]byte)(x[b*q8_1Bytes:])
		ys := (*[32]byte)(xb[4:])
		qh := binary.LittleEndian.Uint32(wb[4:])
		s := nib4((*[16]byte)(wb[8:]), ys) + 16*hbits(qh, ys)
		sum += float32(s)*(f16at(wb[0:])*f16at(xb[0:])) + f16at(wb[2:])*f16at(xb[2:])
	}
	return sum
}

// K formats: per super-block, integer dots per sub-block weighted by the integer sub-scales,
// mins through the Q8_K group sums, then one float scale (d) and one float min scale (dmin).

// unpackScalesK4 expands the 12 packed bytes of Q4_K/Q5_K into 8 scales and 8 mins.
func unpackScalesK4(p *[12]byte) (sc, m [8]int32) {
	for j := 0; j < 4; j++ {
		sc[j] = int32(p[j] & 63)
		m[j] = int32(p[j+4] & 63)
		sc[j+4] = int32(p[j+8]&0xf | (p[j]>>6)<<4)
		m[j+4] = int32(p[j+8]>>4 | (p[j+4]>>6)<<4)
	}
	return
}

// bsum returns the int16 group sum g (0..15) of a Q8_K block.
func bsum(y *[q8_KBytes]byte, g int) int32 {
	return int32(int16(binary.LittleEndian.Uint16(y[260+2*g:])))
}

func dotQ4_KGo(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q4_KBytes]byte)(w[b*q4_KBytes:])
		xb := (*[q8_KBytes]byte)(x[b*q8_KBytes:])
		sc, m := unpackScalesK4((*[12]byte)(wb[4:]))
		var smin, sq int32
		for j := 0; j < 8; j++ {
			smin += m[j] * (bsum(xb, 2*j) + bsum(xb, 2*j+1))
		}
		for c := 0; c < 4; c++ {
			q := (*[32]byte)(wb[16+32*c:])
			y0 := (*[32]byte)(xb[4+64*c:])
			y1 := (*[32]byte)(xb[36+64*c:])
			var s0, s1 int32
			for l := 0; l < 32; l += 2 {
				a, e := q[l], q[l+1]
				s0 += int32(a&15)*i8(y0[l]) + int32(e&15)*i8(y0[l+1])
				s1 += int32(a>>4)*i8(y1[l]) + int32(e>>4)*i8(y1[l+1])
			}
			sq += sc[2*c]*s0 + sc[2*c+1]*s1
		}
		dy := math.Float32frombits(binary.LittleEndian.Uint32(xb[0:]))
		sum += f16at(wb[0:])*dy*float32(sq) - f16at(wb[2:])*dy*float32(smin)
	}
	return sum
}

func dotQ5_KGo(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q5_KBytes]byte)(w[b*q5_KBytes:])
		xb := (*[q8_KBytes]byte)(x[b*q8_KBytes:])
		sc, m := unpackScalesK4((*[12]byte)(wb[4:]))
		qh := (*[32]byte)(wb[16:])
		var smin, sq int32
		for j := 0; j < 8; j++ {
			smin += m[j] * (bsum(xb, 2*j) + bsum(xb, 2*j+1))
		}
		for c := 0; c < 4; c++ {
			q := (*[32]byte)(wb[48+32*c:])
			y0 := (*[32]byte)(xb[4+64*c:])
			y1 := (*[32]byte)(xb[36+64*c:])
			u0, u1 := uint(2*c), uint(2*c+1)
			var s0, s1 int32
			for l := 0; l < 32; l++ {
				a, h := q[l], qh[l]
				s0 += int32(a&15|(h>>u0&1)<<4) * i8(y0[l])
				s1 += int32(a>>4|(h>>u1&1)<<4) * i8(y1[l])
			}
			sq += sc[2*c]*s0 + sc[2*c+1]*s1
		}
		dy := math.Float32frombits(binary.LittleEndian.Uint32(xb[0:]))
		sum += f16at(wb[0:])*dy*float32(sq) - f16at(wb[2:])*dy*float32(smin)
	}
	return sum
}

func dotQ6_KGo(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q6_KBytes]byte)(w[b*q6_KBytes:])
		xb := (*[q8_KBytes]byte)(x[b*q8_KBytes:])
		sc := (*[16]byte)(wb[192:])
		var sq, soff int32
		for g := 0; g < 16; g++ {
			soff += i8(sc[g]) * bsum(xb, g)
		}
		for h := 0; h < 2; h++ {
			ql := (*[64]byte)(wb[64*h:])
			qh := (*[32]byte)(wb[128+32*h:])
			y := (*[128]byte)(xb[4+128*h:])
			s := (*[8]byte)(sc[8*h:])
			for half := 0; half < 2; half++ {
				var s0, s1, s2, s3 int32
				for l := 16 * half; l < 16*half+16; l++ {
					a, e, hh := ql[l], ql[l+32], qh[l]
					s0 += int32(a&15|(hh&3)<<4) * i8(y[l])
					s1 += int32(e&15|(hh>>2&3)<<4) * i8(y[l+32])
					s2 += int32(a>>4|(hh>>4&3)<<4) * i8(y[l+64])
					s3 += int32(e>>4|(hh>>6)<<4) * i8(y[l+96])
				}
				sq += i8(s[half])*s0 + i8(s[half+2])*s1 + i8(s[half+4])*s2 + i8(s[half+6])*s3
			}
		}
		dy := math.Float32frombits(binary.LittleEndian.Uint32(xb[0:]))
		sum += f16at(wb[208:]) * dy * float32(sq-32*soff)
	}
	return sum
}
