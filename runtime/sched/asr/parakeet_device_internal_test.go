package asr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// TestParakeetDeviceLoop transcribes every reference clip at once (four decoding together, the
// others joining as they finish) on a backend that decides on the device, once on the device
// loop and once on the host loop, and requires the same text and tokens (ids and times, which
// come from the tokens' frames and durations), p and plog within 1e-5. A beam transcription
// among them decodes on the device beam loop, then on the host loop, the same both times.
func TestParakeetDeviceLoop(t *testing.T) {
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var clips [][]float32
	for _, name := range beamClips {
		clips = append(clips, beamClipSamples(t, name))
	}
	for _, be := range sharedtest.Backends(t, 2) {
		if _, ok := be.(backend.GreedyTransducer); !ok {
			t.Logf("%s decides on the host: no device loop to test", be.Name())
			continue
		}
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			run := func(hostOnly bool) []*Result {
				hostLoopOnly = hostOnly
				e, err := NewParakeet(m, Config{MaxActive: 4, EncodeBatch: 2, MaxQueue: len(clips) + 1})
				hostLoopOnly = false
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				if (e.dev == nil) != hostOnly {
					t.Fatalf("host loop only %v, device loop %v", hostOnly, e.dev != nil)
				}
				res := make([]*Result, len(clips)+1)
				errs := make([]error, len(clips)+1)
				var wg sync.WaitGroup
				for i := range len(clips) + 1 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						p, c := DefaultParams(), clips[i%len(clips)]
						if i == len(clips) {
							p.BeamSize = 2
						}
						res[i], errs[i] = e.Transcribe(context.Background(), c, p, nil)
					}()
				}
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Fatalf("%s: %v", beamClips[i%len(clips)], err)
					}
				}
				return res
			}
			dev, host := run(false), run(true)
			if dev[len(clips)].Text != host[len(clips)].Text {
				t.Errorf("beam: %q, the host loop %q", dev[len(clips)].Text, host[len(clips)].Text)
			}
			for i, name := range beamClips {
				d, h := dev[i], host[i]
				if d.Text != h.Text || len(d.Segments) != len(h.Segments) {
					t.Errorf("%s: %q in %d segments, the host loop %q in %d", name, d.Text, len(d.Segments), h.Text, len(h.Segments))
					continue
				}
				var mp, ml float64
				n := 0
				for s := range d.Segments {
					dt, ht := d.Segments[s].Tokens, h.Segments[s].Tokens
					if len(dt) != len(ht) {
						t.Errorf("%s: segment %d: %d tokens, the host loop %d", name, s, len(dt), len(ht))
						break
					}
					for k := range dt {
						if dt[k].ID != ht[k].ID || dt[k].T0 != ht[k].T0 || dt[k].T1 != ht[k].T1 {
							t.Errorf("%s: token %d: %+v, the host loop %+v", name, k, dt[k], ht[k])
							break
						}
						mp, ml = max(mp, math.Abs(float64(dt[k].P-ht[k].P))), max(ml, math.Abs(float64(dt[k].PLog-ht[k].PLog)))
					}
					n += len(dt)
				}
				if mp > 1e-5 || ml > 1e-5 {
					t.Errorf("%s: max |Δ| p %.3g, plog %.3g (≤ 1e-5)", name, mp, ml)
				}
				t.Logf("%s: %d tokens, max |Δ| p %.3g, plog %.3g", name, n, mp, ml)
			}
		})
	}
}

// liveOutcome is what TestParakeetDeviceLive compares between the two loops.
type liveOutcome struct {
	events   [][]Event          // streams decoded together, beside an offline transcription
	offline  []Token            // that transcription's tokens
	toks     [][]parakeet.Token // streams decoded alone, every token (no endpoints)
	whole    []parakeet.Token   // a stream with whole context, every token
	retried  []Event            // a stream one of whose chunks failed and was decoded again
	straight []Event            // the same stream with no failure
	chunks   int64              // chunks decoded on the device loop
}

