package decode

import (
	"errors"
	"fmt"
	"math"

	"github.com/parleyhq/parley/internal/vec"
)

// MaxBeamWidth is the widest beam TDTBeam accepts. Serving uses 1 to 8; a round costs
// O(Width²) bookkeeping, so the wider beams are for analysis and tests.
const MaxBeamWidth = 64

// BeamMerge says how two hypotheses in the same state are combined into one.
type BeamMerge uint8

const (
	// MergeLogSumExp adds their probabilities: the merged score is the log-sum-exp of both, as
	// NeMo's transducer beam searches recombine hypotheses (merge_duplicate_hypotheses in
	// tdt_beam_decoding.py, self_recombine_hyps_ in rnnt_batched_beam_utils.py).
	MergeLogSumExp BeamMerge = iota
	// MergeMax keeps the better one alone (a Viterbi search over alignments).
	MergeMax
)

// TDTBeam configures a beam search over the joint outputs of a Token-and-Duration Transducer,
// or without durations of a plain RNN-T (Rule says which). A TDTBeamSearch runs it.
type TDTBeam struct {
	Rule  TDT       // blank, durations and the max-symbols rule, as the greedy search reads them
	Width int       // hypotheses kept, 1 to MaxBeamWidth; 1 is exactly Rule's greedy search
	Merge BeamMerge // how hypotheses in the same state combine
}

// Validate checks the configuration.
func (c *TDTBeam) Validate() error {
	if err := c.Rule.Validate(); err != nil {
		return err
	}
	if c.Width < 1 || c.Width > MaxBeamWidth {
		return fmt.Errorf("decode: TDT beam: width %d (want 1 to %d)", c.Width, MaxBeamWidth)
	}
	if c.Merge > MergeMax {
		return fmt.Errorf("decode: TDT beam: unknown merge rule %d", c.Merge)
	}
	return nil
}

// PredictRequest asks for one prediction-network step: the state in slot From advanced by
// Token, written with its output (the joint's prediction input) to slot To. From is -1 for the
// network's initial state; To is never a slot any request of the round reads.
type PredictRequest struct {
	From, Token, To int32
}

// JointRequest asks for one joint row: the encoder output at Frame joined with the prediction
// output held in Slot.
type JointRequest struct {
	Frame int
	Slot  int32
}

// BeamHyp describes one hypothesis of a beam.
type BeamHyp struct {
	Score  float64 // its log-probability under the search's scoring (see TDTBeamSearch)
	Tokens int     // tokens emitted since Reset, those taken by Stable included
	Frame  int     // the frame it reads next; at least the frame count once it has finished
}

