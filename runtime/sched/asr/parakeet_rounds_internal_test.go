package asr

import (
	"context"
	"math"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// roundLog records the joint calls of a Parakeet scheduler's host loop through
// parakeetJointHook: each call's jobs and rows, and the calls whose round did not follow the
// step's previous one, or that held a greedy decoder the previous round did not.
type roundLog struct {
	mu        sync.Mutex
	calls     int
	rows      map[*pjob]int // the joint rows of each job
	maxJobs   int           // the most jobs in one call
	badRound  int           // calls whose round is neither 0 nor the previous one's next
	badGreedy int           // greedy decoders back in a round after one without them
	last      int
	prev      map[*pjob]bool // the greedy decoders in the step's previous round
}

func newRoundLog() *roundLog {
	return &roundLog{rows: map[*pjob]int{}, prev: map[*pjob]bool{}, last: -1}
}

func (l *roundLog) hook(round int, parts []jpart) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if round != 0 && round != l.last+1 {
		l.badRound++
	}
	l.last = round
	jobs := map[*pjob]bool{}
	for _, p := range parts {
		if !p.in {
			continue
		}
		jobs[p.j] = true
		l.rows[p.j] += p.n
		if p.s == nil && round > 0 && !l.prev[p.j] {
			l.badGreedy++
		}
	}
	l.maxJobs = max(l.maxJobs, len(jobs))
	clear(l.prev)
	for _, p := range parts {
		if p.in && p.s == nil {
			l.prev[p.j] = true
		}
	}
}

// total is the rows of every job the log saw.
func (l *roundLog) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.rows {
		n += r
	}
	return n
}

// TestParakeetJointRounds: an offline greedy transcription, a beam transcription and a live
// stream decoded together (all on the host loop) give exactly what each gives alone (tokens
// with their probabilities, the stream's events; the pure-Go backend computes a joint row alike
// whatever rows go with it; a native backend's products round a row differently by the rows
// beside it, so there probabilities agree within 1e-6, log-probabilities within 1e-5),
// computing the same joint rows; the host loop makes one joint call a round: each step's
// rounds are numbered 0, 1, 2... with a call each, a greedy transcription stays in the rounds
// until it emits and never comes back in the step, and the three share calls, so that they take
// fewer calls together than alone.
func TestParakeetJointRounds(t *testing.T) {
	hostLoopOnly = true
	e := openParakeetSmall(t, Config{MaxActive: 4, MaxQueue: 4, EncodeBatch: 2})
	hostLoopOnly = false
	exact := e.m.Backend().Name() == "purego"
	pcms := map[string][]float32{}
	for _, c := range []string{"jfk", "psx-cards-001", "ami-ES2011a-headset0-40s-46s"} {
		pcm := testWAV(t, c)
		if raceEnabled {
			pcm = pcm[:min(len(pcm), 4*SampleRate)]
		}
		pcms[c] = pcm
	}
	beam := DefaultParams()
	beam.BeamSize = 3
	cfg := SessionConfig{Chunk: 800 * time.Millisecond, LeftContext: 2 * time.Second, RightContext: 240 * time.Millisecond, Silence: 240 * time.Millisecond}
	ctx := context.Background()
	type out struct {
		greedy, beam []Token
		events       []Event
		errs         [3]error
	}
	transcribe := func(pcm []float32, p Params) ([]Token, error) {
		res, err := e.Transcribe(ctx, pcm, p, nil)
		if err != nil {
			return nil, err
		}
		var toks []Token
		for _, s := range res.Segments {
			toks = append(toks, s.Tokens...)
		}
		return toks, nil
	}
	stream := func(pcm []float32) ([]Event, error) {
		l, err := e.NewLive(cfg)
		if err != nil {
			return nil, err
		}
		return streamEvents(ctx, l, pcm, SampleRate/10)
	}
	jobs := []func(o *out){
		func(o *out) { o.greedy, o.errs[0] = transcribe(pcms["jfk"], DefaultParams()) },
		func(o *out) { o.beam, o.errs[1] = transcribe(pcms["psx-cards-001"], beam) },
		func(o *out) { o.events, o.errs[2] = stream(pcms["ami-ES2011a-headset0-40s-46s"]) },
	}
	var alone out
	aloneCalls, aloneRows := 0, 0
	for _, job := range jobs {
		l := newRoundLog()
		parakeetJointHook = l.hook
		job(&alone)
		parakeetJointHook = nil
		aloneCalls, aloneRows = aloneCalls+l.calls, aloneRows+l.total()
		if l.badRound != 0 || l.badGreedy != 0 {
			t.Errorf("alone: %d calls out of their rounds' order, %d greedy decoders back in a step's rounds", l.badRound, l.badGreedy)
		}
	}
	for i, err := range alone.errs {
		if err != nil {
			t.Fatalf("job %d alone: %v", i, err)
		}
	}
	if len(alone.greedy) == 0 || len(alone.beam) == 0 || len(alone.events) == 0 {
		t.Fatalf("alone: %d greedy tokens, %d beam tokens, %d events", len(alone.greedy), len(alone.beam), len(alone.events))
	}
	l := newRoundLog()
	parakeetJointHook = l.hook
	defer func() { parakeetJointHook = nil }()
	var together out
	var wg sync.WaitGroup
	for _, job := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			job(&together)
		}()
	}
	wg.Wait()
	parakeetJointHook = nil
	for i, err := range together.errs {
		if err != nil {
			t.Fatalf("job %d together: %v", i, err)
		}
	}
	if !sameTokens(together.greedy, alone.greedy, exact) {
		t.Errorf("greedy together %+v\nalone %+v", together.greedy, alone.greedy)
	}
	if !sameTokens(together.beam, alone.beam, exact) {
		t.Errorf("beam together %+v\nalone %+v", together.beam, alone.beam)
	}
	if !sameEvents(together.events, alone.events, exact) {
		t.Errorf("stream together %+v\nalone %+v", together.events, alone.events)
	}
	if l.badRound != 0 || l.badGreedy != 0 {
		t.Errorf("together: %d calls out of their rounds' order, %d greedy decoders back in a step's rounds", l.badRound, l.badGreedy)
	}
	if rows := l.total(); rows != aloneRows {
		t.Errorf("%d joint rows together, %d alone", rows, aloneRows)
	}
	if l.maxJobs < 3 || l.calls >= aloneCalls {
		t.Errorf("together: at most %d jobs in a call, %d calls (alone %d): the jobs did not share calls", l.maxJobs, l.calls, aloneCalls)
	}
	t.Logf("%d joint calls together, %d alone; %d rows", l.calls, aloneCalls, aloneRows)
}

