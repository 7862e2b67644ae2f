package decode

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/parleyhq/parley/internal/vec"
)

// toyCase is a random transducer shape the properties are checked on.
type toyCase struct {
	name       string
	vocab      int
	frames     int
	durations  []int
	maxSymbols int
}

// toyCases: TDT with Parakeet's durations, with a max-symbols limit that fires often, with a
// duration set without 1, and RNN-Ts.
var toyCases = []toyCase{
	{"tdt-v12", 12, 40, []int{0, 1, 2, 3, 4}, 10},
	{"tdt-v5-max2", 5, 30, []int{0, 1, 2, 3, 4}, 2},
	{"tdt-v20-d026", 20, 32, []int{0, 2, 6}, 3},
	{"rnnt-v8", 8, 30, nil, 3},
	{"rnnt-v16-max1", 16, 24, nil, 1},
}

var merges = []BeamMerge{MergeLogSumExp, MergeMax}

// TestTDTBeamWidth1IsGreedy: width 1 decides exactly as TDT.Step driven frame by frame: the
// same tokens, frames, durations, P and PLog (compared with ==), also where logits tie.
func TestTDTBeamWidth1IsGreedy(t *testing.T) {
	for _, c := range toyCases {
		for seed := range uint64(16) {
			net := newToy(seed, c.vocab, c.frames, c.durations, c.maxSymbols)
			net.ties = seed >= 8
			want := greedy(t, net)
			for _, merge := range merges {
				s := decodeBeam(t, net, TDTBeam{Width: 1, Merge: merge}, nil)
				got := s.Tokens(0, nil)
				if s.Len() != 1 || !slices.Equal(got, want) {
					t.Fatalf("%s seed %d: %d hypotheses, tokens\n%+v\ngreedy\n%+v", c.name, seed, s.Len(), got, want)
				}
			}
		}
	}
}

// roundLog records, for each round of a search, which hypotheses it expanded (frame, run) and
// the pruning threshold after it: the score of the Width-th hypothesis kept, -Inf when fewer
// were kept (nothing was pruned by the selection).
type roundLog struct {
	key   [][2]int32
	theta []float64
}

func logRounds(d *driver, w int) *roundLog {
	l := &roundLog{}
	d.onRound = func(st *stream) {
		s := st.s
		l.key = append(l.key, [2]int32{s.t, s.hyps[s.expand[0]].run})
	}
	d.afterRound = func(st *stream) {
		th := math.Inf(-1)
		if st.s.Len() == w {
			th = st.s.Hyp(w - 1).Score
		}
		l.theta = append(l.theta, th)
	}
	return l
}

// decodeLogged is decodeBeam with a log of the rounds, and the driver's checks of every round
// on or off.
func decodeLogged(t *testing.T, net toyNet, c TDTBeam, check bool) (*TDTBeamSearch, *roundLog) {
	c.Rule = net.rule()
	s, err := NewTDTBeamSearch(c)
	if err != nil {
		t.Fatal(err)
	}
	st := &stream{s: s, net: net}
	d := newDriver(t, []*stream{st})
	d.check = check
	l := logRounds(d, c.Width)
	if err := s.AddFrames(net.frames()); err != nil {
		t.Fatal(err)
	}
	s.Finish()
	for d.round([]*stream{st}) {
	}
	checkDone(t, s)
	return s, l
}

// checkDone checks a finished search: done, best first, and no two hypotheses of the same tokens.
func checkDone(t *testing.T, s *TDTBeamSearch) {
	t.Helper()
	if !s.Done() {
		t.Fatal("not done")
	}
	seen := map[string]bool{}
	for i := range s.Len() {
		if i > 0 && s.Hyp(i).Score > s.Hyp(i-1).Score {
			t.Fatalf("hypothesis %d scores %v, above %d's %v", i, s.Hyp(i).Score, i-1, s.Hyp(i-1).Score)
		}
		if h := s.Hyp(i); h.Frame != s.Frames() || h.Tokens != len(s.Tokens(i, nil)) {
			t.Fatalf("hypothesis %d: %+v after %d frames, %d tokens", i, h, s.Frames(), len(s.Tokens(i, nil)))
		}
		k := seqOf(s.Tokens(i, nil))
		if seen[k] {
			t.Fatalf("two finished hypotheses hold %s", k)
		}
		seen[k] = true
	}
}

// scoredPath is a path of the lattice as the search scores it: after each decision i, the state
// (frame, run), the path's score so far, and the rank of the decision's pair among its row's
// pairs in the search's order.
type scoredPath struct {
	frame, run []int32
	score      []float64
	rank       []int
}