// TDTBeamSearch is a frame-synchronous beam search over a transducer's joint outputs, driven
// round by round by a scheduler that computes the prediction network and the joint for it.
//
// # The search
//
// A hypothesis is a token sequence with an alignment: the frame its next joint row reads, the
// zero-duration tokens emitted at that frame so far (run), and a score. A round expands every
// hypothesis of the beam that stands at the lowest frame t: one joint row each, at frame t.
// Each row gives log-probabilities as NeMo's beam searches use them: a log-softmax over the
// Blank+1 token logits (blank included) and, for a TDT, a separate log-softmax over the
// duration logits; a (token, duration) pair scores their sum. Each expanded hypothesis offers
// its Width best pairs (ties to the token with the higher logit, then the lower id, then the
// same for durations). A pair moves the hypothesis as the greedy rule TDT.Step does: a blank
// advances max(duration, 1) frames, a token with a duration d > 0 advances d, a token of
// duration 0 stays at t unless it is the MaxSymbols-th zero-duration token there, when it
// advances one. The candidates (these expansions and the hypotheses waiting at later frames)
// are merged where they stand in the same state (below) and the Width best are kept (ties to
// the hypotheses already waiting, then in order of the expanded hypotheses' rank and their
// pairs' rank). A round reads only frame t, and frames are taken in order, so the result does
// not depend on how the encoder output arrives in chunks (AddFrames). A hypothesis has
// finished when it reaches the frame count given by Finish; the search is done when all have.
//
// Two hypotheses are in the same state when they hold the same tokens and read the same frame
// next: then every continuation of one is a continuation of the other with the same scores, and
// Merge combines them. (Their counts of zero-duration tokens agree too: the hypotheses at the
// lowest frame were all made by the same round, and those at later frames have none. So NeMo's
// key, tokens and frame, is exact here under the max-symbols rule.) Finished hypotheses of the
// same tokens are merged whatever frame past the end they reached.
//
// With Width 1 the search is the greedy rule exactly (same tokens, frames, durations, P and
// PLog). With a width at least the number of states ever live, nothing is pruned and the
// search is exact: the best path (MergeMax) or the token sequence of the highest total
// probability over the alignments the lattice allows (MergeLogSumExp).
//
// # Why this variant
//
// NeMo has three transducer beam searches that handle TDT durations. The default one
// (BeamTDTInfer.default_beam_search) expands one hypothesis at a time, best first, with a
// data-dependent stopping test: a joint call per hypothesis, nothing to batch. mAES
// (modified_adaptive_expansion_search) is frame-synchronous and expands all hypotheses of a
// frame together, for up to maes_num_steps rounds per frame, but prunes expansions by value and
// rescores with a prefix search that calls the joint on the stored prediction outputs of every
// prefix pair: irregular work. The batched mALSD search (ModifiedALSDBatchedTDTComputer) steps
// every hypothesis once per step, each at its own frame, in fixed shapes: good on a GPU, but a
// hypothesis that reaches the end of the encoder output received so far must wait while the
// others step on, so a streaming result depends on the chunking. This search keeps mAES's
// frame-synchronous rounds (all hypotheses of the lowest frame expanded together, at most
// MaxSymbols rounds per frame, as the greedy rule), the pair top-k of mALSD and the default
// search, and NeMo's recombination; it leaves out prefix search (its effect, adding the
// probability of reaching a hypothesis by another alignment, is what merging does for the
// states the beam holds) and value pruning. Each round is one batched prediction call and one
// batched joint call for every stream together, and streaming does not change the result. The
// price of frame-synchronous rounds is their number: a round expands only the hypotheses at the
// lowest frame, so there are more rounds than greedy steps, with fewer rows each (about one
// round per frame against greedy's one step per two frames, 1.8 rows per round at width 4, on
// the random rows of BenchmarkTDTBeam). And a hypothesis that reaches tokens already expanded at
// its frame, by one more zero-duration token, is expanded again a round later on the same joint
// row (1 to 2 % of the rows on the random transducers of the tests; not worth keeping rows).
//
// # Scores and results
//
// The search's score of a hypothesis is the sum of its pairs' log-probabilities, with merged
// hypotheses combined by Merge. The beam is kept best first by score; finished hypotheses are
// ranked by it too (NeMo's score_norm ranks by score per token instead: use SequenceScore with
// BeamHyp.Tokens to rank so). Emitted tokens are TDTSteps as the greedy rule reports them: the
// frame the token was read at, the token, the duration chosen, and P and PLog by whisper.cpp's
// definitions (see TDTStep), so results are assembled the same way as greedy ones.
//
// # Driving it
//
// The scheduler owns the prediction-network states and outputs in slots: Slots() of them per
// search (2·Width), numbered from 0 (it maps them onto its own tensors, e.g. at an offset per
// stream). The search asks for prediction steps by slot, and hypotheses with the same tokens
// share one slot, so a state is computed once for all of them; a hypothesis's state is asked for
// only when the hypothesis is expanded, so one pruned before its frame costs no prediction.
// Every joint row of a round is at the same frame. Each round, for every search that is Ready:
//
//	run the prediction network on Predictions()   // all searches' requests in one call
//	compute the joint rows of Joints()            // likewise, rows [len(Joints()), Rule.Width()]
//	Advance(rows)
//
// AddFrames tells the search that more encoder frames can be read, Finish that no more will
// come; Done reports the end, and Len, Hyp and Tokens the beam, best first. Stable hands over
// the tokens every hypothesis agrees on, which no later round can change, and frees them.
//
// NewTDTBeamSearch allocates everything the search needs, except the token history (the tokens
// and alignments of the hypotheses, and the trie of their token sequences), which grows with
// the part of the transcript not yet taken by Stable, amortised; once Stable takes what settles,
// it reuses what it freed. A round (Advance and the preparation of the next) allocates nothing
// else. A TDTBeamSearch is not safe for concurrent use; distinct searches are independent.
type TDTBeamSearch struct {
	cfg         TDTBeam
	nTok        int // Blank+1 token logits per row
	nDur        int // duration logits per row (0 for an RNN-T)
	rowW        int // Rule.Width()
	k           int // best tokens taken from each row: min(Width, nTok)
	dk          int // best durations taken from each row: min(Width, nDur), 1 for an RNN-T
	lse         bool
	maxRun      int32
	blank       int32
	durs        []int32 // Rule.Durations
	hyps, next  []tdtHyp
	expand      []int32 // the hypotheses the current round expands (indices into hyps), in the order of their joint rows
	t           int32   // the frame of the current round
	ready       bool
	avail       int32 // frames that can be read
	final       bool
	preds       []PredictRequest
	joints      []JointRequest
	slotRefs    []int32 // hypotheses referring to each slot
	slotSeq     []int32 // the sequence each live slot holds
	freeSlots   []int32
	seqs        []seqNode
	freeSeqs    []int32
	nodes       []tokNode
	freeNodes   []int32
	rows        []rowScore  // [Width] the round's joint rows
	tokBuf      []candidate // [Width][k] best tokens of each row
	durBuf      []int32     // [Width][nDur] durations of each row, best first
	pairBuf     []tdtPair   // [Width][Width] best pairs of each row
	cands       []tdtCand
	table       []int32 // open-addressing merge table: candidate index + 1, 0 empty
	used        []int32 // the table entries the round filled
	best        []int32 // kept candidates, best first
	stableCount int
	dropped     int // candidates pruned since Reset (pairs beyond a row's Width best included)
}

