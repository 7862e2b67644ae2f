package decode

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// toyNet is a transducer the tests drive the search with: a prediction network whose state is
// a vector, and a joint that turns (frame, state) into a row of Rule.Width() logits.
type toyNet interface {
	rule() TDT
	frames() int
	stateDim() int
	// predict writes into dst the state h advanced by tok; h is nil for the initial state.
	predict(dst, h []float32, tok int32)
	joint(dst []float32, frame int, h []float32)
}

// toyTransducer is a random transducer: a recurrent prediction network
// h' = tanh(R·h + E[tok]) from h = 0, encoder frames enc[t], and a joint
// z = J·tanh(enc[t] + h) + bias, with a bias on the blank so that blanks take a share of the
// decisions. Everything is float32, as a backend computes it.
type toyTransducer struct {
	r    TDT
	t, h int
	emb  []float32 // [Blank+1, h]
	rec  []float32 // [h, h]
	enc  []float32 // [t, h]
	out  []float32 // [Width, h]
	bias []float32 // [Width]
	ties bool      // round the logits to quarters, so that many are equal
}

func newToy(seed uint64, vocab, frames int, durations []int, maxSymbols int) *toyTransducer {
	r := rand.New(rand.NewPCG(seed, 0x7d7))
	const h = 8
	m := &toyTransducer{r: TDT{Blank: int32(vocab), Durations: durations, MaxSymbols: maxSymbols}, t: frames, h: h}
	w := m.r.Width()
	fill := func(n int, scale float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * scale)
		}
		return x
	}
	m.emb = fill((vocab+1)*h, 1)
	m.rec = fill(h*h, 1.5/math.Sqrt(h))
	m.enc = fill(frames*h, 1)
	m.out = fill(w*h, 2.5/math.Sqrt(h))
	m.bias = make([]float32, w)
	m.bias[vocab] = 1
	for d := range durations {
		m.bias[vocab+1+d] = float32(r.NormFloat64() * 0.5)
	}
	return m
}

func (m *toyTransducer) rule() TDT     { return m.r }
func (m *toyTransducer) frames() int   { return m.t }
func (m *toyTransducer) stateDim() int { return m.h }

func (m *toyTransducer) predict(dst, h []float32, tok int32) {
	e := m.emb[int(tok)*m.h : int(tok+1)*m.h]
	for i := range m.h {
		s := e[i]
		if h != nil {
			for j, v := range h {
				s += m.rec[i*m.h+j] * v
			}
		}
		dst[i] = float32(math.Tanh(float64(s)))
	}
}

func (m *toyTransducer) joint(dst []float32, frame int, h []float32) {
	var a [16]float32
	for i := range m.h {
		a[i] = float32(math.Tanh(float64(m.enc[frame*m.h+i] + h[i])))
	}
	for o := range dst {
		s := m.bias[o]
		for i := range m.h {
			s += m.out[o*m.h+i] * a[i]
		}
		if m.ties {
			s = float32(math.Round(float64(s)*4) / 4)
		}
		dst[o] = s
	}
}

// frameRows is a toyNet whose rows depend only on the frame: rows[t] for every state.
type frameRows struct {
	r    TDT
	rows [][]float32
}

func (f *frameRows) rule() TDT                                   { return f.r }
func (f *frameRows) frames() int                                 { return len(f.rows) }
func (f *frameRows) stateDim() int                               { return 1 }
func (f *frameRows) predict(dst, h []float32, tok int32)         { dst[0] = 0 }
func (f *frameRows) joint(dst []float32, frame int, _ []float32) { copy(dst, f.rows[frame]) }

// stream is one search with the slots a driver gives it.
type stream struct {
	s    *TDTBeamSearch
	net  toyNet
	base int // its first slot in the driver's state table
}

// driver plays the scheduler: it owns every stream's prediction states in one table, runs each
// round's prediction steps and joint rows for all ready streams together, and checks on the way
// that the search's slots hold what it says (seqs: the tokens each slot's state was computed on).
type driver struct {
	t          *testing.T
	states     [][]float32
	seqs       [][]int32
	rows       []float32
	preds      int // prediction steps run
	joints     int // joint rows computed
	check      bool
	onRound    func(st *stream) // called before each stream's Advance
	afterRound func(st *stream) // called after it
}

func newDriver(t *testing.T, streams []*stream) *driver {
	d := &driver{t: t, check: true}
	for _, st := range streams {
		st.base = len(d.states)
		for range st.s.Slots() {
			d.states = append(d.states, make([]float32, st.net.stateDim()))
			d.seqs = append(d.seqs, nil)
		}
	}
	return d
}