// scorePath replays decisions through net, scoring each pair with the search's arithmetic.
func scorePath(net toyNet, path []pathStep) scoredPath {
	r := net.rule()
	nTok := int(r.Blank) + 1
	h := make([]float32, net.stateDim())
	net.predict(h, nil, r.Blank)
	row := make([]float32, r.Width())
	sp := scoredPath{frame: []int32{0}, run: []int32{0}, score: []float64{0}, rank: []int{0}}
	frame, run, score := 0, 0, 0.0
	for _, p := range path {
		net.joint(row, frame, h)
		m, _ := vec.Max(row[:nTok])
		lseTok := float64(m) + math.Log(vec.SumExp(row[:nTok], m))
		lp := float64(row[p.tok]) - lseTok
		lseDur := 0.0
		if len(r.Durations) > 0 {
			md, _ := vec.Max(row[nTok:])
			lseDur = float64(md) + math.Log(vec.SumExp(row[nTok:], md))
			lp += float64(row[nTok+p.durIdx]) - lseDur
		}
		// The rank of the pair in the search's order: score descending, then the token's rank
		// (logit descending, id ascending), then the duration's (likewise).
		better := func(tok, di int) bool {
			q := float64(row[tok]) - lseTok
			if len(r.Durations) > 0 {
				q += float64(row[nTok+di]) - lseDur
			}
			if q != lp {
				return q > lp
			}
			if row[tok] != row[p.tok] {
				return row[tok] > row[p.tok]
			}
			if tok != int(p.tok) {
				return tok < int(p.tok)
			}
			return row[nTok+di] > row[nTok+p.durIdx] || (row[nTok+di] == row[nTok+p.durIdx] && di < p.durIdx)
		}
		rank := 0
		for tok := range nTok {
			for di := range max(len(r.Durations), 1) {
				if (tok != int(p.tok) || di != p.durIdx) && better(tok, di) {
					rank++
				}
			}
		}
		dur := 0
		if len(r.Durations) > 0 {
			dur = r.Durations[p.durIdx]
		}
		switch {
		case p.tok == r.Blank:
			frame, run = frame+max(dur, 1), 0
		case dur > 0:
			frame, run = frame+dur, 0
		case run+1 >= r.MaxSymbols:
			frame, run = frame+1, 0
		default:
			run++
		}
		if p.tok != r.Blank {
			h2 := make([]float32, len(h))
			net.predict(h2, h, p.tok)
			h = h2
		}
		score += lp
		sp.frame = append(sp.frame, int32(frame))
		sp.run = append(sp.run, int32(run))
		sp.score = append(sp.score, score)
		sp.rank = append(sp.rank, rank)
	}
	return sp
}

// pruned reports how the search could have lost path p: the first prefix state of p that
// either was not among its parent's Width best pairs or, while it waited (from the round that
// created it to the round that would expand it), scored no more than the Width-th hypothesis
// kept by a round. It returns "" if there is none: then the search cannot have lost p.
func (l *roundLog) pruned(p scoredPath, w, frames int) string {
	less := func(a, b [2]int32) bool { return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]) }
	for i := 1; i < len(p.score); i++ {
		if p.rank[i] >= w {
			return fmt.Sprintf("decision %d is pair %d of its row", i, p.rank[i])
		}
		created := [2]int32{p.frame[i-1], p.run[i-1]}
		expanded := [2]int32{p.frame[i], p.run[i]}
		for r, k := range l.key {
			if less(k, created) || (p.frame[i] < int32(frames) && !less(k, expanded)) {
				continue
			}
			if p.score[i] <= l.theta[r] {
				return fmt.Sprintf("state %d (frame %d, run %d, score %.6f) is below the threshold %.6f of round %d (frame %d, run %d)",
					i, p.frame[i], p.run[i], p.score[i], l.theta[r], r, k[0], k[1])
			}
		}
	}
	return ""
}

// greedyPath returns every decision of the greedy loop, blanks included.
func greedyPath(t *testing.T, net toyNet) []pathStep {
	r := net.rule()
	h := make([]float32, net.stateDim())
	h2 := make([]float32, net.stateDim())
	net.predict(h, nil, r.Blank)
	row := make([]float32, r.Width())
	var out []pathStep
	s := TDTState{}
	for s.Frame < net.frames() {
		net.joint(row, s.Frame, h)
		st, err := r.Step(&s, row)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pathStep{st.Frame, st.Token, st.DurIdx})
		if st.Emit {
			net.predict(h2, h, st.Token)
			h, h2 = h2, h
		}
	}
	return out
}