// tdtHyp is one hypothesis: its token sequence (seq, exact identity) and alignment (node). Its
// prediction state is in seqs[seq].slot; while that is -1 (pending), the state is the one in
// slot from advanced by the sequence's last token. It holds a reference on seq, on the slot (or
// from), on held until the round's predictions have read it, and on node.
type tdtHyp struct {
	score float64
	frame int32
	run   int32
	seq   int32
	from  int32 // pending: the slot its state is predicted from; -1 the initial state
	held  int32 // -1 or a slot a prediction of this round reads
	node  int32 // its last emitted token, -1 none
	ntok  int32
}

// seqNode is one token sequence of the trie of the live hypotheses' sequences and their
// prefixes: a sequence is its last token after its parent. Two hypotheses hold the same tokens
// exactly when they are on the same node.
type seqNode struct {
	parent      int32 // -1: the root, the empty sequence or the tokens Stable took
	tok         int32 // the last token (the blank at the root of a stream)
	refs        int32 // hypotheses on it and child nodes
	slot        int32 // the slot holding its prediction state, -1 none
	depth       int32 // tokens since Reset
	child, next int32 // first child, next sibling (-1 none)
}

// tokNode is one emitted token of the history tree: a hypothesis points at its last token.
type tokNode struct {
	step   TDTStep
	parent int32
	refs   int32
	depth  int32 // tokens before it since Reset
}

// rowScore holds one joint row's normalisers and best pairs.
type rowScore struct {
	lseTok, lseDur float64
	lseAll         float64 // LogSumExp of the whole row, NaN until a kept token needs it
	sumTok         float64 // Σ exp(z[j] - mTok) over the token logits
	mTok           float32
	pairs          []tdtPair
}

// tdtPair is a (token, duration) pair of a row and its log-probability.
type tdtPair struct {
	logp   float64
	tok    int32
	durIdx int32
}

// tdtCand is a candidate of a round: a waiting hypothesis (pair < 0) or an expansion.
type tdtCand struct {
	score float64
	key   int64 // the token sequence: a seqs index, or for a sequence not in the trie yet -2-(parent·nTok+tok)
	frame int32
	run   int32
	src   int32 // the hypothesis it continues (an index into hyps)
	pair  int32 // -1, or the expansion's pair in pairBuf
	dead  bool  // merged into an earlier candidate
}

var errNotReady = errors.New("decode: TDT beam: Advance without a round to advance (see Ready)")

// NewTDTBeamSearch validates c and returns a search at the start of a stream (as after Reset).
func NewTDTBeamSearch(c TDTBeam) (*TDTBeamSearch, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	w := c.Width
	s := &TDTBeamSearch{
		cfg:    c,
		nTok:   int(c.Rule.Blank) + 1,
		nDur:   len(c.Rule.Durations),
		rowW:   c.Rule.Width(),
		lse:    c.Merge == MergeLogSumExp,
		maxRun: int32(min(c.Rule.MaxSymbols, math.MaxInt32)),
		blank:  c.Rule.Blank,
	}
	s.cfg.Rule.Durations = append([]int(nil), c.Rule.Durations...)
	s.k = min(w, s.nTok)
	s.dk = max(min(w, s.nDur), 1)
	for _, d := range c.Rule.Durations {
		s.durs = append(s.durs, int32(min(d, math.MaxInt32/4)))
	}
	nc := w + w*w
	s.hyps = make([]tdtHyp, 0, w)
	s.next = make([]tdtHyp, 0, w)
	s.expand = make([]int32, 0, w)
	s.preds = make([]PredictRequest, 0, w)
	s.joints = make([]JointRequest, 0, w)
	s.slotRefs = make([]int32, 2*w)
	s.slotSeq = make([]int32, 2*w)
	s.freeSlots = make([]int32, 0, 2*w)
	s.seqs = make([]seqNode, 0, 64*w)
	s.freeSeqs = make([]int32, 0, 64*w)
	s.nodes = make([]tokNode, 0, 64*w)
	s.freeNodes = make([]int32, 0, 64*w)
	s.rows = make([]rowScore, w)
	s.tokBuf = make([]candidate, w*s.k)
	s.durBuf = make([]int32, w*max(s.nDur, 1))
	s.pairBuf = make([]tdtPair, w*w)
	s.cands = make([]tdtCand, 0, nc)
	tsize := 4
	for tsize < 2*nc {
		tsize *= 2
	}
	s.table = make([]int32, tsize)
	s.used = make([]int32, 0, nc)
	s.best = make([]int32, 0, w)
	s.Reset()
	return s, nil
}

// Slots is the number of prediction-state slots the search refers to, numbered from 0.
func (s *TDTBeamSearch) Slots() int { return len(s.slotRefs) }

// Config returns the search's configuration.
func (s *TDTBeamSearch) Config() TDTBeam { return s.cfg }

// Reset starts a new stream: no frames yet, one hypothesis with no tokens, whose state is the
// prediction network's on the blank (requested by the first round).
func (s *TDTBeamSearch) Reset() {
	s.freeSlots = s.freeSlots[:0]
	for i := len(s.slotRefs) - 1; i >= 0; i-- {
		s.slotRefs[i] = 0
		s.freeSlots = append(s.freeSlots, int32(i))
	}
	s.nodes, s.freeNodes = s.nodes[:0], s.freeNodes[:0]
	s.seqs, s.freeSeqs = s.seqs[:0], s.freeSeqs[:0]
	root := s.newSeq(-1, s.blank)
	s.hyps = append(s.hyps[:0], tdtHyp{seq: root, from: -1, held: -1, node: -1})
	s.seqs[root].refs = 1
	s.avail, s.final, s.stableCount, s.dropped = 0, false, 0, 0
	s.prepare()
}

