package purego

import (
	"sync"

	"github.com/parleyhq/parley/runtime/quant"
)

// The attention kernels: pure Go here, replaced at init by assembly where the CPU allows
// (simd_amd64.go). Rows are [HeadDim] slices of the cache or of the query.

// simdKernels names the implementation of dot4, dot4F16, axpy4, axpy4F16, expSum and
// scaleRoundF16: "go", or "avx2" where the CPU has AVX2, FMA and F16C.
var simdKernels = "go"

// dot4 returns q·k0, q·k1, q·k2, q·k3; each k holds at least len(q) values.
var dot4 = dot4Go

// dot4F16 is dot4 for keys of F16 bits, summed as ggml's F16 dot product is on x86: the
// products of whole blocks of f16Block elements in float32, those of the rest in float64. Head
// sizes that are multiples of 32 are summed in float32 alone; smaller ones in float64.
var dot4F16 = dot4F16Go

// f16Block is the block of dot4F16's float32 sums.
const f16Block = 32

func dot4Go(q, k0, k1, k2, k3 []float32) (s0, s1, s2, s3 float32) {
	n := len(q)
	k0, k1, k2, k3 = k0[:n], k1[:n], k2[:n], k3[:n]
	for i, v := range q {
		s0 += v * k0[i]
		s1 += v * k1[i]
		s2 += v * k2[i]
		s3 += v * k3[i]
	}
	return
}

func dot4F16Go(q []float32, k0, k1, k2, k3 []uint16) (s0, s1, s2, s3 float32) {
	t := f16Table
	n := len(q)
	k0, k1, k2, k3 = k0[:n], k1[:n], k2[:n], k3[:n]
	m := n &^ (f16Block - 1)
	for i, v := range q[:m] {
		s0 += v * t[k0[i]]
		s1 += v * t[k1[i]]
		s2 += v * t[k2[i]]
		s3 += v * t[k3[i]]
	}
	return dot4F16Tail(q[m:], k0[m:], k1[m:], k2[m:], k3[m:], s0, s1, s2, s3)
}

// dot4F16Tail adds the products of q and the k to s0..s3 in float64, and returns the sums
// rounded to float32.
func dot4F16Tail(q []float32, k0, k1, k2, k3 []uint16, s0, s1, s2, s3 float32) (float32, float32, float32, float32) {
	t := f16Table
	n := len(q)
	k0, k1, k2, k3 = k0[:n], k1[:n], k2[:n], k3[:n]
	a0, a1, a2, a3 := float64(s0), float64(s1), float64(s2), float64(s3)
	for i, v := range q {
		a0 += float64(v * t[k0[i]])
		a1 += float64(v * t[k1[i]])
		a2 += float64(v * t[k2[i]])
		a3 += float64(v * t[k3[i]])
	}
	return float32(a0), float32(a1), float32(a2), float32(a3)
}

// axpy4 adds a·x0 + b·x1 + c·x2 + d·x3 to y; each x holds at least len(y) values.
var axpy4 = axpy4Go

// axpy4F16 is axpy4 for rows of F16 bits.
var axpy4F16 = axpy4F16Go

func axpy4Go(y []float32, a, b, c, d float32, x0, x1, x2, x3 []float32) {
	n := len(y)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	for i := range y {
		y[i] += a*x0[i] + b*x1[i] + c*x2[i] + d*x3[i]
	}
}

func axpy4F16Go(y []float32, a, b, c, d float32, x0, x1, x2, x3 []uint16) {
	t := f16Table
	n := len(y)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	for i := range y {
		y[i] += a*t[x0[i]] + b*t[x1[i]] + c*t[x2[i]] + d*t[x3[i]]
	}
}

// scaleRoundF16 sets dst[i] to src[i]·f rounded to F16 (to nearest, ties to even, as
// quant.F32ToF16), as float32; src holds at least len(dst) values and may be dst.
var scaleRoundF16 = scaleRoundF16Go

func scaleRoundF16Go(dst, src []float32, f float32) {
	t := f16Table
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] = t[quant.F32ToF16(v*f)]
	}
}

// expSum sets x[i] = exp(x[i] - m), with m at least every x[i], and returns the sum of the new
// x[i] in float64.
var expSum = expSumGo

func expSumGo(x []float32, m float32) float64 {
	sum := 0.0
	for i, v := range x {
		e := expf(v - m)
		x[i] = e
		sum += float64(e)
	}
	return sum
}

// scale32 multiplies y by f.
func scale32(y []float32, f float32) {
	for i := range y {
		y[i] *= f
	}
}

var (
	f16Once  sync.Once
	f16Table *[1 << 16]float32 // every F16 value as float32, made with the first F16 cache
)

func initF16Table() {
	t := new([1 << 16]float32)
	for h := range t {
		t[h] = quant.F16ToF32(uint16(h))
	}
	f16Table = t
}
