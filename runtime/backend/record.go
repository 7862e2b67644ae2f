package backend

import "errors"

// recordTries is how many steps in a row may fail to record before a Recording stops trying.
const recordTries = 3

// Recording runs a model's steps through a backend that records (Recorder): each step's
// operations are recorded and then run as one unit. A step whose recording fails (an
// operation the backend cannot record, or a refused replay) runs again as its operations are
// called, so a caller sees the step's own result either way; after recordTries such steps in a
// row, or at once when the backend's recording is off, the Recording stops recording. The zero
// value is ready to use; one Recording serves one sequence of steps (a model context).
type Recording struct {
	off   bool // record nothing more
	fails int  // steps in a row whose recording failed
}

// Run calls ops, recorded and replayed where be is a Recorder. ops must be safe to call twice:
// when a recording fails, nothing of it has run, and ops runs again unrecorded.
func (r *Recording) Run(be Backend, ops func() error) error {
	rec, ok := be.(Recorder)
	if !ok || r.off {
		return ops()
	}
	err := rec.Record()
	if errors.Is(err, ErrNotRecording) {
		r.off = true
		return ops()
	}
	if err == nil {
		if err = ops(); err == nil {
			err = rec.Replay()
		} else {
			rec.Discard()
		}
		if err == nil {
			r.fails = 0
			return nil
		}
	}
	// Nothing recorded ran. The operations called one by one either run (recording was the
	// problem) or fail for themselves.
	if err := ops(); err != nil {
		return err
	}
	if r.fails++; r.fails >= recordTries {
		r.off = true
	}
	return nil
}