// TestTDTBeamAgainstGreedy: beam search is not monotone, so a wider beam can return less than
// greedy when greedy's path is pruned by hypotheses that later fall behind. What holds, and is
// asserted for every toy case, seed, merge rule and width 2 to 8: the beam's best score is at
// least the score of greedy's path under the search's scoring, unless greedy's path was pruned:
// one of its states, while it waited to be expanded, scored no more than the Width-th
// hypothesis a round kept. The test reports how often the beam falls below greedy.
func TestTDTBeamAgainstGreedy(t *testing.T) {
	below, better, total := 0, 0, 0
	for _, c := range toyCases {
		for seed := range uint64(20) {
			net := newToy(seed, c.vocab, c.frames, c.durations, c.maxSymbols)
			gp := scorePath(net, greedyPath(t, net))
			g := gp.score[len(gp.score)-1]
			for _, merge := range merges {
				w1 := decodeBeam(t, net, TDTBeam{Width: 1, Merge: merge}, nil).Hyp(0).Score
				if w1 != g {
					t.Fatalf("%s seed %d: width 1 scores %v, greedy's path %v", c.name, seed, w1, g)
				}
				for w := 2; w <= 8; w++ {
					s, l := decodeLogged(t, net, TDTBeam{Width: w, Merge: merge}, seed < 3)
					b := s.Hyp(0).Score
					total++
					switch {
					case b > g:
						better++
					case b < g:
						below++
						why := l.pruned(gp, w, net.frames())
						if why == "" {
							t.Errorf("%s seed %d merge %d width %d: best %.6f below greedy's %.6f, and greedy's path was never pruned",
								c.name, seed, merge, w, b, g)
						}
					}
				}
			}
		}
	}
	t.Logf("of %d searches, %d beat greedy's path, %d fell below it (each time greedy's path had been pruned)", total, better, below)
	if better < total/2 {
		t.Errorf("only %d of %d searches beat greedy", better, total)
	}
}

// tinyCases are lattices small enough to enumerate every path and for MaxBeamWidth to hold
// every state: 2 to 4 frames, 1 to 4 tokens; one with a duration that overshoots the end, one
// with thousands of alignments of 9 token sequences.
var tinyCases = []toyCase{
	{"tdt-v2-d012-t2", 2, 2, []int{0, 1, 2}, 2},
	{"tdt-v2-d01-t4-max1", 2, 4, []int{0, 1}, 1},
	{"tdt-v1-d012-t4", 1, 4, []int{0, 1, 2}, 2},
	{"tdt-v2-d0124-t3-max1", 2, 3, []int{0, 1, 2, 4}, 1},
	{"rnnt-v2-t2", 2, 2, nil, 2},
	{"rnnt-v2-t3-max1", 2, 3, nil, 1},
	{"rnnt-v4-t2-max1", 4, 2, nil, 1},
}

