package asr

import (
	"context"
	"testing"
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
