package asr

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/models/whisper"
)

// manualWhisper makes a scheduler whose loop the test steps by hand (e.q.loop.Step).
func manualWhisper(t *testing.T, m *whisper.Model, cfg Config) *Whisper {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: a hand-stepped recogniser has no goroutine of its own; the full run checks it")
	}
	noLoop = true
	e, err := NewWhisper(m, cfg)
	noLoop = false
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// queueWhisper is a hand-stepped scheduler over tiny.en (closed when t ends), a shared recording and
// greedy English parameters without timestamps: the set-up of the queue tests.
func queueWhisper(t *testing.T, cfg Config) (*Whisper, []float32, Params) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: a hand-stepped recogniser has no goroutine of its own; the full run checks it")
	}
	e := manualWhisper(t, testModel(t, "tiny.en"), cfg)
	t.Cleanup(func() { e.Close() })
	p := DefaultParams()
	p.Language, p.NoTimestamps, p.TemperatureInc = "en", true, 0
	return e, testWAV(t, "psx-cards-001"), p
}

// preparedJob is a transcription of samples with p under ctx, its features computed, not queued.
func preparedJob(t *testing.T, e *Whisper, ctx context.Context, p Params, samples []float32) *job {
	t.Helper()
	j := newJob(ctx, p)
	if err := e.prepare(j, samples); err != nil {
		t.Fatal(err)
	}
	return j
}

