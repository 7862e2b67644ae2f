package asr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// liveBeamClips are the clips of the live beam tests (shorter under the race detector).
func liveBeamClips(t *testing.T, names ...string) [][]float32 {
	var pcms [][]float32
	for _, c := range names {
		pcm := testWAV(t, c)
		if raceEnabled {
			pcm = pcm[:min(len(pcm), 5*SampleRate)]
		}
		pcms = append(pcms, pcm)
	}
	return pcms
}

// endpointed is a chunking with short chunks and silences, so that utterances end inside the
// clips and the beam starts over from its final hypothesis.
var endpointed = SessionConfig{Chunk: 800 * time.Millisecond, LeftContext: 2 * time.Second, RightContext: 240 * time.Millisecond, Silence: 240 * time.Millisecond}

// TestParakeetLiveBeamWidth1: a stream decoded by the beam search of width 1 (with the greedy
// search beside it, starting over from the final hypothesis at every endpoint) reports exactly
// the events of the greedy stream, with endpoints and at whole context (the tokens compared
// whole: ids, frames, durations, probabilities), but for the stable text of its partials.
func TestParakeetLiveBeamWidth1(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: one stream at a time, compared with the greedy one; TestParakeetLiveBeamTogether runs streams side by side")
	}
	e := openParakeetSmall(t, Config{MaxActive: 2})
	names := []string{"jfk", "ami-ES2011a-headset0-40s-46s", "psx-cards-001"}
	ctx := context.Background()
	finals := 0
	for i, pcm := range liveBeamClips(t, names...) {
		var evs [2][]Event
		var toks [2][]parakeet.Token
		for k, beam := range []bool{false, true} {
			liveBeamAlways = beam
			l, err := e.NewLive(endpointed)
			if err == nil {
				evs[k], err = streamEvents(ctx, l, pcm, SampleRate/10)
			}
			if err == nil {
				toks[k] = streamTokens(t, e, SessionConfig{LeftContext: maxContext, RightContext: maxContext}, pcm, SampleRate/5)
			}
			liveBeamAlways = false
			if err != nil {
				t.Fatal(err)
			}
			if beam && l.(*pstream).b == nil {
				t.Fatal("the stream has no beam search")
			}
		}
		for k := range evs[1] {
			evs[1][k].Stable = "" // a beam stream's alone (TestParakeetLiveBeamStable)
		}
		if !reflect.DeepEqual(evs[1], evs[0]) {
			t.Errorf("%s: beam of 1 %+v\ngreedy %+v", names[i], evs[1], evs[0])
		}
		if len(toks[0]) < 5 || !reflect.DeepEqual(toks[1], toks[0]) {
			t.Errorf("%s, whole context: beam of 1 %+v\ngreedy %+v", names[i], toks[1], toks[0])
		}
		for _, ev := range evs[0] {
			if ev.Type == "final" {
				finals++
			}
		}
	}
	if finals < len(names)+2 {
		t.Errorf("%d finals: the streams had too few endpoints to test", finals)
	}
}