// round runs one round of every ready stream, all prediction steps first, then all joint rows,
// then each stream's Advance on its part of the rows. It returns whether any stream was ready.
func (d *driver) round(streams []*stream) bool {
	any := false
	for _, st := range streams {
		if !st.s.Ready() {
			continue
		}
		any = true
		// The tokens whose state a slot holds (one no prediction of this round writes).
		held := map[string]bool{}
		for i := range st.s.hyps {
			if c := st.s.seqs[st.s.hyps[i].seq].slot; c >= 0 && !slices.ContainsFunc(st.s.Predictions(),
				func(p PredictRequest) bool { return p.To == c }) {
				held[fmt.Sprint(d.seqs[st.base+int(c)])] = true
			}
		}
		seen := map[[2]int32]bool{}
		for _, p := range st.s.Predictions() {
			if seen[[2]int32{p.From, p.Token}] {
				d.t.Fatalf("two predictions of slot %d on token %d in one round", p.From, p.Token)
			}
			seen[[2]int32{p.From, p.Token}] = true
			to := st.base + int(p.To)
			if p.From < 0 {
				if p.Token != st.net.rule().Blank {
					d.t.Fatalf("the initial state advanced by %d", p.Token)
				}
				st.net.predict(d.states[to], nil, p.Token)
				d.seqs[to] = []int32{}
			} else {
				from := st.base + int(p.From)
				st.net.predict(d.states[to], d.states[from], p.Token)
				d.seqs[to] = append(append([]int32{}, d.seqs[from]...), p.Token)
			}
			if held[fmt.Sprint(d.seqs[to])] {
				d.t.Fatalf("a prediction of %v, whose state a slot holds", d.seqs[to])
			}
			d.preds++
		}
	}
	if !any {
		return false
	}
	d.rows = d.rows[:0]
	type span struct{ lo, hi int }
	spans := make([]span, len(streams))
	for i, st := range streams {
		if !st.s.Ready() {
			continue
		}
		r := st.net.rule()
		w := r.Width()
		spans[i].lo = len(d.rows)
		for _, j := range st.s.Joints() {
			n := len(d.rows)
			d.rows = append(d.rows, make([]float32, w)...)
			st.net.joint(d.rows[n:], j.Frame, d.states[st.base+int(j.Slot)])
			d.joints++
		}
		spans[i].hi = len(d.rows)
	}
	for i, st := range streams {
		if !st.s.Ready() {
			continue
		}
		if d.check {
			d.checkSlots(st)
		}
		if d.onRound != nil {
			d.onRound(st)
		}
		if err := st.s.Advance(d.rows[spans[i].lo:spans[i].hi]); err != nil {
			d.t.Fatal(err)
		}
		if d.check {
			checkRefs(d.t, st.s)
		}
		if d.afterRound != nil {
			d.afterRound(st)
		}
	}
	return true
}

// checkSlots checks that every hypothesis's state is the one of its tokens, that hypotheses
// share a state exactly when their tokens are equal, and that the round expands the hypotheses
// at the lowest frame, which share one zero-duration count, all others having none.
func (d *driver) checkSlots(st *stream) {
	s := st.s
	for i := range s.hyps {
		h := &s.hyps[i]
		if h.frame < s.t || (h.frame == s.t) != slices.Contains(s.expand, int32(i)) ||
			(h.frame == s.t && h.run != s.hyps[s.expand[0]].run) || (h.frame > s.t && h.run != 0) {
			d.t.Fatalf("round at frame %d expands %v; hypothesis %d is at frame %d, run %d", s.t, s.expand, i, h.frame, h.run)
		}
	}
	// One joint row per expanded hypothesis, each for its own state.
	if len(s.Joints()) != len(s.expand) {
		d.t.Fatalf("%d joint rows for %d hypotheses", len(s.Joints()), len(s.expand))
	}
	for j, e := range s.expand {
		if jr := s.Joints()[j]; jr.Frame != int(s.t) || jr.Slot != s.seqs[s.hyps[e].seq].slot {
			d.t.Fatalf("hypothesis %d reads joint row %+v", e, jr)
		}
	}
	checkRefs(d.t, s)
	bySeq := map[string]int64{}
	for i := range s.hyps {
		h := &s.hyps[i]
		toks := s.Tokens(i, nil)
		seq := make([]int32, len(toks))
		for k, x := range toks {
			seq[k] = x.Token
		}
		var have []int32
		q := s.seqs[h.seq]
		switch {
		case q.slot >= 0:
			have = d.seqs[st.base+int(q.slot)]
		case h.from < 0:
			have = []int32{}
		default:
			have = append(append([]int32{}, d.seqs[st.base+int(h.from)]...), q.tok)
		}
		// The state's tokens: those Stable took, then the hypothesis's own.
		if len(have) != s.stableCount+len(seq) || fmt.Sprint(have[s.stableCount:]) != fmt.Sprint(seq) {
			d.t.Fatalf("hypothesis %d holds tokens %v, its state was computed on %v", i, seq, have)
		}
		k := int64(h.seq)
		if o, ok := bySeq[fmt.Sprint(seq)]; ok && o != k {
			d.t.Fatalf("tokens %v are held in two states (%d and %d)", seq, o, k)
		}
		bySeq[fmt.Sprint(seq)] = k
	}
	if len(bySeq) > 0 {
		keys := map[int64]bool{}
		for _, k := range bySeq {
			if keys[k] {
				d.t.Fatal("two token sequences share a state")
			}
			keys[k] = true
		}
	}
}

