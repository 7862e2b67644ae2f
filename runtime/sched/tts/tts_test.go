package tts

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/npy"
	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/pockettts"
	"github.com/parleyhq/parley/runtime/tokenizer/sentencepiece"

	_ "github.com/parleyhq/parley/runtime/backend/all"
)

// End to end against upstream's recordings (../shared/reference/tts): the text through the
// front end, the reference voice state, the recorded noise, the frame loop with its stop rule and
// the decoder; the same number of frames and the waveform within 1e-4 absolute (F32 weights; the
// model's stages are compared one by one, with their figures, in pockettts's parity tests).
const waveTol = 1e-4

type fixture struct {
	ck    *pockettts.Checkpoint
	m     *pockettts.Model
	s     *Synthesizer
	voice *pockettts.Voice
	tok   pockettts.Tokenizer
	ref   string
}

func newFixture(t *testing.T, be backend.Backend) *fixture {
	t.Helper()
	ref := sharedtest.Path(t, "reference/tts")
	ck, err := pockettts.Open(sharedtest.PocketTTSRandomWeights(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	tok, err := sentencepiece.Load(filepath.Join(ref, "tokenizer", "random-unigram-4000.model"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := pockettts.New(be, ck.Weights)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	s, err := New(m, tok, Config{Text: ck.Text})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	cfg := m.Config()
	v, err := pockettts.LoadVoice(filepath.Join(ref, "voice", "voice_state.safetensors"), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{ck: ck, m: m, s: s, voice: v, tok: tok, ref: ref}
}

func readArray(t testing.TB, path string) []float32 {
	t.Helper()
	a, err := npy.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return a.Data
}

func TestSpeakParity(t *testing.T) {
	for _, be := range sharedtest.Backends(t, 2) {
		t.Run(be.Name(), func(t *testing.T) {
			runs := []string{"t1-hello"}
			if be.Name() == "cpu" && !raceEnabled {
				runs = append(runs, "t3-numbers", "t2-fox-greedy")
			} else if raceEnabled || be.Name() == "cuda" {
				t.Skip("a whole synthesis takes minutes here; the cpu backend compares them")
			}
			f := newFixture(t, be)
			for _, run := range runs {
				t.Run(run, func(t *testing.T) {
					dir := filepath.Join(f.ref, run)
					var meta struct {
						Text string  `json:"text"`
						Temp float64 `json:"temp"`
					}
					b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
					if err != nil {
						t.Fatal(err)
					}
					if err := json.Unmarshal(b, &meta); err != nil {
						t.Fatal(err)
					}
					want := readArray(t, filepath.Join(dir, "audio.npy"))
					r := Request{Text: meta.Text, Voice: f.voice, Temperature: meta.Temp}
					if meta.Temp > 0 {
						r.Noise = readArray(t, filepath.Join(dir, "noise.npy"))
					}
					var got []float32
					err = f.s.Speak(context.Background(), r, func(a []float32) error {
						if len(a) != f.s.FrameSamples() {
							t.Fatalf("a frame of %d samples, want %d", len(a), f.s.FrameSamples())
						}
						got = append(got, a...)
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
					if len(got) != len(want) {
						t.Fatalf("%d samples (%d frames), the reference %d (%d frames)", len(got), len(got)/1920, len(want), len(want)/1920)
					}
					maxDiff := 0.0
					for i := range want {
						maxDiff = max(maxDiff, math.Abs(float64(got[i]-want[i])))
					}
					if !(maxDiff <= waveTol) {
						t.Fatalf("waveform differs by %.3g, over %.0e", maxDiff, waveTol)
					}
					t.Logf("%d frames, waveform within %.2g", len(got)/f.s.FrameSamples(), maxDiff)
				})
			}
		})
	}
}

// TestSpeakErrors: bad requests fail with an error before anything is emitted, and emit's
// error and a cancelled context stop a synthesis.
func TestSpeakErrors(t *testing.T) {
	be := sharedtest.Backends(t, 2)[0]
	f := newFixture(t, be)
	ctx := context.Background()
	emitted := 0
	count := func([]float32) error { emitted++; return nil }
	for name, r := range map[string]Request{
		"empty text":   {Text: " \n\t", Voice: f.voice},
		"no voice":     {Text: "Hello."},
		"NaN temp":     {Text: "Hello.", Voice: f.voice, Temperature: math.NaN()},
		"ragged noise": {Text: "Hello.", Voice: f.voice, Noise: make([]float32, 33)},
		"unknown name": {Text: "Hello.", VoiceName: "nobody"},
	} {
		if err := f.s.Speak(ctx, r, count); !errors.Is(err, ErrInput) {
			t.Errorf("%s: %v, want ErrInput", name, err)
		}
	}
	if emitted != 0 {
		t.Errorf("%d frames emitted by bad requests", emitted)
	}
	emitted = 0
	err := f.s.Speak(ctx, Request{Text: "Hello world.", Voice: f.voice, Noise: make([]float32, 2*32)}, count)
	if !errors.Is(err, ErrNoiseExhausted) || emitted != 2 {
		t.Errorf("two rows of noise: %v after %d frames, want ErrNoiseExhausted after 2", err, emitted)
	}
	stop := errors.New("enough")
	emitted = 0
	err = f.s.Speak(ctx, Request{Text: "Hello world.", Voice: f.voice, Temperature: 0}, func([]float32) error {
		emitted++
		if emitted == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || emitted != 3 {
		t.Errorf("emit's error: %v after %d frames", err, emitted)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.s.Speak(cctx, Request{Text: "Hello world.", Voice: f.voice}, count); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	// a synthesis queued behind a full batch gives up when its context ends; one more than the
	// queue holds is refused
	s, err := New(f.m, f.tok, Config{Text: f.ck.Text, MaxActive: 1, MaxQueue: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hold, first := make(chan struct{}), make(chan struct{})
	blocked := make(chan error, 1)
	go func() {
		n := 0
		blocked <- s.Speak(ctx, Request{Text: "Hello world.", Voice: f.voice}, func([]float32) error {
			if n++; n == 1 {
				close(first)
			}
			<-hold
			return stop
		})
	}()
	<-first
	wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer wcancel()
	queued := make(chan error, 1)
	go func() { queued <- s.Speak(wctx, Request{Text: "Hello world.", Voice: f.voice}, count) }()
	for s.loop.Queued() == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := s.Speak(ctx, Request{Text: "Hello world.", Voice: f.voice}, count); !errors.Is(err, ErrQueueFull) {
		t.Errorf("past the queue: %v, want ErrQueueFull", err)
	}
	if err := <-queued; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting past the deadline: %v", err)
	}
	close(hold)
	if err := <-blocked; !errors.Is(err, stop) {
		t.Errorf("the synthesis ahead: %v", err)
	}
	s.Close()
	if err := s.Speak(ctx, Request{Text: "Hello world.", Voice: f.voice}, count); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// TestConcurrentMatchesAlone: syntheses of different texts, voices and temperatures running at
// once (two submitted together, a third joining while they run, each leaving when its text
// ends) each give the waveform they give alone, frame for frame, within waveTol.
func TestConcurrentMatchesAlone(t *testing.T) {
	be := sharedtest.Backend(t, "cpu", 2)
	f := newFixture(t, be)
	concurrentMatchesAlone(t, f, f.s)
}

// TestDecoderOverlap: with the Mimi decoder on a backend and goroutine of its own
// (Config.Decoder), frame i decoded while frame i+1's FlowLM step runs, concurrent syntheses
// give the waveforms of TestConcurrentMatchesAlone; emit's error, a cancelled context and
// recorded noise running out end a synthesis after the frames it made, as without.
func TestDecoderOverlap(t *testing.T) {
	f := newFixture(t, sharedtest.Backend(t, "cpu", 1))
	s, err := New(f.m, f.tok, Config{Text: f.ck.Text, Decoder: decoderModel(t, f)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	concurrentMatchesAlone(t, f, s)
	ctx := context.Background()
	emitted := 0
	count := func([]float32) error { emitted++; return nil }
	err = s.Speak(ctx, Request{Text: "Hello world.", Voice: f.voice, Noise: make([]float32, 2*32)}, count)
	if !errors.Is(err, ErrNoiseExhausted) || emitted != 2 {
		t.Errorf("two rows of noise: %v after %d frames, want ErrNoiseExhausted after 2", err, emitted)
	}
	stop := errors.New("enough")
	emitted = 0
	err = s.Speak(ctx, Request{Text: "Hello world.", Voice: f.voice, Temperature: 0}, func([]float32) error {
		if emitted++; emitted == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || emitted != 3 {
		t.Errorf("emit's error: %v after %d frames", err, emitted)
	}
	cctx, cancel := context.WithCancel(ctx)
	emitted = 0
	err = s.Speak(cctx, Request{Text: "Hello world.", Voice: f.voice}, func([]float32) error {
		if emitted++; emitted == 2 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled after 2 frames: %v", err)
	}
	// the decoder's model must compute elsewhere, on the same checkpoint's shapes
	if _, err := New(f.m, f.tok, Config{Text: f.ck.Text, Decoder: f.m}); err == nil {
		t.Error("a decoder on the FlowLM's own backend accepted")
	}
	s.Close()
	if err := s.Speak(ctx, Request{Text: "Hello world.", Voice: f.voice}, count); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// decoderModel loads f's checkpoint again on a native CPU backend of one thread of its own.
func decoderModel(t *testing.T, f *fixture) *pockettts.Model {
	t.Helper()
	m, err := pockettts.New(sharedtest.Backend(t, "cpu", 1), f.ck.Weights)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// concurrentMatchesAlone runs TestConcurrentMatchesAlone's syntheses on s.
func concurrentMatchesAlone(t *testing.T, f *fixture, s *Synthesizer) {
	t.Helper()
	short := &pockettts.Voice{Positions: 20}
	for _, l := range f.voice.Layers {
		w := len(l.K) / f.voice.Positions
		short.Layers = append(short.Layers, pockettts.VoiceLayer{K: l.K[:20*w], V: l.V[:20*w]})
	}
	reqs := []Request{
		{Text: "Hello world.", Voice: f.voice, Temperature: 0.7, Seed: 1},
		{Text: "One, two, three, four, five.", Voice: short, Temperature: 0.7, Seed: 2},
		{Text: "Streaming speech.", Voice: f.voice, Temperature: 0},
	}
	alone, err := New(f.m, f.tok, Config{Text: f.ck.Text, MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	want := make([][]float32, len(reqs))
	for i, r := range reqs {
		if err := alone.Speak(context.Background(), r, func(a []float32) error { want[i] = append(want[i], a...); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	got := make([][]float32, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	speak := func(i int, onFrame func(n int)) {
		defer wg.Done()
		n := 0
		errs[i] = s.Speak(context.Background(), reqs[i], func(a []float32) error {
			got[i] = append(got[i], a...)
			n++
			if onFrame != nil {
				onFrame(n)
			}
			return nil
		})
	}
	wg.Add(2)
	go speak(0, func(n int) {
		if n == 5 { // the third joins the two in flight
			wg.Add(1)
			go speak(2, nil)
		}
	})
	go speak(1, nil)
	wg.Wait()
	F := s.FrameSamples()
	for i := range reqs {
		if errs[i] != nil {
			t.Fatalf("synthesis %d: %v", i, errs[i])
		}
		if len(got[i]) != len(want[i]) {
			t.Fatalf("synthesis %d: %d frames batched, %d alone", i, len(got[i])/F, len(want[i])/F)
		}
		maxDiff := 0.0
		for k := range want[i] {
			maxDiff = max(maxDiff, math.Abs(float64(got[i][k]-want[i][k])))
		}
		if !(maxDiff <= waveTol) {
			t.Errorf("synthesis %d: waveform differs from the one alone by %.3g, over %.0e", i, maxDiff, waveTol)
		}
		t.Logf("synthesis %d: %d frames, within %.2g of the one alone", i, len(got[i])/F, maxDiff)
	}
	if st := s.Stats(); st.Steps == 0 {
		t.Error("no steps counted")
	}
}
