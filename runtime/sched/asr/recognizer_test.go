package asr

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

// fakeJob is a job that ends at the first step after its admission.
type fakeJob struct{ request }

// fakeWork admits up to max jobs and ends every admitted job at its next step, through the
// shared queue, as a family's Work does.
type fakeWork struct {
	q      *queue[*fakeJob]
	max    int
	active []*fakeJob
}

func (w *fakeWork) Reap(time.Time) {}

func (w *fakeWork) Expire(j *fakeJob, _ time.Time) bool {
	if j.ctx.Err() == nil {
		return false
	}
	j.admitted.Store(true)
	w.q.end(&j.request, nil)
	return true
}

func (w *fakeWork) Admit(j *fakeJob) bool {
	if len(w.active) >= w.max {
		return false
	}
	j.admitted.Store(true)
	w.active = append(w.active, j)
	return true
}

func (w *fakeWork) Step(time.Time) (seqs, tokens int, busy bool) {
	n := len(w.active)
	for _, j := range w.active {
		w.q.end(&j.request, nil)
	}
	w.active = w.active[:0]
	return n, n, n > 0
}

func (w *fakeWork) Abort(j *fakeJob) {
	j.admitted.Store(true)
	w.q.end(&j.request, ErrClosed)
}

func (w *fakeWork) Shutdown() {
	for _, j := range w.active {
		w.q.end(&j.request, ErrClosed)
	}
	w.active = nil
}

func newFakeJob(ctx context.Context) *fakeJob {
	j := &fakeJob{}
	j.start(ctx)
	return j
}

// TestQueueAdmission drives the shared queue by hand: the bound on transcriptions in flight
// (running and waiting) answers ErrQueueFull at once and is freed when a job ends, not at the
// loop's next step; a caller whose job is still queued returns with its context's error, and the
// loop then drops the job; Close fails what is queued with ErrClosed.
func TestQueueAdmission(t *testing.T) {
	w := &fakeWork{max: 1}
	cfg, err := Config{MaxActive: 1, MaxQueue: 1}.withDefaults(4)
	if err != nil {
		t.Fatal(err)
	}
	q, err := newQueue[*fakeJob](w, cfg, "test step")
	if err != nil {
		t.Fatal(err)
	}
	w.q = q
	a, b := newFakeJob(context.Background()), newFakeJob(context.Background())
	for _, j := range []*fakeJob{a, b} {
		if err := q.enqueue(j); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.enqueue(newFakeJob(context.Background())); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("a third job with one running and one waiting allowed: %v, want ErrQueueFull", err)
	}
	q.loop.Step() // admits a and ends it; b waits
	<-a.done
	if a.err != nil || q.inFlight.Load() != 1 || q.loop.Queued() != 1 {
		t.Fatalf("after the first step: %v, %d in flight, %d queued; want a ended, b waiting", a.err, q.inFlight.Load(), q.loop.Queued())
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := newFakeJob(ctx)
	got := make(chan error, 1)
	go func() { got <- q.submit(ctx, c) }() // a ended: room for c at once
	for q.loop.Queued() < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("a queued job whose caller gave up: %v, want the cancellation", err)
	}
	if n := q.inFlight.Load(); n != 2 {
		t.Errorf("%d in flight before the loop drops the cancelled job, want 2", n)
	}
	q.loop.Step() // drops c, admits b and ends it
	<-b.done
	<-c.done
	if n := q.inFlight.Load(); n != 0 || b.err != nil || !errors.Is(c.err, context.Canceled) {
		t.Errorf("after the step: %d in flight, errors %v and %v", n, b.err, c.err)
	}
	d := newFakeJob(context.Background())
	if err := q.enqueue(d); err != nil {
		t.Fatal(err)
	}
	q.loop.Close()
	<-d.done
	if !errors.Is(d.err, ErrClosed) || q.inFlight.Load() != 0 {
		t.Errorf("a job queued at Close: %v (%d in flight), want ErrClosed", d.err, q.inFlight.Load())
	}
	if err := q.enqueue(newFakeJob(context.Background())); !errors.Is(err, ErrClosed) {
		t.Errorf("enqueue after Close: %v, want ErrClosed", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	c, err := Config{}.withDefaults(4)
	if err != nil || c.MaxActive != 4 || c.MelThreads != 2 || c.EncodeBatch != 1 || c.MaxQueue != 0 {
		t.Errorf("defaults %+v, %v", c, err)
	}
	for _, bad := range []Config{{MaxQueue: -1}, {MaxActive: 2, EncodeBatch: 3}} {
		if _, err := bad.withDefaults(4); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestCheckAudio(t *testing.T) {
	if err := checkAudio([]float32{0, 0.5, -1}); err != nil {
		t.Errorf("a recording refused: %v", err)
	}
	for _, bad := range [][]float32{nil, {}, {0, float32(math.NaN())}, {float32(math.Inf(-1))}} {
		if err := checkAudio(bad); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%v: %v, want ErrBadRequest", bad, err)
		}
	}
}