// streamBeam streams pcm through a stream of width w configured by cfg (no endpoints) and
// decodes it to its end; it returns the stream, its tokens those of the better hypothesis.
func streamBeam(t *testing.T, e *Parakeet, cfg SessionConfig, w int, pcm []float32, step int) *pstream {
	t.Helper()
	cfg.Silence = -1
	cfg.Params = DefaultParams()
	cfg.Params.BeamSize = w
	l, err := e.NewLive(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := l.(*pstream)
	ctx := context.Background()
	for i := 0; i < len(pcm); i += step {
		if _, err := s.Write(ctx, pcm[i:min(i+step, len(pcm))]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.flush(ctx); err != nil {
		t.Fatal(err)
	}
	e.vocab.Transcript(s.toks) // their times
	return s
}

// TestParakeetLiveBeamWholeContext: a stream of width 4 whose every chunk is encoded with the
// whole recording around it (left and right context covering it) decodes the offline beam
// transcription's tokens of width 4 exactly (ids and times; probabilities within 1e-6,
// log-probabilities within 1e-5, as TestParakeetStreamWholeContext for greedy streams),
// although its searches stop at every chunk's end; its greedy search gives the greedy stream's
// tokens, and the result scores at least as high as that. With the default context the tokens
// differ from the offline ones; their edit distance is logged.
func TestParakeetLiveBeamWholeContext(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: one stream at a time, compared with the offline tokens; TestParakeetLiveBeamTogether runs streams side by side")
	}
	e := openParakeetSmall(t, Config{MaxActive: 2})
	names := []string{"jfk", "ami-ES2011a-headset0-40s-46s"}
	if !raceEnabled {
		names = append(names, "psx-librivox-0870", "psx-cards-001")
	}
	whole := SessionConfig{LeftContext: maxContext, RightContext: maxContext}
	p := DefaultParams()
	p.BeamSize = 4
	for i, pcm := range liveBeamClips(t, names...) {
		res, err := e.Transcribe(context.Background(), pcm, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := res.Segments[0].Tokens
		greedy := streamTokens(t, e, whole, pcm, SampleRate/10)
		for _, step := range []int{SampleRate / 10, len(pcm)} {
			s := streamBeam(t, e, whole, 4, pcm, step)
			got := s.toks
			if len(got) != len(want) {
				t.Fatalf("%s (writes of %d): %d tokens, offline %d", names[i], step, len(got), len(want))
			}
			for k, w := range want {
				g := got[k]
				if g.ID != w.ID || float64(g.T0)/100 != w.T0 || float64(g.T1)/100 != w.T1 ||
					math.Abs(float64(g.P-w.P)) > 1e-6 || math.Abs(float64(g.PLog-w.PLog)) > 1e-5 {
					t.Fatalf("%s (writes of %d): token %d is %+v, offline %+v", names[i], step, k, g, w)
				}
			}
			b, g := s.b.beam.Hyp(0).Score, s.b.greedy.Hyp(0).Score
			gs := s.b.greedy.Tokens(0, nil)
			if len(gs) != len(greedy) {
				t.Fatalf("%s: the greedy search has %d tokens, the greedy stream %d", names[i], len(gs), len(greedy))
			}
			for k, st := range gs {
				if st.Token != greedy[k].ID || st.Frame != greedy[k].Frame || st.Dur != greedy[k].Dur || st.P != greedy[k].P {
					t.Fatalf("%s: the greedy search's token %d is %+v, the greedy stream's %+v", names[i], k, st, greedy[k])
				}
			}
			if best, _ := s.b.best(); best.Hyp(0).Score < g {
				t.Errorf("%s: the result scores %.4f, below greedy's %.4f", names[i], best.Hyp(0).Score, g)
			}
			t.Logf("%s (writes of %d): beam %.4f, greedy %.4f", names[i], step, b, g)
		}
		s := streamBeam(t, e, SessionConfig{}, 4, pcm, SampleRate/10)
		a, w := make([]int32, len(s.toks)), make([]int32, len(want))
		for k := range s.toks {
			a[k] = s.toks[k].ID
		}
		for k := range want {
			w[k] = want[k].ID
		}
		t.Logf("%s: default context, beam 4: %d tokens, edit distance %d to the %d offline", names[i], len(a), editDistance(a, w), len(w))
	}
}

// TestParakeetLiveBeamTogether: beam streams of several widths, a greedy stream and a beam
// transcription decoded together (chunks encoded in one call, prediction steps in one batch)
// report exactly what each reports alone.
func TestParakeetLiveBeamTogether(t *testing.T) {
	var maxSeqs atomic.Int64
	e := openParakeetSmall(t, Config{MaxActive: 4, MaxQueue: 4, EncodeBatch: 1, OnStep: func(_ time.Duration, seqs, _ int) {
		if int64(seqs) > maxSeqs.Load() {
			maxSeqs.Store(int64(seqs))
		}
	}})
	names := []string{"jfk", "ami-ES2011a-headset0-40s-46s", "psx-cards-001"}
	pcms := liveBeamClips(t, names...)
	widths := []int{4, 8, 1}
	ctx := context.Background()
	run := func(i int) ([]Event, error) {
		cfg := endpointed
		cfg.Params = DefaultParams()
		cfg.Params.BeamSize = widths[i]
		l, err := e.NewLive(cfg)
		if err != nil {
			return nil, err
		}
		return streamEvents(ctx, l, pcms[i], SampleRate/10)
	}
	p := DefaultParams()
	p.BeamSize = 4
	alone := make([][]Event, len(pcms))
	for i := range pcms {
		var err error
		if alone[i], err = run(i); err != nil {
			t.Fatal(err)
		}
	}
	want, err := e.Transcribe(ctx, pcms[1], p, nil)
	if err != nil {
		t.Fatal(err)
	}
	maxSeqs.Store(0)
	together := make([][]Event, len(pcms))
	errs := make([]error, len(pcms)+1)
	var res *Result
	var wg sync.WaitGroup
	for i := range pcms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			together[i], errs[i] = run(i)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, errs[len(pcms)] = e.Transcribe(ctx, pcms[1], p, nil)
	}()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i := range pcms {
		if !reflect.DeepEqual(together[i], alone[i]) {
			t.Errorf("%s, beam %d: together %+v\nalone %+v", names[i], widths[i], together[i], alone[i])
		}
	}
	// The native backend multiplies four rows or more by another kernel than fewer: the
	// transcription's probabilities within 1e-6.
	if res.Text != want.Text {
		t.Errorf("the transcription beside the streams gave %q, alone %q", res.Text, want.Text)
	}
	if maxSeqs.Load() < 2 {
		t.Errorf("at most %d decoded in one step: the streams were never decoded together", maxSeqs.Load())
	}
}

// TestParakeetLiveBeamCancelled: a write whose context ends while its chunk is being decoded
// fails with the context's error and leaves the stream's searches as they were: the stream
// then reports the events of one never interrupted.
func TestParakeetLiveBeamCancelled(t *testing.T) {
	var steps atomic.Int64
	var cancel atomic.Pointer[context.CancelFunc]
	e := openParakeetSmall(t, Config{MaxActive: 1, OnStep: func(time.Duration, int, int) {
		if steps.Add(1) == 4 {
			if c := cancel.Load(); c != nil {
				(*c)()
			}
		}
	}})
	pcm := testWAV(t, "jfk")[:4*SampleRate]
	cfg := endpointed
	cfg.Params = DefaultParams()
	cfg.Params.BeamSize = 4
	ctx := context.Background()
	l, err := e.NewLive(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, err := streamEvents(ctx, l, pcm, SampleRate/10)
	if err != nil {
		t.Fatal(err)
	}
	if l, err = e.NewLive(cfg); err != nil {
		t.Fatal(err)
	}
	var got []Event
	evs, err := l.Write(ctx, pcm[:SampleRate])
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, evs...)
	s := l.(*pstream)
	frames, hyp := s.b.beam.Frames(), s.b.beam.Hyp(0)
	cctx, c := context.WithCancel(ctx)
	steps.Store(0)
	cancel.Store(&c)
	_, err = l.Write(cctx, pcm[SampleRate:2*SampleRate])
	cancel.Store(nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a write cancelled while decoding: %v", err)
	}
	if steps.Load() < 4 {
		t.Fatalf("the cancelled write ran %d steps: the test did not cut its chunk short", steps.Load())
	}
	if s.b.beam.Frames() != frames || s.b.beam.Hyp(0) != hyp {
		t.Fatalf("after a cancelled write the beam stands at %+v of %d frames, before it %+v of %d", s.b.beam.Hyp(0), s.b.beam.Frames(), hyp, frames)
	}
	evs, err = streamEvents(ctx, l, pcm[2*SampleRate:], SampleRate/10)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, evs...)
	if fmt.Sprint(finalsOf(got)) != fmt.Sprint(finalsOf(want)) {
		t.Errorf("after a cancelled write, finals %+v\nwant %+v", finalsOf(got), finalsOf(want))
	}
}

// finalsOf returns the final events of evs.
func finalsOf(evs []Event) []Event {
	var out []Event
	for _, ev := range evs {
		if ev.Type == "final" {
			out = append(out, ev)
		}
	}
	return out
}

// TestParakeetLiveBeamStepAllocs: once the chunks of two beam streams are encoded, a step of
// their decoding (one batched prediction call, the rounds' joint rows) allocates nothing but
// the searches' token histories' amortised growth.
func TestParakeetLiveBeamStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	noLoop = true
	e := openParakeetSmall(t, Config{MaxActive: 2})
	noLoop = false
	pcm := testWAV(t, "jfk")
	var jobs []*pjob
	for range 2 {
		cfg := SessionConfig{Chunk: maxChunk}
		cfg.Params = DefaultParams()
		cfg.Params.BeamSize = 4
		l, err := e.NewLive(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s := l.(*pstream)
		s.audio = append(s.audio, pcm...)
		j, err := s.chunkJob(context.Background(), len(pcm), true)
		if err != nil || j == nil {
			t.Fatal(j, err)
		}
		if err := e.q.enqueue(j); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, j)
	}
	for range 20 { // admit and encode both, the first rounds
		e.q.loop.Step()
	}
	for _, j := range jobs {
		if j.ph != ppDecode || j.err != nil || j.beam == nil {
			t.Fatalf("chunk in phase %d, error %v", j.ph, j.err)
		}
	}
	if a := testing.AllocsPerRun(20, func() { e.q.loop.Step() }); a > 0.5 {
		t.Errorf("%v allocations per step, want none but the history's amortised growth", a)
	}
	for _, j := range jobs {
		if j.ph != ppDecode || j.beam.Hyp(0).Tokens < 5 {
			t.Fatalf("the steps measured were not all decoding: phase %d, %d tokens", j.ph, j.beam.Hyp(0).Tokens)
		}
	}
}

