package quant

import (
	"encoding/binary"
	"math"
)

func dequantF32(src []byte, dst []float32) {
	src = src[:4*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func quantF32(src []float32, dst []byte) {
	dst = dst[:4*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

func dequantF16(src []byte, dst []float32) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = f16Table[binary.LittleEndian.Uint16(src[2*i:])]
	}
}

func quantF16(src []float32, dst []byte) {
	dst = dst[:2*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
	}
}

func dequantBF16(src []byte, dst []float32) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

func quantBF16(src []float32, dst []byte) {
	dst = dst[:2*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
	}
}

// dotF32Go returns sum w[i]*x[i] over n float32 values; w and x hold at least 4n bytes.
func dotF32Go(n int, w, x []byte) float32 {
	w, x = w[:4*n], x[:4*n]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= n; i += 4 {
		a := w[4*i : 4*i+16 : 4*i+16]
		b := x[4*i : 4*i+16 : 4*i+16]
		s0 += math.Float32frombits(binary.LittleEndian.Uint32(a[0:])) * math.Float32frombits(binary.LittleEndian.Uint32(b[0:]))
		s1 += math.Float32frombits(binary.LittleEndian.Uint32(a[4:])) * math.Float32frombits(binary.LittleEndian.Uint32(b[4:]))
		s2 += math.Float32frombits(binary.LittleEndian.Uint32(a[8:])) * math.Float32frombits(binary.LittleEndian.Uint32(b[8:]))
		s3 += math.Float32frombits(binary.LittleEndian.Uint32(a[12:])) * math.Float32frombits(binary.LittleEndian.Uint32(b[12:]))
	}
	for ; i < n; i++ {
		s0 += math.Float32frombits(binary.LittleEndian.Uint32(w[4*i:])) * math.Float32frombits(binary.LittleEndian.Uint32(x[4*i:]))
	}
	return (s0 + s1) + (s2 + s3)
}

// dotF16Go returns sum w[i]*x[i] over n binary16 values; w and x hold at least 2n bytes.
func dotF16Go(n int, w, x []byte) float32 {
	w, x = w[:2*n], x[:2*n]
	t := f16Table
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= n; i += 4 {
		a := w[2*i : 2*i+8 : 2*i+8]
		b := x[2*i : 2*i+8 : 2*i+8]
		s0 += t[binary.LittleEndian.Uint16(a[0:])] * t[binary.LittleEndian.Uint16(b[0:])]
		s1 += t[binary.LittleEndian.Uint16(a[2:])] * t[binary.LittleEndian.Uint16(b[2:])]
		s2 += t[binary.LittleEndian.Uint16(a[4:])] * t[binary.LittleEndian.Uint16(b[4:])]
		s3 += t[binary.LittleEndian.Uint16(a[6:])] * t[binary.LittleEndian.Uint16(b[6:])]
	}
	for ; i < n; i++ {
		s0 += t[binary.LittleEndian.Uint16(w[2*i:])] * t[binary.LittleEndian.Uint16(x[2*i:])]
	}
	return (s0 + s1) + (s2 + s3)
}

// dotBF16Go returns sum w[i]*x[i] over n bfloat16 values; w and x hold at least 2n bytes.
func dotBF16Go(n int, w, x []byte) float32 {
	w, x = w[:2*n], x[:2*n]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= n; i += 4 {
		a := w[2*i : 2*i+8 : 2*i+8]
		b := x[2*i : 2*i+8 : 2*i+8]
		s0 += bf(a[0:]) * bf(b[0:])
		s1 += bf(a[2:]) * bf(b[2:])
		s2 += bf(a[4:]) * bf(b[4:])
		s3 += bf(a[6:]) * bf(b[6:])
	}
	for ; i < n; i++ {
		s0 += bf(w[2*i:]) * bf(x[2*i:])
	}
	return (s0 + s1) + (s2 + s3)
}

func bf(b []byte) float32 {
	return math.Float32frombits(uint32(binary.LittleEndian.Uint16(b)) << 16)
}
