package asr_test

import (
	"context"
	"reflect"
	"sync"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/backendtest"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// TestChooserPath runs the same transcriptions at once (greedy with timestamps and temperature
// fallback, so best-of draws; beam search; greedy without timestamps; one detecting its
// language, whose row is read while the others' tokens are chosen in the same steps) on a
// backend and on a backend.Chooser form of it (backendtest.Choosing: as a GPU backend, the
// tokens are chosen behind the Chooser interface), and checks that every result is the same,
// token for token and probability for probability. The pure-Go backend gives a row the same
// arithmetic whatever the batch holds.
func TestChooserPath(t *testing.T) {
	path := synthModel(t, ggml.Shape{Name: "mini", State: 64, Head: 2, AudioLayer: 1, TextLayer: 2}, "tiny")
	type req struct {
		utt            string
		beam           int
		noTS, fallback bool
	}
	reqs := []req{{"jfk", 1, false, true}, {"jfk", 3, false, false}, {"psx-cards-001", 1, true, false},
		{"psx-cards-001", 2, false, true}}
	if asr.RaceEnabled {
		reqs = reqs[1:3]
	}
	audio := map[string][]float32{}
	for _, r := range reqs {
		audio[r.utt] = asr.LoadWAV(t, r.utt)
	}
	run := func(be backend.Backend) []*asr.Result {
		m, err := whisper.Open(be, path)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		eng, err := asr.NewWhisper(m, asr.Config{MaxActive: len(reqs), EncodeBatch: len(reqs)})
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		res := make([]*asr.Result, len(reqs))
		errs := make([]error, len(reqs))
		var wg sync.WaitGroup
		for i, r := range reqs {
			p := asr.DefaultParams()
			p.Language, p.NoTimestamps, p.BeamSize, p.Seed = "en", r.noTS, r.beam, 3
			if i == 2 {
				p.Language = "auto"
			}
			p.SuppressNonSpeech = i%2 == 1
			if !r.fallback {
				p.TemperatureInc = 0
			}
			if asr.RaceEnabled {
				p.MaxTokens = 4
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i], errs[i] = eng.Transcribe(context.Background(), audio[r.utt], p, nil)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		return res
	}
	want := run(sharedtest.Backend(t, "go", 1))
	ch := &backendtest.Choosing{Backend: sharedtest.Backend(t, "go", 1)}
	got := run(ch)
	if ch.Calls == 0 {
		t.Fatal("the decoder never asked the backend to choose")
	}
	if len(reqs) > 2 && want[2].Language == "" {
		t.Error("the request that detects its language reports none")
	}
	hot := false
	for i := range reqs {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("request %d (%+v): chosen by the backend %.80q, by the scheduler %.80q", i, reqs[i], got[i].Text, want[i].Text)
		}
		if len(want[i].Segments) == 0 {
			t.Errorf("request %d: no segments", i)
		}
		for _, s := range want[i].Segments {
			hot = hot || s.Temperature > 0
		}
	}
	if !hot && !asr.RaceEnabled {
		t.Error("no window was decoded again at a temperature: nothing was drawn")
	}
}