// AddFrames makes n more encoder frames readable. It fails after Finish.
func (s *TDTBeamSearch) AddFrames(n int) error {
	if s.final {
		return errors.New("decode: TDT beam: frames added after Finish")
	}
	if n < 0 || n > math.MaxInt32/2-int(s.avail) {
		return fmt.Errorf("decode: TDT beam: cannot add %d frames to %d", n, s.avail)
	}
	s.avail += int32(n)
	if !s.ready {
		s.prepare()
	}
	return nil
}

// Finish says that no more frames will come: hypotheses that reach the frame count have
// finished.
func (s *TDTBeamSearch) Finish() {
	s.final = true
	if !s.ready {
		s.finish()
	}
}

// Ready reports whether a round is waiting for its prediction steps and joint rows.
func (s *TDTBeamSearch) Ready() bool { return s.ready }

// Done reports whether every hypothesis has finished (after Finish).
func (s *TDTBeamSearch) Done() bool { return s.final && !s.ready }

// Frames returns the number of frames made readable so far.
func (s *TDTBeamSearch) Frames() int { return int(s.avail) }

// Predictions returns the prediction steps the round needs before its joint rows, in no
// particular order (no request reads a slot another writes). The slice is valid until the next
// Advance, AddFrames, Finish or Reset.
func (s *TDTBeamSearch) Predictions() []PredictRequest { return s.preds }

// Joints returns the joint rows the round needs, all at one frame, in the order Advance reads
// them. The slice is valid until the next Advance, AddFrames, Finish or Reset.
func (s *TDTBeamSearch) Joints() []JointRequest { return s.joints }

// Len returns the number of hypotheses in the beam.
func (s *TDTBeamSearch) Len() int { return len(s.hyps) }

// Hyp describes hypothesis i of the beam (0 is the best).
func (s *TDTBeamSearch) Hyp(i int) BeamHyp {
	h := &s.hyps[i]
	return BeamHyp{Score: h.score, Tokens: int(h.ntok), Frame: int(h.frame)}
}

// Tokens appends to dst the tokens hypothesis i emitted after those Stable has taken, first to
// last, and returns it.
func (s *TDTBeamSearch) Tokens(i int, dst []TDTStep) []TDTStep {
	n := 0
	for x := s.hyps[i].node; x >= 0; x = s.nodes[x].parent {
		n++
	}
	dst = growSteps(dst, n)
	j := len(dst)
	for x := s.hyps[i].node; x >= 0; x = s.nodes[x].parent {
		j--
		dst[j] = s.nodes[x].step
	}
	return dst
}

// growSteps returns dst extended by n elements.
func growSteps(dst []TDTStep, n int) []TDTStep {
	if cap(dst)-len(dst) < n {
		d := make([]TDTStep, len(dst), len(dst)+n+len(dst)/2)
		copy(d, dst)
		dst = d
	}
	return dst[:len(dst)+n]
}

// Stable appends to dst the tokens that every hypothesis holds (the beginning of each one's
// tokens, which no later round changes), forgets them, and returns dst. Tokens and Stable then
// start after them.
func (s *TDTBeamSearch) Stable(dst []TDTStep) []TDTStep {
	a := s.hyps[0].node
	for i := 1; i < len(s.hyps) && a >= 0; i++ {
		b := s.hyps[i].node
		for a != b && a >= 0 && b >= 0 {
			if s.nodes[a].depth >= s.nodes[b].depth {
				a = s.nodes[a].parent
			} else {
				b = s.nodes[b].parent
			}
		}
		if b < 0 {
			a = -1
		}
	}
	if a < 0 {
		return dst
	}
	n := 0
	for x := a; x >= 0; x = s.nodes[x].parent {
		n++
	}
	dst = growSteps(dst, n)
	j := len(dst)
	for x := a; x >= 0; x = s.nodes[x].parent {
		j--
		dst[j] = s.nodes[x].step
	}
	s.stableCount += n
	// Every sequence now starts with the stable tokens: the node of those becomes a root.
	p := s.hyps[0].seq
	for s.seqs[p].depth > int32(s.stableCount) {
		p = s.seqs[p].parent
	}
	if q := s.seqs[p].parent; q >= 0 {
		s.unlinkSeq(p)
		s.seqs[p].parent = -1
		s.releaseSeq(q)
	}
	// Cut every hypothesis's chain below a; a and the tokens before it are then freed.
	for i := range s.hyps {
		h := &s.hyps[i]
		if h.node == a {
			h.node = -1
			s.releaseNode(a)
			continue
		}
		x := h.node
		for s.nodes[x].parent >= 0 && s.nodes[x].parent != a {
			x = s.nodes[x].parent
		}
		if s.nodes[x].parent == a {
			s.nodes[x].parent = -1
			s.releaseNode(a)
		}
	}
	return dst
}