// TestTDTBeamExhaustive compares the search with every path of small lattices (within the
// max-symbols rule), scored in float64 with math.Exp. It asserts:
//   - at width MaxBeamWidth nothing is pruned on these lattices (checked: no pair of any row is
//     left out and no candidate is dropped), and the best hypothesis is the exhaustive best:
//     the best path's score (MergeMax) or the best token sequence's total probability over all
//     its paths (MergeLogSumExp), within 1e-6, and the same tokens unless the runner-up is
//     within 1e-6;
//   - at every width 1 to 8 and both merge rules, no hypothesis claims more than its tokens
//     have (at most its sequence's best path, or total), and the best is at least the
//     exhaustive best path unless that path was pruned (TestTDTBeamAgainstGreedy's criterion);
//   - each lattice is wide enough that small widths do prune.
func TestTDTBeamExhaustive(t *testing.T) {
	const tol = 1e-6
	for _, c := range tinyCases {
		for seed := range uint64(6) {
			net := newToy(seed, c.vocab, c.frames, c.durations, c.maxSymbols)
			lat := newLattice(net)
			bk, bs := lat.bestPath()
			tk, ts := lat.bestTotal()
			name := fmt.Sprintf("%s seed %d (%d paths, %d sequences)", c.name, seed, lat.paths, len(lat.total))
			for _, merge := range merges {
				s := decodeBeam(t, net, TDTBeam{Width: MaxBeamWidth, Merge: merge}, nil)
				if s.dropped != 0 {
					t.Fatalf("%s: %d candidates pruned at width %d", name, s.dropped, MaxBeamWidth)
				}
				wantK, wantS, runnerUp := bk, bs, secondBest(lat.bestS)
				if merge == MergeLogSumExp {
					wantK, wantS, runnerUp = tk, ts, secondBest(lat.total)
				}
				got := seqOf(s.Tokens(0, nil))
				if math.Abs(s.Hyp(0).Score-wantS) > tol || (got != wantK && wantS-runnerUp > tol) {
					t.Errorf("%s merge %d: best %s %.9f, exhaustive %s %.9f", name, merge, got, s.Hyp(0).Score, wantK, wantS)
				}
				if n := len(lat.total); s.Len() != min(n, MaxBeamWidth) {
					t.Errorf("%s merge %d: %d hypotheses, %d sequences", name, merge, s.Len(), n)
				}
			}
			bp := scorePath(net, lat.best[bk])
			pruning := false
			for w := 1; w <= 8; w++ {
				for _, merge := range merges {
					s, l := decodeLogged(t, net, TDTBeam{Width: w, Merge: merge}, true)
					pruning = pruning || s.dropped > 0
					for i := range s.Len() {
						k := seqOf(s.Tokens(i, nil))
						limit := lat.bestS[k]
						if merge == MergeLogSumExp {
							limit = lat.total[k]
						}
						if s.Hyp(i).Score > limit+tol {
							t.Fatalf("%s width %d merge %d: %s scores %.9f, its paths have %.9f", name, w, merge, k, s.Hyp(i).Score, limit)
						}
					}
					if s.Hyp(0).Score < bs-tol {
						if why := l.pruned(bp, w, net.frames()); why == "" {
							t.Errorf("%s width %d merge %d: best %.6f below the best path's %.6f, which was never pruned",
								name, w, merge, s.Hyp(0).Score, bs)
						}
					}
				}
			}
			if !pruning {
				t.Errorf("%s: widths 1 to 8 never prune", name)
			}
		}
	}
}

// TestTDTBeamMerge: with durations [1, 2], the empty sequence reaches frame 2 by a blank of
// duration 2, or by two blanks of duration 1. After the round at frame 1 the beam holds it once,
// scored by the merge rule from both paths (the rows depend only on the frame).
func TestTDTBeamMerge(t *testing.T) {
	net := &frameRows{r: TDT{Blank: 1, Durations: []int{1, 2}, MaxSymbols: 3}, rows: [][]float32{
		{-2, 1, 0, 0.5},
		{-1, 0.7, 0.2, -0.3},
		{0.5, 0, 0, 0},
		{0.1, 0.2, 0.3, 0.4},
	}}
	lp := func(f, tok, d int) float64 {
		return logSoftmax64(net.rows[f][:2])[tok] + logSoftmax64(net.rows[f][2:])[d]
	}
	long := lp(0, 1, 1)
	short := lp(0, 1, 0) + lp(1, 1, 0)
	for _, merge := range merges {
		want := math.Max(long, short)
		if merge == MergeLogSumExp {
			want = logAddExp(long, short)
		}
		s, err := NewTDTBeamSearch(TDTBeam{Rule: net.r, Width: 8, Merge: merge})
		if err != nil {
			t.Fatal(err)
		}
		st := &stream{s: s, net: net}
		d := newDriver(t, []*stream{st})
		if err := s.AddFrames(len(net.rows)); err != nil {
			t.Fatal(err)
		}
		for s.Ready() && s.t <= 1 {
			d.round([]*stream{st})
		}
		n, score := 0, 0.0
		for i := range s.Len() {
			if h := s.Hyp(i); h.Tokens == 0 && h.Frame == 2 {
				n++
				score = h.Score
			}
		}
		if n != 1 || math.Abs(score-want) > 1e-6 {
			t.Errorf("merge %d: %d hypotheses without tokens at frame 2, score %.9f, want one at %.9f (paths %.9f, %.9f)",
				merge, n, score, want, long, short)
		}
	}
}

