package purego

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/runtime/quant"
)

// TestAxpy4 checks the dispatched axpy4 and axpy4F16 (assembly where the CPU allows) against
// float64 sums, for lengths around the 8-element vector width. Each output is one float32
// rounding of products and sums of five terms: within 8·2^-24 of the sum of their magnitudes.
func TestAxpy4(t *testing.T) {
	f16Once.Do(initF16Table)
	r := rand.New(rand.NewPCG(7, 11))
	t.Logf("kernels: %s", simdKernels)
	for _, n := range []int{1, 7, 8, 9, 16, 63, 64, 65, 128} {
		y := make([]float32, n)
		x := make([][]float32, 4)
		h := make([][]uint16, 4)
		for k := range x {
			x[k] = make([]float32, n)
			h[k] = make([]uint16, n)
			for i := range x[k] {
				h[k][i] = quant.F32ToF16(float32(r.NormFloat64()))
				x[k][i] = quant.F16ToF32(h[k][i])
			}
		}
		f := [4]float32{float32(r.NormFloat64()), float32(r.NormFloat64()), float32(r.NormFloat64()), float32(r.NormFloat64())}
		for i := range y {
			y[i] = float32(r.NormFloat64())
		}
		for _, impl := range []struct {
			name string
			run  func(y []float32)
		}{
			{"axpy4", func(y []float32) { axpy4(y, f[0], f[1], f[2], f[3], x[0], x[1], x[2], x[3]) }},
			{"axpy4Go", func(y []float32) { axpy4Go(y, f[0], f[1], f[2], f[3], x[0], x[1], x[2], x[3]) }},
			{"axpy4F16", func(y []float32) { axpy4F16(y, f[0], f[1], f[2], f[3], h[0], h[1], h[2], h[3]) }},
			{"axpy4F16Go", func(y []float32) { axpy4F16Go(y, f[0], f[1], f[2], f[3], h[0], h[1], h[2], h[3]) }},
		} {
			got := append([]float32(nil), y...)
			impl.run(got)
			for i := range got {
				want, mag := float64(y[i]), math.Abs(float64(y[i]))
				for k := range x {
					want += float64(f[k]) * float64(x[k][i])
					mag += math.Abs(float64(f[k]) * float64(x[k][i]))
				}
				if d := math.Abs(float64(got[i]) - want); d > 8*0x1p-24*mag {
					t.Fatalf("%s n=%d: y[%d] = %v, want %v", impl.name, n, i, got[i], want)
				}
			}
		}
	}
}
