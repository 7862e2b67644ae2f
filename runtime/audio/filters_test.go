package audio

import (
	"math"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/ggml"
)

// The computed filter bank must be the one whisper.cpp's files store (OpenAI's mel_filters.npz,
// made by librosa in float64 and stored as float32): equal to within one float32 rounding of each
// weight (the weights are below 0.03, so 2e-9 absolute is a few units in the last place).
func TestSlaneyFiltersMatchFiles(t *testing.T) {
	for _, name := range []string{"tiny", "tiny.en", "base.en"} {
		f, err := ggml.Open(sharedtest.Path(t, "models/asr/for-tests-ggml-"+name+".bin"))
		if err != nil {
			t.Fatal(err)
		}
		want := f.Filters
		f.Close()
		got, err := SlaneyFilters(want.NMel)
		if err != nil {
			t.Fatal(err)
		}
		if got.NMel != want.NMel || got.NFFT != want.NFFT || len(got.Data) != len(want.Data) {
			t.Fatalf("%s: computed %d×%d filters, the file has %d×%d", name, got.NMel, got.NFFT, want.NMel, want.NFFT)
		}
		worst, exact := 0.0, 0
		for i := range want.Data {
			d := math.Abs(float64(got.Data[i]) - float64(want.Data[i]))
			worst = max(worst, d)
			if got.Data[i] == want.Data[i] {
				exact++
			}
			if d > 2e-9 || (want.Data[i] == 0) != (got.Data[i] == 0) {
				t.Fatalf("%s: filter %d bin %d: computed %g, the file has %g", name, i/want.NFFT, i%want.NFFT, got.Data[i], want.Data[i])
			}
		}
		t.Logf("%s: %d of %d weights bit-identical, largest difference %.3g", name, exact, len(want.Data), worst)
	}
}

// 128 bins (large-v3; no file here stores that bank): the same formula as 80, so checked only for
// the shape of a bank: non-negative triangles whose peaks rise with the filter index.
func TestSlaneyFilters128(t *testing.T) {
	f, err := SlaneyFilters(128)
	if err != nil {
		t.Fatal(err)
	}
	prevPeak := -1
	for i := range f.NMel {
		row := f.Data[i*f.NFFT : (i+1)*f.NFFT]
		peak := 0
		for j, w := range row {
			if w < 0 || math.IsNaN(float64(w)) {
				t.Fatalf("filter %d bin %d: weight %g", i, j, w)
			}
			if w > row[peak] {
				peak = j
			}
		}
		if peak < prevPeak {
			t.Fatalf("filter %d peaks at bin %d, before filter %d's %d", i, peak, i-1, prevPeak)
		}
		prevPeak = peak
	}
	if _, err := SlaneyFilters(0); err == nil {
		t.Error("0 mel bins: no error")
	}
}