// TestParakeetRoundsStepAllocs drives the Parakeet scheduler's loop by hand over three greedy
// transcriptions and checks that a steady-state step, a prediction-network call for all three
// and the joint rounds up to each one's next token, allocates nothing.
func TestParakeetRoundsStepAllocs(t *testing.T) {
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
	noLoop, hostLoopOnly = true, true
	e, err := NewParakeet(m, Config{MaxActive: 3, EncodeBatch: 3})
	noLoop, hostLoopOnly = false, false
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var js []*pjob
	for _, c := range []string{"jfk", "ljs-LJ001-0001", "ljs-LJ001-0014"} {
		samples := testWAV(t, c)
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
		js = append(js, j)
	}
	for range 5 { // encode, the first tokens
		e.q.loop.Step()
	}
	for _, j := range js {
		if j.ph != ppDecode || j.err != nil {
			t.Fatalf("job in phase %d, error %v", j.ph, j.err)
		}
	}
	if a := testing.AllocsPerRun(10, func() { e.q.loop.Step() }); a != 0 {
		t.Errorf("%v allocations per scheduler step, want 0", a)
	}
	for _, j := range js {
		if j.ph != ppDecode || len(j.toks) < 10 {
			t.Errorf("the steps measured did not all decode: %d samples: phase %d, %d tokens", j.nSamples, j.ph, len(j.toks))
		}
	}
}

// sameTokens reports whether a and b are the same tokens; but for probabilities within 1e-6 and
// log-probabilities within 1e-5 unless exact.
func sameTokens(a, b []Token, exact bool) bool {
	if exact || len(a) != len(b) {
		return reflect.DeepEqual(a, b)
	}
	for i := range a {
		x, y := a[i], b[i]
		if math.Abs(float64(x.P-y.P)) > 1e-6 || math.Abs(float64(x.PLog-y.PLog)) > 1e-5 {
			return false
		}
		x.P, x.PLog = y.P, y.PLog
		if x != y {
			return false
		}
	}
	return true
}

// sameEvents reports whether a and b are the same events; but for their tokens'
// log-probabilities within 1e-5 unless exact.
func sameEvents(a, b []Event, exact bool) bool {
	if exact || len(a) != len(b) {
		return reflect.DeepEqual(a, b)
	}
	for i := range a {
		x, y := a[i], b[i]
		if len(x.Tokens) != len(y.Tokens) {
			return false
		}
		for k := range x.Tokens {
			if math.Abs(float64(x.Tokens[k].PLog-y.Tokens[k].PLog)) > 1e-5 || x.Tokens[k].Text != y.Tokens[k].Text {
				return false
			}
		}
		x.Tokens, y.Tokens = nil, nil
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}