// TestParakeetLiveBeamStable: the stable text of a beam stream's partial (Event.Stable) begins
// the partial's text, every later partial's of the utterance and its final's. A search of width
// 1 (its hypothesis the greedy one's) settles every token: its stable text is the partial's but
// the last word. On the random model the beam's and the greedy search's hypotheses part at once,
// so wider beams settle little; a greedy stream's partials have no stable text.
func TestParakeetLiveBeamStable(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: one stream at a time, checked for its stable text; TestParakeetLiveBeamTogether runs streams side by side")
	}
	e := openParakeetSmall(t, Config{MaxActive: 2})
	names := []string{"jfk", "ami-ES2011a-headset0-40s-46s", "psx-librivox-0870"}
	ctx := context.Background()
	settled := 0
	for i, pcm := range liveBeamClips(t, names...) {
		for _, w := range []int{0, 1, 4, 8} {
			cfg := SessionConfig{Chunk: 400 * time.Millisecond, RightContext: 240 * time.Millisecond}
			cfg.Params = DefaultParams()
			cfg.Params.BeamSize = max(w, 1)
			liveBeamAlways = w == 1
			l, err := e.NewLive(cfg)
			liveBeamAlways = false
			if err != nil {
				t.Fatal(err)
			}
			evs, err := streamEvents(ctx, l, pcm, SampleRate/10)
			if err != nil {
				t.Fatal(err)
			}
			var stables []string
			set := 0
			for _, ev := range evs {
				for _, st := range stables {
					if !strings.HasPrefix(ev.Text, st) {
						t.Fatalf("%s, beam %d: %s %q does not begin with the stable %q of an earlier partial", names[i], w, ev.Type, ev.Text, st)
					}
				}
				switch ev.Type {
				case "partial":
					if ev.Stable == "" {
						break
					}
					set++
					stables = append(stables, ev.Stable)
					if w == 1 {
						if k := strings.LastIndexByte(ev.Text, ' '); k < 0 || ev.Stable != strings.TrimSpace(ev.Text[:k]) {
							t.Errorf("%s, beam 1: partial %q, stable %q: want all but its last word", names[i], ev.Text, ev.Stable)
						}
					}
				case "final":
					stables = stables[:0]
				}
			}
			t.Logf("%s, beam %d: %d partials with stable text", names[i], w, set)
			if w == 0 && set > 0 {
				t.Errorf("%s, greedy: %d partials with stable text", names[i], set)
			}
			if w == 1 {
				settled += set
			}
		}
	}
	if settled == 0 {
		t.Error("no partial of the searches of width 1 had stable text")
	}
}
