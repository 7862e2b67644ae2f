//go:build amd64 && !noasm

package purego

func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
func xgetbv0() (eax, edx uint32)

//go:noescape
func axpy4F16AVX2(y *float32, f *[4]float32, x0, x1, x2, x3 *uint16, n int)

//go:noescape
func axpy4F32AVX2(y *float32, f *[4]float32, x0, x1, x2, x3 *float32, n int)

//go:noescape
func scaleRoundF16AVX2(dst, src *float32, f float32, n int)

//go:noescape
func dot4F16AVX2(q *float32, k0, k1, k2, k3 *uint16, n int, out *[4]float32)

//go:noescape
func dot4F32AVX2(q *float32, k0, k1, k2, k3 *float32, n int, out *[4]float32)

//go:noescape
func scores2F32AVX2(q0, q1, k *float32, kstride, nk, hd int, scale float32, s0, s1 *float32)

//go:noescape
func scores2F16AVX2(q0, q1 *float32, k *uint16, kstride, nk, hd int, scale float32, s0, s1 *float32)

//go:noescape
func pv2F32AVX2(o0, o1, p0, p1, v *float32, vstride, nk int)

//go:noescape
func pv2F16AVX2(o0, o1, p0, p1 *float32, v *uint16, vstride, nk int)

//go:noescape
func geluAVX2(y, x *float32, n int)

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
	if xcr0, _ := xgetbv0(); xcr0&6 != 6 {
		return false
	}
	_, b7, _, _ := cpuid(7, 0)
	return b7&(1<<5) != 0
}

func init() {
	if !hasAVX2() {
		return
	}
	axpy4 = func(y []float32, a, b, c, d float32, x0, x1, x2, x3 []float32) {
		f := [4]float32{a, b, c, d}
		n := len(y)
		x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
		m := n &^ 7
		if m > 0 {
			axpy4F32AVX2(&y[0], &f, &x0[0], &x1[0], &x2[0], &x3[0], m)
		}
		if m < n {
			axpy4Go(y[m:], a, b, c, d, x0[m:], x1[m:], x2[m:], x3[m:])
		}
	}
	axpy4F16 = func(y []float32, a, b, c, d float32, x0, x1, x2, x3 []uint16) {
		f := [4]float32{a, b, c, d}
		n := len(y)
		x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
		m := n &^ 7
		if m > 0 {
			axpy4F16AVX2(&y[0], &f, &x0[0], &x1[0], &x2[0], &x3[0], m)
		}
		if m < n {
			axpy4F16Go(y[m:], a, b, c, d, x0[m:], x1[m:], x2[m:], x3[m:])
		}
	}
	dot4 = func(q, k0, k1, k2, k3 []float32) (s0, s1, s2, s3 float32) {
		n := len(q)
		k0, k1, k2, k3 = k0[:n], k1[:n], k2[:n], k3[:n]
		m := n &^ 7
		var out [4]float32
		if m > 0 {
			dot4F32AVX2(&q[0], &k0[0], &k1[0], &k2[0], &k3[0], m, &out)
		}
		if m < n {
			t0, t1, t2, t3 := dot4Go(q[m:], k0[m:], k1[m:], k2[m:], k3[m:])
			out[0], out[1], out[2], out[3] = out[0]+t0, out[1]+t1, out[2]+t2, out[3]+t3
		}
		return out[0], out[1], out[2], out[3]
	}
	dot4F16 = func(q []float32, k0, k1, k2, k3 []uint16) (s0, s1, s2, s3 float32) {
		n := len(q)
		k0, k1, k2, k3 = k0[:n], k1[:n], k2[:n], k3[:n]
		m := n &^ (f16Block - 1)
		var out [4]float32
		if m > 0 {
			dot4F16AVX2(&q[0], &k0[0], &k1[0], &k2[0], &k3[0], m, &out)
		}
		if m == n {
			return out[0], out[1], out[2], out[3]
		}
		return dot4F16Tail(q[m:], k0[m:], k1[m:], k2[m:], k3[m:], out[0], out[1], out[2], out[3])
	}
	scaleRoundF16 = func(dst, src []float32, f float32) {
		n := len(dst)
		src = src[:n]
		m := n &^ 7
		if m > 0 {
			scaleRoundF16AVX2(&dst[0], &src[0], f, m)
		}
		if m < n {
			scaleRoundF16Go(dst[m:], src[m:], f)
		}
	}
	scores2 = func(q0, q1, k []float32, kstride, nk int, scale float32, s0, s1 []float32) {
		hd := len(q0)
		if nk <= 0 || hd <= 0 {
			return
		}
		_, _, _, _ = q1[hd-1], k[(nk-1)*kstride+hd-1], s0[nk-1], s1[nk-1]
		scores2F32AVX2(&q0[0], &q1[0], &k[0], kstride, nk, hd, scale, &s0[0], &s1[0])
	}
	scores2F16 = func(q0, q1 []float32, k []uint16, kstride, nk int, scale float32, s0, s1 []float32) {
		hd := len(q0)
		if nk <= 0 || hd <= 0 {
			return
		}
		_, _, _, _ = q1[hd-1], k[(nk-1)*kstride+hd-1], s0[nk-1], s1[nk-1]
		scores2F16AVX2(&q0[0], &q1[0], &k[0], kstride, nk, hd, scale, &s0[0], &s1[0])
	}
	pv2 = func(o0, o1, p0, p1, v []float32, vstride, nk int) {
		if nk <= 0 {
			return
		}
		_, _, _, _, _ = o0[pvWidth-1], o1[pvWidth-1], p0[nk-1], p1[nk-1], v[(nk-1)*vstride+pvWidth-1]
		pv2F32AVX2(&o0[0], &o1[0], &p0[0], &p1[0], &v[0], vstride, nk)
	}
	pv2F16 = func(o0, o1, p0, p1 []float32, v []uint16, vstride, nk int) {
		if nk <= 0 {
			return
		}
		_, _, _, _, _ = o0[pvWidth-1], o1[pvWidth-1], p0[nk-1], p1[nk-1], v[(nk-1)*vstride+pvWidth-1]
		pv2F16AVX2(&o0[0], &o1[0], &p0[0], &p1[0], &v[0], vstride, nk)
	}
	gelu = func(y, x []float32) {
		n := len(x)
		y = y[:n]
		m := n &^ 7
		if m > 0 {
			geluAVX2(&y[0], &x[0], m)
		}
		if m < n {
			geluGo(y[m:], x[m:])
		}
	}
	simdKernels = "avx2"
}
