package vec

import "math"

var negInf = float32(math.Inf(-1))

// Max returns the largest element of x (-Inf for an empty x, and the sign of a zero maximum
// unspecified) and whether x holds a NaN, which Max otherwise ignores.
func Max(x []float32) (m float32, nan bool) { return maxf(x) }

// Index returns the first i with x[i] == v (so -0 and +0 match each other), or -1.
func Index(x []float32, v float32) int { return index(x, v) }

var (
	maxf  = maxGo
	index = indexGo
)

func maxGo(x []float32) (float32, bool) {
	m, nan := negInf, false
	for _, v := range x {
		if v > m {
			m = v
		} else if v != v {
			nan = true
		}
	}
	return m, nan
}

func indexGo(x []float32, v float32) int {
	for i, e := range x {
		if e == v {
			return i
		}
	}
	return -1
}
