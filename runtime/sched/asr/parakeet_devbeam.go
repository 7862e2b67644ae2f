package asr

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// Beam transcriptions (offline, Params.BeamSize above 1), on a backend that searches on the
// device (backend.BeamTransducer, the CUDA backend), decode on a parakeet.BeamLoop instead of the
// host loop: the job in the loop's row r of active jobs (deviceRow) searches its clip in stream
// 2r with its beam and in stream 2r+1 with a beam of 1 (the greedy search beside it). A step
// issues beamRounds rounds of every stream, then reads once which are done; when both searches
// of a transcription are, the higher score's hypothesis is its result, as endBeamStep chooses
// on the host loop. The loop is made at the first beam transcription, for clips of
// beamLoopFrames frames or of that transcription's, and made again for a longer clip when no
// transcription is on it, up to beamLoopMaxFrames; a clip it cannot take, or one that comes
// when the loop cannot be made, decodes on the host loop. Live streams with a beam stay on the host loop.

// beamRounds is how many rounds of each search a step issues before it reads the device.
const beamRounds = 8

// beamLoopFrames is the longest clip, in encoder frames, the beam loop is first made for (six
// minutes at 80 ms a frame); beamLoopMaxFrames the longest it is made for (about 44 minutes).
// Tests change them.
var beamLoopFrames, beamLoopMaxFrames = 4500, 1 << 15

// beamLoop is the scheduler's state of the device beam loop.
type beamLoop struct {
	m      *parakeet.Model
	rows   int
	l      *parakeet.BeamLoop // nil until the first beam transcription
	frames int                // the longest clip l takes
	jobs   []*pjob            // [row] the transcription searching there, nil when none
	done   []bool             // [stream]
	greedy []parakeet.Token   // the greedy search's result, reused
	busy   int                // rows with a transcription
	jobsN  int64              // transcriptions started on the loop, for tests
}

// newBeamLoop makes the scheduler's state of the device beam loop of m for rows active jobs, or
// nil where the backend searches on the host.
func newBeamLoop(m *parakeet.Model, rows int) *beamLoop {
	if hostLoopOnly {
		return nil
	}
	if _, ok := m.Backend().(backend.BeamTransducer); !ok {
		return nil
	}
	return &beamLoop{m: m, rows: rows, jobs: make([]*pjob, rows), done: make([]bool, 2*rows)}
}

// fit makes sure the loop takes a clip of frames frames; false where it cannot now.
func (b *beamLoop) fit(frames int) (bool, error) {
	if b.l != nil && frames <= b.frames {
		return true, nil
	}
	if frames > max(beamLoopMaxFrames, beamLoopFrames) || b.busy > 0 {
		return false, nil
	}
	if b.l != nil {
		err := b.l.Close()
		b.l = nil
		if err != nil {
			return false, err
		}
	}
	n := max(frames, beamLoopFrames)
	l, err := b.m.NewBeamLoop(parakeet.BeamLoopConfig{Streams: 2 * b.rows, Width: MaxDecoders, MaxFrames: n, K: beamRounds})
	if err != nil {
		return false, err
	}
	b.l, b.frames = l, n
	return true, nil
}

// startDeviceBeam moves beam transcription j, just encoded, onto the device beam loop; false
// where there is none or it cannot take j's clip now (j then decodes on the host).
func (e *Parakeet) startDeviceBeam(j *pjob) (bool, error) {
	b := e.dbeam
	if b == nil || j.stream != nil || j.p.BeamSize <= 1 {
		return false, nil
	}
	if ok, err := b.fit(j.frames); !ok || err != nil {
		// A loop that cannot be made (the device out of memory, say) leaves j to the host
		// loop; the next beam transcription tries to make it again.
		return false, nil
	}
	r := deviceRow(j.slot)
	if err := b.l.Start(2*r, j.proj, j.frames, j.p.BeamSize); err != nil {
		return true, err
	}
	if err := b.l.Start(2*r+1, j.proj, j.frames, 1); err != nil {
		return true, errors.Join(err, b.l.Stop(2*r))
	}
	b.jobs[r] = j
	j.onDevice, j.onBeam = true, true
	b.busy++
	b.jobsN++
	return true, nil
}

// stopDeviceBeam takes j off the device beam loop, before its projection is released.
func (e *Parakeet) stopDeviceBeam(j *pjob) error {
	b, r := e.dbeam, deviceRow(j.slot)
	j.onDevice, j.onBeam = false, false
	b.jobs[r] = nil
	b.busy--
	return errors.Join(b.l.Stop(2*r), b.l.Stop(2*r+1))
}

// deviceBeamStep issues beamRounds rounds of every search on the device beam loop, then reads
// which are done; a transcription whose two searches are is emitted and done. It reports the
// transcriptions searched and the tokens of those that ended.
func (e *Parakeet) deviceBeamStep() (seqs, tokens int) {
	b := e.dbeam
	if b == nil || b.busy == 0 {
		return 0, 0
	}
	fail := func(err error) {
		for _, j := range b.jobs {
			if j != nil && j.ph == ppDecode {
				j.err, j.ph = fmt.Errorf("parakeet: %w", err), ppDone
			}
		}
	}
	for range beamRounds {
		if err := b.l.Round(); err != nil {
			fail(err)
			return 0, 0
		}
	}
	// A stream whose joint rows were not numbers, or that emitted too many tokens, fails alone
	// (Failed below).
	if err := b.l.Read(b.done); err != nil {
		var nf *parakeet.NonFiniteError
		if !errors.As(err, &nf) && !errors.Is(err, parakeet.ErrBeamFull) {
			fail(err)
			return 0, 0
		}
	}
	for r, j := range b.jobs {
		if j == nil || j.ph != ppDecode {
			continue
		}
		seqs++
		if err := errors.Join(b.l.Failed(2*r), b.l.Failed(2*r+1)); err != nil {
			var nf *parakeet.NonFiniteError
			if errors.As(err, &nf) {
				j.err = errNonFiniteParakeet
			} else {
				j.err = fmt.Errorf("parakeet: %w", err)
			}
			j.ph = ppDone
			continue
		}
		if !b.done[2*r] || !b.done[2*r+1] {
			continue
		}
		tokens += e.endDeviceBeam(j, r)
		j.ph = ppDone
	}
	return seqs, tokens
}

// endDeviceBeam assembles the result of beam transcription j, whose searches in row r are done,
// as endBeamStep does: the greedy search's hypothesis when its score is higher than the beam's
// best. It returns the result's tokens.
func (e *Parakeet) endDeviceBeam(j *pjob, r int) int {
	b := e.dbeam
	toks, best, err := b.l.Result(2*r, nil)
	if err != nil {
		j.err = fmt.Errorf("parakeet: %w", err)
		return 0
	}
	var greedy float64
	b.greedy, greedy, err = b.l.Result(2*r+1, b.greedy[:0])
	if err != nil {
		j.err = fmt.Errorf("parakeet: %w", err)
		return 0
	}
	if greedy > best {
		toks = append(toks[:0], b.greedy...)
	}
	j.toks = toks
	if parakeetBeamHook != nil {
		parakeetBeamHook(j, best, greedy)
	}
	e.emit(j)
	return len(toks)
}

// closeDeviceBeam releases the device beam loop.
func (e *Parakeet) closeDeviceBeam() error {
	if e.dbeam == nil || e.dbeam.l == nil {
		return nil
	}
	err := e.dbeam.l.Close()
	e.dbeam.l = nil
	return err
}
