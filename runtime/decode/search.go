package decode

import (
	"math"
	"slices"
)

// Candidate is a one-token continuation of a hypothesis during beam search: the hypothesis it
// continues (From, the caller's index), its cumulative log-probability with the token (Score),
// and the token as the caller keeps it.
type Candidate[T any] struct {
	From  int
	Score float64
	Token T
}

// Beams is the bookkeeping of one beam-search step, as whisper.cpp's whisper_full does it: every
// live hypothesis adds its best continuations (Add), and Best ranks them all by cumulative
// log-probability, ties in the order of the hypotheses they continue and then in the order they
// were added, and keeps the best. What a kept candidate becomes (a hypothesis whose cache is a
// fork of its source's) is the caller's. The candidates' storage is kept between steps, so a
// steady-state step allocates nothing. The zero value is ready to use; it is not safe for
// concurrent use.
type Beams[T any] struct {
	cands []Candidate[T]
}

// Reset forgets the candidates of the last step.
func (b *Beams[T]) Reset() { b.cands = b.cands[:0] }

// Add offers the continuation of hypothesis from by tok, of cumulative log-probability score.
func (b *Beams[T]) Add(from int, score float64, tok T) {
	b.cands = append(b.cands, Candidate[T]{From: from, Score: score, Token: tok})
}

// Best ranks the candidates added since Reset and returns the n best (all of them if there are
// fewer), best first. The slice is valid until the next Reset or Add.
func (b *Beams[T]) Best(n int) []Candidate[T] {
	RankCandidates(b.cands)
	return b.cands[:min(max(n, 0), len(b.cands))]
}

// RankCandidates orders c best first: by Score descending, then by From ascending; candidates
// equal in both keep their order.
func RankCandidates[T any](c []Candidate[T]) {
	slices.SortStableFunc(c, func(a, b Candidate[T]) int {
		switch {
		case a.Score > b.Score:
			return -1
		case a.Score < b.Score:
			return 1
		}
		return a.From - b.From
	})
}

// SequenceScore is the score by which finished hypotheses of different lengths are ranked: the
// sum of the n tokens' log-probabilities divided by a length penalty, which is n itself (the
// average log-probability) when lengthPenalty ≤ 0, as in whisper.cpp's and OpenAI's default, and
// Google NMT's ((5+n)/6)^lengthPenalty otherwise.
func SequenceScore(sumLogprob float64, n int, lengthPenalty float32) float64 {
	pen := float64(n)
	if lengthPenalty > 0 {
		pen = math.Pow((5+pen)/6, float64(lengthPenalty))
	}
	return sumLogprob / pen
}

// BestOf picks the best of several finished candidates (the samples of best-of decoding, or the
// beams that finished): the highest score, the first offered among equals. A NaN score is kept
// only if it is offered first, and then nothing replaces it. The zero value holds no candidate.
type BestOf struct {
	best  int
	score float64
	any   bool
}

// Reset forgets every candidate offered.
func (b *BestOf) Reset() { *b = BestOf{} }

// Offer considers candidate i of the given score.
func (b *BestOf) Offer(i int, score float64) {
	if !b.any || score > b.score {
		b.best, b.score, b.any = i, score, true
	}
}

// Best returns the best candidate offered, and false when none was.
func (b *BestOf) Best() (int, bool) { return b.best, b.any }
