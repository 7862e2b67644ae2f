package audio

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// Rates exercised: common ones, an exact bank with many phases (11025: 640), and rate pairs
// whose bank would be too large and is interpolated (44101 and 7999 Hz: 16000 phases).
var testRates = []int{8000, 11025, 22050, 32000, 44100, 48000, 96000, 44101, 7999}

func TestResamplePassthrough(t *testing.T) {
	x := testSignal(12345, 1)
	y, err := Resample(x, SampleRate)
	if err != nil {
		t.Fatal(err)
	}
	if len(y) != len(x) {
		t.Fatalf("%d samples out of %d", len(y), len(x))
	}
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
			t.Fatalf("sample %d changed: %v → %v", i, x[i], y[i])
		}
	}
}

func TestResampleRejectsRates(t *testing.T) {
	for _, r := range []int{0, -1, MinRate - 1, MaxRate + 1} {
		if _, err := NewResampler(r, SampleRate); !errors.Is(err, ErrUnsupported) {
			t.Errorf("rate %d: err %v", r, err)
		}
	}
}

// TestResampleFloat64Reference compares the polyphase implementation with the defining sum
// y[k] = Σ x[i]·h(i − k·in/out) evaluated in float64 straight from the kernel formula, at every
// output sample including both edges. Tolerances: exact banks differ only by float32
// coefficients and float32 sums of ≤ 2·half products (≤ 2e-6 on unit-amplitude input);
// interpolated banks add the error of interpolating the kernel linearly between 256 phases
// per input sample, (1/256)²/8·max|h”| summed over the taps (≤ 2e-5).
func TestResampleFloat64Reference(t *testing.T) {
	for _, in := range testRates {
		t.Run(fmt.Sprint(in), func(t *testing.T) {
			x := testSignal(in/5+17, uint64(in))
			got, err := Resample(x, in)
			if err != nil {
				t.Fatal(err)
			}
			spec := specFor(in, SampleRate)
			k := kernelFor(in, SampleRate)
			nOut := (len(x)*SampleRate + in - 1) / in
			if len(got) != nOut {
				t.Fatalf("%d outputs, want %d", len(got), nOut)
			}
			tol := 2e-6
			if !k.exact {
				tol = 2e-5
			}
			maxd := 0.0
			for o := range got {
				pos := float64(o) * float64(in) / SampleRate
				lo := max(0, int(math.Floor(pos))-spec.half)
				hi := min(len(x)-1, int(math.Ceil(pos))+spec.half)
				want := 0.0
				for i := lo; i <= hi; i++ {
					want += float64(x[i]) * spec.eval(float64(i)-pos)
				}
				d := math.Abs(float64(got[o]) - want)
				maxd = max(maxd, d)
				if d > tol {
					t.Fatalf("output %d: got %v, want %v (|Δ| %.3g > %.3g)", o, got[o], want, d, tol)
				}
			}
			t.Logf("%d Hz: %d taps, %d phases (exact %v), max |Δ| %.3g", in, k.taps, k.phases, k.exact, maxd)
		})
	}
}

// TestResamplerChunking: any split of the input into Process calls gives the one-shot output
// (which, being long, is computed by several goroutines when GOMAXPROCS allows).
func TestResamplerChunking(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, in := range []int{44100, 8000, 44101} {
		x := testSignal(3*in+7, 5)
		want, err := Resample(x, in)
		if err != nil {
			t.Fatal(err)
		}
		r, _ := NewResampler(in, SampleRate)
		var got []float32
		for rest := x; len(rest) > 0; {
			n := min(len(rest), rng.IntN(1400))
			got = r.Process(got, rest[:n])
			rest = rest[n:]
		}
		got = r.Flush(got)
		if r.Process(nil, x[:10]) != nil || r.Flush(nil) != nil {
			t.Fatal("output after Flush")
		}
		if len(got) != len(want) {
			t.Fatalf("%d Hz: chunked %d outputs, one-shot %d", in, len(got), len(want))
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%d Hz: output %d is %v chunked, %v one-shot", in, i, got[i], want[i])
			}
		}
	}
}

// toneFit returns the amplitude of the f Hz component of y (sampled at rate) over [a, b) by
// least squares on sin and cos, and the rms of what remains.
func toneFit(y []float32, rate int, f float64, a, b int) (amp, resid float64) {
	var ss, cc, sc, ys, yc float64
	for i := a; i < b; i++ {
		s, c := math.Sincos(2 * math.Pi * f * float64(i) / float64(rate))
		ss += s * s
		cc += c * c
		sc += s * c
		ys += float64(y[i]) * s
		yc += float64(y[i]) * c
	}
	det := ss*cc - sc*sc
	p := (ys*cc - yc*sc) / det
	q := (yc*ss - ys*sc) / det
	r2 := 0.0
	for i := a; i < b; i++ {
		s, c := math.Sincos(2 * math.Pi * f * float64(i) / float64(rate))
		e := float64(y[i]) - p*s - q*c
		r2 += e * e
	}
	return math.Hypot(p, q), math.Sqrt(r2 / float64(b-a))
}

