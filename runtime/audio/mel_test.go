package audio

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestLogMelWhisperCpp compares the encoder input window with the one whisper.cpp fed its
// encoder (reference/asr/tensors/<utt>/mel.f32, [80, 3000]). Tolerance 1e-4 absolute: whisper.cpp
// computes the spectrum in float32 and this package in float64; a float64 reference lands
// within 2.6e-5 of whisper.cpp on these clips (reference README §5), and an output of (x+4)/4
// moves by 1e-4 only when a mel energy moves by 0.1 %.
func TestLogMelWhisperCpp(t *testing.T) {
	filters := testFilters(t)
	for _, utt := range []string{"jfk", "psx-cards-001"} {
		t.Run(utt, func(t *testing.T) {
			want := readF32(t, sharedtest.Path(t, "reference/asr/tensors/"+utt+"/mel.f32"))
			samples, info := decodeFile(t, sharedtest.Path(t, "data/asr/wav/"+utt+".wav"))
			if info.SampleRate != SampleRate || info.Channels != 1 || info.Codec != "pcm_s16le" {
				t.Fatalf("unexpected input %+v", info)
			}
			mel, nFrames, err := LogMel(samples, filters, 2)
			if err != nil {
				t.Fatal(err)
			}
			if nFrames != MelFrames(len(samples)) || nFrames < WindowFrames {
				t.Fatalf("nFrames %d for %d samples", nFrames, len(samples))
			}
			win, err := MelWindow(nil, mel, filters.NMel, nFrames, 0, WindowFrames)
			if err != nil {
				t.Fatal(err)
			}
			if len(win) != len(want) {
				t.Fatalf("window has %d values, reference %d", len(win), len(want))
			}
			maxd, sum2 := 0.0, 0.0
			at := 0
			for i := range want {
				d := math.Abs(float64(win[i]) - float64(want[i]))
				sum2 += d * d
				if d > maxd {
					maxd, at = d, i
				}
			}
			t.Logf("%s: %d samples, max |Δ| %.3g at [%d, %d], rms %.3g", utt, len(samples), maxd, at/WindowFrames, at%WindowFrames, math.Sqrt(sum2/float64(len(want))))
			if maxd > 1e-4 {
				t.Errorf("max |Δ| %.3g > 1e-4 at [%d, %d]: got %v, want %v", maxd, at/WindowFrames, at%WindowFrames, win[at], want[at])
			}
		})
	}
}

// refLogMel is the log-mel spectrogram as the reference README §5 spells it out, written
// independently in float64: explicit padded signal, defining DFT sum, dense filter product.
// Returns [nMel, nFrames].
func refLogMel(samples []float32, f MelFilters) ([]float64, int) {
	n := len(samples)
	padded := make([]float64, 200+n+ChunkSamples+200)
	for i := 0; i < 200; i++ {
		if 200-i < n {
			padded[i] = float64(samples[200-i])
		}
	}
	for i, v := range samples {
		padded[200+i] = float64(v)
	}
	nFrames := (len(padded) - 400) / 160
	out := make([]float64, f.NMel*nFrames)
	frame := make([]float64, 400)
	for i := 0; i < nFrames; i++ {
		zero := true
		for j := range frame {
			frame[j] = 0.5 * (1 - math.Cos(2*math.Pi*float64(j)/400)) * padded[160*i+j]
			zero = zero && frame[j] == 0
		}
		pow := make([]float64, 201)
		if !zero {
			pow = naivePower(frame)
		}
		for m := 0; m < f.NMel; m++ {
			sum := 0.0
			for k := 0; k < 201; k++ {
				sum += pow[k] * float64(f.Data[m*201+k])
			}
			out[m*nFrames+i] = math.Log10(math.Max(sum, 1e-10))
		}
	}
	top := math.Inf(-1)
	for _, v := range out {
		top = math.Max(top, v)
	}
	for i, v := range out {
		out[i] = (math.Max(v, top-8) + 4) / 4
	}
	return out, nFrames
}

// testSignal is seeded noise under an envelope that spans 120 dB, with a run of exact zeros,
// so that the clamp at max − 8 decades is exercised.
func testSignal(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	s := make([]float32, n)
	for i := range s {
		env := math.Pow(10, -6*float64(i%5000)/5000)
		if i%7000 > 6500 {
			env = 0
		}
		s[i] = float32(env * (rng.Float64()*2 - 1) * 0.8)
	}
	return s
}

// randomFilters is a seeded filter bank shaped like Whisper's: non-negative, sparse rows with a
// few dense ones.
func randomFilters(nMel int, seed uint64) MelFilters {
	rng := rand.New(rand.NewPCG(seed, 9))
	f := MelFilters{NMel: nMel, NFFT: FreqBins, Data: make([]float32, nMel*FreqBins)}
	for m := 0; m < nMel; m++ {
		lo := rng.IntN(FreqBins)
		w := 1 + rng.IntN(12)
		if m%5 == 0 {
			lo, w = 0, FreqBins
		}
		for k := lo; k < min(FreqBins, lo+w); k++ {
			f.Data[m*FreqBins+k] = float32(rng.Float64() * 0.05)
		}
	}
	return f
}

