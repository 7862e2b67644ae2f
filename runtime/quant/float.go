package quant

import (
	"encoding/binary"
	"math"
	"unsafe"
)

func dequantF32(src []byte, dst []float32) {
	if littleEndian && len(dst) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), 4*len(dst)), src)
		return
	}
	src = src[:4*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func quantF32(src []float32, dst []byte) {
	if littleEndian && len(src) > 0 {
		copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(src))), 4*len(src)))
		return
	}
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

// littleEndian reports whether float32 values can be read in place from little-endian bytes.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// f32View returns the first n float32 values of b in place, if b is 4-byte aligned and the
// machine little-endian (GGUF data is 32-byte aligned, so weights normally are); b holds at
// least 4n bytes.
func f32View(b []byte, n int) ([]float32, bool) {
	if n == 0 || !littleEndian {
		return nil, false
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(p), n), true
}

// dotF32Go returns sum w[i]*x[i] over n float32 values; w and x hold at least 4n bytes.
// Reading the values in place (with eight partial sums) is about 1.4x faster than decoding
// each one from bytes, which moves it through an integer register.
func dotF32Go(n int, w, x []byte) float32 {
	a, ok1 := f32View(w, n)
	b, ok2 := f32View(x, n)
	if !ok1 || !ok2 {
		return dotF32Bytes(n, w, x)
	}
	var s0, s1, s2, s3, s4, s5, s6, s7 float32
	i := 0
	for ; i+8 <= n; i += 8 {
		p, q := (*[8]float32)(a[i:]), (*[8]float32)(b[i:])
		s0 += p[0] * q[0]
		s1 += p[1] * q[1]
		s2 += p[2] * q[2]
		s3 += p[3] * q[3]
		s4 += p[4] * q[4]
		s5 += p[5] * q[5]
		s6 += p[6] * q[6]
		s7 += p[7] * q[7]
	}
	for ; i < n; i++ {
		s0 += a[i] * b[i]
	}
	return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
}

// dotF32Bytes is dotF32Go for unaligned rows or big-endian machines.
func dotF32Bytes(n int, w, x []byte) float32 {
	w, x = w[:4*n], x[:4*n]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= n; i += 4 {
		a := w[4*i : 4*i+16 : 4*i+16]
		b := x[4*i : 4*i+16 : 4*i+16]
		s0 += f32at(a[0:]) * f32at(b[0:])
		s1 += f32at(a[4:]) * f32at(b[4:])
		s2 += f32at(a[8:]) * f32at(b[8:])
		s3 += f32at(a[12:]) * f32at(b[12:])
	}
	for ; i < n; i++ {
		s0 += f32at(w[4*i:]) * f32at(x[4*i:])
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
