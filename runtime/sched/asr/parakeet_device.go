package asr

import (
	"errors"
	"fmt"
	"slices"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// Greedy transcriptions and the chunks of greedy live streams, on a backend that decides on the
// device (backend.GreedyTransducer, the CUDA backend), decode on a parakeet.GreedyLoop instead
// of the host loop of decodeStep: a scheduler step issues deviceSteps decisions of every such
// job (the prediction network on the tokens just emitted, the joint, the greedy rule, all on the
// device) and then reads their emitted tokens and ends once. Each active job owns the loop's row
// of its slot. A chunk's row goes on from where its stream's last chunk left off (its frame,
// last token, pending prediction and the prediction network's state, which the stream keeps
// between chunks as the host loop's slot does), and at the chunk's end its state goes back to
// the job's slot, which finish saves for the next chunk as it does the host loop's; a chunk that
// fails saves nothing, so the stream goes on from the last good one. Beam transcriptions search
// on the device beam loop (parakeet_devbeam.go); beam streams stay on the host loop, in the same
// steps.

// deviceSteps is how many decisions of each transcription a step issues before it reads the
// device.
const deviceSteps = 8

// hostLoopOnly, set by tests, keeps every transcription on the host loop.
var hostLoopOnly bool

// deviceLoop is the scheduler's state of the device loop.
type deviceLoop struct {
	l    *parakeet.GreedyLoop
	jobs []*pjob            // [row] the job decoding there, nil when none
	toks [][]parakeet.Token // [row] the job's tokens, for Read
	done []bool             // [row]
	had  []int              // [row] the job's tokens before the step's read
	// [row] where a chunk's row stands at its end (parakeet.GreedyLoop.Save)
	carry  []parakeet.GreedyCarry
	chunks int64 // live chunks started here, for tests
	busy   int   // rows with a job
}

// newDeviceLoop makes the device loop of e's model, or nil where the backend has none.
func newDeviceLoop(m *parakeet.Model, rows int) (*deviceLoop, error) {
	if hostLoopOnly {
		return nil, nil
	}
	l, err := m.NewGreedyLoop(rows, deviceSteps)
	if errors.Is(err, parakeet.ErrNoGreedyLoop) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	d := &deviceLoop{l: l, jobs: make([]*pjob, rows), toks: make([][]parakeet.Token, rows), done: make([]bool, rows),
		had: make([]int, rows), carry: make([]parakeet.GreedyCarry, rows)}
	for i := range d.carry {
		d.carry[i].State = make([]float32, l.StateSize())
	}
	return d, nil
}

// deviceRow is the loop's row of a job in slot.
func deviceRow(slot int32) int { return int(slot) / pslotStride }

// startDevice moves greedy transcription or live chunk j, just encoded, onto the device loop;
// false where there is none (j then decodes on the host).
func (e *Parakeet) startDevice(j *pjob) (bool, error) {
	d := e.dev
	if d == nil || j.p.BeamSize > 1 || j.beam != nil {
		return false, nil
	}
	r := deviceRow(j.slot)
	if j.stream == nil {
		if err := d.l.Start(r, j.proj, j.end); err != nil {
			return true, err
		}
	} else {
		c := parakeet.GreedyCarry{Frame: j.state.Frame, Token: j.tok, Pending: j.pending, Started: j.started, State: j.stream.dstate}
		if err := d.l.Continue(r, j.proj, j.frame0, j.end, &c); err != nil {
			return true, err
		}
		// Room for a token a frame: the chunk's steps need not grow its tokens.
		j.toks = slices.Grow(j.toks, j.end-j.frame0)
		d.chunks++
	}
	d.jobs[r], d.toks[r] = j, j.toks
	j.onDevice = true
	d.busy++
	return true, nil
}

// stopDevice takes j off the device loop, before its projection is released.
func (e *Parakeet) stopDevice(j *pjob) error {
	if !j.onDevice {
		return nil
	}
	if j.onBeam {
		return e.stopDeviceBeam(j)
	}
	d, r := e.dev, deviceRow(j.slot)
	j.onDevice = false
	d.jobs[r], d.toks[r] = nil, nil
	d.busy--
	return d.l.Stop(r)
}

// deviceStep issues deviceSteps decisions of every transcription on the device loop, then reads
// their tokens; a transcription that reached its end is emitted and done. It reports the
// transcriptions decoded and the tokens they emitted.
func (e *Parakeet) deviceStep() (seqs, tokens int) {
	d := e.dev
	if d == nil || d.busy == 0 {
		return 0, 0
	}
	fail := func(err error) {
		for _, j := range d.jobs {
			if j != nil {
				j.err, j.ph = fmt.Errorf("parakeet: %w", err), ppDone
			}
		}
	}
	for range deviceSteps {
		if err := d.l.Step(); err != nil {
			fail(err)
			return 0, 0
		}
	}
	for r, t := range d.toks {
		d.had[r] = len(t)
	}
	// A row whose logits were not numbers fails alone (Failed below).
	if err := d.l.Read(d.toks, d.done); err != nil {
		if _, nonFinite := err.(*parakeet.NonFiniteError); !nonFinite {
			fail(err)
			return 0, 0
		}
	}
	for r, j := range d.jobs {
		if j == nil || j.ph != ppDecode {
			continue
		}
		seqs++
		tokens += len(d.toks[r]) - d.had[r]
		j.toks = d.toks[r]
		if d.l.Failed(r) {
			j.err, j.ph = errNonFiniteParakeet, ppDone
			continue
		}
		if !d.done[r] {
			continue
		}
		if j.stream != nil {
			if err := e.saveDevice(j); err != nil {
				j.err = fmt.Errorf("parakeet: %w", err)
			}
		} else {
			e.emit(j)
		}
		j.ph = ppDone
	}
	return seqs, tokens
}

// saveDevice takes where live chunk j's row stands at its end: the decoder's state (into j's
// slot, which finish saves for the stream's next chunk), its frame, last token and whether the
// prediction network has yet to take it.
func (e *Parakeet) saveDevice(j *pjob) error {
	d, r := e.dev, deviceRow(j.slot)
	c := &d.carry[r]
	if err := d.l.Save(r, c); err != nil {
		return err
	}
	j.state, j.tok, j.pending, j.started = decode.TDTState{Frame: c.Frame}, c.Token, c.Pending, c.Started
	if !c.Started {
		return nil
	}
	return e.dec.LoadState(j.slot, c.State)
}

// closeDevice releases the device loop.
func (e *Parakeet) closeDevice() error {
	if e.dev == nil {
		return nil
	}
	return e.dev.l.Close()
}
