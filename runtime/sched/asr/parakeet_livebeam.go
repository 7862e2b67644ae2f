package asr

import (
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// pbeam is the beam search of a live stream (SessionConfig.Params.BeamSize above 1): the beam
// and the greedy search beside it, as a beam transcription runs them, kept from chunk to chunk
// with the prediction-network states of their slots.
//
// A chunk's job adds the chunk's frames to both searches and runs their rounds in the
// recogniser's steps, batched with every other job's, until no hypothesis stands at a frame of
// the chunk; its slots' states are saved when it ends and loaded when the next chunk is
// admitted. After each chunk the stream's tokens are the better-scoring of the two searches'
// best hypotheses. At an endpoint that hypothesis is final, and both searches start over from
// it alone (decode.TDTBeamSearch.ResetAt), as the greedy decoder goes on from its state; at a
// Commit, which decodes the epoch to its end, it is final as a transcription's result is (the
// same choice, so a stream with whole context gives the transcription's tokens exactly), and
// both searches start over from the initial state.
type pbeam struct {
	beam, greedy *decode.TDTBeamSearch
	// saved are copies of beam and greedy as of the last chunk decoded: a chunk that fails goes
	// back to them, so that it can be decoded again.
	saved [2]*decode.TDTBeamSearch
	// states holds the prediction states of the searches' slots, row k for the job's slot+k
	// ([pslotStride][StateSize], the beam's rows from 0, the greedy search's from greedySlots),
	// valid once a chunk has been decoded since the start; next receives a chunk's.
	states, next []float32
	valid        bool
	n            int // the decoder's StateSize
	steps, other []decode.TDTStep
}

// newPBeam makes the searches of a stream of width w.
func newPBeam(e *Parakeet, w int) (*pbeam, error) {
	b := &pbeam{}
	for i, c := range []decode.TDTBeam{{Rule: e.rule, Width: w, Merge: decode.MergeMax}, {Rule: e.rule, Width: 1, Merge: decode.MergeMax}} {
		s, err := decode.NewTDTBeamSearch(c)
		if err != nil {
			return nil, err
		}
		if b.saved[i], err = decode.NewTDTBeamSearch(c); err != nil {
			return nil, err
		}
		if i == 0 {
			b.beam = s
		} else {
			b.greedy = s
		}
	}
	b.n = e.dec.StateSize()
	b.states, b.next = make([]float32, pslotStride*b.n), make([]float32, pslotStride*b.n)
	return b, nil
}

// reset starts both searches over from the initial state.
func (b *pbeam) reset() {
	b.beam.Reset()
	b.greedy.Reset()
	b.valid = false
	b.save()
}

// save copies the searches into saved.
func (b *pbeam) save() {
	b.saved[0].CopyFrom(b.beam) // same configurations: no error
	b.saved[1].CopyFrom(b.greedy)
}

// restore goes back to the searches as saved.
func (b *pbeam) restore() {
	b.beam.CopyFrom(b.saved[0])
	b.greedy.CopyFrom(b.saved[1])
}

// best returns the search whose best hypothesis scores higher (the beam on a tie) and the row of
// its slot 0 in states.
func (b *pbeam) best() (*decode.TDTBeamSearch, int) {
	if b.greedy.Hyp(0).Score > b.beam.Hyp(0).Score {
		return b.greedy, greedySlots
	}
	return b.beam, 0
}

// liveSlots is the number of leading decoder slots that hold states the active jobs read: a
// prediction step copies those alone into its new states (Decoder.SetLive). Slots are taken
// lowest first, so few jobs keep it low.
func (e *Parakeet) liveSlots() int {
	n := 0
	for _, j := range e.active {
		switch {
		case j.slot < 0:
		case j.beam != nil:
			n = max(n, int(j.slot)+pslotStride)
		default:
			n = max(n, int(j.slot)+1)
		}
	}
	return n
}

// beamRows calls f with every row of a job's slots that the searches of width w use.
func beamRows(w int, f func(k int) error) error {
	for k := range 2 * w {
		if err := f(k); err != nil {
			return err
		}
	}
	for k := greedySlots; k < greedySlots+2; k++ {
		if err := f(k); err != nil {
			return err
		}
	}
	return nil
}

// loadStream loads a chunk's stream's prediction-network state(s) into its slots.
func (e *Parakeet) loadStream(j *pjob) error {
	s := j.stream
	if j.beam == nil {
		return e.dec.LoadState(j.slot, s.dstate)
	}
	n := s.b.n
	return beamRows(j.beam.Config().Width, func(k int) error {
		return e.dec.LoadState(j.slot+int32(k), s.b.states[k*n:(k+1)*n])
	})
}

// saveStream saves a chunk's prediction-network state(s) for its stream's next chunk.
func (e *Parakeet) saveStream(j *pjob) error {
	s := j.stream
	if j.beam == nil {
		return e.dec.SaveState(j.slot, s.dstate)
	}
	n := s.b.n
	return beamRows(j.beam.Config().Width, func(k int) error {
		return e.dec.SaveState(j.slot+int32(k), s.b.next[k*n:(k+1)*n])
	})
}

// chunkFrames makes a beam chunk's frames readable by its searches; the last chunk of an epoch
// finishes them.
func chunkFrames(j *pjob) error {
	for _, s := range [...]*decode.TDTBeamSearch{j.beam, j.greedy} {
		if err := s.AddFrames(j.end - s.Frames()); err != nil {
			return err
		}
		if j.last {
			s.Finish()
		}
	}
	return nil
}

// beamChunkDone takes a beam chunk's result: the states its job saved, the searches as they are
// now, and the better hypothesis's tokens as the utterance's.
func (s *pstream) beamChunkDone() {
	b := s.b
	b.states, b.next = b.next, b.states
	b.valid = true
	b.save()
	src, _ := b.best()
	b.steps = src.Tokens(0, b.steps[:0])
	s.toks = s.toks[:0]
	for _, st := range b.steps {
		s.toks = append(s.toks, parakeet.Token{ID: st.Token, Frame: st.Frame, DurIdx: st.DurIdx, Dur: st.Dur, P: st.P, PLog: st.PLog})
	}
	if n := len(s.toks); n > 0 {
		s.lastEnd = s.toks[n-1].Frame + s.toks[n-1].Dur
	}
}

// settled returns how many of the better hypothesis's tokens (steps) every hypothesis of both
// searches holds: tokens that no later round changes.
func (b *pbeam) settled() int {
	n := len(b.steps)
	for _, sr := range [...]*decode.TDTBeamSearch{b.beam, b.greedy} {
		for i := range sr.Len() {
			b.other = sr.Tokens(i, b.other[:0])
			k := 0
			for k < min(n, len(b.other)) && b.other[k].Token == b.steps[k].Token {
				k++
			}
			n = k
		}
	}
	return n
}

// stableText is the text of a beam stream's partial that no later event of the utterance
// changes (Event.Stable): the words of its settled tokens but the last.
func (s *pstream) stableText() string {
	n := min(s.b.settled(), len(s.toks))
	if n == 0 {
		return ""
	}
	seg, ok := s.e.segment(s.toks[:n], 0)
	if !ok {
		return ""
	}
	ws := Words([]Segment{seg}, s.cfg.IsSpecial, s.cfg.Params.Language)
	if len(ws) <= 1 {
		return ""
	}
	return joinWords(ws[:len(ws)-1])
}

// beamRestart starts both searches over from the better hypothesis, whose tokens were just
// reported final: its state is copied to both searches' slot 0.
func (s *pstream) beamRestart() {
	b := s.b
	src, base := b.best()
	r := src.Root(0)
	if r.Slot >= 0 {
		n := b.n
		from := b.states[(base+int(r.Slot))*n : (base+int(r.Slot)+1)*n]
		for _, to := range [...]int{0, greedySlots} {
			if to != base+int(r.Slot) {
				copy(b.states[to*n:(to+1)*n], from)
			}
		}
		r.Slot = 0
	}
	// A hypothesis's own place is a valid start: ResetAt cannot fail.
	_ = b.beam.ResetAt(r)
	_ = b.greedy.ResetAt(r)
	b.save()
}
