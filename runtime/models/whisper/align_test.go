package whisper

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// pathCost sums cost ([n, m]) over a path.
func pathCost(cost []float64, m int, rows, cols []int) float64 {
	s := 0.0
	for i := range rows {
		s += cost[rows[i]*m+cols[i]]
	}
	return s
}

// bestPath is the least cost of any monotonic path from (0,0) to (n-1,m-1), by exhaustive search.
func bestPath(cost []float64, n, m, i, j int) float64 {
	c := cost[i*m+j]
	if i == n-1 && j == m-1 {
		return c
	}
	best := math.Inf(1)
	if i+1 < n && j+1 < m {
		best = min(best, bestPath(cost, n, m, i+1, j+1))
	}
	if i+1 < n {
		best = min(best, bestPath(cost, n, m, i+1, j))
	}
	if j+1 < m {
		best = min(best, bestPath(cost, n, m, i, j+1))
	}
	return c + best
}

func TestDTWFindsTheLeastCostPath(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for trial := range 300 {
		n, m := 1+r.IntN(5), 1+r.IntN(6)
		cost := make([]float64, n*m)
		for i := range cost {
			cost[i] = r.NormFloat64()
		}
		rows, cols := dtw(cost, n, m)
		if len(rows) == 0 || rows[0] != 0 || cols[0] != 0 || rows[len(rows)-1] != n-1 || cols[len(cols)-1] != m-1 {
			t.Fatalf("trial %d (%dx%d): path %v %v does not run corner to corner", trial, n, m, rows, cols)
		}
		for k := 1; k < len(rows); k++ {
			di, dj := rows[k]-rows[k-1], cols[k]-cols[k-1]
			if di < 0 || dj < 0 || di > 1 || dj > 1 || di+dj == 0 {
				t.Fatalf("trial %d: step %d of %v %v is not a unit monotonic step", trial, k, rows, cols)
			}
		}
		got, want := pathCost(cost, m, rows, cols), bestPath(cost, n, m, 0, 0)
		if math.Abs(got-want) > 1e-9 {
			t.Fatalf("trial %d (%dx%d): path cost %v, least possible %v", trial, n, m, got, want)
		}
	}
}

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

// TestWordTimestamps transcribes a recording with word timing and checks what must hold of any
// alignment: every text token gets a span inside the window and the audio, spans follow each
// other without gaps or overlaps, and the times are not the interpolated ones. The model has
// random weights (what the tests have), so the times themselves carry no meaning here.
func TestWordTimestamps(t *testing.T) {
	m := testModel(t, "tiny.en")
	e, err := NewEngine(m, EngineConfig{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	samples := testWAV(t, "jfk")
	dur := float64(len(samples)) / SampleRate
	p := DefaultParams()
	p.Language, p.NoTimestamps, p.TemperatureInc, p.MaxTokens = "en", true, 0, 0
	t0 := time.Now()
	plain, err := e.Transcribe(context.Background(), samples, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	p.WordTimestamps = true
	res, err := e.Transcribe(context.Background(), samples, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	if res.Text != plain.Text {
		t.Fatalf("word timing changed the text:\n%q\n%q", res.Text, plain.Text)
	}
	differ, prevEnd, n := false, 0.0, 0
	for si, s := range res.Segments {
		for ti, tok := range s.Tokens {
			if tok.ID >= e.tok.EOT {
				continue
			}
			if tok.T0 < 0 || tok.T1 < tok.T0 || tok.T1 > dur+1e-9 {
				t.Fatalf("token %d of segment %d (%q): span %v..%v outside 0..%v", ti, si, tok.Text, tok.T0, tok.T1, dur)
			}
			if n > 0 && math.Abs(tok.T0-prevEnd) > 1e-9 {
				t.Fatalf("token %d of segment %d starts at %v, the previous ended at %v", ti, si, tok.T0, prevEnd)
			}
			prevEnd = tok.T1
			pt := plain.Segments[si].Tokens[ti]
			differ = differ || math.Abs(pt.T0-tok.T0) > 1e-6
			n++
		}
	}
	if n < 10 {
		t.Fatalf("only %d text tokens", n)
	}
	if !differ {
		t.Error("aligned times equal the interpolated ones")
	}
	t.Logf("%d tokens aligned over %.2f s; last ends at %.2f s; transcription %v, with word timing %v",
		n, dur, prevEnd, t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond))
}

// TestWordTimestampsWithSegments aligns windows decoded with timestamp tokens, whose text falls
// into several segments: the aligned spans must still run in order through each window.
func TestWordTimestampsWithSegments(t *testing.T) {
	m := testModel(t, "tiny.en")
	e, err := NewEngine(m, EngineConfig{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	samples := testWAV(t, "jfk")
	dur := float64(len(samples)) / SampleRate
	p := DefaultParams()
	p.Language, p.TemperatureInc, p.WordTimestamps = "en", 0, true
	res, err := e.Transcribe(context.Background(), samples, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	prev, n := 0.0, 0
	for si, s := range res.Segments {
		for ti, tok := range s.Tokens {
			if tok.ID >= e.tok.EOT {
				continue
			}
			if tok.T0 < 0 || tok.T1 < tok.T0 || tok.T1 > dur+1e-9 || tok.T0 < prev-1e-9 {
				t.Fatalf("token %d of segment %d (%q): span %v..%v (previous start %v, audio %v s)", ti, si, tok.Text, tok.T0, tok.T1, prev, dur)
			}
			prev = tok.T0
			n++
		}
	}
	t.Logf("%d segments, %d text tokens", len(res.Segments), n)
	if n == 0 {
		t.Fatal("no text tokens")
	}
}