// Advance takes the round's joint rows (len(Joints()) rows of Rule.Width() logits, in the order
// of Joints) and moves the beam on. It fails, leaving the search as it was, when no round is
// ready, when rows has the wrong length, or when a row holds a NaN or +Inf, or its token
// logits or its duration logits are all -Inf.
func (s *TDTBeamSearch) Advance(rows []float32) error {
	if !s.ready {
		return errNotReady
	}
	if len(rows) != len(s.joints)*s.rowW {
		return fmt.Errorf("decode: TDT beam: %d logits for %d joint rows of %d", len(rows), len(s.joints), s.rowW)
	}
	for j := range s.joints {
		if err := s.scoreRow(j, rows[j*s.rowW:(j+1)*s.rowW]); err != nil {
			return err
		}
	}
	s.collect()
	s.merge()
	s.selectBest()
	s.commit(rows)
	if s.final {
		s.prepare()
		if !s.ready {
			s.finish()
		}
		return nil
	}
	s.prepare()
	return nil
}

// scoreRow computes row j's normalisers and its Width best pairs.
func (s *TDTBeamSearch) scoreRow(j int, row []float32) error {
	t := s.t
	r := &s.rows[j]
	toks, bad := topKFromLogits(row[:s.nTok], s.k, s.tokBuf[j*s.k:(j+1)*s.k])
	if bad >= 0 {
		return fmt.Errorf("decode: TDT beam: token logit %d of the row at frame %d is NaN", bad, t)
	}
	m := toks[0].logit
	if math.IsInf(float64(m), 0) {
		return fmt.Errorf("decode: TDT beam: the token logits at frame %d have no finite maximum (%v)", t, m)
	}
	r.mTok = m
	r.sumTok = vec.SumExp(row[:s.nTok], m)
	r.lseTok = float64(m) + math.Log(r.sumTok)
	r.lseAll = math.NaN()
	durs := s.durBuf[j*max(s.nDur, 1) : (j+1)*max(s.nDur, 1)]
	if s.nDur > 0 {
		dl := row[s.nTok:]
		for i, v := range dl {
			if v != v {
				return fmt.Errorf("decode: TDT beam: duration logit %d of the row at frame %d is NaN", i, t)
			}
			// Insertion sort, best first, ties to the lower index.
			p := i
			for p > 0 && dl[durs[p-1]] < v {
				durs[p] = durs[p-1]
				p--
			}
			durs[p] = int32(i)
		}
		md := dl[durs[0]]
		if math.IsInf(float64(md), 0) {
			return fmt.Errorf("decode: TDT beam: the duration logits at frame %d have no finite maximum (%v)", t, md)
		}
		r.lseDur = float64(md) + math.Log(vec.SumExp(dl, md))
	} else {
		durs[0], r.lseDur = 0, 0
	}
	// The Width best pairs of the grid tokens × durations, best first, ties in grid order
	// (token rank, then duration rank). Both lists are sorted, so a row or column can stop at
	// the first pair that is not better than the worst kept.
	w := s.cfg.Width
	pairs := s.pairBuf[j*w : j*w]
grid:
	for a := range toks {
		tl := float64(toks[a].logit) - r.lseTok
		if math.IsInf(tl, -1) {
			break
		}
		for b := 0; b < s.dk; b++ {
			lp := tl
			if s.nDur > 0 {
				lp += float64(row[s.nTok+int(durs[b])]) - r.lseDur
			}
			if len(pairs) == w && !(lp > pairs[w-1].logp) {
				if b == 0 {
					break grid
				}
				break
			}
			if math.IsInf(lp, -1) {
				break
			}
			p := len(pairs)
			if p < w {
				pairs = pairs[:p+1]
			} else {
				p = w - 1
			}
			for p > 0 && pairs[p-1].logp < lp {
				pairs[p] = pairs[p-1]
				p--
			}
			pairs[p] = tdtPair{logp: lp, tok: toks[a].id, durIdx: durs[b]}
		}
	}
	r.pairs = pairs
	return nil
}

// collect lists the round's candidates: the hypotheses waiting at later frames, then each
// expanded hypothesis's pairs.
func (s *TDTBeamSearch) collect() {
	s.cands = s.cands[:0]
	for i := range s.hyps {
		h := &s.hyps[i]
		if h.frame != s.t {
			s.cands = append(s.cands, tdtCand{score: h.score, key: int64(h.seq), frame: h.frame, run: h.run,
				src: int32(i), pair: -1})
		}
	}
	total := s.nTok * max(s.nDur, 1)
	for j, e := range s.expand {
		h := &s.hyps[e]
		r := &s.rows[j]
		s.dropped += total - len(r.pairs)
		for pi, p := range r.pairs {
			c := tdtCand{score: h.score + p.logp, src: e, pair: int32(j*s.cfg.Width + pi)}
			var dur int32
			if s.nDur > 0 {
				dur = s.durs[p.durIdx]
			}
			c.frame, c.run = s.move(h.frame, h.run, p.tok, dur)
			c.key = int64(h.seq)
			if p.tok != s.blank {
				if ch := s.childSeq(h.seq, p.tok); ch >= 0 {
					c.key = int64(ch)
				} else {
					c.key = -2 - (int64(h.seq)*int64(s.nTok) + int64(p.tok))
				}
			}
			s.cands = append(s.cands, c)
		}
	}
}

