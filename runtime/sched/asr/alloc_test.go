package asr

import (
	"context"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// TestStepAllocs drives the scheduler's step loop by hand over two transcriptions (one greedy, one
// beam search with 3 beams) and checks that a steady-state step, a batched decoder forward plus
// sampling and beam reordering, allocates nothing.
func TestStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	m := testModel(t, "tiny.en")
	e := manualWhisper(t, m, Config{MaxActive: 2})
	defer func() {
		e.dec.Close()
		e.enc.Close()
	}()
	samples := testWAV(t, "psx-cards-001")
	for _, beam := range []int{1, 3} {
		p := DefaultParams()
		p.Language, p.NoTimestamps, p.TemperatureInc, p.BeamSize = "en", true, 0, beam
		e.admit(preparedJob(t, e, context.Background(), p, samples))
	}
	for range 8 { // encode both windows, feed the prompts, take the first steps
		e.q.loop.Step()
	}
	for _, j := range e.active {
		if j.ph != phDecode || j.err != nil {
			t.Fatalf("job in phase %d, error %v", j.ph, j.err)
		}
	}
	if a := testing.AllocsPerRun(20, func() { e.q.loop.Step() }); a != 0 {
		t.Errorf("%v allocations per scheduler step, want 0", a)
	}
}

// TestParakeetStepAllocs drives the Parakeet scheduler's loop by hand over one greedy
// transcription and checks that a steady-state step, a prediction-network call and the joint
// rows up to the next token, allocates nothing.
func TestParakeetStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	be, _, err := backend.New(backend.Choose(""), backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := parakeet.Load(f, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	noLoop = true
	e, err := NewParakeet(m, Config{MaxActive: 1})
	noLoop = false
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	samples := testWAV(t, "jfk")
	j := &pjob{p: DefaultParams(), nSamples: len(samples), slot: -1}
	j.start(context.Background())
	if j.mel, err = m.FrontEnd.LogMel(nil, samples); err != nil {
		t.Fatal(err)
	}
	j.melRows = len(j.mel) / m.HParams.NMels
	j.frames = parakeet.EncoderFrames(j.melRows)
	j.end = j.frames
	if !(*parakeetWork)(e).Admit(j) {
		t.Fatal("not admitted")
	}
	for range 3 { // encode, the first tokens
		e.q.loop.Step()
	}
	if j.ph != ppDecode || j.err != nil {
		t.Fatalf("job in phase %d, error %v", j.ph, j.err)
	}
	if a := testing.AllocsPerRun(10, func() { e.q.loop.Step() }); a != 0 {
		t.Errorf("%v allocations per scheduler step, want 0", a)
	}
	if j.ph != ppDecode || len(j.toks) < 10 {
		t.Errorf("the steps measured did not all decode: phase %d, %d tokens", j.ph, len(j.toks))
	}
}

// TestParakeetBeamStepAllocs drives the Parakeet scheduler's loop by hand over one beam
// transcription (width 4) and checks that its steps allocate nothing once the search's token
// history has grown to the transcript (it grows amortised: at most a few allocations over the
// steps measured).
func TestParakeetBeamStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	be, _, err := backend.New(backend.Choose(""), backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := parakeet.Load(f, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	noLoop = true
	e, err := NewParakeet(m, Config{MaxActive: 1})
	noLoop = false
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	samples := testWAV(t, "jfk")
	p := DefaultParams()
	p.BeamSize = 4
	j := &pjob{p: p, nSamples: len(samples), slot: -1}
	j.start(context.Background())
	if j.mel, err = m.FrontEnd.LogMel(nil, samples); err != nil {
		t.Fatal(err)
	}
	j.melRows = len(j.mel) / m.HParams.NMels
	j.frames = parakeet.EncoderFrames(j.melRows)
	j.end = j.frames
	if !(*parakeetWork)(e).Admit(j) {
		t.Fatal("not admitted")
	}
	for range 20 { // encode, the first rounds
		e.q.loop.Step()
	}
	if j.ph != ppDecode || j.err != nil || j.beam == nil {
		t.Fatalf("job in phase %d, error %v", j.ph, j.err)
	}
	a := testing.AllocsPerRun(20, func() { e.q.loop.Step() })
	if a > 0.5 {
		t.Errorf("%v allocations per scheduler step, want none but the history's amortised growth", a)
	}
	if j.ph != ppDecode {
		t.Errorf("the steps measured did not all decode: phase %d", j.ph)
	}
}
