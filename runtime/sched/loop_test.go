package sched

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// fakeReq is a request of fakeWork: it needs size units of room while admitted and runs for
// steps steps.
type fakeReq struct {
	id, size, steps int
	cancelled       bool
	ended           string // "", "done", "expired", "reaped", "aborted", "shutdown"
}

// fakeWork has room units of room and records what the Loop asked of it.
type fakeWork struct {
	room     int
	active   []*fakeReq
	admitted []int
	calls    []string
}

func (w *fakeWork) Reap(time.Time) {
	w.calls = append(w.calls, "reap")
	w.active = slices.DeleteFunc(w.active, func(r *fakeReq) bool {
		if r.cancelled {
			r.ended = "reaped"
			w.room += r.size
			return true
		}
		return false
	})
}

func (w *fakeWork) Expire(r *fakeReq, _ time.Time) bool {
	if r.cancelled {
		r.ended = "expired"
	}
	return r.cancelled
}

func (w *fakeWork) Admit(r *fakeReq) bool {
	w.calls = append(w.calls, "admit")
	if r.size > w.room {
		return false
	}
	w.room -= r.size
	w.active = append(w.active, r)
	w.admitted = append(w.admitted, r.id)
	return true
}

func (w *fakeWork) Step(time.Time) (seqs, tokens int, busy bool) {
	w.calls = append(w.calls, "step")
	if len(w.active) == 0 {
		return 0, 0, false
	}
	seqs = len(w.active)
	for _, r := range w.active {
		tokens += r.size
		r.steps--
	}
	w.active = slices.DeleteFunc(w.active, func(r *fakeReq) bool {
		if r.steps <= 0 {
			r.ended = "done"
			w.room += r.size
			return true
		}
		return false
	})
	return seqs, tokens, true
}

func (w *fakeWork) Abort(r *fakeReq) { r.ended = "aborted" }

func (w *fakeWork) Shutdown() {
	for _, r := range w.active {
		r.ended = "shutdown"
	}
	w.active = nil
}