// move returns where a hypothesis at frame t with run zero-duration tokens there goes with
// tok and a duration of dur frames: TDT.Step's rule.
func (s *TDTBeamSearch) move(t, run, tok, dur int32) (frame, nrun int32) {
	switch {
	case tok == s.blank:
		return t + max(dur, 1), 0
	case dur > 0:
		return t + dur, 0
	case run+1 >= s.maxRun:
		return t + 1, 0
	}
	return t, run + 1
}

// childSeq returns the node of sequence p followed by tok, or -1 if the trie has none.
func (s *TDTBeamSearch) childSeq(p, tok int32) int32 {
	for c := s.seqs[p].child; c >= 0; c = s.seqs[c].next {
		if s.seqs[c].tok == tok {
			return c
		}
	}
	return -1
}

// newSeq adds sequence parent+tok to the trie (parent -1: a root); nothing refers to it yet.
func (s *TDTBeamSearch) newSeq(parent, tok int32) int32 {
	n := seqNode{parent: parent, tok: tok, slot: -1, child: -1, next: -1}
	if parent >= 0 {
		n.depth = s.seqs[parent].depth + 1
		n.next = s.seqs[parent].child
		s.seqs[parent].refs++
	}
	var i int32
	if k := len(s.freeSeqs); k > 0 {
		i = s.freeSeqs[k-1]
		s.freeSeqs = s.freeSeqs[:k-1]
		s.seqs[i] = n
	} else {
		s.seqs = append(s.seqs, n)
		i = int32(len(s.seqs) - 1)
	}
	if parent >= 0 {
		s.seqs[parent].child = i
	}
	return i
}

// unlinkSeq removes node i from its parent's children.
func (s *TDTBeamSearch) unlinkSeq(i int32) {
	p := s.seqs[i].parent
	if s.seqs[p].child == i {
		s.seqs[p].child = s.seqs[i].next
		return
	}
	for c := s.seqs[p].child; c >= 0; c = s.seqs[c].next {
		if s.seqs[c].next == i {
			s.seqs[c].next = s.seqs[i].next
			return
		}
	}
}

func (s *TDTBeamSearch) releaseSeq(i int32) {
	for i >= 0 {
		if s.seqs[i].refs--; s.seqs[i].refs > 0 {
			return
		}
		p := s.seqs[i].parent
		if p >= 0 {
			s.unlinkSeq(i)
		}
		s.freeSeqs = append(s.freeSeqs, i)
		i = p
	}
}

// merge combines candidates in the same state into the first of them (its score by Merge, the
// rest from the better one; ties to the first).
func (s *TDTBeamSearch) merge() {
	mask := uint64(len(s.table) - 1)
	s.used = s.used[:0]
	for i := range s.cands {
		c := &s.cands[i]
		h := (uint64(c.key)*0x9e3779b97f4a7c15 ^ uint64(uint32(c.frame))*0xc2b2ae3d27d4eb4f ^ uint64(uint32(c.run))) * 0x165667b19e3779f9
		for p := (h >> 32) & mask; ; p = (p + 1) & mask {
			k := s.table[p]
			if k == 0 {
				s.table[p] = int32(i + 1)
				s.used = append(s.used, int32(p))
				break
			}
			o := &s.cands[k-1]
			if o.key != c.key || o.frame != c.frame || o.run != c.run {
				continue
			}
			score := max(o.score, c.score)
			if s.lse {
				score = logAddExp(o.score, c.score)
			}
			if c.score > o.score {
				*o = *c
			}
			o.score = score
			c.dead = true
			break
		}
	}
	for _, p := range s.used {
		s.table[p] = 0
	}
}

// logAddExp returns log(e^a + e^b).
func logAddExp(a, b float64) float64 {
	if a < b {
		a, b = b, a
	}
	if math.IsInf(b, -1) {
		return a
	}
	return a + math.Log1p(math.Exp(b-a))
}

// selectBest puts the indices of the Width best live candidates in best, best first: score
// descending, then candidate order.
func (s *TDTBeamSearch) selectBest() {
	w := s.cfg.Width
	b := s.best[:0]
	live := 0
	for i := range s.cands {
		c := &s.cands[i]
		if c.dead {
			continue
		}
		live++
		if len(b) == w && !(c.score > s.cands[b[w-1]].score) {
			continue
		}
		p := len(b)
		if p < w {
			b = b[:p+1]
		} else {
			p = w - 1
		}
		for p > 0 && s.cands[b[p-1]].score < c.score {
			b[p] = b[p-1]
			p--
		}
		b[p] = int32(i)
	}
	s.dropped += live - len(b)
	s.best = b
}

