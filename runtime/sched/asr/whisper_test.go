package asr_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// TestConcurrentTranscriptionsMatchSequential runs several transcriptions (greedy and beam
// search, different recordings) through one scheduler at once, so that their hypotheses share
// batched decoder steps, and checks each result against the same request run alone.
func TestConcurrentTranscriptionsMatchSequential(t *testing.T) {
	// The pure-Go backend's kernels give every row the same arithmetic whatever the batch holds,
	// so batched and alone must agree exactly; the native backend picks kernels by batch size
	// (sums in another order), which may swap near-tied beams of a random-weight model.
	be := sharedtest.Backend(t, "go", 2)
	m := openModel(t, be, "tiny.en")
	type req struct {
		utt  string
		beam int
	}
	reqs := []req{{"psx-cards-001", 1}, {"jfk", 1}, {"ls-tc-1089-134686-0001", 3}, {"psx-cards-001", 2}}
	maxTok := 16
	if asr.RaceEnabled {
		reqs, maxTok = reqs[:2], 4
	}
	params := func(r req) asr.Params {
		p := asr.DefaultParams()
		p.Language, p.NoTimestamps, p.TemperatureInc, p.BeamSize, p.MaxTokens = "en", true, 0, r.beam, maxTok
		return p
	}
	audio := map[string][]float32{}
	for _, r := range reqs {
		audio[r.utt] = asr.LoadWAV(t, r.utt)
	}
	type out struct {
		ids []int32
		avg float64
	}
	ids := func(res *asr.Result) out {
		var o out
		for _, s := range res.Segments {
			o.avg = s.AvgLogprob
			for _, tk := range s.Tokens {
				o.ids = append(o.ids, tk.ID)
			}
		}
		return o
	}
	seq, err := asr.NewWhisper(m, asr.Config{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]out, len(reqs))
	for i, r := range reqs {
		res, err := seq.Transcribe(context.Background(), audio[r.utt], params(r), nil)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = ids(res)
		if len(want[i].ids) == 0 {
			t.Fatalf("%s: no tokens", r.utt)
		}
	}
	seq.Close()

	// Windows encoded one per step and several in one encoder call give the same results.
	for _, eb := range []int{1, min(3, len(reqs))} {
		eng, err := asr.NewWhisper(m, asr.Config{MaxActive: len(reqs), EncodeBatch: eb})
		if err != nil {
			t.Fatal(err)
		}
		got := make([]out, len(reqs))
		errs := make([]error, len(reqs))
		var wg sync.WaitGroup
		for i, r := range reqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := eng.Transcribe(context.Background(), audio[r.utt], params(r), nil)
				if err == nil {
					got[i] = ids(res)
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		for i := range reqs {
			if errs[i] != nil {
				t.Fatalf("request %d: %v", i, errs[i])
			}
			if !slices.Equal(got[i].ids, want[i].ids) || got[i].avg != want[i].avg {
				t.Errorf("encoder batch %d, request %d (%s, beam %d): batched %v (%.5f), alone %v (%.5f)", eb, i, reqs[i].utt, reqs[i].beam, got[i].ids, got[i].avg, want[i].ids, want[i].avg)
			}
		}
		eng.Close()
	}
}

// TestCancelAndClose checks that a cancelled transcription returns promptly with the
// context's error and frees its cache, that the queue bound answers ErrQueueFull, and that Close
// fails work in flight with ErrClosed and leaves no goroutine behind.
func TestCancelAndClose(t *testing.T) {
	backends := backendsUnderTest(t)
	m := openModel(t, backends[len(backends)-1], "tiny.en")
	before := runtime.NumGoroutine()
	eng, err := asr.NewWhisper(m, asr.Config{MaxActive: 1, MaxQueue: 1})
	if err != nil {
		t.Fatal(err)
	}
	samples := asr.LoadWAV(t, "psx-cards-001")
	p := asr.DefaultParams()
	p.Language, p.NoTimestamps, p.TemperatureInc = "en", true, 0
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := eng.Transcribe(ctx, samples, p, func(asr.Segment) {})
		first <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-first:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled transcription: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a cancelled transcription did not return")
	}
	// The loop releases a cancelled transcription's blocks within a step (or when it reaches a
	// transcription still queued).
	free, all := eng.FreeBlocks()
	for deadline := time.Now().Add(10 * time.Second); free != all && time.Now().Before(deadline); free, all = eng.FreeBlocks() {
		time.Sleep(5 * time.Millisecond)
	}
	if free != all {
		t.Errorf("%d of %d cache blocks free after cancellation", free, all)
	}
	bad := p
	bad.BeamSize = 99
	if _, err := eng.Transcribe(context.Background(), samples, bad, nil); err == nil {
		t.Error("beam size 99 accepted")
	}
	if _, err := eng.Transcribe(context.Background(), nil, p, nil); err == nil {
		t.Error("empty audio accepted")
	}
	done := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := eng.Transcribe(context.Background(), samples, p, nil)
			done <- err
		}()
	}
	time.Sleep(100 * time.Millisecond)
	eng.Close()
	full, closed := 0, 0
	for range 3 {
		switch err := <-done; {
		case errors.Is(err, asr.ErrQueueFull):
			full++
		case errors.Is(err, asr.ErrClosed):
			closed++
		case err != nil:
			t.Errorf("unexpected error %v", err)
		}
	}
	t.Logf("after Close: %d queue-full, %d closed", full, closed)
	deadline := time.Now().Add(30 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Close, %d before", n, before)
	}
}

