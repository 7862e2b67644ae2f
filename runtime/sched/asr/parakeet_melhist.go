package asr

import "github.com/parleyhq/parley/runtime/models/parakeet"

// melHistory keeps the raw log-mel frames (parakeet.FrontEnd.RawLogMel) a live stream has heard
// before its current window, up to a bound, so that the window's per-feature normalisation takes
// its statistics over them and the window together rather than over the window alone: the
// encoder then sees features scaled nearly as a whole recording's are. Frames are kept as they
// leave the windows (the samples before the next window's start), each from the window that
// heard it; the rows are those of consecutive mel hops ending at the epoch sample end.
type melHistory struct {
	nMel int
	max  int       // frames used at most: the latest
	rows []float32 // frames, oldest first; at most 2·max kept
	end  int       // the epoch sample after the last frame's hop
}

// reset forgets every frame (a new epoch).
func (h *melHistory) reset() { h.rows, h.end = h.rows[:0], 0 }

// logMel computes the normalised log-mel of win, the epoch's samples from w0 on, into dst (see
// parakeet.FrontEnd.LogMel), its statistics over the window's frames and the history's before
// w0 (the latest max of them); then, unless last, keeps the window's frames before next (the
// next window's start) that the history lacks.
func (h *melHistory) logMel(fe *parakeet.FrontEnd, dst, win []float32, w0, next int, last bool) ([]float32, error) {
	mel, err := fe.RawLogMel(dst, win)
	if err != nil {
		return nil, err
	}
	hist := h.before(w0)
	valid := len(win) / parakeet.HopLength
	if !last && h.max > 0 {
		// the window's rows from the history's end (or w0) up to next, kept raw before Normalize
		r0 := max(0, h.end-w0) / parakeet.HopLength
		r1 := min(valid, max(0, next-w0)/parakeet.HopLength)
		if r1 > r0 {
			if len(h.rows)+(r1-r0)*h.nMel > 2*h.max*h.nMel {
				keep := h.rows[len(h.rows)-min(len(h.rows), h.max*h.nMel):]
				h.rows = h.rows[:copy(h.rows, keep)]
				hist = nil // recomputed below from the moved rows
			}
			if hist == nil {
				hist = h.before(w0)
			}
			// appended past hist's rows, which Normalize reads
			h.rows = append(h.rows, mel[r0*h.nMel:r1*h.nMel]...)
			h.end = w0 + r1*parakeet.HopLength
		}
	}
	fe.Normalize(mel, valid, hist)
	return mel, nil
}

// before is the latest max frames of the history before the epoch sample w0 (the frames from
// w0 on are the window's own).
func (h *melHistory) before(w0 int) []float32 {
	if h.max == 0 {
		return nil
	}
	n := len(h.rows) / h.nMel
	if h.end > w0 {
		n -= (h.end - w0) / parakeet.HopLength
	}
	n = max(0, n)
	return h.rows[max(0, n-h.max)*h.nMel : n*h.nMel]
}
