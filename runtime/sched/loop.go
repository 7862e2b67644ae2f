package sched

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Work is one kind of model stepped by a Loop: the Scheduler's token batches for language
// models, or a speech recogniser's windows and decoder steps (runtime/sched/asr). R is its
// request type.
//
// The Loop calls a Work only from the goroutine running Loop.Run (or, for Abort, from Close when
// Run never started). Expire, Admit and Abort are called with the Loop's queue locked, so they must
// not call the Loop; Reap and Step are called without the lock.
type Work[R any] interface {
	// Reap ends the admitted requests that were cancelled or ran past their deadline, so that
	// admission right after it can use what they held.
	Reap(now time.Time)
	// Expire ends queued request r if it was cancelled or ran past its deadline, and reports
	// whether it did; an ended request leaves the queue.
	Expire(r R, now time.Time) bool
	// Admit takes the request at the head of the queue in if there is room for it and reports
	// whether it did; false leaves it at the head, and nothing behind it is admitted before it.
	Admit(r R) bool
	// Step advances every admitted request by one batched step. It reports the sequences and
	// tokens the step's batch held (none when it did other work only, such as encoding audio),
	// and false when there was nothing to do (the Loop then waits for Wake).
	Step(now time.Time) (seqs, tokens int, busy bool)
	// Abort ends a queued request when the Loop shuts down.
	Abort(r R)
	// Shutdown ends every admitted request when the Loop shuts down.
	Shutdown()
}

// Flusher is a Work that holds back the ends of its requests during a step. Flush delivers
// them; the Loop calls it after every Step, once the step is counted (Stats, OnStep), so that a
// client that sees its request end also sees the step that ended it in the counters. Shutdown
// must deliver what it ends itself.
type Flusher interface {
	Flush()
}

// LoopConfig configures a Loop. Zero fields take the defaults given.
type LoopConfig struct {
	MaxQueue int              // requests waiting beyond which Enqueue fails with ErrQueueFull (> 0)
	Clock    func() time.Time // default time.Now
	Logger   *slog.Logger     // per-step records at LevelTrace only; default discards
	Name     string           // the message of the per-step trace record (default "step")

	// OnStep, if set, is called after each step that did work, with its duration and the
	// sequences and tokens of its batch. It runs on the step goroutine, which it holds up: it must
	// be fast and must not call the Loop.
	OnStep func(d time.Duration, seqs, tokens int)
}

// LoopStats is a snapshot of a Loop's counters.
type LoopStats struct {
	Queued          int
	Steps           uint64
	LastStep        time.Duration
	LastBatchSeqs   int
	LastBatchTokens int
}

// Loop is the machinery every kind of model is scheduled with: a bounded FIFO queue; admission
// from its head only, so that no request overtakes another and none starves; one goroutine (Run)
// that owns everything admitted and steps it in batches; cancellation and deadlines applied at
// step boundaries, queued or admitted; a shutdown that ends everything queued or in flight; and
// per-step accounting (Stats, LoopConfig.OnStep, trace records). What a request is, when it fits
// and what a step does belong to its Work.
type Loop[R any] struct {
	w     Work[R]
	flush Flusher // w, if it is one
	cfg   LoopConfig
	clock func() time.Time
	log   *slog.Logger

	mu      sync.Mutex
	queue   []R
	closed  bool
	started bool
	closing chan struct{}
	once    sync.Once
	ended   sync.Once // Close's ending of everything when Run never started
	done    chan struct{}
	wake    chan struct{}

	steps                atomic.Uint64
	lastStep             atomic.Int64
	lastSeqs, lastTokens atomic.Int32
}

// NewLoop makes a loop that steps w.
func NewLoop[R any](w Work[R], cfg LoopConfig) (*Loop[R], error) {
	if w == nil {
		return nil, errors.New("sched: nil work")
	}
	if cfg.MaxQueue <= 0 {
		return nil, errors.New("sched: queue size must be positive")
	}
	l := &Loop[R]{w: w, cfg: cfg, clock: cfg.Clock, log: cfg.Logger,
		queue:   make([]R, 0, cfg.MaxQueue),
		closing: make(chan struct{}), done: make(chan struct{}), wake: make(chan struct{}, 1)}
	if l.clock == nil {
		l.clock = time.Now
	}
	l.flush, _ = w.(Flusher)
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.cfg.Name == "" {
		l.cfg.Name = "step"
	}
	return l, nil
}

