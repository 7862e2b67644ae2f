package asr

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sync"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/decode"
)

// beamClips are the reference clips of the transducer's tests.
var beamClips = []string{"psx-cards-001", "jfk", "psx-cards-002", "ls-tc-1089-134686-0001", "ami-ES2011a-headset0-40s-46s",
	"psx-librivox-0870", "ljs-LJ001-0005", "ljs-LJ001-0014", "ls-dc-2412-153948-0000", "concat-40s"}

// beamClipSamples reads clip name of beamClips.
func beamClipSamples(t testing.TB, name string) []float32 {
	t.Helper()
	path := "data/asr/wav/" + name + ".wav"
	if name == "concat-40s" {
		path = "reference/asr-transducer/audio/concat-40s.wav"
	}
	b, err := os.ReadFile(sharedtest.Path(t, path))
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := audio.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// beamRecord is what parakeetBeamHook saw of one beam transcription.
type beamRecord struct {
	beam, greedy float64
	greedySteps  []decode.TDTStep
	beamSteps    []decode.TDTStep
	end          int64
}

// recordBeams sets parakeetBeamHook for the duration of t and returns the records by clip
// length in samples.
func recordBeams(t *testing.T, e *Parakeet) (map[int]beamRecord, *sync.Mutex) {
	recs, mu := map[int]beamRecord{}, &sync.Mutex{}
	parakeetBeamHook = func(j *pjob, beam, greedy float64) {
		mu.Lock()
		defer mu.Unlock()
		recs[j.nSamples] = beamRecord{beam: beam, greedy: greedy, greedySteps: j.greedy.Tokens(0, nil), beamSteps: j.beam.Tokens(0, nil),
			end: e.m.HParams.SegmentEnd(j.melRows, j.frames)}
	}
	t.Cleanup(func() { parakeetBeamHook = nil })
	return recs, mu
}

// TestParakeetBeam transcribes every reference clip greedily and with beams of 1, 4 and 8: a
// beam of 1 gives the greedy result exactly; a wider beam's greedy candidate (the width-1
// search run beside it) gives exactly the greedy transcription; the result is the
// higher-scoring hypothesis's, so it scores at least as high as greedy; and the beam alone
// finds a better hypothesis than greedy on most clips.
func TestParakeetBeam(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: one transcription at a time, checked for its results; TestParakeetBeamConcurrent runs beams side by side")
	}
	e := openParakeetSmall(t, Config{MaxActive: 4, EncodeBatch: 2})
	recs, mu := recordBeams(t, e)
	ctx := context.Background()
	better, runs := 0, 0
	for _, name := range beamClips {
		samples := beamClipSamples(t, name)
		p := DefaultParams()
		greedy, err := e.Transcribe(ctx, samples, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(greedy.Segments) == 0 {
			t.Fatalf("%s: no greedy text", name)
		}
		for _, w := range []int{1, 4, 8} {
			p.BeamSize = w
			res, err := e.Transcribe(ctx, samples, p, nil)
			if err != nil {
				t.Fatalf("%s, beam %d: %v", name, w, err)
			}
			if w == 1 {
				if !reflect.DeepEqual(res, greedy) {
					t.Errorf("%s: beam 1 differs from greedy:\n%+v\n%+v", name, res, greedy)
				}
				continue
			}
			mu.Lock()
			r, ok := recs[len(samples)]
			delete(recs, len(samples))
			mu.Unlock()
			if !ok {
				t.Fatalf("%s, beam %d: no beam search ran", name, w)
			}
			g, _ := e.segment(stepTokens(r.greedySteps), r.end)
			if !reflect.DeepEqual(g, greedy.Segments[0]) {
				t.Errorf("%s, beam %d: the greedy candidate differs from the greedy transcription:\n%+v\n%+v", name, w, g, greedy.Segments[0])
			}
			runs++
			want := greedy.Segments
			if r.beam >= r.greedy {
				if r.beam > r.greedy {
					better++
				}
				want = nil
				if s, ok := e.segment(stepTokens(r.beamSteps), r.end); ok {
					want = []Segment{s}
				}
			}
			if !reflect.DeepEqual(res.Segments, want) {
				t.Errorf("%s, beam %d (score %.4f, greedy %.4f): the result is not the better hypothesis's:\n%+v\n%+v", name, w, r.beam, r.greedy, res.Segments, want)
			}
			t.Logf("%s, beam %d: score %.4f (greedy %.4f): %q", name, w, r.beam, r.greedy, res.Text)
		}
	}
	// A beam keeps the greedy path until something scores higher, but pruning can lose it (then
	// the greedy candidate is returned); on these clips it mostly finds better.
	if better*4 < runs*3 {
		t.Errorf("the beam beat greedy on %d of %d transcriptions", better, runs)
	}
}

// TestParakeetBeamConcurrent transcribes every clip greedily and with beams of 4 and 8, all at
// once through one scheduler, and checks that every result is the one it gets alone.
func TestParakeetBeamConcurrent(t *testing.T) {
	e := openParakeetSmall(t, Config{MaxActive: 4, EncodeBatch: 2, MaxQueue: 64})
	ctx := context.Background()
	widths := []int{1, 4, 8}
	clips := beamClips[:6]
	if testing.Short() {
		// Six transcriptions through four decoders still queue and run side by side; -race is
		// slow enough that the other four clips add only minutes.
		clips = beamClips[:2]
	}
	alone := map[string]*Result{}
	samples := map[string][]float32{}
	for _, name := range clips {
		samples[name] = beamClipSamples(t, name)
		for _, w := range widths {
			p := DefaultParams()
			p.BeamSize = w
			res, err := e.Transcribe(ctx, samples[name], p, nil)
			if err != nil {
				t.Fatal(err)
			}
			alone[fmt.Sprint(name, w)] = res
		}
	}
	var wg sync.WaitGroup
	for _, name := range clips {
		for _, w := range widths {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := DefaultParams()
				p.BeamSize = w
				res, err := e.Transcribe(ctx, samples[name], p, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if want := alone[fmt.Sprint(name, w)]; !reflect.DeepEqual(res, want) {
					t.Errorf("%s, beam %d: together %q, alone %q", name, w, res.Text, want.Text)
				}
			}()
		}
	}
	wg.Wait()
}

// TestParakeetBeamBadSize refuses beams outside 1..MaxDecoders.
func TestParakeetBeamBadSize(t *testing.T) {
	e := openParakeetSmall(t, Config{})
	samples := beamClipSamples(t, "jfk")
	for _, w := range []int{0, -1, MaxDecoders + 1, 64} {
		p := DefaultParams()
		p.BeamSize = w
		if _, err := e.Transcribe(context.Background(), samples, p, nil); !errors.Is(err, ErrBadRequest) {
			t.Errorf("beam %d: %v, want ErrBadRequest", w, err)
		}
	}
}

// BenchmarkParakeetBeam transcribes a clip end to end, greedily and with a beam of 4 (the beam's
// time over greedy's is the cost of the search), on the small model and on the 0.6B shape (on
// the fastest backend; skipped unless sharedtest.ParakeetRandomModel can have it).
func BenchmarkParakeetBeam(b *testing.B) {
	for _, shape := range []string{"small", "0.6b-v2"} {
		b.Run(shape, func(b *testing.B) {
			e := openParakeetShape(b, shape, shape != "small", Config{MaxActive: 4, EncodeBatch: 2})
			samples := beamClipSamples(b, "jfk")
			// The first transcription makes the encoder's buffers: not measured.
			if _, err := e.Transcribe(context.Background(), samples, DefaultParams(), nil); err != nil {
				b.Fatal(err)
			}
			for _, w := range []int{1, 4} {
				b.Run(fmt.Sprintf("beam=%d", w), func(b *testing.B) {
					p := DefaultParams()
					p.BeamSize = w
					dec0 := e.Stats().DecodeTime
					for b.Loop() {
						if _, err := e.Transcribe(context.Background(), samples, p, nil); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(len(samples))/SampleRate*float64(b.N)/b.Elapsed().Seconds(), "audio-s/s")
					b.ReportMetric(float64((e.Stats().DecodeTime-dec0).Microseconds())/1000/float64(b.N), "decode-ms/op")
				})
			}
		})
	}
}
