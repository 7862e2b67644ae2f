//go:build amd64 && !noasm

package quant

import "github.com/parleyhq/parley/runtime/tensor"

// AVX2+FMA+F16C kernels, chosen once at init when the CPU and OS support them: F32, F16,
// BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K weights. The other formats use the Go kernels.

// dotKernelSet names the kernels in use: "avx2" when init found the CPU features, else "go".
var dotKernelSet = "go"

func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
func xgetbv0() (eax, edx uint32)

// Assembly kernels over checked inputs. F32/F16 take n a multiple of 32 elements (n > 0);
// the quantized ones take nb > 0 blocks.

//go:noescape
func dotF32Asm(w, x *byte, n int) float32

//go:noescape
func dotF16Asm(w, x *byte, n int) float32

//go:noescape
func f32ToF16Asm(dst *byte, src *float32, n int)

//go:noescape
func dotBF16Asm(w, x *byte, n int) float32

//go:noescape
func dotQ5_KAsm(w, x *byte, nb int) float32

//go:noescape
func dotQ8_0Asm(w, x *byte, nb int) float32

//go:noescape
func dot4Q8_0Asm(w *byte, wRow, rows int, x *byte, xs, nb int, dst *float32, ds int)

//go:noescape
func dotQ4_0Asm(w, x *byte, nb int) float32

//go:noescape
func dot4Q4_0Asm(w *byte, wRow, rows int, x *byte, xs, nb int, dst *float32, ds int)

//go:noescape
func dotQ4_KAsm(w, x *byte, nb int) float32

//go:noescape
func dotQ6_KAsm(w, x *byte, nb int) float32

// hasAVX2 reports AVX2, FMA and F16C with the OS saving YMM state.
func hasAVX2() bool {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return false
	}
	_, _, c1, _ := cpuid(1, 0)
	const (
		fma     = 1 << 12
		osxsave = 1 << 27
		avx     = 1 << 28
		f16c    = 1 << 29
	)
	if c1&(fma|osxsave|avx|f16c) != fma|osxsave|avx|f16c {
		return false
	}
	if xcr0, _ := xgetbv0(); xcr0&6 != 6 { // XMM and YMM state enabled
		return false
	}
	_, b7, _, _ := cpuid(7, 0)
	return b7&(1<<5) != 0
}

func init() {
	if !hasAVX2() {
		return
	}
	dotF32Impl = dotF32AVX2
	dotF16Impl = dotF16AVX2
	dotQ8_0Impl = dotQ8_0AVX2
	dot4Q8_0Impl = dot4Q8_0AVX2
	dot4Q4_0Impl = dot4Q4_0AVX2
	dotQ4_0Impl = dotQ4_0AVX2
	dotQ4_KImpl = dotQ4_KAVX2
	dotQ6_KImpl = dotQ6_KAVX2
	dotBF16Impl = dotBF16AVX2
	dotQ5_KImpl = dotQ5_KAVX2
	dotKernelSet = "avx2"
	quantizers[tensor.F16] = quantF16AVX2
}

func dotF32AVX2(n int, w, x []byte) float32 {
	m := n &^ 31
	var s float32
	if m > 0 {
		s = dotF32Asm(&w[0], &x[0], m)
	}
	if m < n {
		s += dotF32Go(n-m, w[4*m:], x[4*m:])
	}
	return s
}

func dotF16AVX2(n int, w, x []byte) float32 {
	m := n &^ 31
	var s float32
	if m > 0 {
		s = dotF16Asm(&w[0], &x[0], m)
	}
	if m < n {
		s += dotF16Go(n-m, w[2*m:], x[2*m:])
	}
	return s
}

func dotQ8_0AVX2(nb int, w, x []byte) float32 {
	if nb == 0 {
		return 0
	}
	return dotQ8_0Asm(&w[0], &x[0], nb)
}

func dot4Q8_0AVX2(nb int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) {
	dot4Q8_0Asm(&w[0], wRow, rows, &x[0], xRow, nb, &dst[0], 4*ldd)
}

func dot4Q4_0AVX2(nb int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) {
	dot4Q4_0Asm(&w[0], wRow, rows, &x[0], xRow, nb, &dst[0], 4*ldd)
}

func dotQ4_0AVX2(nb int, w, x []byte) float32 {
	if nb == 0 {
		return 0
	}
	return dotQ4_0Asm(&w[0], &x[0], nb)
}

func dotQ4_KAVX2(nb int, w, x []byte) float32 {
	if nb == 0 {
		return 0
	}
	return dotQ4_KAsm(&w[0], &x[0], nb)
}

func dotQ6_KAVX2(nb int, w, x []byte) float32 {
	if nb == 0 {
		return 0
	}
	return dotQ6_KAsm(&w[0], &x[0], nb)
}

func dotBF16AVX2(n int, w, x []byte) float32 {
	m := n &^ 31
	var s float32
	if m > 0 {
		s = dotBF16Asm(&w[0], &x[0], m)
	}
	if m < n {
		s += dotBF16Go(n-m, w[2*m:], x[2*m:])
	}
	return s
}

func dotQ5_KAVX2(nb int, w, x []byte) float32 {
	if nb == 0 {
		return 0
	}
	return dotQ5_KAsm(&w[0], &x[0], nb)
}

func quantF16AVX2(src []float32, dst []byte) {
	m := len(src) &^ 7
	if m > 0 {
		f32ToF16Asm(&dst[0], &src[0], m)
	}
	quantF16(src[m:], dst[2*m:])
}