// TestParakeetDeviceLive streams reference clips on a backend that decides on the device, once
// with the greedy streams' chunks on the device loop and once on the host loop (hostLoopOnly),
// and requires the same: the events of three streams decoded together beside an offline
// transcription (partials, finals at the endpoints, their texts and times, which come from the
// tokens' frames and durations; the finals' log-probabilities within 1e-5) and that
// transcription's tokens; every token of streams decoded alone (ids, frames, durations exactly,
// p and plog within 1e-5); a stream with whole context decodes the offline tokens; and a stream
// one of whose chunks fails mid-way (its context cancelled) decodes it again from the chunk
// before, ending in the finals of the same stream with no failure.
func TestParakeetDeviceLive(t *testing.T) {
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	clips := []string{"jfk", "ami-ES2011a-headset0-40s-46s", "psx-cards-001"}
	var pcms [][]float32
	for _, c := range clips {
		pcms = append(pcms, testWAV(t, c))
	}
	cfg := SessionConfig{Chunk: 800 * time.Millisecond, LeftContext: 2 * time.Second, RightContext: 240 * time.Millisecond, Silence: 240 * time.Millisecond}
	for _, be := range sharedtest.Backends(t, 2) {
		if _, ok := be.(backend.GreedyTransducer); !ok {
			t.Logf("%s decides on the host: no device loop to test", be.Name())
			continue
		}
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			run := func(hostOnly bool) liveOutcome {
				var cancelNext atomic.Pointer[context.CancelFunc]
				hostLoopOnly = hostOnly
				e, err := NewParakeet(m, Config{MaxActive: 4, MaxQueue: 8, EncodeBatch: 1, OnStep: func(time.Duration, int, int) {
					if c := cancelNext.Swap(nil); c != nil {
						(*c)()
					}
				}})
				hostLoopOnly = false
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				if (e.dev == nil) != hostOnly {
					t.Fatalf("host loop only %v, device loop %v", hostOnly, e.dev != nil)
				}
				ctx := context.Background()
				var o liveOutcome
				o.events = make([][]Event, len(pcms))
				errs := make([]error, len(pcms)+1)
				var wg sync.WaitGroup
				for i, pcm := range pcms {
					wg.Add(1)
					go func() {
						defer wg.Done()
						l, err := e.NewLive(cfg)
						if err != nil {
							errs[i] = err
							return
						}
						o.events[i], errs[i] = streamEvents(ctx, l, pcm, SampleRate/10)
					}()
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := e.Transcribe(ctx, pcms[0], DefaultParams(), nil)
					if errs[len(pcms)] = err; err == nil {
						for _, s := range res.Segments {
							o.offline = append(o.offline, s.Tokens...)
						}
					}
				}()
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Fatalf("stream or transcription %d: %v", i, err)
					}
				}
				o.toks = append(o.toks, streamTokens(t, e, SessionConfig{}, pcms[0], SampleRate/10))
				o.whole = streamTokens(t, e, SessionConfig{LeftContext: maxContext, RightContext: maxContext}, pcms[0], SampleRate/10)

				pcm := pcms[1]
				l, err := e.NewLive(cfg)
				if err != nil {
					t.Fatal(err)
				}
				if o.straight, err = streamEvents(ctx, l, pcm, SampleRate/10); err != nil {
					t.Fatal(err)
				}
				if l, err = e.NewLive(cfg); err != nil {
					t.Fatal(err)
				}
				half := len(pcm) / 2
				evs, err := l.Write(ctx, pcm[:half])
				if err != nil {
					t.Fatal(err)
				}
				o.retried = evs
				failing, cancel := context.WithCancel(ctx)
				cancelNext.Store(&cancel)
				if _, err := l.Write(failing, pcm[half:half+SampleRate]); !errors.Is(err, context.Canceled) {
					t.Fatalf("a chunk whose context ends after its first step: %v", err)
				}
				// The failed write's samples were taken: the stream goes on after them.
				rest, err := streamEvents(ctx, l, pcm[half+SampleRate:], SampleRate/10)
				if err != nil {
					t.Fatal(err)
				}
				o.retried = append(o.retried, rest...)
				if e.dev != nil {
					e.Close()
					o.chunks = e.dev.chunks
				}
				return o
			}
			dev, host := run(false), run(true)
			if dev.chunks == 0 {
				t.Fatal("no chunk decoded on the device loop")
			}
			t.Logf("%d chunks on the device loop", dev.chunks)
			for i, clip := range clips {
				compareEvents(t, clip, dev.events[i], host.events[i])
			}
			compareTokens(t, "the transcription beside the streams", dev.offline, host.offline)
			for i := range dev.toks {
				compareParakeetTokens(t, clips[i], dev.toks[i], host.toks[i])
			}
			compareParakeetTokens(t, "whole context", dev.whole, host.whole)
			wholeTokens := make([]Token, len(dev.whole))
			for i, tk := range dev.whole {
				wholeTokens[i] = Token{ID: tk.ID, P: tk.P, PLog: tk.PLog, T0: float64(tk.T0) / 100, T1: float64(tk.T1) / 100}
			}
			compareTokens(t, "whole context against offline", wholeTokens, dev.offline)
			compareEvents(t, "a stream with a failed chunk", finalEvents(dev.retried), finalEvents(dev.straight))
			compareEvents(t, "a stream with a failed chunk, the host loop", finalEvents(host.retried), finalEvents(host.straight))
			compareEvents(t, "a stream with a failed chunk against the host loop", dev.retried, host.retried)
		})
	}
}