// commit makes the kept candidates the beam: references are taken for the new hypotheses
// before the old ones' are dropped, so a shared slot or token lives on.
func (s *TDTBeamSearch) commit(rows []float32) {
	s.next = s.next[:0]
	for _, ci := range s.best {
		c := &s.cands[ci]
		h := s.hyps[c.src]
		if c.pair < 0 {
			h.score, h.held = c.score, -1
			s.retainHyp(&h)
			s.next = append(s.next, h)
			continue
		}
		j := int(c.pair) / s.cfg.Width
		p := s.pairBuf[c.pair]
		n := tdtHyp{score: c.score, frame: c.frame, run: c.run, seq: h.seq, from: -1, held: -1, node: h.node, ntok: h.ntok}
		if p.tok != s.blank {
			switch {
			case c.key >= 0:
				n.seq = int32(c.key)
			default:
				// Kept expansions at different frames may share a sequence new to the trie.
				if n.seq = s.childSeq(h.seq, p.tok); n.seq < 0 {
					n.seq = s.newSeq(h.seq, p.tok)
				}
			}
			if s.seqs[n.seq].slot < 0 {
				n.from = s.seqs[h.seq].slot
			}
			step := TDTStep{Frame: int(s.t), Token: p.tok, DurIdx: int(p.durIdx), Emit: true}
			if s.nDur > 0 {
				step.Dur = int(s.durs[p.durIdx])
			}
			row := rows[j*s.rowW : (j+1)*s.rowW]
			r := &s.rows[j]
			// As TDT.Step: P over the token logits, PLog over the whole row.
			step.P = float32(float64(vec.Expf(row[p.tok]-r.mTok)) / r.sumTok)
			if r.lseAll != r.lseAll {
				r.lseAll = LogSumExp(row)
			}
			step.PLog = float32(float64(row[p.tok]) - r.lseAll)
			n.node = s.newNode(step, h.node, h.ntok)
			n.ntok++
		}
		s.retainHyp(&n)
		s.next = append(s.next, n)
	}
	for i := range s.hyps {
		s.releaseHyp(&s.hyps[i])
	}
	s.hyps, s.next = s.next, s.hyps
}

// retainHyp takes h's references: its sequence, its slot (or the slot it is pending on) and its
// last token.
func (s *TDTBeamSearch) retainHyp(h *tdtHyp) {
	s.seqs[h.seq].refs++
	if c := s.seqs[h.seq].slot; c >= 0 {
		s.slotRefs[c]++
	} else if h.from >= 0 {
		s.slotRefs[h.from]++
	}
	if h.node >= 0 {
		s.nodes[h.node].refs++
	}
}

// releaseHyp drops h's references.
func (s *TDTBeamSearch) releaseHyp(h *tdtHyp) {
	if c := s.seqs[h.seq].slot; c >= 0 {
		s.releaseSlot(c)
	} else if h.from >= 0 {
		s.releaseSlot(h.from)
	}
	if h.held >= 0 {
		s.releaseSlot(h.held)
	}
	s.releaseSeq(h.seq)
	if h.node >= 0 {
		s.releaseNode(h.node)
	}
}

func (s *TDTBeamSearch) releaseSlot(i int32) {
	if s.slotRefs[i]--; s.slotRefs[i] > 0 {
		return
	}
	if q := s.slotSeq[i]; q >= 0 && s.seqs[q].slot == i {
		s.seqs[q].slot = -1
	}
	s.freeSlots = append(s.freeSlots, i)
}

// newNode returns a new token node after parent; nothing refers to it yet.
func (s *TDTBeamSearch) newNode(step TDTStep, parent, depth int32) int32 {
	nd := tokNode{step: step, parent: parent, depth: depth}
	if parent >= 0 {
		s.nodes[parent].refs++
	}
	if n := len(s.freeNodes); n > 0 {
		i := s.freeNodes[n-1]
		s.freeNodes = s.freeNodes[:n-1]
		s.nodes[i] = nd
		return i
	}
	s.nodes = append(s.nodes, nd)
	return int32(len(s.nodes) - 1)
}

func (s *TDTBeamSearch) releaseNode(i int32) {
	for i >= 0 {
		if s.nodes[i].refs--; s.nodes[i].refs > 0 {
			return
		}
		s.freeNodes = append(s.freeNodes, i)
		i = s.nodes[i].parent
	}
}

// prepare sets up the next round, if any hypothesis stands at a readable frame: it expands
// those at the lowest frame, giving every pending one of them a slot (one prediction per
// distinct state, shared with the waiting hypotheses of the same tokens).
func (s *TDTBeamSearch) prepare() {
	s.preds, s.joints, s.expand = s.preds[:0], s.joints[:0], s.expand[:0]
	s.ready = false
	t := int32(math.MaxInt32)
	for i := range s.hyps {
		t = min(t, s.hyps[i].frame)
	}
	if t >= s.avail {
		return
	}
	s.t, s.ready = t, true
	for i := range s.hyps {
		h := &s.hyps[i]
		if h.frame != t {
			continue
		}
		s.expand = append(s.expand, int32(i))
		q := &s.seqs[h.seq]
		if q.slot < 0 {
			c := s.freeSlots[len(s.freeSlots)-1]
			s.freeSlots = s.freeSlots[:len(s.freeSlots)-1]
			q.slot, s.slotSeq[c] = c, h.seq
			s.preds = append(s.preds, PredictRequest{From: h.from, Token: q.tok, To: c})
			for k := range s.hyps {
				if o := &s.hyps[k]; o.seq == h.seq {
					o.held, o.from = o.from, -1
					s.slotRefs[c]++
				}
			}
		}
		s.joints = append(s.joints, JointRequest{Frame: int(t), Slot: q.slot})
	}
}

