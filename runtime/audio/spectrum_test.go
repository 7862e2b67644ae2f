package audio

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestPowerSpectrum compares PowerSpectrum with a direct float64 DFT on seeded random frames,
// for Parakeet's 512 points and lengths with every butterfly.
func TestPowerSpectrum(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{2, 6, 10, 14, 400, 512} {
		p, err := NewPowerSpectrum(n)
		if err != nil {
			t.Fatal(err)
		}
		if p.Len() != n {
			t.Fatalf("Len %d, want %d", p.Len(), n)
		}
		frame := make([]float64, n)
		for i := range frame {
			frame[i] = rng.NormFloat64()
		}
		dst := make([]float64, n/2+1)
		if err := p.Power(dst, frame); err != nil {
			t.Fatal(err)
		}
		for k := range dst {
			var re, im float64
			for j, x := range frame {
				s, c := math.Sincos(-2 * math.Pi * float64(j*k%n) / float64(n))
				re += x * c
				im += x * s
			}
			want := re*re + im*im
			// Relative to the frame's energy: the sums run over n terms of size ~1.
			if d := math.Abs(dst[k] - want); d > 1e-12*float64(n)*float64(n) {
				t.Errorf("n=%d bin %d: %g, want %g (|Δ| %g)", n, k, dst[k], want, d)
			}
		}
		if err := p.Power(dst[:1], frame); err == nil {
			t.Errorf("n=%d: a short destination was accepted", n)
		}
		if err := p.Power(dst, frame[:n-1]); err == nil {
			t.Errorf("n=%d: a short frame was accepted", n)
		}
	}
	if _, err := NewPowerSpectrum(7); err == nil {
		t.Error("an odd length was accepted")
	}
	p, _ := NewPowerSpectrum(512)
	frame, dst := make([]float64, 512), make([]float64, 257)
	if a := testing.AllocsPerRun(10, func() { _ = p.Power(dst, frame) }); a != 0 {
		t.Errorf("Power allocates %v times", a)
	}
}