// TestTDTBeamTieOrder: candidates of equal score rank as documented: pairs by the token's rank
// (higher logit, then lower id), then the duration's; hypotheses by their rank.
func TestTDTBeamTieOrder(t *testing.T) {
	// Tokens 1 and 2 tie above token 0; durations 0 and 1 tie above 2; the blank is last.
	net := &frameRows{r: TDT{Blank: 3, Durations: []int{0, 1, 2}, MaxSymbols: 5}, rows: [][]float32{
		{0, 2, 2, -1, 1, 1, 0},
		{0, 0, 0, 0, 0, 0, 0},
	}}
	s, err := NewTDTBeamSearch(TDTBeam{Rule: net.r, Width: 4})
	if err != nil {
		t.Fatal(err)
	}
	st := &stream{s: s, net: net}
	d := newDriver(t, []*stream{st})
	if err := s.AddFrames(2); err != nil {
		t.Fatal(err)
	}
	d.round([]*stream{st})
	var got []string
	for i := range s.Len() {
		tok := s.Tokens(i, nil)
		got = append(got, fmt.Sprintf("%d/%d@%d", tok[0].Token, tok[0].DurIdx, s.Hyp(i).Frame))
	}
	want := []string{"1/0@0", "1/1@1", "2/0@0", "2/1@1"}
	if !slices.Equal(got, want) {
		t.Errorf("beam %v, want %v", got, want)
	}
}

// TestTDTBeamBatchedAndChunked: several streams of different models, widths and merge rules
// stepped together, each receiving its frames in its own random chunks, end exactly as each
// stream alone with all its frames at once (scores compared with ==): streams are independent,
// and a round reads only frames that every chunking has delivered.
func TestTDTBeamBatchedAndChunked(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	var streams []*stream
	var alone []*TDTBeamSearch
	var chunks [][]int
	for i, c := range toyCases {
		for k := range 2 {
			net := newToy(uint64(100+i*2+k), c.vocab, c.frames, c.durations, c.maxSymbols)
			cfg := TDTBeam{Rule: net.rule(), Width: 1 + r.IntN(8), Merge: merges[k]}
			alone = append(alone, decodeBeam(t, net, cfg, nil))
			s, err := NewTDTBeamSearch(cfg)
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, &stream{s: s, net: net})
			var ch []int
			for left := c.frames; left > 0; {
				n := min(left, r.IntN(7))
				ch = append(ch, n)
				left -= n
			}
			chunks = append(chunks, ch)
		}
	}
	d := newDriver(t, streams)
	for step := 0; ; step++ {
		busy := false
		for i, st := range streams {
			if st.s.Done() {
				continue
			}
			busy = true
			if !st.s.Ready() && step%3 == i%3 {
				if len(chunks[i]) == 0 {
					st.s.Finish()
					continue
				}
				if err := st.s.AddFrames(chunks[i][0]); err != nil {
					t.Fatal(err)
				}
				chunks[i] = chunks[i][1:]
			}
		}
		if !busy {
			break
		}
		d.round(streams)
	}
	for i, st := range streams {
		checkDone(t, st.s)
		a := alone[i]
		if st.s.Len() != a.Len() {
			t.Fatalf("stream %d: %d hypotheses, alone %d", i, st.s.Len(), a.Len())
		}
		for h := range a.Len() {
			if st.s.Hyp(h) != a.Hyp(h) || !slices.Equal(st.s.Tokens(h, nil), a.Tokens(h, nil)) {
				t.Fatalf("stream %d hypothesis %d: %+v, alone %+v", i, h, st.s.Hyp(h), a.Hyp(h))
			}
		}
	}
}

// TestTDTBeamStable: taking the stable tokens after every round loses nothing (the stable tokens
// then the best hypothesis's equal the best hypothesis of a search that never takes them), and
// frees what it takes (the driver checks after every round that exactly the history the
// hypotheses reach is held).
func TestTDTBeamStable(t *testing.T) {
	for i, c := range toyCases {
		net := newToy(uint64(200+i), c.vocab, 4*c.frames, c.durations, c.maxSymbols)
		for _, w := range []int{1, 4, 8} {
			cfg := TDTBeam{Rule: net.rule(), Width: w}
			want := decodeBeam(t, net, cfg, nil)
			s, err := NewTDTBeamSearch(cfg)
			if err != nil {
				t.Fatal(err)
			}
			st := &stream{s: s, net: net}
			d := newDriver(t, []*stream{st})
			var stable []TDTStep
			d.afterRound = func(st *stream) {
				stable = st.s.Stable(stable)
				// Nothing Stable took is still held (checkRefs checks that only reachable
				// nodes are live).
				for i := range s.hyps {
					for x := s.hyps[i].node; x >= 0; x = s.nodes[x].parent {
						if s.nodes[x].depth < int32(len(stable)) {
							t.Fatalf("token %d is held after %d were taken", s.nodes[x].depth, len(stable))
						}
					}
					for x := s.hyps[i].seq; x >= 0; x = s.seqs[x].parent {
						if s.seqs[x].depth < int32(len(stable)) {
							t.Fatalf("a sequence of %d tokens is held after %d were taken", s.seqs[x].depth, len(stable))
						}
					}
				}
			}
			if err := s.AddFrames(net.frames()); err != nil {
				t.Fatal(err)
			}
			s.Finish()
			for d.round([]*stream{st}) {
			}
			got := s.Tokens(0, stable)
			if s.Hyp(0) != want.Hyp(0) || !slices.Equal(got, want.Tokens(0, nil)) {
				t.Fatalf("%s width %d: %+v %d tokens, without Stable %+v", c.name, w, s.Hyp(0), len(got), want.Hyp(0))
			}
			if len(stable) < len(got)/2 {
				t.Errorf("%s width %d: %d of %d tokens taken as stable", c.name, w, len(stable), len(got))
			}
		}
	}
}