// TestQueueBound: with MaxActive transcriptions running and MaxQueue waiting, the next request
// is refused at once with ErrQueueFull (not queued behind them), and the scheduler's statistics
// show the decoder cache in use while a transcription decodes.
func TestQueueBound(t *testing.T) {
	e, samples, p := queueWhisper(t, Config{MaxActive: 1, MaxQueue: 1})
	if err := e.q.enqueue(preparedJob(t, e, context.Background(), p, samples)); err != nil {
		t.Fatal(err)
	}
	for range 4 { // admit, encode, feed the prompt, decode
		e.q.loop.Step()
	}
	st := e.Stats()
	if st.Active != 1 || st.KVBlocksUsed == 0 || st.Steps != 4 || st.LastBatchSeqs != 1 {
		t.Errorf("while decoding: %+v", st)
	}
	if err := e.q.enqueue(preparedJob(t, e, context.Background(), p, samples)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := e.submit(ctx, audio.Samples(samples), p, nil, false); !errors.Is(err, ErrQueueFull) {
		t.Errorf("a third request with one running and one waiting: %v, want ErrQueueFull", err)
	}
	if st := e.Stats(); st.Queued != 1 {
		t.Errorf("%d queued, want 1", st.Queued)
	}
}

// TestQueueFreedAtFinish: a transcription that has just returned to its caller no longer
// counts against the queue, even before the loop's next step: with one running and none
// waiting allowed, the caller can submit its next transcription at once.
func TestQueueFreedAtFinish(t *testing.T) {
	e, samples, p := queueWhisper(t, Config{MaxActive: 1})
	p.MaxTokens = 2
	first := preparedJob(t, e, context.Background(), p, samples)
	if err := e.q.enqueue(first); err != nil {
		t.Fatal(err)
	}
	for i := 0; first.ph != phDone; i++ {
		if i == 100 {
			t.Fatal("the first transcription did not end")
		}
		e.q.loop.Step()
	}
	e.reap() // what the next step does first: the caller of the first is woken here
	<-first.done
	if err := e.q.enqueue(preparedJob(t, e, context.Background(), p, samples)); err != nil {
		t.Errorf("the next transcription after one returned: %v", err)
	}
}

// TestEncoderOrder: windows are encoded in the order their transcriptions began to wait, also
// when a transcription ahead of them leaves (round robin by position skipped one then).
func TestEncoderOrder(t *testing.T) {
	e, samples, p := queueWhisper(t, Config{MaxActive: 3})
	jobs := make([]*job, 3)
	cancels := make([]context.CancelFunc, 3)
	for i := range jobs {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		defer cancel()
		jobs[i] = preparedJob(t, e, ctx, p, samples)
		if err := e.q.enqueue(jobs[i]); err != nil {
			t.Fatal(err)
		}
	}
	e.q.loop.Step() // admits all three, encodes the first
	if jobs[0].ph == phEncode || jobs[1].ph != phEncode || jobs[2].ph != phEncode {
		t.Fatalf("after one step: phases %d %d %d", jobs[0].ph, jobs[1].ph, jobs[2].ph)
	}
	cancels[0]()
	e.q.loop.Step() // the first leaves; the second is encoded
	if jobs[1].ph == phEncode || jobs[2].ph != phEncode {
		t.Errorf("after the first left: second in phase %d, third in phase %d; want the second encoded first", jobs[1].ph, jobs[2].ph)
	}
}

// TestEncoderStagesBetweenSteps: while one transcription decodes, another's window is encoded a
// stage a step (the decoder stepping between stages), and a transcription that ends while its
// window is in the encoder neither receives it nor holds up the others in the same call.
func TestEncoderStagesBetweenSteps(t *testing.T) {
	e, samples, p := queueWhisper(t, Config{MaxActive: 3, EncodeBatch: 2})
	m := e.m
	a := preparedJob(t, e, context.Background(), p, samples)
	if err := e.q.enqueue(a); err != nil {
		t.Fatal(err)
	}
	for i := 0; a.ph != phDecode; i++ {
		if i == 10 {
			t.Fatalf("the first transcription is in phase %d after %d steps", a.ph, i)
		}
		e.q.loop.Step()
	}
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	b := preparedJob(t, e, ctxB, p, samples)
	c := preparedJob(t, e, context.Background(), p, samples)
	for _, j := range []*job{b, c} {
		if err := e.q.enqueue(j); err != nil {
			t.Fatal(err)
		}
	}
	var bCross *whisper.Cross // b's window, until b leaves
	var bHeld []float32
	stages := e.enc.Stages()
	if stages != m.AudioLayer+2 {
		t.Fatalf("%d encoder stages for %d blocks", stages, m.AudioLayer)
	}
	for s := 1; s <= stages; s++ {
		before := a.step
		e.q.loop.Step()
		if a.ph != phDecode || a.step != before+1 {
			t.Fatalf("step %d of the encoder call: the decoding transcription went from token %d to %d (phase %d), want one token a step", s, before, a.step, a.ph)
		}
		if s == 2 {
			cancelB() // reaped at the next step, its window half encoded
			bCross = b.cross
			var err error
			if bHeld, err = m.ReadCross(bCross); err != nil {
				t.Fatal(err)
			}
		}
		if s < stages && c.ph != phEncode {
			t.Fatalf("the window was encoded after %d of %d stages", s, stages)
		}
	}
	if c.ph == phEncode || c.ph == phDone {
		t.Fatalf("after %d stages the second transcription is in phase %d", stages, c.ph)
	}
	// The same window, encoded alone in one step (nothing was decoding) and in stages beside a
	// window whose transcription left.
	alone, err := m.ReadCross(a.cross)
	if err != nil {
		t.Fatal(err)
	}
	staged, err := m.ReadCross(c.cross)
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for k := range alone {
		worst = max(worst, math.Abs(float64(alone[k]-staged[k])))
	}
	if worst > 1e-3 { // as TestEncodeBatch: an F16 ulp at most from a kernel's row blocking
		t.Errorf("the window encoded in stages differs from it encoded alone by %g", worst)
	}
	if len(e.encJobs) != 0 || b.encPicked || c.encPicked {
		t.Errorf("encoder call not ended: %d jobs", len(e.encJobs))
	}
	// b left during the call: its window was not stored in the cross-attention memory it gave
	// back, and b was not set up to decode.
	if after, err := m.ReadCross(bCross); err != nil {
		t.Fatal(err)
	} else if !slices.Equal(after, bHeld) {
		t.Error("the encoder call stored a window in the memory of a transcription that had left")
	}
	if b.ph == phPrompt || b.ph == phDetect || b.ph == phDecode {
		t.Errorf("the transcription that left is in phase %d after its encoder call", b.ph)
	}
	<-b.done
	if !errors.Is(b.err, context.Canceled) {
		t.Errorf("the transcription cancelled during its encoder call: %v", b.err)
	}
	for i := 0; a.ph != phDone || c.ph != phDone; i++ {
		if i == 1000 {
			t.Fatal("the transcriptions did not end")
		}
		e.q.loop.Step()
	}
	e.reap()
	<-a.done
	<-c.done
	if a.err != nil || c.err != nil {
		t.Fatalf("errors: %v, %v", a.err, c.err)
	}
}
