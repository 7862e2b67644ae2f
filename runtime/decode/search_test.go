package decode

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// TestBeamsBest checks Best against a full sort of the same candidates by (score descending,
// source ascending, order added ascending), over random steps with many ties in both keys.
func TestBeamsBest(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 8))
	var b Beams[int]
	for trial := range 500 {
		b.Reset()
		type ref struct {
			from, seq int
			score     float64
		}
		var want []ref
		nHyp := 1 + r.IntN(8)
		for from := range nHyp {
			for range 1 + r.IntN(8) {
				score := math.Round(r.NormFloat64()*4) / 4 // quarters: ties within and across hypotheses
				seq := len(want)
				want = append(want, ref{from, seq, score})
				b.Add(from, score, seq)
			}
		}
		// Hypotheses add their candidates in their order, as a beam step does (the source key on
		// its own: TestRankCandidatesSourceOrder).
		sort.SliceStable(want, func(i, j int) bool {
			if want[i].score != want[j].score {
				return want[i].score > want[j].score
			}
			if want[i].from != want[j].from {
				return want[i].from < want[j].from
			}
			return want[i].seq < want[j].seq
		})
		n := r.IntN(len(want) + 3)
		got := b.Best(n)
		if len(got) != min(n, len(want)) {
			t.Fatalf("trial %d: Best(%d) of %d gave %d", trial, n, len(want), len(got))
		}
		for i, c := range got {
			if w := want[i]; c.From != w.from || c.Score != w.score || c.Token != w.seq {
				t.Fatalf("trial %d: candidate %d is %+v, want from %d score %v token %d", trial, i, c, w.from, w.score, w.seq)
			}
		}
	}
}

// TestRankCandidatesSourceOrder: candidates added out of source order are ranked by source among
// equal scores, and equal in both keep the order they came in.
func TestRankCandidatesSourceOrder(t *testing.T) {
	c := []Candidate[string]{{2, -1, "a"}, {0, -1, "b"}, {1, -0.5, "c"}, {0, -1, "d"}, {2, -2, "e"}}
	RankCandidates(c)
	got := ""
	for _, x := range c {
		got += x.Token
	}
	if got != "cbdae" {
		t.Errorf("ranked %q, want %q", got, "cbdae")
	}
}

// TestBeamsStepAllocs: a steady-state step (Reset, Add, Best) allocates nothing once the
// candidates' storage has grown.
func TestBeamsStepAllocs(t *testing.T) {
	var b Beams[[2]float32]
	step := func() {
		b.Reset()
		for from := range 5 {
			for k := range 5 {
				b.Add(from, -float64(k+from)/3, [2]float32{float32(k), 1})
			}
		}
		if len(b.Best(5)) != 5 {
			t.Fatal("fewer than 5 kept")
		}
	}
	step()
	if a := testing.AllocsPerRun(50, step); a != 0 {
		t.Errorf("%v allocations per beam step, want 0", a)
	}
}

func TestSequenceScore(t *testing.T) {
	for _, c := range []struct {
		sum     float64
		n       int
		penalty float32
		want    float64
	}{
		{-2, 4, -1, -0.5},                          // average log-probability
		{-2, 4, 0, -0.5},                           // 0 is no penalty too
		{-3, 4, 1, -3 / 1.5},                       // ((5+4)/6)^1
		{-3, 7, 0.5, -3 / math.Sqrt(2)},            // ((5+7)/6)^0.5
		{-1.25, 1, 2, -1.25},                       // ((5+1)/6)^2 = 1
		{-4, 10, 0.75, -4 / math.Pow(2.5, 0.75)},   // ((5+10)/6)^0.75
		{-4, 10, -0.75, -0.4},                      // negative: the length
		{0, 3, 1, 0},                               // certain tokens
		{-5, 5, 1.5, -5 / math.Pow(10.0/6, 1.5)},   // ((5+5)/6)^1.5
		{-7, 2, 3, -7 / math.Pow(7.0/6, 3)},        // ((5+2)/6)^3
		{-9, 20, 1, -9 / (25.0 / 6)},               // ((5+20)/6)^1
		{-0.5, 220, -1, -0.5 / 220},                // a whole window
		{-6, 6, 0.25, -6 / math.Pow(11.0/6, 0.25)}, // ((5+6)/6)^0.25
	} {
		if got := SequenceScore(c.sum, c.n, c.penalty); math.Abs(got-c.want) > 1e-12*math.Abs(c.want) {
			t.Errorf("SequenceScore(%v, %d, %v) = %v, want %v", c.sum, c.n, c.penalty, got, c.want)
		}
	}
}

func TestBestOf(t *testing.T) {
	var b BestOf
	if _, ok := b.Best(); ok {
		t.Fatal("a best of nothing")
	}
	nan := math.NaN()
	for _, c := range []struct {
		name   string
		scores []float64
		want   int
	}{
		{"highest", []float64{-3, -1, -2}, 1},
		{"first of equals", []float64{-2, -1, -1, -1.5}, 1},
		{"all -Inf", []float64{math.Inf(-1), math.Inf(-1)}, 0},
		{"NaN first is kept", []float64{nan, 0, 1}, 0},
		{"NaN later is passed over", []float64{-1, nan, -2}, 0},
		{"one", []float64{-7}, 0},
	} {
		b.Reset()
		for i, s := range c.scores {
			b.Offer(i, s)
		}
		if got, ok := b.Best(); !ok || got != c.want {
			t.Errorf("%s: best %d (%v), want %d", c.name, got, ok, c.want)
		}
	}
}
