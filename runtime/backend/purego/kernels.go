package purego

import (
	"sync"

	"github.com/parleyhq/parley/runtime/quant"
)

// The attention kernels: pure Go here, replaced at init by assembly where the CPU allows
// (simd_amd64.go). Rows are [HeadDim] slices of the cache or of the query.

// simdKernels names the implementation of dot4, dot4F16, axpy4, axpy4F16, scaleRoundF16,
// scores2, scores2F16, pv2, pv2F16 and gelu: "go", or "avx2" where the CPU has AVX2, FMA and F16C.
// Softmax exponentials come from internal/vec.
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

// dot4BF16 is dot4 for keys of BF16 bits, summed in float32.
func dot4BF16(q []float32, k0, k1, k2, k3 []uint16) (s0, s1, s2, s3 float32) {
	n := len(q)
	k0, k1, k2, k3 = k0[:n], k1[:n], k2[:n], k3[:n]
	for i, v := range q {
		s0 += v * quant.BF16ToF32(k0[i])
		s1 += v * quant.BF16ToF32(k1[i])
		s2 += v * quant.BF16ToF32(k2[i])
		s3 += v * quant.BF16ToF32(k3[i])
	}
	return
}

// axpy4BF16 is axpy4 for rows of BF16 bits.
func axpy4BF16(y []float32, a, b, c, d float32, x0, x1, x2, x3 []uint16) {
	n := len(y)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	for i := range y {
		y[i] += a*quant.BF16ToF32(x0[i]) + b*quant.BF16ToF32(x1[i]) + c*quant.BF16ToF32(x2[i]) + d*quant.BF16ToF32(x3[i])
	}
}

// scaleRoundBF16 is scaleRoundF16 rounding to BF16 (to nearest, ties to even, as
// quant.F32ToBF16).
func scaleRoundBF16(dst, src []float32, f float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] = quant.BF16ToF32(quant.F32ToBF16(v * f))
	}
}

// scale32 multiplies y by f.
func scale32(y []float32, f float32) {
	for i := range y {
		y[i] *= f
	}
}

// The kernels of FullAttention's blocked path, for head sizes that are multiples of pvWidth.

// scores2 sets s0[j] = scale·(q0·k_j) and s1[j] = scale·(q1·k_j) for j < nk, a multiple of 4,
// where k_j = k[j*kstride : j*kstride+len(q0)]; len(q0) = len(q1) is a multiple of 8. q0 and q1
// may be the same row, and s0 and s1 then the same scores.
var scores2 = scores2Go

// scores2F16 is scores2 for keys of F16 bits, summed in float32.
var scores2F16 = scores2F16Go

// pvWidth is the number of output elements pv2 and pv2F16 update.
const pvWidth = 32

// pv2 adds Σ_{j<nk} p0[j]·v_j to o0 and Σ_{j<nk} p1[j]·v_j to o1, v_j =
// v[j*vstride : j*vstride+pvWidth]. o0 and o1 may be the same row if p0 and p1 are the same
// weights (both sums are then the same).
var pv2 = pv2Go

// pv2F16 is pv2 for values of F16 bits.
var pv2F16 = pv2F16Go

func scores2Go(q0, q1, k []float32, kstride, nk int, scale float32, s0, s1 []float32) {
	hd := len(q0)
	q1 = q1[:hd]
	for j := 0; j < nk; j++ {
		kj := k[j*kstride : j*kstride+hd]
		var a, b float32
		for d, kv := range kj {
			a += q0[d] * kv
			b += q1[d] * kv
		}
		s0[j], s1[j] = scale*a, scale*b
	}
}

func scores2F16Go(q0, q1 []float32, k []uint16, kstride, nk int, scale float32, s0, s1 []float32) {
	t := f16Table
	hd := len(q0)
	q1 = q1[:hd]
	for j := 0; j < nk; j++ {
		kj := k[j*kstride : j*kstride+hd]
		var a, b float32
		for d, kh := range kj {
			kv := t[kh]
			a += q0[d] * kv
			b += q1[d] * kv
		}
		s0[j], s1[j] = scale*a, scale*b
	}
}

func pv2Go(o0, o1, p0, p1, v []float32, vstride, nk int) {
	var a, b [pvWidth]float32
	copy(a[:], o0[:pvWidth])
	copy(b[:], o1[:pvWidth])
	for j := 0; j < nk; j++ {
		vj := v[j*vstride : j*vstride+pvWidth]
		f, g := p0[j], p1[j]
		for d, x := range vj {
			a[d] += f * x
			b[d] += g * x
		}
	}
	copy(o0, a[:])
	copy(o1, b[:])
}

func pv2F16Go(o0, o1, p0, p1 []float32, v []uint16, vstride, nk int) {
	t := f16Table
	var a, b [pvWidth]float32
	copy(a[:], o0[:pvWidth])
	copy(b[:], o1[:pvWidth])
	for j := 0; j < nk; j++ {
		vj := v[j*vstride : j*vstride+pvWidth]
		f, g := p0[j], p1[j]
		for d, h := range vj {
			x := t[h]
			a[d] += f * x
			b[d] += g * x
		}
	}
	copy(o0, a[:])
	copy(o1, b[:])
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
