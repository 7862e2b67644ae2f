package asr

import (
	"math"
	"slices"

	"github.com/parleyhq/parley/runtime/models/whisper"
)

// alignWindow times the text tokens of toks, the window's result, by cross-attention alignment:
// the alignment heads' attention over the text (whisper.Aligner.Attention), through which dynamic
// time warping finds the monotonic path (dtw); the frame at which the path reaches a token is the
// token's start, and the next token's start is its end (whisper.cpp's t_dtw of a text token is
// that token's end here). It returns, for each text token and the end token, the audio frame (20
// ms, from the window's start) at which it starts; nil when that fails (the tokens keep
// interpolated times). seekDelta is where the result ends (in mel frames from the window's
// start): the alignment covers the window up to there, or to the end of the audio if that comes
// first.
func (e *Whisper) alignWindow(j *job, toks []tokData, seekDelta int) []int {
	if e.align == nil {
		if e.alignErr != nil {
			return nil
		}
		a, err := whisper.NewAligner(e.m)
		if err != nil {
			e.alignErr = err // not retried every window
			return nil
		}
		e.align = a
	}
	// <|startoftranscript|> and, for a multilingual model, the language token: no task token.
	seq := append(e.alignToks[:0], e.tok.SOT)
	if e.m.Multilingual() {
		seq = append(seq, j.lang)
	}
	nSot := len(seq)
	seq = append(seq, e.tok.NoTimestamps)
	for _, t := range toks {
		if t.id < e.tok.EOT {
			seq = append(seq, t.id)
		}
	}
	seq = append(seq, e.tok.EOT)
	e.alignToks = seq
	frames := min(whisper.WindowFrames, seekDelta, j.seekEnd-j.seek) / 2
	att, err := e.align.Attention(seq, nSot, j.cross, frames)
	if err != nil {
		return nil
	}
	return tokenStarts(att, len(seq)-nSot-1)
}

// tokenStarts times n tokens by the attention att ([n, frames] row-major, higher where a token
// attends): the path of least cost through its negation (dtw), and for each token the first
// frame of the path on its row.
func tokenStarts(att []float64, n int) []int {
	frames := len(att) / n
	for i := range att {
		att[i] = -att[i]
	}
	ti, fi := dtw(att, n, frames)
	starts := make([]int, 0, n)
	for i := range ti {
		if i == 0 || ti[i] != ti[i-1] {
			starts = append(starts, fi[i])
		}
	}
	return starts
}

// dtw finds the least-cost monotonic path through cost ([n, m] row-major) from (0, 0) to
// (n-1, m-1), each step moving one row, one column or both, and returns the path's row and
// column indices in order. The diagonal or the row step is taken only where it is strictly
// cheaper than both others: every tie takes the column (time) step, as whisper.cpp's does.
func dtw(cost []float64, n, m int) (rows, cols []int) {
	acc := make([]float64, (n+1)*(m+1))
	trace := make([]int8, (n+1)*(m+1))
	for i := range acc {
		acc[i] = math.Inf(1)
	}
	acc[0] = 0
	for j := 1; j <= m; j++ {
		for i := 1; i <= n; i++ {
			c0, c1, c2 := acc[(i-1)*(m+1)+j-1], acc[(i-1)*(m+1)+j], acc[i*(m+1)+j-1]
			var c float64
			var t int8
			switch {
			case c0 < c1 && c0 < c2:
				c, t = c0, 0
			case c1 < c0 && c1 < c2:
				c, t = c1, 1
			default:
				c, t = c2, 2
			}
			acc[i*(m+1)+j] = cost[(i-1)*m+j-1] + c
			trace[i*(m+1)+j] = t
		}
	}
	for j := range m + 1 {
		trace[j] = 2
	}
	for i := range n + 1 {
		trace[i*(m+1)] = 1
	}
	i, j := n, m
	for i > 0 || j > 0 {
		rows = append(rows, i-1)
		cols = append(cols, j-1)
		switch trace[i*(m+1)+j] {
		case 0:
			i, j = i-1, j-1
		case 1:
			i--
		default:
			j--
		}
	}
	// The walk ends at (0,0) of the padded table; drop the step that left the matrix.
	for len(rows) > 0 && (rows[len(rows)-1] < 0 || cols[len(cols)-1] < 0) {
		rows, cols = rows[:len(rows)-1], cols[:len(cols)-1]
	}
	slices.Reverse(rows)
	slices.Reverse(cols)
	return rows, cols
}
