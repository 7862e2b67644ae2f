package audio

import (
	"math"
	"math/rand/v2"
	"testing"
)

// naivePower is |DFT(x)[k]|² for k = 0..n/2 by the defining sum, in float64 with exact angles.
func naivePower(x []float64) []float64 {
	n := len(x)
	out := make([]float64, n/2+1)
	for k := range out {
		var re, im float64
		for j, v := range x {
			s, c := math.Sincos(-2 * math.Pi * float64((k*j)%n) / float64(n))
			re += v * c
			im += v * s
		}
		out[k] = re*re + im*im
	}
	return out
}

// TestRealFFTPower checks the mixed-radix real FFT against the defining sum on seeded random
// frames. Sizes cover every butterfly: radix 4 and 2 (8, 64), 3 (6, 18), 5 (10, 50), the generic
// prime path (14, 22, 2·7·11), mixed (400 = 2·(4·2·5·5), 2·99, 2·125). Both sides are float64;
// the error bound 1e-12·(Σ|x|)² is the scale of the largest possible bin times float64
// rounding accumulated over log(n) stages.
func TestRealFFTPower(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{2, 4, 6, 8, 10, 14, 18, 22, 50, 64, 154, 198, 250, 400} {
		f, err := newRealFFT(n)
		if err != nil {
			t.Fatal(err)
		}
		for trial := 0; trial < 3; trial++ {
			x := make([]float64, n)
			l1 := 0.0
			for i := range x {
				x[i] = rng.NormFloat64()
				l1 += math.Abs(x[i])
			}
			z := make([]complex128, n/2)
			for j := range z {
				z[j] = complex(x[2*j], x[2*j+1])
			}
			got := make([]float64, n/2+1)
			f.power(got, z, make([]complex128, n/2))
			want := naivePower(x)
			tol := 1e-12 * l1 * l1
			for k := range want {
				if d := math.Abs(got[k] - want[k]); d > tol {
					t.Fatalf("n=%d bin %d: got %v, want %v (|Δ| %.3g > %.3g)", n, k, got[k], want[k], d, tol)
				}
			}
		}
	}
	if _, err := newRealFFT(7); err == nil {
		t.Error("odd length accepted")
	}
}
