package backend

import (
	"errors"
	"testing"
)

// startFails is a Recorder whose Record fails (as a GPU backend's may when capture cannot start)
// or, with replayErr, whose Replay does; nothing it records runs.
type startFails struct {
	Backend
	recordErr, replayErr error
	records              int
}

func (s *startFails) Record() error { s.records++; return s.recordErr }
func (s *startFails) Replay() error { return s.replayErr }
func (s *startFails) Discard()      {}

// TestRecordingRun covers Recording.Run's answers to a backend's failures: a Record that fails
// (other than ErrNotRecording) runs the operations unrecorded and counts towards giving up after
// three steps in a row, a success in between resets the count, and a step whose operations fail
// unrecorded too returns their error without counting.
func TestRecordingRun(t *testing.T) {
	calls := 0
	ok := func() error { calls++; return nil }
	be := &startFails{recordErr: errors.New("capture refused")}
	var r Recording
	for range 2 {
		if err := r.Run(be, ok); err != nil {
			t.Fatal(err)
		}
	}
	// A recorded step succeeds: the count starts over.
	be.recordErr = nil
	if err := r.Run(be, ok); err != nil {
		t.Fatal(err)
	}
	be.recordErr = errors.New("capture refused")
	for range 2 {
		if err := r.Run(be, ok); err != nil {
			t.Fatal(err)
		}
	}
	if be.records != 5 || r.off {
		t.Fatalf("after 2 failures, a success and 2 failures: %d records, off %v; want 5, still recording", be.records, r.off)
	}
	// Operations that fail for themselves: their error, not counted.
	bad := errors.New("bad batch")
	if err := r.Run(be, func() error { return bad }); !errors.Is(err, bad) {
		t.Fatalf("failing operations: %v, want %v", err, bad)
	}
	if r.off {
		t.Fatal("a step whose operations failed by themselves counted towards giving up")
	}
	if err := r.Run(be, ok); err != nil {
		t.Fatal(err)
	}
	if !r.off {
		t.Fatal("three failed recordings in a row did not stop recording")
	}
	n := be.records
	if err := r.Run(be, ok); err != nil || be.records != n {
		t.Fatalf("after giving up: err %v, %d more records", err, be.records-n)
	}
	if calls != 7 {
		t.Fatalf("operations ran %d times, want 7 (once for each of the seven steps that succeeded)", calls)
	}
}