// TestLogMelFloat64Reference checks LogMel against refLogMel over odd and tiny lengths, with
// filters both real and random. Tolerance 2e-6 absolute: the outputs are float32 values of
// magnitude ≤ 3 (half an ulp is 1.2e-7) computed from float32-rounded log10 values of
// magnitude ≤ 12 (4.8e-7, divided by 4 on the way out), and LogMel uses whisper.cpp's
// float32-rounded Hann window (relative error 6e-8); float64 spectrum errors are far smaller.
func TestLogMelFloat64Reference(t *testing.T) {
	filterSets := []MelFilters{randomFilters(13, 1), randomFilters(80, 2)}
	for _, n := range []int{0, 1, 150, 200, 201, 399, 401, 12345, 33333} {
		for fi, f := range filterSets {
			samples := testSignal(n, uint64(n))
			got, nFrames, err := LogMel(samples, f, 3)
			if err != nil {
				t.Fatal(err)
			}
			want, wantFrames := refLogMel(samples, f)
			if nFrames != wantFrames {
				t.Fatalf("n=%d: %d frames, want %d", n, nFrames, wantFrames)
			}
			maxd := 0.0
			for i := range want {
				d := math.Abs(float64(got[i]) - want[i])
				if d > maxd {
					maxd = d
				}
				if d > 2e-6 {
					t.Fatalf("n=%d filters %d: [%d, %d] got %v, want %v", n, fi, i/nFrames, i%nFrames, got[i], want[i])
				}
			}
			t.Logf("n=%d filters %d: %d frames, max |Δ| %.3g", n, fi, nFrames, maxd)
		}
	}
}

// TestLogMelThreads: the result does not depend on the number of workers.
func TestLogMelThreads(t *testing.T) {
	f := randomFilters(80, 3)
	samples := testSignal(3*SampleRate+77, 4)
	ref, _, err := LogMel(samples, f, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, th := range []int{0, 2, 3, 7, 64} {
		got, _, err := LogMel(samples, f, th)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ref {
			if math.Float32bits(got[i]) != math.Float32bits(ref[i]) {
				t.Fatalf("threads=%d: value %d is %v, single-threaded %v", th, i, got[i], ref[i])
			}
		}
	}
}

func TestMelFrameCounts(t *testing.T) {
	// whisper.cpp: jfk (176000 samples) has whisper_n_len 1099 and (n + 480000)/160 frames.
	if got := MelContentFrames(176000); got != 1099 {
		t.Errorf("MelContentFrames(176000) = %d, want 1099", got)
	}
	if got := MelFrames(176000); got != 4100 {
		t.Errorf("MelFrames(176000) = %d, want 4100", got)
	}
	if got := MelContentFrames(100); got != 1 {
		t.Errorf("MelContentFrames(100) = %d, want 1 (C truncation)", got)
	}
}

func TestMelWindow(t *testing.T) {
	const nMel, nFrames = 3, 10
	mel := make([]float32, nMel*nFrames)
	for i := range mel {
		mel[i] = float32(i + 1)
	}
	for _, c := range []struct{ off, width int }{{0, 10}, {2, 4}, {8, 5}, {10, 3}, {25, 2}} {
		got, err := MelWindow(make([]float32, 1), mel, nMel, nFrames, c.off, c.width)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != nMel*c.width {
			t.Fatalf("%+v: %d values", c, len(got))
		}
		for j := 0; j < nMel; j++ {
			for i := 0; i < c.width; i++ {
				want := float32(0)
				if c.off+i < nFrames {
					want = mel[j*nFrames+c.off+i]
				}
				if got[j*c.width+i] != want {
					t.Fatalf("%+v: [%d, %d] = %v, want %v", c, j, i, got[j*c.width+i], want)
				}
			}
		}
	}
	for _, c := range []struct{ nMel, nFrames, off, width int }{{3, 9, 0, 1}, {0, 10, 0, 1}, {3, 10, -1, 1}, {3, 10, 0, 0}} {
		if _, err := MelWindow(nil, mel, c.nMel, c.nFrames, c.off, c.width); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestMelFiltersRejected(t *testing.T) {
	good := randomFilters(4, 5)
	nan := randomFilters(4, 5)
	nan.Data[7] = float32(math.NaN())
	for name, f := range map[string]MelFilters{
		"nfft":  {NMel: 4, NFFT: 200, Data: good.Data[:800]},
		"short": {NMel: 4, NFFT: FreqBins, Data: good.Data[:10]},
		"zero":  {NMel: 0, NFFT: FreqBins},
		"nan":   nan,
	} {
		if _, _, err := LogMel(make([]float32, 100), f, 1); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
