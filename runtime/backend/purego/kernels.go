package purego

import (
	"sync"

	"github.com/parleyhq/parley/runtime/quant"
)

// The attention kernels: pure Go here, replaced at init by assembly where the CPU allows
// (simd_amd64.go). Rows are [HeadDim] slices of the cache or of the query.

// simdKernels names the implementation of dot4, dot4F16, axpy4 and axpy4F16: "go", or "avx2"
// where the CPU has AVX2, FMA and F16C.
var simdKernels = "go"

// dot4 returns q·k0, q·k1, q·k2, q·k3; each k holds at least len(q) values.
var dot4 = dot4Go

// dot4F16 is dot4 for keys of F16 bits.
var dot4F16 = dot4F16Go

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
	for i, v := range q {
		s0 += v * t[k0[i]]
		s1 += v * t[k1[i]]
		s2 += v * t[k2[i]]
		s3 += v * t[k3[i]]
	}
	return
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