// finish ends the search once every hypothesis has finished: those of the same tokens are
// merged whatever frame past the end they reached, and the beam is sorted again.
func (s *TDTBeamSearch) finish() {
	for i := range s.hyps {
		h := &s.hyps[i]
		h.frame, h.run = s.avail, 0
	}
	s.next = s.next[:0]
	for i := range s.hyps {
		h := &s.hyps[i]
		merged := false
		for j := range s.next {
			o := &s.next[j]
			if o.seq != h.seq {
				continue
			}
			score := max(o.score, h.score)
			if s.lse {
				score = logAddExp(o.score, h.score)
			}
			if h.score > o.score {
				*o, *h = *h, *o
			}
			o.score = score
			s.releaseHyp(h)
			merged = true
			break
		}
		if !merged {
			s.next = append(s.next, *h)
		}
	}
	// Insertion sort, best first, stable.
	for i := 1; i < len(s.next); i++ {
		for j := i; j > 0 && s.next[j-1].score < s.next[j].score; j-- {
			s.next[j-1], s.next[j] = s.next[j], s.next[j-1]
		}
	}
	s.hyps, s.next = s.next, s.hyps
}

// BeamRoot is where a hypothesis stands, as Root reports it and ResetAt starts from: the frame
// it reads next, the zero-duration tokens it emitted there (Run), its last token (the blank if
// none), and its prediction state: held in Slot, or, while Pending, the state in Slot (-1 the
// initial one) advanced by Token, which the hypothesis's next round would compute.
type BeamRoot struct {
	Frame, Run int
	Token      int32
	Slot       int32
	Pending    bool
}

// Root says where hypothesis i of the beam stands.
func (s *TDTBeamSearch) Root(i int) BeamRoot {
	h := &s.hyps[i]
	q := &s.seqs[h.seq]
	r := BeamRoot{Frame: int(h.frame), Run: int(h.run), Token: q.tok, Slot: q.slot}
	if q.slot < 0 {
		r.Pending, r.Slot = true, h.from
	}
	return r
}

// ResetAt starts the search over from one hypothesis with no tokens that stands where r says,
// its state (or, if r.Pending, the state it is predicted from) in slot 0, or the initial state
// when r.Slot is -1 (then r.Pending must be set). The frames made readable stay so, Finish is
// undone. A stream continues this way after taking a hypothesis as final: the search goes on
// from it alone, as the greedy rule goes on from its state.
func (s *TDTBeamSearch) ResetAt(r BeamRoot) error {
	switch {
	case r.Frame < 0 || r.Frame > math.MaxInt32/2 || r.Run < 0 || r.Run > 0 && int64(r.Run) >= int64(s.maxRun):
		return fmt.Errorf("decode: TDT beam: cannot start at frame %d after %d zero-duration tokens", r.Frame, r.Run)
	case r.Token < 0 || r.Token > s.blank:
		return fmt.Errorf("decode: TDT beam: cannot start after token %d (0 to %d)", r.Token, s.blank)
	case r.Slot < 0 && !r.Pending:
		return errors.New("decode: TDT beam: a start from the initial state must be pending")
	}
	avail := s.avail
	s.Reset()
	s.avail = avail
	h := &s.hyps[0]
	h.frame, h.run = int32(r.Frame), int32(r.Run)
	q := &s.seqs[h.seq]
	q.tok = r.Token
	if r.Slot >= 0 {
		// Reset left every slot free, slot 0 last.
		s.freeSlots = s.freeSlots[:len(s.freeSlots)-1]
		s.slotRefs[0] = 1
		if r.Pending {
			h.from, s.slotSeq[0] = 0, -1 // a state no sequence of the search holds
		} else {
			q.slot, s.slotSeq[0] = 0, h.seq
		}
	}
	s.prepare()
	return nil
}

// CopyFrom makes s the same search as o, which has the same configuration, reusing s's memory:
// it allocates only where o's token history is longer than any s has held. A scheduler keeps
// such a copy to go back to when a round's inputs cannot be computed.
func (s *TDTBeamSearch) CopyFrom(o *TDTBeamSearch) error {
	if s.cfg.Width != o.cfg.Width || s.cfg.Merge != o.cfg.Merge || s.rowW != o.rowW || s.blank != o.blank || s.maxRun != o.maxRun {
		return errors.New("decode: TDT beam: copy between searches of different configurations")
	}
	s.hyps = append(s.hyps[:0], o.hyps...)
	s.expand = append(s.expand[:0], o.expand...)
	s.preds = append(s.preds[:0], o.preds...)
	s.joints = append(s.joints[:0], o.joints...)
	copy(s.slotRefs, o.slotRefs)
	copy(s.slotSeq, o.slotSeq)
	s.freeSlots = append(s.freeSlots[:0], o.freeSlots...)
	s.seqs = append(s.seqs[:0], o.seqs...)
	s.freeSeqs = append(s.freeSeqs[:0], o.freeSeqs...)
	s.nodes = append(s.nodes[:0], o.nodes...)
	s.freeNodes = append(s.freeNodes[:0], o.freeNodes...)
	s.t, s.ready, s.avail, s.final = o.t, o.ready, o.avail, o.final
	s.stableCount, s.dropped = o.stableCount, o.dropped
	return nil
}