// finalEvents are the final events of evs.
func finalEvents(evs []Event) []Event {
	var out []Event
	for _, ev := range evs {
		if ev.Type == "final" {
			out = append(out, ev)
		}
	}
	return out
}

// compareEvents requires got to be want: texts and times exactly, the finals' token texts
// exactly and log-probabilities within 1e-5.
func compareEvents(t *testing.T, name string, got, want []Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d events %+v, want %d %+v", name, len(got), got, len(want), want)
		return
	}
	if len(finalEvents(want)) == 0 {
		t.Errorf("%s: no final to compare", name)
	}
	for i := range want {
		g, w := got[i], want[i]
		gt, wt := g.Tokens, w.Tokens
		g.Tokens, w.Tokens = nil, nil
		if !reflect.DeepEqual(g, w) || len(gt) != len(wt) {
			t.Errorf("%s: event %d: %+v (%d tokens), want %+v (%d)", name, i, g, len(gt), w, len(wt))
			continue
		}
		for k := range wt {
			if gt[k].Text != wt[k].Text || math.Abs(float64(gt[k].PLog-wt[k].PLog)) > 1e-5 {
				t.Errorf("%s: event %d token %d: %+v, want %+v", name, i, k, gt[k], wt[k])
				break
			}
		}
	}
}

// compareTokens requires got to be want: ids and times exactly, p and plog within 1e-5.
func compareTokens(t *testing.T, name string, got, want []Token) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Errorf("%s: %d tokens, want %d (not none)", name, len(got), len(want))
		return
	}
	for k, w := range want {
		g := got[k]
		if g.ID != w.ID || g.T0 != w.T0 || g.T1 != w.T1 || math.Abs(float64(g.P-w.P)) > 1e-5 || math.Abs(float64(g.PLog-w.PLog)) > 1e-5 {
			t.Errorf("%s: token %d: %+v, want %+v", name, k, g, w)
			return
		}
	}
}

// compareParakeetTokens requires got to be want: ids, frames and durations exactly, p and plog
// within 1e-5.
func compareParakeetTokens(t *testing.T, name string, got, want []parakeet.Token) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Errorf("%s: %d tokens, want %d (not none)", name, len(got), len(want))
		return
	}
	for k, w := range want {
		g := got[k]
		if g.ID != w.ID || g.Frame != w.Frame || g.Dur != w.Dur || g.DurIdx != w.DurIdx || g.T0 != w.T0 || g.T1 != w.T1 ||
			math.Abs(float64(g.P-w.P)) > 1e-5 || math.Abs(float64(g.PLog-w.PLog)) > 1e-5 {
			t.Errorf("%s: token %d: %+v, want %+v", name, k, g, w)
			return
		}
	}
}

