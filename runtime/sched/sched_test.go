package sched

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/runtime/decode"
)

func TestSingleLengthAndUsage(t *testing.T) {
	m := newFake(t, 16, 4, 16, 4)
	h := newHarness(t, m, Config{})
	h.run()
	p := prompt(3, 7)
	st := h.submit(t, &Request{Prompt: p, MaxTokens: 10, Sampling: greedy()})
	res := drain(t, st, 1)
	checkSeq(t, m, res[0], p, 10, greedy())
	if u := st.Usage(); u.PromptTokens != 7 || u.CompletionTokens != 10 {
		t.Fatalf("usage %+v", u)
	}
}

func TestEOSAndStop(t *testing.T) {
	m := newFake(t, 16, 4, 16, 4)
	m.eosAt = 12
	h := newHarness(t, m, Config{})
	h.run()
	p := prompt(9, 5)
	res := drain(t, h.submit(t, &Request{Prompt: p, MaxTokens: 50, Sampling: greedy()}), 1)
	checkSeq(t, m, res[0], p, 50, greedy())
	if res[0].reason != decode.StopEOS || len(res[0].tokens) != 12-5 {
		t.Fatalf("got %d tokens, reason %s", len(res[0].tokens), res[0].reason)
	}
	// IgnoreEOS runs past it to the length limit.
	res = drain(t, h.submit(t, &Request{Prompt: p, MaxTokens: 9, Sampling: greedy(), IgnoreEOS: true}), 1)
	if res[0].reason != decode.StopLength || len(res[0].tokens) != 9 || res[0].tokens[12-5] != 0 {
		t.Fatalf("IgnoreEOS: got %v, reason %s", res[0].tokens, res[0].reason)
	}
	// A stop string made of the 3rd and 4th generated tokens' text ends generation before it.
	want, _ := m.reference(t, p, 50, greedy())
	stop := spell(want[2:4])
	full := spell(want)
	cut := full[:indexOf(full, stop)]
	res = drain(t, h.submit(t, &Request{Prompt: p, MaxTokens: 50, Sampling: greedy(), Stop: []string{stop}}), 1)
	if res[0].reason != decode.StopString || res[0].text != cut {
		t.Fatalf("stop %q: got %q (%s), want %q", stop, res[0].text, res[0].reason, cut)
	}
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// TestFIFO: with one sequence in flight at a time, requests run in the order they were submitted.
func TestFIFO(t *testing.T) {
	m := newFake(t, 16, 4, 16, 4)
	h := newHarness(t, m, Config{MaxActive: 1})
	var sts []*Stream
	for i := range 6 {
		sts = append(sts, h.submit(t, &Request{Prompt: prompt(int32(10+i), 3), MaxTokens: 2, Sampling: greedy()}))
	}
	h.run()
	for _, st := range sts {
		drain(t, st, 1)
	}
	if !slices.Equal(m.starts, []int32{10, 11, 12, 13, 14, 15}) {
		t.Fatalf("admission order %v", m.starts)
	}
}

// TestNoOvertaking: a request waiting for blocks is not overtaken by a smaller one behind it.
func TestNoOvertaking(t *testing.T) {
	m := newFake(t, 8, 4, 16, 4) // 32 positions
	h := newHarness(t, m, Config{})
	a := h.submit(t, &Request{Prompt: prompt(20, 4), MaxTokens: 13, Sampling: greedy()}) // 16 positions: 4 blocks
	b := h.submit(t, &Request{Prompt: prompt(21, 4), MaxTokens: 21, Sampling: greedy()}) // 24: 6 blocks, waits for a
	c := h.submit(t, &Request{Prompt: prompt(22, 2), MaxTokens: 3, Sampling: greedy()})  // 4: 1 block, would fit now
	h.run()
	for _, st := range []*Stream{a, b, c} {
		drain(t, st, 1)
	}
	if !slices.Equal(m.starts, []int32{20, 21, 22}) {
		t.Fatalf("admission order %v", m.starts)
	}
}

// TestBudgetAndChunking: every step stays within StepTokens, long prompts are spread over several
// steps, and decode tokens ride along with prompt chunks; outputs are unchanged.
func TestBudgetAndChunking(t *testing.T) {
	m := newFake(t, 64, 4, 16, 8)
	h := newHarness(t, m, Config{StepTokens: 6, MaxActive: 4})
	var ps [][]int32
	var sts []*Stream
	for i, n := range []int{1, 23, 6, 40, 7, 13} {
		p := prompt(int32(30+i), n)
		ps = append(ps, p)
		sts = append(sts, h.submit(t, &Request{Prompt: p, MaxTokens: 5 + i, Sampling: greedy()}))
	}
	h.run()
	for i, st := range sts {
		checkSeq(t, m, drain(t, st, 1)[0], ps[i], 5+i, greedy())
	}
	mixed := false
	for i, n := range m.batches {
		if n > 6 {
			t.Fatalf("step %d: %d tokens, budget 6", i, n)
		}
		if m.rows[i] > 0 && m.rows[i] < n {
			mixed = true
		}
	}
	if !mixed {
		t.Fatal("no step mixed decode tokens with a prompt chunk")
	}
	total := 0
	for _, n := range m.batches {
		total += n
	}
	if s := h.s.Stats(); s.Steps != uint64(len(m.batches)) || s.PromptTokens != 90 || s.GeneratedTokens != 5+6+7+8+9+10 {
		t.Fatalf("stats %+v, %d steps", s, len(m.batches))
	}
}

func TestManyConcurrent(t *testing.T) {
	m := newFake(t, 64, 8, 32, 16)
	h := newHarness(t, m, Config{MaxQueue: 100, StepTokens: 24})
	h.run()
	var wg sync.WaitGroup
	errs := make(chan error, 60)
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := prompt(int32(1+i%60), 1+i%17)
			sp := decode.DefaultParams()
			sp.Seed = uint64(i)
			st, err := h.s.Submit(context.Background(), &Request{Prompt: p, MaxTokens: 1 + i%13, Sampling: sp, TopLogprobs: i % 3})
			if err != nil {
				errs <- err
				return
			}
			var toks []int32
			var reason decode.StopReason
			for ev := range st.Events() {
				if ev.Token >= 0 {
					toks = append(toks, ev.Token)
					if len(ev.Top) != i%3 {
						errs <- errors.New("wrong number of top log-probabilities")
					}
				}
				reason = ev.Reason
			}
			want, wr := m.reference(t, p, 1+i%13, sp)
			if !slices.Equal(toks, want) || reason != wr {
				errs <- errors.New("output differs from the reference")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestQueueFullAndTooLong(t *testing.T) {
	m := newFake(t, 8, 4, 16, 4)
	h := newHarness(t, m, Config{MaxQueue: 2})
	a := h.submit(t, &Request{Prompt: prompt(1, 3), MaxTokens: 4, Sampling: greedy()})
	b := h.submit(t, &Request{Prompt: prompt(2, 3), MaxTokens: 4, Sampling: greedy()})
	if _, err := h.s.Submit(context.Background(), &Request{Prompt: prompt(3, 3), MaxTokens: 4, Sampling: greedy()}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third request: %v, want ErrQueueFull", err)
	}
	for _, r := range []*Request{
		{Prompt: prompt(1, 30), MaxTokens: 4, Sampling: greedy()},          // 33 positions, 32 slots
		{Prompt: prompt(1, 3), MaxTokens: math.MaxInt, Sampling: greedy()}, // overflow-sized
		{Prompt: prompt(1, 7), MaxTokens: 9, N: 3, Sampling: greedy()},     // 16 + 2*(16-4) positions
		{Prompt: prompt(1, 3), MaxTokens: 30, N: 1, Sampling: greedy()},    // 32 fits: must be accepted, but the queue is full
	} {
		_, err := h.s.Submit(context.Background(), r)
		if r.MaxTokens == 30 {
			if !errors.Is(err, ErrQueueFull) {
				t.Fatalf("%d+%d: %v, want ErrQueueFull", len(r.Prompt), r.MaxTokens, err)
			}
			continue
		}
		if !errors.Is(err, ErrTooLong) {
			t.Fatalf("%d+%d (n %d): %v, want ErrTooLong", len(r.Prompt), r.MaxTokens, r.N, err)
		}
	}
	for _, r := range []*Request{{}, {Prompt: []int32{1}}, {Prompt: []int32{fakeVocab}, MaxTokens: 1}, {Prompt: []int32{1}, MaxTokens: 1, N: 5}, {Prompt: []int32{1}, MaxTokens: 1, TopLogprobs: 21}} {
		if _, err := h.s.Submit(context.Background(), r); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v, want ErrInvalid", r, err)
		}
	}
	// Closing before Run ends the queued requests.
	h.s.Close()
	for _, st := range []*Stream{a, b} {
		if r := drain(t, st, 1); r[0].reason != ReasonCancelled {
			t.Fatalf("queued request ended with %q", r[0].reason)
		}
	}
	if _, err := h.s.Submit(context.Background(), &Request{Prompt: prompt(1, 3), MaxTokens: 4, Sampling: greedy()}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if err := h.s.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
}

// TestCancelReleases: Cancel during step 3 ends the sequence at the next step boundary, with its
// held text flushed, and its blocks are free again within that step while another request runs.
func TestCancelReleases(t *testing.T) {
	m := newFake(t, 32, 4, 16, 4)
	h := newHarness(t, m, Config{StepTokens: 4})
	var a *Stream
	free := map[int]int{}
	m.hook = func(call int) {
		free[call] = m.pool.FreeBlocks()
		if call == 3 {
			a.Cancel()
		}
	}
	a = h.submit(t, &Request{Prompt: prompt(5, 4), MaxTokens: 40, Sampling: greedy()})  // 11 blocks
	b := h.submit(t, &Request{Prompt: prompt(6, 4), MaxTokens: 40, Sampling: greedy()}) // 11 blocks
	h.run()
	ra := drain(t, a, 1)[0]
	if ra.reason != ReasonCancelled || len(ra.tokens) != 3 {
		t.Fatalf("cancelled request: %d tokens, reason %q", len(ra.tokens), ra.reason)
	}
	checkSeq(t, m, drain(t, b, 1)[0], prompt(6, 4), 40, greedy())
	if free[3] != 32-22 || free[4] != 32-11 {
		t.Fatalf("free blocks at steps 3, 4: %d, %d", free[3], free[4])
	}
}

// TestContextCancel: a request whose context is cancelled ends "cancelled"; one whose context
// deadline passed ends "timeout"; both while queued too.
func TestContextCancel(t *testing.T) {
	m := newFake(t, 32, 4, 16, 4)
	h := newHarness(t, m, Config{MaxActive: 1})
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer dcancel()
	var a *Stream
	var err error
	m.hook = func(call int) {
		if call == 2 {
			cancel()
			for a.cause.Load() == causeNone { // context.AfterFunc runs in its own goroutine
				runtime.Gosched()
			}
		}
	}
	a, err = h.s.Submit(ctx, &Request{Prompt: prompt(5, 4), MaxTokens: 40, Sampling: greedy()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.s.Submit(dctx, &Request{Prompt: prompt(5, 4), MaxTokens: 40, Sampling: greedy()})
	if err != nil {
		t.Fatal(err)
	}
	for b.cause.Load() == causeNone {
		runtime.Gosched()
	}
	h.run()
	if r := drain(t, a, 1)[0]; r.reason != ReasonCancelled {
		t.Fatalf("cancelled context: %q after %d tokens", r.reason, len(r.tokens))
	}
	if r := drain(t, b, 1)[0]; r.reason != ReasonTimeout || len(r.tokens) != 0 {
		t.Fatalf("expired context: %q after %d tokens", r.reason, len(r.tokens))
	}
}

// TestDeadline: Request.Deadline is checked against the injected clock at each step boundary.
func TestDeadline(t *testing.T) {
	m := newFake(t, 32, 4, 16, 4)
	clk := &fakeClock{t: time.Unix(1000, 0)}
	h := newHarness(t, m, Config{Clock: clk.Now})
	m.hook = func(call int) {
		if call == 5 {
			clk.Add(time.Minute)
		}
	}
	st := h.submit(t, &Request{Prompt: prompt(5, 4), MaxTokens: 40, Deadline: time.Unix(1030, 0), Sampling: greedy()})
	h.run()
	r := drain(t, st, 1)[0]
	if r.reason != ReasonTimeout || len(r.tokens) != 5 {
		t.Fatalf("%q after %d tokens", r.reason, len(r.tokens))
	}
}

// TestNShares: N sequences process the prompt once (plus the tail past the last whole block),
// hold its blocks jointly, and each samples with its own seed.
func TestNShares(t *testing.T) {
	m := newFake(t, 64, 4, 32, 8)
	h := newHarness(t, m, Config{})
	p := prompt(7, 14) // F = 12: three shared blocks, two tokens re-fed per extra sequence
	sp := decode.DefaultParams()
	sp.Temperature = 1.5
	sp.TopK = 0
	sp.MinP = 0
	sp.Seed = 42
	var used []int
	m.hook = func(int) { used = append(used, m.pool.Blocks()-m.pool.FreeBlocks()) }
	st := h.submit(t, &Request{Prompt: p, MaxTokens: 20, N: 3, Sampling: sp})
	h.run()
	res := drain(t, st, 3)
	distinct := false
	for i, r := range res {
		spi := sp
		spi.Seed = SeqSeed(sp.Seed, i)
		checkSeq(t, m, r, p, 20, spi)
		distinct = distinct || !slices.Equal(r.tokens, res[0].tokens)
	}
	if !distinct {
		t.Fatal("the three sequences produced the same tokens")
	}
	if s := h.s.Stats(); s.PromptTokens != 14+2*2 {
		t.Fatalf("%d prompt tokens processed, want 18", s.PromptTokens)
	}
	// Each sequence spans 33 positions (9 blocks); the extra two share 3 of them.
	if slices.Max(used) != 9+2*6 {
		t.Fatalf("blocks in use %v, want at most 21", used)
	}
	if u := st.Usage(); u.PromptTokens != 14 || u.CompletionTokens != 60 {
		t.Fatalf("usage %+v", u)
	}
}

// TestNCancelBeforeFork: cancelling an N>1 request while its prompt is still being processed
// ends every sequence and returns the promised blocks.
func TestNCancelBeforeFork(t *testing.T) {
	m := newFake(t, 64, 4, 32, 8)
	h := newHarness(t, m, Config{StepTokens: 4})
	var st *Stream
	m.hook = func(call int) {
		if call == 2 {
			st.Cancel()
		}
	}
	st = h.submit(t, &Request{Prompt: prompt(7, 20), MaxTokens: 20, N: 3, Sampling: greedy()})
	h.run()
	for i, r := range drain(t, st, 3) {
		if r.reason != ReasonCancelled || len(r.tokens) != 0 {
			t.Fatalf("sequence %d: %q after %d tokens", i, r.reason, len(r.tokens))
		}
	}
	// The scheduler must have forgotten the promise: a request needing every block is admitted.
	big := h.submit(t, &Request{Prompt: prompt(8, 200), MaxTokens: 57, Sampling: greedy()})
	if r := drain(t, big, 1)[0]; r.reason != decode.StopLength {
		t.Fatalf("request needing the whole pool: %q", r.reason)
	}
}

// TestCloseInFlight: Close during a step ends every request, running or queued, and Run returns.
func TestCloseInFlight(t *testing.T) {
	m := newFake(t, 32, 4, 16, 2)
	h := newHarness(t, m, Config{})
	closed := make(chan error, 1)
	m.hook = func(call int) {
		if call == 3 {
			go func() { closed <- h.s.Close() }()
			<-h.s.loop.closing
		}
	}
	var sts []*Stream
	for i := range 4 {
		sts = append(sts, h.submit(t, &Request{Prompt: prompt(int32(i+1), 3), MaxTokens: 20, Sampling: greedy()}))
	}
	h.run()
	for _, st := range sts {
		if r := drain(t, st, 1)[0]; r.reason != ReasonCancelled {
			t.Fatalf("%q", r.reason)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := <-h.errc; err != nil {
		t.Fatal(err)
	}
	h.errc = nil
}

// TestCloseConcurrentBeforeRun: several Close calls at once on a scheduler that never ran end
// every queued request once, and each returns once that is done.
func TestCloseConcurrentBeforeRun(t *testing.T) {
	m := newFake(t, 32, 4, 16, 2)
	h := newHarness(t, m, Config{MaxQueue: 64})
	var sts []*Stream
	for i := range 40 {
		sts = append(sts, h.submit(t, &Request{Prompt: prompt(int32(i+1), 3), MaxTokens: 2, Sampling: greedy()}))
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.s.Close(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for _, st := range sts {
		if r := drain(t, st, 1)[0]; r.reason != ReasonCancelled {
			t.Fatalf("%q", r.reason)
		}
	}
}

// TestRunContext: Run returns ctx.Err() when its context ends, ending what is in flight.
func TestRunContext(t *testing.T) {
	m := newFake(t, 32, 4, 16, 2)
	h := newHarness(t, m, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	m.hook = func(call int) {
		if call == 2 {
			cancel()
		}
	}
	st := h.submit(t, &Request{Prompt: prompt(1, 3), MaxTokens: 20, Sampling: greedy()})
	errc := make(chan error, 1)
	go func() { errc <- h.s.Run(ctx) }()
	if r := drain(t, st, 1)[0]; r.reason != ReasonCancelled {
		t.Fatalf("%q", r.reason)
	}
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if _, err := h.s.Submit(context.Background(), &Request{Prompt: prompt(1, 3), MaxTokens: 2, Sampling: greedy()}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Run returned: %v", err)
	}
}

// TestForwardError ends the requests in the failed step with Reason "error" and goes on.
func TestForwardError(t *testing.T) {
	m := newFake(t, 32, 4, 16, 2)
	h := newHarness(t, m, Config{})
	m.hook = func(call int) {
		if call == 2 {
			m.fail = errBoom
		}
	}
	st := h.submit(t, &Request{Prompt: prompt(1, 3), MaxTokens: 20, Sampling: greedy()})
	h.run()
	if r := drain(t, st, 1)[0]; r.reason != ReasonError || !errors.Is(r.err, errBoom) {
		t.Fatalf("%q %v", r.reason, r.err)
	}
	p := prompt(2, 3)
	checkSeq(t, m, drain(t, h.submit(t, &Request{Prompt: p, MaxTokens: 5, Sampling: greedy()}), 1)[0], p, 5, greedy())
}

func TestConfig(t *testing.T) {
	m := newFake(t, 8, 4, 16, 4)
	for _, c := range []Config{{StepTokens: 17}, {MaxActive: 5}, {StepTokens: 2, MaxActive: 3}, {MaxQueue: -1}} {
		if _, err := New(m, fakeText{}, c); err == nil {
			t.Fatalf("%+v accepted", c)
		}
	}
}

// TestStreamMemory: a request's events take memory as they queue, not up front for every event
// it could produce: a queued request of four sequences of up to 200,000 tokens each allocates
// well under a megabyte (its events, had they all been allocated at once, would take tens).
func TestStreamMemory(t *testing.T) {
	m := newFake(t, 1<<16, 16, 16, 4)
	h := newHarness(t, m, Config{})
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	st := h.submit(t, &Request{Prompt: prompt(3, 7), MaxTokens: 200_000, N: 4, Sampling: greedy()})
	runtime.ReadMemStats(&ms1)
	if d := ms1.TotalAlloc - ms0.TotalAlloc; d > 1<<20 {
		t.Errorf("Submit allocated %d bytes", d)
	}
	st.Cancel()
	h.run()
	for range st.Events() {
	}
}

// TestFirstStepErrorReleases: a request whose very first step fails (its blocks reserved, none
// yet written) gives every block back.
func TestFirstStepErrorReleases(t *testing.T) {
	m := newFake(t, 16, 4, 16, 2)
	h := newHarness(t, m, Config{})
	m.hook = func(call int) {
		if call == 1 {
			m.fail = errBoom
		}
	}
	st := h.submit(t, &Request{Prompt: prompt(1, 6), MaxTokens: 20, Sampling: greedy()})
	h.run()
	if r := drain(t, st, 1)[0]; r.reason != ReasonError {
		t.Fatalf("reason %q", r.reason)
	}
	if free := m.pool.FreeBlocks(); free != m.pool.Blocks() {
		t.Fatalf("%d of %d blocks free after the failed request", free, m.pool.Blocks())
	}
}

// TestQueuedDeadlineWhileIdle: a request waiting for blocks held elsewhere, with nothing else to
// step, times out at its deadline: the loop, asleep with nothing to do, is woken for it.
func TestQueuedDeadlineWhileIdle(t *testing.T) {
	m := newFake(t, 4, 4, 16, 2)
	h := newHarness(t, m, Config{})
	held := m.pool.NewSeq(0)
	if err := held.Reserve(12); err != nil { // 3 of 4 blocks, as if another user held them
		t.Fatal(err)
	}
	defer func() { // the pool is the loop's until it stops
		h.s.Close()
		held.Release()
	}()
	h.run()
	st := h.submit(t, &Request{Prompt: prompt(1, 6), MaxTokens: 6, Deadline: time.Now().Add(100 * time.Millisecond), Sampling: greedy()})
	done := make(chan []seqResult, 1)
	go func() { done <- drain(t, st, 1) }()
	select {
	case r := <-done:
		if r[0].reason != ReasonTimeout {
			t.Fatalf("reason %q", r[0].reason)
		}
	case <-time.After(10 * time.Second):
		st.Cancel()
		<-done
		t.Fatal("the queued request outlived its deadline by 10 s")
	}
}

// TestEventPieces: every event of a token carries the token's bytes, and those of its
// alternatives, for prompt and generated tokens alike; a final flush carries none.
func TestEventPieces(t *testing.T) {
	m := newFake(t, 16, 4, 16, 4)
	h := newHarness(t, m, Config{})
	h.run()
	sp := decode.DefaultParams()
	sp.Seed = 3
	st := h.submit(t, &Request{Prompt: prompt(5, 6), MaxTokens: 8, Sampling: sp, TopLogprobs: 3, PromptLogprobs: true, IgnoreEOS: true})
	n := 0
	for ev := range st.Events() {
		if ev.Token < 0 {
			if ev.Piece != nil || ev.TopPieces != nil {
				t.Errorf("flush event with pieces: %+v", ev)
			}
			continue
		}
		n++
		if !bytes.Equal(ev.Piece, letters[ev.Token]) || len(ev.TopPieces) != len(ev.Top) || len(ev.Top) != 3 {
			t.Fatalf("event %+v: piece %q, %d pieces of %d alternatives", ev, ev.Piece, len(ev.TopPieces), len(ev.Top))
		}
		for i, a := range ev.Top {
			if !bytes.Equal(ev.TopPieces[i], letters[a.ID]) {
				t.Errorf("alternative %d of token %d: %q, want %q", a.ID, ev.Token, ev.TopPieces[i], letters[a.ID])
			}
		}
	}
	if n != 5+8 {
		t.Errorf("%d token events, want 5 scored and 8 generated", n)
	}
}

// TestStepByHand: a scheduler stepped by its caller instead of Run produces what Run does, each
// step's events ready when Step returns, the stream ended by the step that ends its request; a
// cancellation ends the request at the next step.
func TestStepByHand(t *testing.T) {
	m := newFake(t, 32, 4, 8, 4)
	h := newHarness(t, m, Config{})
	p, q := prompt(3, 11), prompt(7, 2)
	a := h.submit(t, &Request{Prompt: p, MaxTokens: 6, Sampling: greedy(), IgnoreEOS: true})
	b := h.submit(t, &Request{Prompt: q, MaxTokens: 20, Sampling: greedy()})
	if a.Ready() || b.Ready() {
		t.Fatal("a stream ready before any step")
	}
	var got seqResult
	steps := 0
	for !a.Ready() || got.reason == "" {
		if !h.s.Step() {
			t.Fatalf("step %d: nothing to run", steps)
		}
		steps++
		for a.Ready() {
			ev, err := a.Next(context.Background())
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if ev.Token >= 0 {
				got.tokens = append(got.tokens, ev.Token)
			}
			got.text += string(ev.Text)
			if ev.Done {
				got.reason = ev.Reason
			}
		}
	}
	checkSeq(t, m, got, p, 6, greedy())
	if _, err := a.Next(context.Background()); err != io.EOF {
		t.Errorf("after its last event: %v, want io.EOF", err)
	}
	// 11 prompt tokens in steps of 8 beside the other request: the first token at step 2 at the
	// earliest, the sixth five steps later.
	if steps < 7 {
		t.Errorf("%d steps", steps)
	}
	b.Cancel()
	h.s.Step()
	res := drain(t, b, 1)
	if res[0].reason != ReasonCancelled {
		t.Errorf("cancelled request ended %q", res[0].reason)
	}
	if h.s.Step() {
		t.Error("a step with nothing to run reported work")
	}
}
