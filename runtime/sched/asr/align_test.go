package asr

import (
	"context"
	"math"
	"math/rand/v2"
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

// TestWordTimestamps transcribes a recording with word timing and checks what must hold of any
// alignment: every text token gets a span inside the window and the audio, spans follow each
// other without gaps or overlaps, and the times are not the interpolated ones. The model has
// random weights (what the tests have), so the times themselves carry no meaning here.
func TestWordTimestamps(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: one transcription at a time, checked for its numbers; the recogniser's goroutines run in the concurrency tests")
	}
	m := testModel(t, "tiny.en")
	e, err := NewWhisper(m, Config{MaxActive: 1})
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
	if testing.Short() {
		t.Skip("-short: one transcription at a time, checked for its numbers; the recogniser's goroutines run in the concurrency tests")
	}
	m := testModel(t, "tiny.en")
	e, err := NewWhisper(m, Config{MaxActive: 1})
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
