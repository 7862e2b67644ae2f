//go:build amd64 && !noasm

package vec

import "golang.org/x/sys/cpu"

//go:noescape
func expSumAVX2(x *float32, n int, m float32, store bool) float64

//go:noescape
func maxAVX(x *float32, n int) (m float32, nan bool)

//go:noescape
func indexAVX(x *float32, n int, v float32) int

//go:noescape
func dotsAVX2(dst, q, k *float32, hd, stride, n int)

// sumAVX2 is ExpSum (store) or SumExp: whole vectors in assembly, the rest in Go.
func sumAVX2(x []float32, m float32, store bool) float64 {
	k := len(x) &^ 7
	sum := 0.0
	if k > 0 {
		sum = expSumAVX2(&x[0], k, m, store)
	}
	if k < len(x) {
		if store {
			sum += expSumGo(x[k:], m)
		} else {
			sum += sumExpGo(x[k:], m)
		}
	}
	return sum
}

func init() {
	if !cpu.X86.HasAVX2 || !cpu.X86.HasFMA {
		return
	}
	expSum = func(x []float32, m float32) float64 { return sumAVX2(x, m, true) }
	sumExp = func(x []float32, m float32) float64 { return sumAVX2(x, m, false) }
	maxf = func(x []float32) (float32, bool) {
		k := len(x) &^ 31
		if k == 0 {
			return maxGo(x)
		}
		m, nan := maxAVX(&x[0], k)
		if k < len(x) {
			m2, nan2 := maxGo(x[k:])
			m, nan = max(m, m2), nan || nan2
		}
		return m, nan
	}
	index = func(x []float32, v float32) int {
		k := len(x) &^ 7
		if k > 0 {
			if i := indexAVX(&x[0], k, v); i >= 0 {
				return i
			}
		}
		if i := indexGo(x[k:], v); i >= 0 {
			return k + i
		}
		return -1
	}
	dots = func(dst, q, k []float32, stride int) {
		if len(q)%16 != 0 || len(q) == 0 {
			dotsGo(dst, q, k, stride)
			return
		}
		dotsAVX2(&dst[0], &q[0], &k[0], len(q), stride, len(dst))
	}
	Kernels = "avx2"
}
