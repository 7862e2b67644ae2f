package tts

import (
	"context"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestStepAllocs drives the step loop by hand over two syntheses of different voices and texts,
// their callers' frames drained between steps, and checks that a steady-state step (one FlowLM
// frame step, flow head included, and one decoder step over both) allocates nothing.
func TestStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	for _, be := range sharedtest.Backends(t, 2) {
		if be.Name() == "cuda" {
			continue // the emulation takes minutes a step
		}
		t.Run(be.Name(), func(t *testing.T) { stepAllocs(t, newFixture(t, be)) })
	}
}

func stepAllocs(t *testing.T, f *fixture) {
	s, err := newSynthesizer(f.m, f.tok, Config{Text: f.ck.Text, MaxActive: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var jobs []*job
	for _, r := range []Request{
		{Text: "The quick brown fox jumps over the lazy dog, and then it runs far away.", Voice: f.voice, Temperature: 0},
		{Text: "Numbers like one, two and three are read out one by one.", Voice: f.voice, Temperature: 0.7, Seed: 5},
	} {
		j, err := s.newJob(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.loop.Enqueue(j); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, j)
	}
	frames := 0
	step := func() {
		s.loop.Step()
		for _, j := range jobs {
			for {
				select {
				case a := <-j.frames:
					frames++
					j.free <- a
					continue
				default:
				}
				break
			}
		}
	}
	for range 3 { // the text passes, the first frames
		step()
	}
	if a := testing.AllocsPerRun(10, step); a != 0 {
		t.Errorf("%v allocations per step, want 0", a)
	}
	for _, j := range jobs {
		if j.ended || j.chunk != 0 || !j.started {
			t.Fatalf("a synthesis left its first chunk during the measurement (ended %v, chunk %d, error %v): not a steady state", j.ended, j.chunk, j.err)
		}
	}
	if frames != 2*14 {
		t.Errorf("%d frames from 14 steps of two syntheses, want %d", frames, 2*14)
	}
}