// TestParakeetDeviceChunkStepAllocs: on the device loop, once the chunks of two streams are
// encoded, a step of their decoding (deviceSteps decisions of each, then one read) allocates
// nothing.
func TestParakeetDeviceChunkStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	noLoop = true
	e := openParakeetSmall(t, Config{MaxActive: 2})
	noLoop = false
	if e.dev == nil {
		t.Skipf("%s decides on the host: no device loop to test", e.m.Backend().Name())
	}
	pcm := testWAV(t, "jfk")
	pcm = append(pcm, pcm...) // 22 s: many steps of one chunk
	var jobs []*pjob
	for range 2 {
		l, err := e.NewLive(SessionConfig{Chunk: maxChunk})
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
	for range 2 { // admit and encode both, take the first steps
		e.q.loop.Step()
	}
	for _, j := range jobs {
		if j.ph != ppDecode || j.err != nil || !j.onDevice || j.end-j.frame0 < 200 {
			t.Fatalf("chunk in phase %d, error %v, on the device %v, frames %d..%d", j.ph, j.err, j.onDevice, j.frame0, j.end)
		}
	}
	if a := testing.AllocsPerRun(5, func() { e.q.loop.Step() }); a != 0 {
		t.Errorf("%v allocations per step, want 0", a)
	}
	for _, j := range jobs {
		if j.ph != ppDecode || len(j.toks) < 5 {
			t.Fatalf("the steps measured were not all decoding: phase %d, %d tokens", j.ph, len(j.toks))
		}
	}
}

// TestParakeetDeviceBeam transcribes reference clips with beams of 2, 4 and 8 at once, beside
// greedy transcriptions of them, on a backend that searches on the device, once with the beams
// on the device beam loop and once on the host loop (hostLoopOnly), and requires the same
// results: texts, token ids, frames, durations and times exactly, p and plog within 1e-5. Every
// beam went to the device loop; with the loop made too short for the longest clip, that clip's
// beams decode on the host loop and the results are the same again.
func TestParakeetDeviceBeam(t *testing.T) {
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := beamClips[:4]
	var clips [][]float32
	longest := 0
	for i, name := range names {
		clips = append(clips, beamClipSamples(t, name))
		if len(clips[i]) > len(clips[longest]) {
			longest = i
		}
	}
	type job struct {
		clip, width int
	}
	var jobs []job
	beams := 0
	for i := range clips {
		for k, w := range []int{1, 2, 4, 8} {
			if (i+k)%2 == 0 || w == 1 {
				jobs = append(jobs, job{i, w})
				if w > 1 {
					beams++
				}
			}
		}
	}
	for _, be := range sharedtest.Backends(t, 2) {
		if _, ok := be.(backend.BeamTransducer); !ok {
			t.Logf("%s searches on the host: no device beam loop to test", be.Name())
			continue
		}
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			run := func(hostOnly bool) ([]*Result, int64) {
				hostLoopOnly = hostOnly
				e, err := NewParakeet(m, Config{MaxActive: 4, EncodeBatch: 2, MaxQueue: len(jobs)})
				hostLoopOnly = false
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				if (e.dbeam == nil) != hostOnly {
					t.Fatalf("host loop only %v, device beam loop %v", hostOnly, e.dbeam != nil)
				}
				res := make([]*Result, len(jobs))
				errs := make([]error, len(jobs))
				var wg sync.WaitGroup
				for i, jb := range jobs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						p := DefaultParams()
						p.BeamSize = jb.width
						res[i], errs[i] = e.Transcribe(context.Background(), clips[jb.clip], p, nil)
					}()
				}
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Fatalf("%s, beam %d: %v", names[jobs[i].clip], jobs[i].width, err)
					}
				}
				if e.dbeam == nil {
					return res, 0
				}
				e.Close()
				return res, e.dbeam.jobsN
			}
			t0 := time.Now()
			host, _ := run(true)
			t1 := time.Now()
			dev, n := run(false)
			t.Logf("host loop %v, device beam loop %v", t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
			if n != int64(beams) {
				t.Errorf("%d beam transcriptions on the device loop, want %d", n, beams)
			}
			compare := func(what string, got []*Result) {
				for i, jb := range jobs {
					compareResults(t, fmt.Sprintf("%s: %s, beam %d", what, names[jb.clip], jb.width), got[i], host[i])
				}
			}
			compare("device beam loop", dev)

			// The loop made for clips shorter than the longest: its beams decode on the host.
			frames := parakeet.EncoderFrames(parakeet.MelFrames(len(clips[longest])))
			defer func(a, b int) { beamLoopFrames, beamLoopMaxFrames = a, b }(beamLoopFrames, beamLoopMaxFrames)
			beamLoopFrames, beamLoopMaxFrames = frames/2, frames/2
			short, n := run(false)
			want := 0
			for _, jb := range jobs {
				if jb.width > 1 && parakeet.EncoderFrames(parakeet.MelFrames(len(clips[jb.clip]))) <= frames/2 {
					want++
				}
			}
			if n != int64(want) || want == beams {
				t.Errorf("%d beam transcriptions on a short device loop, want %d of %d", n, want, beams)
			}
			compare("short device beam loop", short)
		})
	}
}