func newTestLoop(t *testing.T, w *fakeWork, cfg LoopConfig) *Loop[*fakeReq] {
	t.Helper()
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = 8
	}
	l, err := NewLoop[*fakeReq](w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestLoopFIFO: admission takes requests from the head of the queue only, so a small request
// behind a big one that does not fit waits for it, and each step reaps before it admits.
func TestLoopFIFO(t *testing.T) {
	w := &fakeWork{room: 4}
	l := newTestLoop(t, w, LoopConfig{})
	a, big, small := &fakeReq{id: 1, size: 3, steps: 2}, &fakeReq{id: 2, size: 4, steps: 1}, &fakeReq{id: 3, size: 1, steps: 1}
	for _, r := range []*fakeReq{a, big, small} {
		if err := l.Enqueue(r); err != nil {
			t.Fatal(err)
		}
	}
	if !l.Step() || !slices.Equal(w.admitted, []int{1}) {
		t.Fatalf("first step admitted %v, want [1]: the small request must not overtake the big one", w.admitted)
	}
	if got := l.Queued(); got != 2 {
		t.Errorf("%d queued, want 2", got)
	}
	l.Step() // a finishes
	l.Step() // big admitted and finishes
	l.Step() // small admitted and finishes
	if !slices.Equal(w.admitted, []int{1, 2, 3}) || a.ended != "done" || big.ended != "done" || small.ended != "done" {
		t.Errorf("admitted %v, ended %q %q %q", w.admitted, a.ended, big.ended, small.ended)
	}
	if l.Step() {
		t.Error("a step with nothing to do reported work")
	}
	w.calls = w.calls[:0]
	l.Enqueue(&fakeReq{id: 4, size: 1, steps: 1})
	l.Step()
	if !slices.Equal(w.calls, []string{"reap", "admit", "step"}) {
		t.Errorf("calls %v, want reap, admit, step", w.calls)
	}
}

// TestLoopReapBeforeAdmit: room freed by a cancelled request is used by the same step's admission.
func TestLoopReapBeforeAdmit(t *testing.T) {
	w := &fakeWork{room: 2}
	l := newTestLoop(t, w, LoopConfig{})
	a, b := &fakeReq{id: 1, size: 2, steps: 100}, &fakeReq{id: 2, size: 2, steps: 1}
	l.Enqueue(a)
	l.Step()
	l.Enqueue(b)
	l.Step()
	if len(w.admitted) != 1 {
		t.Fatalf("admitted %v while the first request holds all the room", w.admitted)
	}
	a.cancelled = true
	l.Step()
	if a.ended != "reaped" || !slices.Equal(w.admitted, []int{1, 2}) {
		t.Errorf("after cancelling: first %q, admitted %v", a.ended, w.admitted)
	}
}

// TestLoopQueue: the queue's bound, expiry of queued requests, and Close before Run.
func TestLoopQueue(t *testing.T) {
	w := &fakeWork{room: 0}
	l := newTestLoop(t, w, LoopConfig{MaxQueue: 2})
	x, y := &fakeReq{id: 1, size: 1}, &fakeReq{id: 2, size: 1}
	l.Enqueue(x)
	l.Enqueue(y)
	if err := l.Enqueue(&fakeReq{id: 3}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("third request: %v, want ErrQueueFull", err)
	}
	x.cancelled = true
	l.Step()
	if x.ended != "expired" || l.Queued() != 1 {
		t.Errorf("cancelled queued request: %q, %d queued", x.ended, l.Queued())
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if y.ended != "aborted" || l.Queued() != 0 {
		t.Errorf("Close before Run: queued request %q, %d queued", y.ended, l.Queued())
	}
	if err := l.Enqueue(&fakeReq{}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
	if err := l.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close: %v", err)
	}
	// Close before Run also ends what Step admitted by hand.
	w2 := &fakeWork{room: 1}
	l2 := newTestLoop(t, w2, LoopConfig{})
	admitted := &fakeReq{size: 1, steps: 10}
	l2.Enqueue(admitted)
	l2.Step()
	l2.Close()
	if admitted.ended != "shutdown" {
		t.Errorf("Close before Run: admitted request %q", admitted.ended)
	}
	if _, err := NewLoop[*fakeReq](w, LoopConfig{}); err == nil {
		t.Error("a loop without a queue was made")
	}
	if _, err := NewLoop[*fakeReq](nil, LoopConfig{MaxQueue: 1}); err == nil {
		t.Error("a loop without work was made")
	}
}

// TestLoopAccounting: Stats and OnStep see each step that did work, with its batch.
func TestLoopAccounting(t *testing.T) {
	now := time.Unix(0, 0)
	clock := func() time.Time { now = now.Add(time.Millisecond); return now }
	type rec struct {
		d            time.Duration
		seqs, tokens int
	}
	var got []rec
	w := &fakeWork{room: 10}
	l := newTestLoop(t, w, LoopConfig{Clock: clock, OnStep: func(d time.Duration, s, k int) { got = append(got, rec{d, s, k}) }})
	l.Enqueue(&fakeReq{size: 2, steps: 1})
	l.Enqueue(&fakeReq{size: 3, steps: 2})
	l.Step()
	l.Step()
	l.Step()
	want := []rec{{time.Millisecond, 2, 5}, {time.Millisecond, 1, 3}}
	if !slices.Equal(got, want) {
		t.Errorf("OnStep saw %v, want %v", got, want)
	}
	st := l.Stats()
	if st.Steps != 2 || st.LastBatchSeqs != 1 || st.LastBatchTokens != 3 || st.LastStep != time.Millisecond || st.Queued != 0 {
		t.Errorf("stats %+v", st)
	}
	// A busy step without a batch (work of size 0 here; a speech model's encoder in earnest)
	// counts as a step and keeps the last batch.
	l.Enqueue(&fakeReq{size: 0, steps: 1})
	l.Step()
	st = l.Stats()
	if st.Steps != 3 || st.LastBatchSeqs != 1 || st.LastBatchTokens != 3 || len(got) != 3 || got[2].tokens != 0 {
		t.Errorf("after a step without a batch: stats %+v, OnStep saw %v", st, got)
	}
}

// TestLoopRun: Run steps what is queued, waits when idle, and on cancellation ends what is
// queued and admitted; a second Run is refused.
func TestLoopRun(t *testing.T) {
	w := &fakeWork{room: 1}
	stepped := make(chan struct{}, 100)
	l := newTestLoop(t, w, LoopConfig{OnStep: func(time.Duration, int, int) {
		select {
		case stepped <- struct{}{}:
		default:
		}
	}})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx) }()
	long, waiting := &fakeReq{size: 1, steps: 1 << 30}, &fakeReq{size: 1, steps: 1}
	l.Enqueue(long)
	<-stepped
	l.Enqueue(waiting)
	<-stepped
	cancel()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v", err)
	}
	if long.ended != "shutdown" || waiting.ended != "aborted" {
		t.Errorf("after cancellation: admitted %q, queued %q", long.ended, waiting.ended)
	}
	if err := l.Run(context.Background()); err == nil {
		t.Error("second Run accepted")
	}
	if err := l.Enqueue(&fakeReq{}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Run ended: %v", err)
	}
	l.Close()
}

// flushWork is fakeWork as a Flusher: it records, at each Flush, the steps the Loop had counted
// and the OnStep calls made.
type flushWork struct {
	fakeWork
	l       *Loop[*fakeReq]
	onSteps int
	flushes [][2]uint64 // Stats().Steps, OnStep calls
}

func (w *flushWork) Flush() {
	w.flushes = append(w.flushes, [2]uint64{w.l.Stats().Steps, uint64(w.onSteps)})
}

// TestLoopFlush: a Flusher's Flush runs after every Step, busy or not, once the step is counted
// in Stats and seen by OnStep, so that what it delivers (a request's end) comes after the
// counters that include it.
func TestLoopFlush(t *testing.T) {
	w := &flushWork{fakeWork: fakeWork{room: 10}}
	l, err := NewLoop[*fakeReq](w, LoopConfig{MaxQueue: 4, OnStep: func(time.Duration, int, int) { w.onSteps++ }})
	if err != nil {
		t.Fatal(err)
	}
	w.l = l
	l.Enqueue(&fakeReq{size: 2, steps: 1})
	l.Enqueue(&fakeReq{size: 3, steps: 2})
	l.Step()
	l.Step()
	l.Step() // idle
	want := [][2]uint64{{1, 1}, {2, 2}, {2, 2}}
	if !slices.Equal(w.flushes, want) {
		t.Fatalf("flushes saw (steps, OnStep calls) %v, want %v", w.flushes, want)
	}
}