// decodeBeam runs one search over net with the frames given in chunks (all at once if chunks
// is nil), and returns it done.
func decodeBeam(t *testing.T, net toyNet, c TDTBeam, chunks []int) *TDTBeamSearch {
	c.Rule = net.rule()
	s, err := NewTDTBeamSearch(c)
	if err != nil {
		t.Fatal(err)
	}
	st := &stream{s: s, net: net}
	d := newDriver(t, []*stream{st})
	if chunks == nil {
		chunks = []int{net.frames()}
	}
	for _, n := range chunks {
		if err := s.AddFrames(n); err != nil {
			t.Fatal(err)
		}
		for d.round([]*stream{st}) {
		}
	}
	s.Finish()
	for d.round([]*stream{st}) {
	}
	if !s.Done() {
		t.Fatal("not done after Finish")
	}
	return s
}

// greedy runs TDT.Step over net as whisper.cpp's loop does.
func greedy(t *testing.T, net toyNet) []TDTStep {
	r := net.rule()
	h := make([]float32, net.stateDim())
	h2 := make([]float32, net.stateDim())
	net.predict(h, nil, r.Blank)
	row := make([]float32, r.Width())
	var out []TDTStep
	s := TDTState{}
	for s.Frame < net.frames() {
		net.joint(row, s.Frame, h)
		st, err := r.Step(&s, row)
		if err != nil {
			t.Fatal(err)
		}
		if st.Emit {
			out = append(out, st)
			net.predict(h2, h, st.Token)
			h, h2 = h2, h
		}
	}
	return out
}

// pathStep is one decision of a path through the lattice.
type pathStep struct {
	frame  int
	tok    int32
	durIdx int
}

// lattice enumerates the paths of a toy transducer by brute force, scoring them in float64
// with math.Exp (independently of the search's float32 exponentials).
type lattice struct {
	net   toyNet
	rows  map[string][]float32 // by frame and tokens
	paths int
	// per token sequence: the best path and its score, and the log-sum-exp of all its paths
	best  map[string][]pathStep
	bestS map[string]float64
	total map[string]float64
}

func newLattice(net toyNet) *lattice {
	l := &lattice{net: net, rows: map[string][]float32{}, best: map[string][]pathStep{},
		bestS: map[string]float64{}, total: map[string]float64{}}
	l.walk(0, 0, nil, nil, 0)
	return l
}

func (l *lattice) row(frame int, seq []int32) []float32 {
	k := fmt.Sprint(frame, seq)
	if r, ok := l.rows[k]; ok {
		return r
	}
	r := l.net.rule()
	h := make([]float32, l.net.stateDim())
	l.net.predict(h, nil, r.Blank)
	for _, tok := range seq {
		h2 := make([]float32, len(h))
		l.net.predict(h2, h, tok)
		h = h2
	}
	row := make([]float32, r.Width())
	l.net.joint(row, frame, h)
	l.rows[k] = row
	return row
}

// logSoftmax64 returns the float64 log-softmax of x.
func logSoftmax64(x []float32) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = max(m, float64(v))
	}
	s := 0.0
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - m - math.Log(s)
	}
	return out
}

func (l *lattice) walk(frame, run int, seq []int32, path []pathStep, score float64) {
	r := l.net.rule()
	if frame >= l.net.frames() {
		l.paths++
		k := fmt.Sprint(seq)
		if old, ok := l.bestS[k]; !ok || score > old {
			l.bestS[k] = score
			l.best[k] = append([]pathStep{}, path...)
		}
		if old, ok := l.total[k]; ok {
			l.total[k] = logAddExp(old, score)
		} else {
			l.total[k] = score
		}
		return
	}
	row := l.row(frame, seq)
	nTok := int(r.Blank) + 1
	tl := logSoftmax64(row[:nTok])
	dl := []float64{0}
	if len(r.Durations) > 0 {
		dl = logSoftmax64(row[nTok:])
	}
	for tok := range nTok {
		for di := range dl {
			dur := 0
			if len(r.Durations) > 0 {
				dur = r.Durations[di]
			}
			nf, nr := frame, 0
			nseq := seq
			switch {
			case int32(tok) == r.Blank:
				nf += max(dur, 1)
			case dur > 0:
				nf += dur
			case run+1 >= r.MaxSymbols:
				nf++
			default:
				nr = run + 1
			}
			if int32(tok) != r.Blank {
				nseq = append(append([]int32{}, seq...), int32(tok))
			}
			l.walk(nf, nr, nseq, append(path, pathStep{frame, int32(tok), di}), score+tl[tok]+dl[di])
		}
	}
}

