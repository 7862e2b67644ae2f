package quant

import (
	"encoding/binary"
	"math"
	"math/rand"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Reference decoders written from the block layouts alone, in float64, element by element.
// refDecode returns each element as a sum of a scaled part and an offset part (the offset is
// the Q4_1/Q5_1 min or the K-quant -dmin*m; zero elsewhere), so tolerances can be set from the
// magnitudes a kernel actually adds.

// refHalf decodes binary16 by its definition.
func refHalf(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>10) & 31
	m := float64(h & 1023)
	switch e {
	case 0:
		return sign * m * math.Ldexp(1, -24)
	case 31:
		if m != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * (1 + m/1024) * math.Ldexp(1, e-15)
}

func refBF16(h uint16) float64 { return float64(math.Float32frombits(uint32(h) << 16)) }

func u16at(b []byte, o int) uint16 { return binary.LittleEndian.Uint16(b[o:]) }

func refDecode(dt tensor.DType, src []byte, n int) (scaled, offset []float64) {
	scaled, offset = make([]float64, n), make([]float64, n)
	bs, ts := dt.BlockSize(), dt.TypeSize()
	for e := 0; e < n; e++ {
		b := src[(e/bs)*ts : (e/bs+1)*ts]
		j := e % bs
		nib := func(qs []byte) int { return int(qs[j%16]>>(4*(j/16))) & 15 } // legacy nibble
		switch dt {
		case tensor.F32:
			scaled[e] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
		case tensor.F16:
			scaled[e] = refHalf(u16at(b, 0))
		case tensor.BF16:
			scaled[e] = refBF16(u16at(b, 0))
		case tensor.Q4_0:
			scaled[e] = refHalf(u16at(b, 0)) * float64(nib(b[2:])-8)
		case tensor.Q4_1:
			scaled[e] = refHalf(u16at(b, 0)) * float64(nib(b[4:]))
			offset[e] = refHalf(u16at(b, 2))
		case tensor.Q5_0:
			h := int(binary.LittleEndian.Uint32(b[2:])>>j) & 1
			scaled[e] = refHalf(u16at(b, 0)) * float64(nib(b[6:])+16*h-16)
		case tensor.Q5_1:
			h := int(binary.LittleEndian.Uint32(b[4:])>>j) & 1
			scaled[e] = refHalf(u16at(b, 0)) * float64(nib(b[8:])+16*h)
			offset[e] = refHalf(u16at(b, 2))
		case tensor.Q8_0:
			scaled[e] = refHalf(u16at(b, 0)) * float64(int8(b[2+j]))
		case tensor.Q8_1:
			scaled[e] = refHalf(u16at(b, 0)) * float64(int8(b[4+j]))
		case tensor.Q4_K, tensor.Q5_K:
			sc, m := refScaleMin(b[4:16], j/32)
			var q int
			if dt == tensor.Q4_K {
				q = int(b[16+32*(j/64)+j%32]>>(4*(j%64/32))) & 15
			} else {
				q = int(b[48+32*(j/64)+j%32]>>(4*(j%64/32)))&15 + 16*(int(b[16+j%32]>>(j/32))&1)
			}
			scaled[e] = refHalf(u16at(b, 0)) * float64(sc) * float64(q)
			offset[e] = -refHalf(u16at(b, 2)) * float64(m)
		case tensor.Q2_K, tensor.Q3_K:
			// Element j is bits 2r..2r+1 of byte l of half h's 32 qs bytes, with
			// j = 128h + 32r + l; sub-block j/16 has its own scale.
			h, r, l, s := j/128, j%128/32, j%32, j/16
			if dt == tensor.Q2_K {
				q := int(b[16+32*h+l]>>(2*r)) & 3
				scaled[e] = refHalf(u16at(b, 80)) * float64(b[s]&15) * float64(q)
				offset[e] = -refHalf(u16at(b, 82)) * float64(b[s]>>4)
				break
			}
			// Q3_K: the third bit is bit j/32 of hmask[j%32], set meaning no -4; the 6-bit
			// scale is a low nibble of byte s (s<8) or a high nibble of byte s-8, with two high
			// bits from byte 8+s%4 at bit 2*(s/4), all in the 12 bytes from offset 96.
			q := int(b[32+32*h+l]>>(2*r))&3 + 4*(int(b[l]>>(j/32))&1) - 4
			var sc byte
			if s < 8 {
				sc = b[96+s] & 15
			} else {
				sc = b[96+s-8] >> 4
			}
			sc |= (b[104+s%4] >> (2 * (s / 4)) & 3) << 4
			scaled[e] = refHalf(u16at(b, 108)) * float64(int(sc)-32) * float64(q)
		case tensor.IQ4_NL:
			// Code j is the low nibble of qs[j] (j<16) or the high nibble of qs[j-16]; it
			// stands for the level kv[code].
			q := nib(b[2:])
			scaled[e] = refHalf(u16at(b, 0)) * float64(refIQ4Levels[q])
		case tensor.IQ4_XS:
			// Sub-block s = j/32 is laid out as one IQ4_NL block's codes in the 16 bytes from
			// 8+16s; its 6-bit scale is nibble s%2 of byte 4+s/2 with bits 2s..2s+1 of the
			// 16-bit field at offset 2 above them, offset by -32.
			s, jj := j/32, j%32
			q := int(b[8+16*s+jj%16]>>(4*(jj/16))) & 15
			ls := int(b[4+s/2]>>(4*(s%2)))&15 | int(u16at(b, 2)>>(2*s)&3)<<4
			scaled[e] = refHalf(u16at(b, 0)) * float64(ls-32) * float64(refIQ4Levels[q])
		case tensor.Q6_K:
			h, r := j/128, j%128
			qt, l := r/32, r%32
			lo := int(b[64*h+l+32*(qt&1)]>>(4*(qt>>1))) & 15
			hi := int(b[128+32*h+l]>>(2*qt)) & 3
			sc := float64(int8(b[192+j/16]))
			scaled[e] = refHalf(u16at(b, 208)) * sc * float64(lo+16*hi-32)
		case tensor.Q8_K:
			d := float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
			scaled[e] = d * float64(int8(b[4+j]))
		default:
			panic("refDecode: " + dt.String())
		}
	}
	return scaled, offset
}

// refIQ4Levels are the 16 levels of the IQ4_NL and IQ4_XS codes (ggml-common.h, kvalues_iq4nl).
var refIQ4Levels = [16]int{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// refScaleMin decodes the 6-bit scale and min of K sub-block s from the 12 packed bytes: the
// first four of each are the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); the last four
// take 4 low bits from bytes 8-11 (scale low nibble, min high nibble) and 2 high bits from the
// top of bytes 0-3 (scales) and 4-7 (mins).
func refScaleMin(p []byte, s int) (sc, m int) {
	if s < 4 {
		return int(p[s] & 63), int(p[s+4] & 63)
	}
	sc = int(p[s+4]&15) | int(p[s-4]>>6)<<4
	m = int(p[s+4]>>4) | int(p[s]>>6)<<4
	return sc, m
}

// randHalf returns a random finite binary16 with magnitude in [2^(lo-15), 2^(hi-15)).
func randHalf(r *rand.Rand, lo, hi int, signed bool) uint16 {
	h := uint16(lo+r.Intn(hi-lo))<<10 | uint16(r.Intn(1024))
	if signed && r.Intn(2) == 0 {
		h |= 0x8000
	}
	return h
}

// randQ8 returns a random int8 quant in [-127, 127], the range ggml's quantizers produce.
func randQ8(r *rand.Rand) byte { return byte(int8(r.Intn(255) - 127)) }

// randBlocks returns nb random blocks of dt: random quant bits and finite scales of moderate
// size (weights ~ 2^-6..2^1, activations larger), with Q8_1 s and Q8_K bsums consistent with
// the quants, as the quantizers write them.
func randBlocks(r *rand.Rand, dt tensor.DType, nb int) []byte {
	ts := dt.TypeSize()
	out := make([]byte, nb*ts)
	r.Read(out)
	for b := 0; b < nb; b++ {
		y := out[b*ts : (b+1)*ts]
		switch dt {
		case tensor.F16:
			binary.LittleEndian.PutUint16(y, randHalf(r, 8, 17, true))
		case tensor.BF16:
			binary.LittleEndian.PutUint16(y, F32ToBF16(float32(r.NormFloat64())))
		case tensor.F32:
			binary.LittleEndian.PutUint32(y, math.Float32bits(float32(r.NormFloat64())))
		case tensor.Q4_0, tensor.Q5_0:
			binary.LittleEndian.PutUint16(y, randHalf(r, 9, 16, true))
		case tensor.Q4_1, tensor.Q5_1:
			binary.LittleEndian.PutUint16(y, randHalf(r, 9, 14, false))
			binary.LittleEndian.PutUint16(y[2:], randHalf(r, 9, 16, true))
		case tensor.Q8_0, tensor.Q8_1:
			off := 2
			if dt == tensor.Q8_1 {
				off = 4
			}
			d := randHalf(r, 9, 16, true)
			binary.LittleEndian.PutUint16(y, d)
			sum := 0
			for j := range 32 {
				y[off+j] = randQ8(r)
				sum += int(int8(y[off+j]))
			}
			if dt == tensor.Q8_1 {
				binary.LittleEndian.PutUint16(y[2:], F32ToF16(float32(sum)*F16ToF32(d)))
			}
		case tensor.Q4_K, tensor.Q5_K:
			binary.LittleEndian.PutUint16(y, randHalf(r, 5, 10, false))
			binary.LittleEndian.PutUint16(y[2:], randHalf(r, 5, 10, false))
		case tensor.Q2_K:
			binary.LittleEndian.PutUint16(y[80:], randHalf(r, 5, 10, false))
			binary.LittleEndian.PutUint16(y[82:], randHalf(r, 5, 10, false))
		case tensor.Q3_K:
			binary.LittleEndian.PutUint16(y[108:], randHalf(r, 3, 8, true))
		case tensor.Q6_K:
			binary.LittleEndian.PutUint16(y[208:], randHalf(r, 3, 8, true))
		case tensor.IQ4_NL:
			binary.LittleEndian.PutUint16(y, randHalf(r, 3, 8, true))
		case tensor.IQ4_XS:
			binary.LittleEndian.PutUint16(y, randHalf(r, 1, 6, true))
		case tensor.Q8_K:
			binary.LittleEndian.PutUint32(y, math.Float32bits(float32(r.NormFloat64()*0.05)))
			for g := range 16 {
				sum := 0
				for j := range 16 {
					y[4+16*g+j] = randQ8(r)
					sum += int(int8(y[4+16*g+j]))
				}
				binary.LittleEndian.PutUint16(y[260+2*g:], uint16(int16(sum)))
			}
		}
	}
	return out
}

// randFloats returns n seeded values of a mixed distribution: mostly Gaussian with a few
// larger outliers, never all zero.
func randFloats(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		v := r.NormFloat64()
		if r.Intn(50) == 0 {
			v *= 6
		}
		x[i] = float32(v * scale)
	}
	return x
}

var allTypes = []tensor.DType{
	tensor.F32, tensor.F16, tensor.BF16, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1,
	tensor.Q8_0, tensor.Q8_1, tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K,
	tensor.Q8_K, tensor.IQ4_NL, tensor.IQ4_XS,
}

var dotTypes = []tensor.DType{
	tensor.F32, tensor.F16, tensor.BF16, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1,
	tensor.Q8_0, tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K, tensor.IQ4_NL,
	tensor.IQ4_XS,
}
