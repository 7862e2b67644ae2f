package whisper

import (
	"math"
	"testing"
)

// TestExpf compares expf with float64 exp over the range log-probabilities take, in fine steps,
// at the underflow edge and at -Inf. Bound: 3e-7 relative (2 ulp of float32).
func TestExpf(t *testing.T) {
	var worst float64
	for x := float32(-87.3); x <= 10; x += 0.000731 {
		want := math.Exp(float64(x))
		got := float64(expf(x))
		if rel := math.Abs(got-want) / want; rel > worst {
			worst = rel
		}
	}
	t.Logf("max relative error %.3g", worst)
	if worst > 3e-7 {
		t.Errorf("expf is off by %.3g relative", worst)
	}
	if expf(float32(math.Inf(-1))) != 0 || expf(-100) != 0 || expf(0) != 1 {
		t.Errorf("expf(-Inf) %v, expf(-100) %v, expf(0) %v", expf(float32(math.Inf(-1))), expf(-100), expf(0))
	}
}

func BenchmarkExpf(b *testing.B) {
	x := make([]float32, 51864)
	for i := range x {
		x[i] = -float32(i%2000) / 100
	}
	b.Run("expf", func(b *testing.B) {
		var s float32
		for range b.N {
			for _, v := range x {
				s += expf(v)
			}
		}
		_ = s
	})
	b.Run("math.Exp", func(b *testing.B) {
		var s float32
		for range b.N {
			for _, v := range x {
				s += float32(math.Exp(float64(v)))
			}
		}
		_ = s
	})
}