// bestPath returns the best path over all sequences and its score.
func (l *lattice) bestPath() (string, float64) {
	bk, bs := "", math.Inf(-1)
	for k, s := range l.bestS {
		if s > bs {
			bk, bs = k, s
		}
	}
	return bk, bs
}

// bestTotal returns the token sequence of the highest total probability and its log.
func (l *lattice) bestTotal() (string, float64) {
	bk, bs := "", math.Inf(-1)
	for k, s := range l.total {
		if s > bs {
			bk, bs = k, s
		}
	}
	return bk, bs
}

// secondBest returns the second-highest value of m.
func secondBest(m map[string]float64) float64 {
	a, b := math.Inf(-1), math.Inf(-1)
	for _, v := range m {
		if v > a {
			a, b = v, a
		} else if v > b {
			b = v
		}
	}
	return b
}

// seqOf returns the tokens of steps as fmt prints a []int32.
func seqOf(steps []TDTStep) string {
	s := make([]int32, len(steps))
	for i, x := range steps {
		s[i] = x.Token
	}
	return fmt.Sprint(s)
}

// checkRefs checks the search's reference counts against what its hypotheses reach: the live
// token nodes and sequence nodes are exactly those reachable from a hypothesis, each with one
// reference per hypothesis on it and per live child, and every slot has one reference per
// hypothesis referring to it (its sequence's slot, or the slot a pending one is predicted from,
// and the slot a prediction of this round still reads) and is free when it has none.
func checkRefs(t *testing.T, s *TDTBeamSearch) {
	t.Helper()
	// expect returns the references each node reachable from roots should have.
	expect := func(roots []int32, parent func(int32) int32) map[int32]int32 {
		refs := map[int32]int32{}
		for _, x := range roots {
			for first := true; x >= 0; x, first = parent(x), false {
				_, seen := refs[x]
				if first {
					refs[x]++
				} else if !seen {
					refs[x] += 0
				}
				if seen {
					break
				}
			}
		}
		for x := range refs {
			if p := parent(x); p >= 0 {
				refs[p]++
			}
		}
		return refs
	}
	var nodeRoots, seqRoots []int32
	slotRefs := make([]int32, s.Slots())
	for i := range s.hyps {
		h := &s.hyps[i]
		nodeRoots = append(nodeRoots, h.node)
		seqRoots = append(seqRoots, h.seq)
		if c := s.seqs[h.seq].slot; c >= 0 {
			slotRefs[c]++
		} else if h.from >= 0 {
			slotRefs[h.from]++
		}
		if h.held >= 0 {
			slotRefs[h.held]++
		}
	}
	for _, k := range []struct {
		name string
		want map[int32]int32
		live int
		refs func(int32) int32
	}{
		{"token", expect(nodeRoots, func(x int32) int32 { return s.nodes[x].parent }), len(s.nodes) - len(s.freeNodes),
			func(x int32) int32 { return s.nodes[x].refs }},
		{"sequence", expect(seqRoots, func(x int32) int32 { return s.seqs[x].parent }), len(s.seqs) - len(s.freeSeqs),
			func(x int32) int32 { return s.seqs[x].refs }},
	} {
		if k.live != len(k.want) {
			t.Fatalf("%d %s nodes live, %d reachable", k.live, k.name, len(k.want))
		}
		for x, n := range k.want {
			if k.refs(x) != n {
				t.Fatalf("%s node %d has %d references, want %d", k.name, x, k.refs(x), n)
			}
		}
	}
	for x := range expect(seqRoots, func(x int32) int32 { return s.seqs[x].parent }) {
		if c := s.seqs[x].slot; c >= 0 && s.slotSeq[c] != x {
			t.Fatalf("sequence node %d holds slot %d, which holds %d", x, c, s.slotSeq[c])
		}
	}
	free := 0
	for c, n := range slotRefs {
		if s.slotRefs[c] != n {
			t.Fatalf("slot %d has %d references, %d hypotheses refer to it", c, s.slotRefs[c], n)
		}
		if n == 0 {
			free++
		}
	}
	if free != len(s.freeSlots) {
		t.Fatalf("%d slots unreferenced, %d free", free, len(s.freeSlots))
	}
}
