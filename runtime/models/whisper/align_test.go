package whisper

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestMedianFilter(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for _, n := range []int{1, 2, 3, 4, 7, 8, 50} {
		src := make([]float64, n)
		for i := range src {
			src[i] = r.Float64()
		}
		got := make([]float64, n)
		medianFilter(got, src, 7)
		if n <= 3 {
			if !slices.Equal(got, src) {
				t.Errorf("n=%d: a row no longer than 3 must be copied: %v from %v", n, got, src)
			}
			continue
		}
		// reference: reflect-pad by 3 (x3 x2 x1 | x0 … | x(n-2) x(n-3) x(n-4)), sort each window
		pad := []float64{src[3], src[2], src[1]}
		if n < 4 {
			continue
		}
		padded := append(append(pad, src...), src[n-2], src[n-3], src[n-4])
		for i := range n {
			w := slices.Clone(padded[i : i+7])
			slices.Sort(w)
			if got[i] != w[3] {
				t.Errorf("n=%d: median at %d = %v, want %v", n, i, got[i], w[3])
			}
		}
	}
}

// TestStandardizeEpsilon: attention weights are small, and the epsilon added to the variance
// damps a column whose weights barely differ. Column [0, 2e-5]: mean 1e-5, variance 1e-10, so
// ±1e-5 / sqrt(1e-10 + 1e-9) = ±0.301511…; without the epsilon it would be ±1.
func TestStandardizeEpsilon(t *testing.T) {
	x := []float64{0, 2e-5}
	standardize(x, 2, 1)
	want := 1e-5 / math.Sqrt(1.1e-9)
	if math.Abs(x[0]+want) > 1e-12 || math.Abs(x[1]-want) > 1e-12 {
		t.Errorf("standardised column %v, want [%v %v]", x, -want, want)
	}
}

// TestCrossWeightsSoftmaxOverAllKeys: the weights of the frames kept are the attention's own,
// normalised over every key of the window, not over the frames kept; checked against a float64
// computation.
func TestCrossWeightsSoftmaxOverAllKeys(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 9))
	const n, keys, frames, T, off, hd = 3, 9, 4, 6, 2, 3
	q := make([]float32, n*T)
	k := make([]float32, keys*T)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	for i := range k {
		k[i] = float32(r.NormFloat64())
	}
	scale := 1 / math.Sqrt(hd)
	w := make([]float64, n*frames)
	crossWeights(w, make([]float32, keys), q, k, n, frames, T, off, hd, float32(scale))
	for i := range n {
		var e [keys]float64
		sum := 0.0
		for f := range keys {
			s := 0.0
			for d := range hd {
				s += float64(q[i*T+off+d]) * float64(k[f*T+off+d])
			}
			e[f] = math.Exp(s * scale)
			sum += e[f]
		}
		for f := range frames {
			if want := e[f] / sum; math.Abs(w[i*frames+f]-want) > 1e-6*want {
				t.Errorf("query %d, frame %d: weight %v, want %v", i, f, w[i*frames+f], want)
			}
		}
	}
}

func TestStandardize(t *testing.T) {
	x := []float64{1, 10, 2, 10, 3, 10, 6, 10} // [4 rows, 2 cols]; column 1 is constant
	standardize(x, 4, 2)
	mean, sq := 0.0, 0.0
	for r := range 4 {
		mean += x[r*2]
		sq += x[r*2] * x[r*2]
		if x[r*2+1] != 0 {
			t.Errorf("constant column standardised to %v, want 0", x[r*2+1])
		}
	}
	if math.Abs(mean) > 1e-12 || math.Abs(sq/4-1) > 1e-9 {
		t.Errorf("column 0 after standardising: mean %v, mean square %v", mean/4, sq/4)
	}
}

func TestAlignHeads(t *testing.T) {
	for _, c := range []struct {
		m    Model
		want []AlignHead
	}{
		{Model{HParams: HParams{TextLayer: 4, TextState: 384, TextHead: 6, NVocab: 51864, Mels: 80}}, alignPresets["tiny.en"]},
		{Model{HParams: HParams{TextLayer: 4, TextState: 384, TextHead: 6, NVocab: 51865, Mels: 80}}, alignPresets["tiny"]},
		{Model{HParams: HParams{TextLayer: 6, TextState: 512, TextHead: 8, NVocab: 51864, Mels: 80}}, alignPresets["base.en"]},
		{Model{HParams: HParams{TextLayer: 32, TextState: 1280, TextHead: 20, NVocab: 51866, Mels: 128}}, alignPresets["large-v3"]},
		{Model{HParams: HParams{TextLayer: 4, TextState: 1280, TextHead: 20, NVocab: 51866, Mels: 128}}, alignPresets["large-v3-turbo"]},
		{Model{HParams: HParams{TextLayer: 3, TextState: 64, TextHead: 2, NVocab: 51864, Mels: 80}}, []AlignHead{{1, 0}, {1, 1}, {2, 0}, {2, 1}}},
	} {
		if got := c.m.AlignHeads(); !slices.Equal(got, c.want) {
			t.Errorf("%d layers × %d, vocab %d: heads %v, want %v", c.m.TextLayer, c.m.TextState, c.m.NVocab, got, c.want)
		}
	}
}