// TestTDTBeamErrors: bad configurations and rows are refused, and a refused row leaves the
// search as it was.
func TestTDTBeamErrors(t *testing.T) {
	rule := TDT{Blank: 3, Durations: []int{0, 1, 2}, MaxSymbols: 2}
	for _, c := range []TDTBeam{
		{Rule: rule, Width: 0}, {Rule: rule, Width: MaxBeamWidth + 1}, {Rule: rule, Width: 2, Merge: 7},
		{Rule: TDT{Blank: 3, MaxSymbols: 0}, Width: 2},
	} {
		if _, err := NewTDTBeamSearch(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	s, err := NewTDTBeamSearch(TDTBeam{Rule: rule, Width: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Advance(nil); err == nil {
		t.Error("Advance before any frame")
	}
	if err := s.AddFrames(-1); err == nil {
		t.Error("negative frames added")
	}
	if err := s.AddFrames(3); err != nil {
		t.Fatal(err)
	}
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	ninf := float32(math.Inf(-1))
	for _, row := range [][]float32{
		make([]float32, 6),
		{0, nan, 0, 0, 0, 0, 0},
		{0, 0, 0, 0, 0, nan, 0},
		{0, inf, 0, 0, 0, 0, 0},
		{0, 0, 0, 0, 0, 0, inf},
		{ninf, ninf, ninf, ninf, 0, 0, 0},
		{0, 0, 0, 0, ninf, ninf, ninf},
	} {
		if err := s.Advance(row); err == nil {
			t.Errorf("row %v accepted", row)
		}
		if !s.Ready() || len(s.Joints()) != 1 || len(s.Predictions()) != 1 || s.Len() != 1 {
			t.Fatalf("a refused row moved the search")
		}
	}
	if err := s.Advance([]float32{0, 1, 0, 0, 0, 0, ninf}); err != nil {
		t.Fatal(err)
	}
	s.Finish()
	if err := s.AddFrames(1); err == nil {
		t.Error("frames added after Finish")
	}
}

// TestTDTBeamAllocs: a round (Advance, Stable and reading the next round's requests) allocates
// nothing once the search has warmed up, at Parakeet's row width and width 8.
func TestTDTBeamAllocs(t *testing.T) {
	b := newRandRounds(8, 1024, []int{0, 1, 2, 3, 4}, 10)
	for range 200 {
		b.round()
	}
	if a := testing.AllocsPerRun(200, b.round); a != 0 {
		t.Errorf("a round allocates %v times", a)
	}
}

// randRounds drives a search with random joint rows, as a benchmark does: frames never run out
// and the stable tokens are taken every round.
type randRounds struct {
	s      *TDTBeamSearch
	rows   [][]float32 // a pool of rows
	buf    []float32
	stable []TDTStep
	next   int
	rounds int
}

func newRandRounds(width, vocab int, durations []int, maxSymbols int) *randRounds {
	rule := TDT{Blank: int32(vocab), Durations: durations, MaxSymbols: maxSymbols}
	s, err := NewTDTBeamSearch(TDTBeam{Rule: rule, Width: width})
	if err != nil {
		panic(err)
	}
	if err := s.AddFrames(math.MaxInt32 / 4); err != nil {
		panic(err)
	}
	r := rand.New(rand.NewPCG(7, uint64(vocab)))
	b := &randRounds{s: s, buf: make([]float32, 0, width*rule.Width()), stable: make([]TDTStep, 0, 1024)}
	// Rows like a trained model's: a few tokens stand out; the blank often wins.
	for range 64 {
		row := randLogits(r, rule.Width(), 1, false)
		for range 3 {
			row[r.IntN(vocab)] += 6
		}
		row[vocab] += float32(r.NormFloat64()*3 + 6)
		b.rows = append(b.rows, row)
	}
	return b
}

func (b *randRounds) round() {
	b.buf = b.buf[:0]
	for range b.s.Joints() {
		b.buf = append(b.buf, b.rows[b.next%len(b.rows)]...)
		b.next++
	}
	if err := b.s.Advance(b.buf); err != nil {
		panic(err)
	}
	b.stable = b.s.Stable(b.stable[:0])
	b.rounds++
}

// TestTDTBeamSharing: work is shared between hypotheses. The driver checks every round that a
// round requests one joint row per expanded hypothesis, for its state, that hypotheses of equal
// tokens share one slot, and that no prediction recomputes a state a slot holds. Over whole
// decodes at width 4 the test logs the work done: joint rows against expansions would be equal
// by construction, so it logs how many rows repeat a row of an earlier round at the same frame
// and tokens (a hypothesis that reaches tokens already expanded at its frame through one more
// zero-duration token), and the prediction steps against the tokens of the best hypotheses.
func TestTDTBeamSharing(t *testing.T) {
	for _, c := range toyCases {
		joints, repeats, preds, tokens := 0, 0, 0, 0
		for seed := range uint64(10) {
			net := newToy(seed, c.vocab, c.frames, c.durations, c.maxSymbols)
			s, err := NewTDTBeamSearch(TDTBeam{Rule: net.rule(), Width: 4})
			if err != nil {
				t.Fatal(err)
			}
			st := &stream{s: s, net: net}
			d := newDriver(t, []*stream{st})
			rows := map[string]bool{}
			d.onRound = func(st *stream) {
				for _, j := range s.Joints() {
					k := fmt.Sprint(j.Frame, d.seqs[int(j.Slot)])
					if rows[k] {
						repeats++
					}
					rows[k] = true
				}
			}
			if err := s.AddFrames(net.frames()); err != nil {
				t.Fatal(err)
			}
			s.Finish()
			for d.round([]*stream{st}) {
			}
			joints += d.joints
			preds += d.preds
			tokens += s.Hyp(0).Tokens
		}
		t.Logf("%s: %d joint rows, %d of them repeats; %d prediction steps for %d tokens in the best hypotheses",
			c.name, joints, repeats, preds, tokens)
	}
}

// TestTDTBeamReset: a search reset after a stream decodes the next exactly as a new one.
func TestTDTBeamReset(t *testing.T) {
	a := newToy(31, 12, 40, []int{0, 1, 2, 3, 4}, 10)
	b := newToy(32, 12, 40, []int{0, 1, 2, 3, 4}, 10)
	cfg := TDTBeam{Rule: a.rule(), Width: 4}
	want := decodeBeam(t, b, cfg, nil)
	s, err := NewTDTBeamSearch(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, net := range []*toyTransducer{a, b} {
		s.Reset()
		st := &stream{s: s, net: net}
		d := newDriver(t, []*stream{st})
		if err := s.AddFrames(net.frames()); err != nil {
			t.Fatal(err)
		}
		s.Finish()
		for d.round([]*stream{st}) {
		}
	}
	for i := range want.Len() {
		if s.Hyp(i) != want.Hyp(i) || !slices.Equal(s.Tokens(i, nil), want.Tokens(i, nil)) {
			t.Fatalf("hypothesis %d: %+v after Reset, %+v new", i, s.Hyp(i), want.Hyp(i))
		}
	}
}

// restartChunked runs a search of width w over net, the frames given in chunks of n; after each
// chunk it takes hypothesis 0's tokens and starts the search over from it (ResetAt, its state
// copied to slot 0 as a stream's scheduler does). It returns the tokens taken, in order.
func restartChunked(t *testing.T, net toyNet, w, n int) []TDTStep {
	s, err := NewTDTBeamSearch(TDTBeam{Rule: net.rule(), Width: w, Merge: MergeMax})
	if err != nil {
		t.Fatal(err)
	}
	st := &stream{s: s, net: net}
	d := newDriver(t, []*stream{st})
	d.check = false // a pending start's state is its last token's, which it does not hold
	var out []TDTStep
	for left := net.frames(); left > 0; left -= n {
		if err := s.AddFrames(min(n, left)); err != nil {
			t.Fatal(err)
		}
		for d.round([]*stream{st}) {
			checkRefs(t, s)
		}
		out = s.Tokens(0, out)
		r := s.Root(0)
		if r.Slot >= 0 {
			copy(d.states[0], d.states[r.Slot])
			r.Slot = 0
		}
		if err := s.ResetAt(r); err != nil {
			t.Fatal(err)
		}
		checkRefs(t, s)
		if s.Len() != 1 || s.Hyp(0).Tokens != 0 || s.Hyp(0).Frame != r.Frame || s.Hyp(0).Score != 0 {
			t.Fatalf("after ResetAt(%+v): %d hypotheses, the first %+v", r, s.Len(), s.Hyp(0))
		}
	}
	s.Finish()
	for d.round([]*stream{st}) {
	}
	if !s.Done() {
		t.Fatal("not done after Finish")
	}
	return s.Tokens(0, out)
}

// TestTDTBeamResetAt: a search of width 1 started over after every chunk from its hypothesis
// (ResetAt of Root) decides exactly as the greedy rule over the whole, whatever the chunks (the
// hypothesis then stands pending, after a token, or with its state computed, or in a run of
// zero-duration tokens); wider searches start over with their references consistent; bad
// starts are refused.
func TestTDTBeamResetAt(t *testing.T) {
	for _, c := range toyCases {
		for seed := range uint64(4) {
			net := newToy(300+seed, c.vocab, c.frames, c.durations, c.maxSymbols)
			want := greedy(t, net)
			for _, n := range []int{1, 2, 3, 7} {
				if got := restartChunked(t, net, 1, n); !slices.Equal(got, want) {
					t.Fatalf("%s seed %d chunks of %d: tokens\n%+v\ngreedy\n%+v", c.name, seed, n, got, want)
				}
				restartChunked(t, net, 4, n)
			}
		}
	}
	s, err := NewTDTBeamSearch(TDTBeam{Rule: TDT{Blank: 3, Durations: []int{0, 1, 2}, MaxSymbols: 2}, Width: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []BeamRoot{{Frame: -1, Slot: 0}, {Run: -1, Slot: 0}, {Token: 99, Slot: 0}, {Token: -1, Slot: 0}, {Slot: -1}, {Run: 1 << 20, Slot: 0}} {
		if err := s.ResetAt(r); err == nil {
			t.Errorf("ResetAt(%+v): no error", r)
		}
	}
}

// TestTDTBeamCopyFrom: a search that goes back to a copy taken between chunks (CopyFrom), after
// rounds on rows that are then thrown away, ends as a search that never took them.
func TestTDTBeamCopyFrom(t *testing.T) {
	for i, c := range toyCases {
		net := newToy(uint64(400+i), c.vocab, c.frames, c.durations, c.maxSymbols)
		for _, w := range []int{1, 4} {
			cfg := TDTBeam{Rule: net.rule(), Width: w, Merge: MergeMax}
			want := decodeBeam(t, net, cfg, nil)
			s, _ := NewTDTBeamSearch(cfg)
			saved, _ := NewTDTBeamSearch(cfg)
			st := &stream{s: s, net: net}
			d := newDriver(t, []*stream{st})
			half := c.frames / 2
			if err := s.AddFrames(half); err != nil {
				t.Fatal(err)
			}
			for d.round([]*stream{st}) {
			}
			if err := saved.CopyFrom(s); err != nil {
				t.Fatal(err)
			}
			states := make([][]float32, len(d.states))
			seqs := slices.Clone(d.seqs)
			for k := range states {
				states[k] = slices.Clone(d.states[k])
			}
			// Rounds on the rest, their rows thrown away.
			if err := s.AddFrames(c.frames - half); err != nil {
				t.Fatal(err)
			}
			for k := 0; k < 5 && d.round([]*stream{st}); k++ {
			}
			if err := s.CopyFrom(saved); err != nil {
				t.Fatal(err)
			}
			for k := range states {
				copy(d.states[k], states[k])
			}
			copy(d.seqs, seqs)
			checkRefs(t, s)
			if err := s.AddFrames(c.frames - half); err != nil {
				t.Fatal(err)
			}
			s.Finish()
			for d.round([]*stream{st}) {
			}
			if s.Hyp(0) != want.Hyp(0) || !slices.Equal(s.Tokens(0, nil), want.Tokens(0, nil)) {
				t.Fatalf("%s width %d: %+v, without the copy %+v", c.name, w, s.Hyp(0), want.Hyp(0))
			}
		}
	}
	a, _ := NewTDTBeamSearch(TDTBeam{Rule: TDT{Blank: 3, Durations: []int{0, 1, 2}, MaxSymbols: 2}, Width: 2})
	b, _ := NewTDTBeamSearch(TDTBeam{Rule: TDT{Blank: 3, Durations: []int{0, 1, 2}, MaxSymbols: 2}, Width: 3})
	if err := a.CopyFrom(b); err == nil {
		t.Error("a copy between widths: no error")
	}
}