// compareResults requires got to be want: texts and segments, token ids, frames, durations and
// times exactly, p and plog within 1e-5.
func compareResults(t *testing.T, name string, got, want *Result) {
	t.Helper()
	if got.Text != want.Text || len(got.Segments) != len(want.Segments) || len(want.Segments) == 0 {
		t.Errorf("%s: %q in %d segments, want %q in %d (not none)", name, got.Text, len(got.Segments), want.Text, len(want.Segments))
		return
	}
	for s := range want.Segments {
		g, w := got.Segments[s], want.Segments[s]
		if g.Start != w.Start || g.End != w.End || len(g.Tokens) != len(w.Tokens) {
			t.Errorf("%s: segment %d: %v..%v, %d tokens, want %v..%v, %d", name, s, g.Start, g.End, len(g.Tokens), w.Start, w.End, len(w.Tokens))
			continue
		}
		for k, wt := range w.Tokens {
			gt := g.Tokens[k]
			if gt.ID != wt.ID || gt.Frame != wt.Frame || gt.Duration != wt.Duration || gt.T0 != wt.T0 || gt.T1 != wt.T1 ||
				math.Abs(float64(gt.P-wt.P)) > 1e-5 || math.Abs(float64(gt.PLog-wt.PLog)) > 1e-5 {
				t.Errorf("%s: token %d: %+v, want %+v", name, k, gt, wt)
				break
			}
		}
	}
}

// TestParakeetDeviceBeamStepAllocs: on the device beam loop, once two beam transcriptions are
// encoded, a step of their searches (beamRounds rounds of each, then one read) allocates nothing.
func TestParakeetDeviceBeamStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pcm := testWAV(t, "jfk")
	pcm = append(pcm, pcm...) // 22 s: many steps of one search
	for _, be := range sharedtest.Backends(t, 2) {
		if _, ok := be.(backend.BeamTransducer); !ok {
			t.Logf("%s searches on the host: no device beam loop to test", be.Name())
			continue
		}
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			noLoop = true
			e, err := NewParakeet(m, Config{MaxActive: 2})
			noLoop = false
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			var jobs []*pjob
			for _, w := range []int{3, 8} {
				jobs = append(jobs, queueBeam(t, e, pcm, w))
			}
			for range 2 { // admit and encode both, take the first steps
				e.q.loop.Step()
			}
			for _, j := range jobs {
				if j.ph != ppDecode || j.err != nil || !j.onBeam {
					t.Fatalf("beam transcription in phase %d, error %v, on the device beam loop %v", j.ph, j.err, j.onBeam)
				}
			}
			if a := testing.AllocsPerRun(5, func() { e.q.loop.Step() }); a != 0 {
				t.Errorf("%v allocations per step, want 0", a)
			}
			for _, j := range jobs {
				if j.ph != ppDecode || e.dbeam.l.Rounds(2*deviceRow(j.slot)) < 6*beamRounds {
					t.Fatalf("the steps measured were not all searching: phase %d, %d rounds", j.ph, e.dbeam.l.Rounds(2*deviceRow(j.slot)))
				}
			}
		})
	}
}

// queueBeam queues the beam transcription of pcm with a beam of width in e, whose loop the test
// steps.
func queueBeam(t *testing.T, e *Parakeet, pcm []float32, width int) *pjob {
	t.Helper()
	p := DefaultParams()
	p.BeamSize = width
	j := &pjob{p: p, nSamples: len(pcm), slot: -1}
	j.start(context.Background())
	var err error
	if j.mel, err = e.m.FrontEnd.LogMel(nil, pcm); err != nil {
		t.Fatal(err)
	}
	j.melRows = len(j.mel) / e.m.HParams.NMels
	j.frames = parakeet.EncoderFrames(j.melRows)
	j.end = j.frames
	if err := e.q.enqueue(j); err != nil {
		t.Fatal(err)
	}
	return j
}