// Enqueue queues r behind every request already waiting and wakes the loop. ErrQueueFull:
// MaxQueue requests are waiting; ErrClosed: the loop is closing.
func (l *Loop[R]) Enqueue(r R) error {
	l.mu.Lock()
	switch {
	case l.closed:
		l.mu.Unlock()
		return ErrClosed
	case len(l.queue) >= l.cfg.MaxQueue:
		l.mu.Unlock()
		return ErrQueueFull
	}
	l.queue = append(l.queue, r)
	l.mu.Unlock()
	l.Wake()
	return nil
}

// Wake makes a waiting loop take a step: after a cancellation, for example. Safe from any
// goroutine.
func (l *Loop[R]) Wake() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Queued is the number of requests waiting. Safe from any goroutine.
func (l *Loop[R]) Queued() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}

// Stats returns a snapshot of the loop's counters. Safe from any goroutine.
func (l *Loop[R]) Stats() LoopStats {
	return LoopStats{Queued: l.Queued(), Steps: l.steps.Load(), LastStep: time.Duration(l.lastStep.Load()),
		LastBatchSeqs: int(l.lastSeqs.Load()), LastBatchTokens: int(l.lastTokens.Load())}
}

// Close stops accepting requests, ends those queued or in flight and waits for Run to return.
// Before Run has started it ends them itself (requests admitted by calling Step by hand
// included).
func (l *Loop[R]) Close() error {
	l.mu.Lock()
	l.closed = true
	started := l.started
	l.mu.Unlock()
	l.once.Do(func() { close(l.closing) })
	if started {
		<-l.done
		return nil
	}
	// Once, however many callers: the others wait for it.
	l.ended.Do(func() {
		l.mu.Lock()
		l.abortQueued()
		l.mu.Unlock()
		l.w.Shutdown()
	})
	return nil
}

// Run is the step loop; it returns nil after Close, or ctx.Err() when ctx is done (ending every
// request and refusing new ones). It may be called once.
func (l *Loop[R]) Run(ctx context.Context) error {
	l.mu.Lock()
	if l.started {
		l.mu.Unlock()
		return errors.New("sched: Run called twice")
	}
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	l.started = true
	l.mu.Unlock()
	defer close(l.done)
	for {
		select {
		case <-ctx.Done():
			l.shutdown()
			return ctx.Err()
		case <-l.closing:
			l.shutdown()
			return nil
		default:
		}
		if l.Step() {
			continue
		}
		select {
		case <-l.wake:
		case <-ctx.Done():
		case <-l.closing:
		}
	}
}

// Step runs one step: it ends expired requests, queued or admitted, admits from the head of the
// queue while the Work has room, and lets the Work step. It reports whether the Work did anything.
// Run calls it; a caller that drives a Work by hand (Scheduler.Step, tests) may call it instead of
// Run.
func (l *Loop[R]) Step() bool {
	busy := l.step()
	if l.flush != nil {
		l.flush.Flush()
	}
	return busy
}

func (l *Loop[R]) step() bool {
	start := l.clock()
	l.reapQueued(start)
	l.w.Reap(start)
	l.admit()
	seqs, tokens, busy := l.w.Step(start)
	if !busy {
		return false
	}
	l.steps.Add(1)
	if tokens > 0 { // a step without a batch (a speech model's encoder alone) keeps the last batch
		l.lastSeqs.Store(int32(seqs))
		l.lastTokens.Store(int32(tokens))
	}
	d := l.clock().Sub(start)
	l.lastStep.Store(int64(d))
	if l.cfg.OnStep != nil {
		l.cfg.OnStep(d, seqs, tokens)
	}
	if l.log.Enabled(context.Background(), LevelTrace) {
		l.log.Log(context.Background(), LevelTrace, l.cfg.Name, "seqs", seqs, "tokens", tokens, "took", d)
	}
	return true
}

func (l *Loop[R]) reapQueued(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	j := 0
	for _, r := range l.queue {
		if l.w.Expire(r, now) {
			continue
		}
		l.queue[j] = r
		j++
	}
	clear(l.queue[j:])
	l.queue = l.queue[:j]
}

func (l *Loop[R]) admit() {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for n < len(l.queue) && l.w.Admit(l.queue[n]) {
		n++
	}
	if n == 0 {
		return
	}
	k := copy(l.queue, l.queue[n:])
	clear(l.queue[k:])
	l.queue = l.queue[:k]
}

func (l *Loop[R]) shutdown() {
	l.mu.Lock()
	l.closed = true
	l.abortQueued()
	l.mu.Unlock()
	l.w.Shutdown()
}

// abortQueued ends every queued request; l.mu is held.
func (l *Loop[R]) abortQueued() {
	for _, r := range l.queue {
		l.w.Abort(r)
	}
	clear(l.queue)
	l.queue = l.queue[:0]
}
