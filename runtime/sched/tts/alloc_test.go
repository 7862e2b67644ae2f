package tts

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestStepAllocs drives the step loop by hand over two syntheses of different texts,
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
		t.Run(be.Name(), func(t *testing.T) { stepAllocs(t, newFixture(t, be), false) })
	}
	t.Run("cpu/decoder", func(t *testing.T) {
		f := newFixture(t, sharedtest.Backend(t, "cpu", 1))
		stepAllocs(t, f, true)
	})
}

// stepAllocs: with decoder, the Mimi decoder runs on a backend and goroutine of its own
// (Config.Decoder), and each step's frames are delivered at the next.
func stepAllocs(t *testing.T, f *fixture, decoder bool) {
	cfg := Config{Text: f.ck.Text, MaxActive: 2}
	if decoder {
		cfg.Decoder = decoderModel(t, f)
	}
	s, err := newSynthesizer(f.m, f.tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Two reference runs that go without EOS for over 100 frames, with their recorded noise.
	var jobs []*job
	for _, run := range []string{"t5-stream", "t2-fox"} {
		var meta struct {
			Text string `json:"text"`
		}
		b, err := os.ReadFile(filepath.Join(f.ref, run, "meta.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &meta); err != nil {
			t.Fatal(err)
		}
		r := Request{Text: meta.Text, Voice: f.voice, Noise: readArray(t, filepath.Join(f.ref, run, "noise.npy"))}
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
		drain:
			for {
				select {
				case a, ok := <-j.frames:
					if !ok {
						break drain
					}
					frames++
					j.free <- a
				default:
					break drain
				}
			}
		}
	}
	// The text passes, and frames until the decoder transformer's attention window is full
	// (its scratch then stops growing).
	for range 20 {
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
	want := 2 * 31
	if decoder {
		want -= 2 // the last step's, being decoded
	}
	if frames != want {
		t.Errorf("%d frames from 31 steps of two syntheses, want %d", frames, want)
	}
}