func sine(n, rate int, f float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(math.Sin(2 * math.Pi * f * float64(i) / float64(rate)))
	}
	return x
}

func db(x float64) float64 { return 20 * math.Log10(x) }

// TestResampleTones sweeps pure tones through each rate converter. In band (up to 0.9 of the
// narrower Nyquist frequency B) the gain stays within ±0.1 dB and what is not the tone (images
// when upsampling, aliases, distortion) is > 60 dB down; above B (downsampling) the tone itself
// is > 60 dB down. Edges (one filter length) are excluded.
func TestResampleTones(t *testing.T) {
	for _, in := range testRates {
		t.Run(fmt.Sprint(in), func(t *testing.T) {
			b := float64(min(in, SampleRate)) / 2
			n := in / 4
			k := kernelFor(in, SampleRate)
			edge := k.half*SampleRate/in + 2
			worstGain, worstResid, worstStop := 0.0, -200.0, -200.0
			for i := 0; i <= 24; i++ {
				f := 20 + (0.9*b-20)*float64(i)/24
				y, err := Resample(sine(n, in, f), in)
				if err != nil {
					t.Fatal(err)
				}
				amp, resid := toneFit(y, SampleRate, f, edge, len(y)-edge)
				g := db(amp)
				if math.Abs(g) > math.Abs(worstGain) {
					worstGain = g
				}
				worstResid = max(worstResid, db(resid*math.Sqrt2))
				if math.Abs(g) > 0.1 || db(resid*math.Sqrt2) > -60 {
					t.Errorf("%.1f Hz: gain %.4f dB, residual %.1f dB", f, g, db(resid*math.Sqrt2))
				}
			}
			if in > SampleRate {
				for i := 0; i <= 24; i++ {
					f := b + (float64(in)/2*0.999-b)*float64(i)/24
					y, err := Resample(sine(n, in, f), in)
					if err != nil {
						t.Fatal(err)
					}
					rms := 0.0
					for _, v := range y[edge : len(y)-edge] {
						rms += float64(v) * float64(v)
					}
					level := db(math.Sqrt(rms/float64(len(y)-2*edge)) * math.Sqrt2)
					worstStop = max(worstStop, level)
					if level > -60 {
						t.Errorf("%.1f Hz (above %g Hz): output at %.1f dB", f, b, level)
					}
				}
			}
			stop := "none (upsampling)"
			if in > SampleRate {
				stop = fmt.Sprintf("≤ %.1f dB", worstStop)
			}
			t.Logf("%d Hz: passband gain within %.4f dB, non-tone ≤ %.1f dB, above B %s", in, worstGain, worstResid, stop)
		})
	}
}

// TestResampleSweep resamples a linear chirp from 20 Hz to 0.9·B and compares every interior
// output with the chirp evaluated at the output instant: a flat, zero-phase passband reproduces
// it to within the ripple (0.1 dB is a relative error of 1.2 %) plus the stopband leakage.
func TestResampleSweep(t *testing.T) {
	for _, in := range testRates {
		b := float64(min(in, SampleRate)) / 2
		const dur = 1.0
		f0, f1 := 20.0, 0.9*b
		chirp := func(tm float64) float64 {
			return math.Sin(2 * math.Pi * (f0*tm + (f1-f0)/(2*dur)*tm*tm))
		}
		x := make([]float32, int(dur*float64(in)))
		for i := range x {
			x[i] = float32(chirp(float64(i) / float64(in)))
		}
		y, err := Resample(x, in)
		if err != nil {
			t.Fatal(err)
		}
		edge := kernelFor(in, SampleRate).half*SampleRate/in + 2
		maxe := 0.0
		for o := edge; o < len(y)-edge; o++ {
			maxe = max(maxe, math.Abs(float64(y[o])-chirp(float64(o)/SampleRate)))
		}
		t.Logf("%d Hz: chirp 20–%.0f Hz, max error %.2e (%.1f dB)", in, f1, maxe, db(maxe))
		if maxe > 0.0116 {
			t.Errorf("%d Hz: chirp error %.3g exceeds 0.1 dB of full scale", in, maxe)
		}
	}
}