// TestParakeetDeviceBeamNonFinite: a beam transcription whose encoder projection holds infinities at
// frames its searches have not reached fails with the error the host loop gives it, alone: the
// transcription beside it ends with the host loop's text.
func TestParakeetDeviceBeamNonFinite(t *testing.T) {
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pcm := testWAV(t, "jfk")
	for _, be := range sharedtest.Backends(t, 2) {
		if _, ok := be.(backend.BeamTransducer); !ok {
			t.Logf("%s searches on the host: no device beam loop to test", be.Name())
			continue
		}
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			run := func(hostOnly bool) (error, string) {
				noLoop, hostLoopOnly = true, hostOnly
				e, err := NewParakeet(m, Config{MaxActive: 2})
				noLoop, hostLoopOnly = false, false
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				bad, good := queueBeam(t, e, pcm, 4), queueBeam(t, e, pcm, 4)
				e.q.loop.Step() // admit and encode both, the first rounds
				if bad.ph != ppDecode || bad.onBeam == hostOnly || bad.proj == nil {
					t.Fatalf("phase %d, on the device beam loop %v (host loop only %v)", bad.ph, bad.onBeam, hostOnly)
				}
				// +Inf, which the joint's ReLU keeps (a NaN it may make 0), then NaN logits.
				nan := make([]float32, m.HParams.NPredDim)
				for i := range nan {
					nan[i] = float32(math.Inf(1))
				}
				for r := 60; r < 70; r++ {
					if err := be.Write(bad.proj, r, nan); err != nil {
						t.Fatal(err)
					}
				}
				for range 10000 {
					select {
					case <-bad.done:
						select {
						case <-good.done:
							if good.err != nil || len(good.segs) == 0 {
								t.Fatalf("the transcription beside: %v, %d segments", good.err, len(good.segs))
							}
							return bad.err, good.segs[0].Text
						default:
						}
					default:
					}
					e.q.loop.Step()
				}
				t.Fatal("the transcriptions did not end")
				return nil, ""
			}
			devErr, devText := run(false)
			hostErr, hostText := run(true)
			if !errors.Is(devErr, errNonFiniteParakeet) || !errors.Is(hostErr, errNonFiniteParakeet) {
				t.Errorf("infinite projections: %v, on the host loop %v; want %v", devErr, hostErr, errNonFiniteParakeet)
			}
			if devText != hostText {
				t.Errorf("the transcription beside: %q, on the host loop %q", devText, hostText)
			}
		})
	}
}

// TestParakeetDeviceBeamGrow: a clip longer than the device beam loop takes, coming when no
// transcription is on the loop, has the loop made again for it and searches there, with the
// host loop's result.
func TestParakeetDeviceBeamGrow(t *testing.T) {
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pcm := testWAV(t, "jfk")
	clips := [][]float32{pcm[:3*SampleRate], pcm}
	for _, be := range sharedtest.Backends(t, 2) {
		if _, ok := be.(backend.BeamTransducer); !ok {
			t.Logf("%s searches on the host: no device beam loop to test", be.Name())
			continue
		}
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			defer func(a, b int) { beamLoopFrames, beamLoopMaxFrames = a, b }(beamLoopFrames, beamLoopMaxFrames)
			beamLoopFrames = 10
			run := func(hostOnly bool) []*Result {
				hostLoopOnly = hostOnly
				e, err := NewParakeet(m, Config{MaxActive: 2})
				hostLoopOnly = false
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				var res []*Result
				for _, c := range clips {
					p := DefaultParams()
					p.BeamSize = 4
					r, err := e.Transcribe(context.Background(), c, p, nil)
					if err != nil {
						t.Fatal(err)
					}
					res = append(res, r)
				}
				if !hostOnly {
					e.Close()
					if want := parakeet.EncoderFrames(parakeet.MelFrames(len(pcm))); e.dbeam.jobsN != 2 || e.dbeam.frames != want {
						t.Errorf("%d transcriptions on the device beam loop, made for %d frames; want 2, %d", e.dbeam.jobsN, e.dbeam.frames, want)
					}
				}
				return res
			}
			dev, host := run(false), run(true)
			for i := range clips {
				compareResults(t, fmt.Sprintf("clip %d", i), dev[i], host[i])
			}
		})
	}
}
