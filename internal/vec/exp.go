// Package vec holds the float32 vector routines that more than one package's hot loops share:
// e^x in float32, a sum of exponentials, the maximum of a row, the first place of a value and
// one vector's dot products with strided rows, in Go and, where the CPU has AVX2 and FMA, in
// assembly.
package vec

import "math"

// Kernels names the implementation ExpSum uses: "avx2" or "go".
var Kernels = "go"

// Expf returns e^x within a few float32 ulp: 0 where the result would be below the smallest
// normal float32 (x < -87.33654), +Inf above the largest.
func Expf(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
		round = 12582912 // 1.5·2^23: adding it rounds to an integer
	)
	if x < -87.33654 {
		return 0
	}
	if x > 88.72283 {
		return float32(math.Inf(1))
	}
	kf := x*log2e + round
	kf -= round
	r := x - kf*ln2hi - kf*ln2lo
	// e^r on |r| <= ln2/2 by its Taylor polynomial of degree 7 (truncation below 6e-9).
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720+r*(1.0/5040)))))))
	k := int32(kf)
	if k > 127 {
		return p * 2 * math.Float32frombits(uint32(127+127)<<23)
	}
	return p * math.Float32frombits(uint32(k+127)<<23)
}

// ExpSum sets x[i] = e^(x[i]-m), with m at least every x[i] (-Inf gives 0), and returns the sum
// of the new x[i] in float64.
func ExpSum(x []float32, m float32) float64 { return expSum(x, m) }

// SumExp returns the sum of e^(x[i]-m) in float64, as ExpSum does, leaving x as it is.
func SumExp(x []float32, m float32) float64 { return sumExp(x, m) }

var (
	expSum = expSumGo
	sumExp = sumExpGo
)

func sumExpGo(x []float32, m float32) float64 {
	sum := 0.0
	for _, v := range x {
		sum += float64(Expf(v - m))
	}
	return sum
}

func expSumGo(x []float32, m float32) float64 {
	sum := 0.0
	for i, v := range x {
		e := Expf(v - m)
		x[i] = e
		sum += float64(e)
	}
	return sum
}
