//go:build amd64 && !noasm

package vec

import "golang.org/x/sys/cpu"

//go:noescape
func expSumAVX2(x *float32, n int, m float32) float64

func init() {
	if !cpu.X86.HasAVX2 || !cpu.X86.HasFMA {
		return
	}
	expSum = func(x []float32, m float32) float64 {
		n := len(x)
		k := n &^ 7
		sum := 0.0
		if k > 0 {
			sum = expSumAVX2(&x[0], k, m)
		}
		if k < n {
			sum += expSumGo(x[k:], m)
		}
		return sum
	}
	Kernels = "avx2"
}
