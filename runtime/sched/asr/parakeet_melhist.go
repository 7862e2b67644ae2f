package asr

import "github.com/parleyhq/parley/runtime/models/parakeet"

// melHistory gathers the per-feature statistics of the raw log-mel frames
// (parakeet.FrontEnd.RawLogMel) a live stream has heard before its current window, so that the
// window's normalisation takes its statistics over them and the window together rather than over
// the window alone: the encoder then sees features scaled nearly as a whole recording's are
// (offline transcription normalises over the whole clip). Each frame is gathered from the
// window that heard it first, once the next window starts past it; until then it waits, raw, in
// pending (a chunk that fails is encoded again from the same window).
type melHistory struct {
	stats   *parakeet.FeatureStats // the frames before pendEnd's window
	pending []float32              // raw frames of the last window before pendEnd, not yet in stats
	pendEnd int                    // epoch samples
}

func newMelHistory(fe *parakeet.FrontEnd) melHistory {
	return melHistory{stats: fe.NewFeatureStats()}
}

// reset forgets every frame (a new epoch).
func (h *melHistory) reset() {
	h.stats.Reset()
	h.pending, h.pendEnd = h.pending[:0], 0
}

// logMel computes the normalised log-mel of win, the epoch's samples from w0 on, into dst (see
// parakeet.FrontEnd.LogMel), its statistics over the window's frames and the frames heard before
// w0; then, unless last, keeps the window's frames before next (the next window's start)
// pending.
func (h *melHistory) logMel(fe *parakeet.FrontEnd, dst, win []float32, w0, next int, last bool) ([]float32, error) {
	mel, err := fe.RawLogMel(dst, win)
	if err != nil {
		return nil, err
	}
	if h.pendEnd <= w0 {
		h.stats.Add(h.pending) // before this window: heard
	} // else this window is the pending frames' own again
	h.pending = h.pending[:0]
	valid := len(win) / parakeet.HopLength
	if !last {
		nm := fe.Mels()
		r1 := min(valid, max(0, next-w0)/parakeet.HopLength)
		h.pending = append(h.pending, mel[:r1*nm]...)
		h.pendEnd = w0 + r1*parakeet.HopLength
	}
	fe.Normalize(mel, valid, h.stats)
	return mel, nil
}