// TestTimestampsAndFallback decodes with timestamps and temperature fallback on (whisper-cli's
// defaults). A random-weight model repeats itself, so its windows fail the entropy and
// compression checks and are decoded again at higher temperatures with best-of-5 sampling. The
// result must be reproducible for a seed, its segments ordered and inside the audio's windows,
// and the subtitle renderings well formed.
func TestTimestampsAndFallback(t *testing.T) {
	if asr.RaceEnabled {
		t.Skip("whole-window decoding runs without the race detector (too slow under it)")
	}
	backends := backendsUnderTest(t)
	m := openModel(t, backends[len(backends)-1], "tiny.en")
	eng := newWhisper(t, m)
	defer eng.Close()
	p := asr.DefaultParams()
	p.Seed = 7
	samples := asr.LoadWAV(t, "jfk")
	var streamed []asr.Segment
	a, err := eng.Transcribe(context.Background(), samples, p, func(s asr.Segment) { streamed = append(streamed, s) })
	if err != nil {
		t.Fatal(err)
	}
	b, err := eng.Transcribe(context.Background(), samples, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Text != b.Text || len(a.Segments) != len(b.Segments) {
		t.Fatalf("same seed, different results:\n%q\n%q", a.Text, b.Text)
	}
	if len(streamed) != len(a.Segments) {
		t.Errorf("%d segments streamed, %d in the result", len(streamed), len(a.Segments))
	}
	maxTemp := float32(0)
	prevEnd := 0.0
	for i, s := range a.Segments {
		maxTemp = max(maxTemp, s.Temperature)
		if s.Start < prevEnd-1e-9 || s.End < s.Start || s.End > a.Duration {
			t.Errorf("segment %d [%.2f, %.2f] out of order or outside the audio (%.2f s)", i, s.Start, s.End, a.Duration)
		}
		prevEnd = s.Start
		for _, tk := range s.Tokens {
			if tk.T0 < s.Start-1e-9 || tk.T1 > s.End+1e-9 {
				t.Errorf("segment %d: token time [%.2f, %.2f] outside [%.2f, %.2f]", i, tk.T0, tk.T1, s.Start, s.End)
			}
		}
	}
	t.Logf("%d segments, highest temperature %.1f, text %.60q", len(a.Segments), maxTemp, a.Text)
	if maxTemp == 0 {
		t.Error("a random-weight model's repetitive output was never decoded again at a higher temperature")
	}
	if srt := a.SRT(); len(a.Segments) > 0 && !strings.Contains(srt, " --> ") {
		t.Errorf("SRT without time ranges:\n%s", srt)
	}
	if vtt := a.VTT(); !strings.HasPrefix(vtt, "WEBVTT\n\n") {
		t.Errorf("VTT header missing:\n%s", vtt)
	}
}

// TestLongAudioWindows: audio longer than 30 s is decoded window by window; without timestamps
// each window is one segment, starting where the previous window ended.
func TestLongAudioWindows(t *testing.T) {
	if asr.RaceEnabled {
		t.Skip("whole-window decoding runs without the race detector (too slow under it)")
	}
	backends := backendsUnderTest(t)
	m := openModel(t, backends[len(backends)-1], "tiny.en")
	eng := newWhisper(t, m)
	defer eng.Close()
	jfk := asr.LoadWAV(t, "jfk")
	var long []float32
	for range 6 {
		long = append(long, jfk...)
	}
	p := asr.DefaultParams()
	p.Language, p.NoTimestamps, p.TemperatureInc, p.MaxTokens = "en", true, 0, 4
	res, err := eng.Transcribe(context.Background(), long, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	var starts []float64
	for _, s := range res.Segments {
		starts = append(starts, s.Start)
	}
	if len(starts) != 3 || starts[0] != 0 || starts[1] != 30 || starts[2] != 60 || res.Segments[2].End != res.Duration {
		t.Errorf("%.1f s of audio: segments start at %v (last ends %.2f), want 0, 30, 60 (ending at %.2f)", res.Duration, starts, res.Segments[len(res.Segments)-1].End, res.Duration)
	}
}
