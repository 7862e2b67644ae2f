package sched

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// EmbedModel is what the embedding scheduler steps: one batched forward over whole sequences,
// each pooled to one row and normalised. bert (EncoderEmbedModel) and llama (DecoderEmbedModel)
// contexts satisfy it through the adapters.
type EmbedModel interface {
	// Embed writes one embedding of Dim values per sequence into out: tokens holds the sequences
	// one after another, lens[s] tokens for sequence s.
	Embed(tokens []int32, lens []int, out []float32) error
	Dim() int        // values per embedding
	StepTokens() int // most tokens one Embed takes, every sequence together
	MaxTokens() int  // most tokens one sequence may have (at most StepTokens)
}

// EmbedConfig configures an Embedder. Zero fields take the defaults given.
type EmbedConfig struct {
	MaxQueue int              // waiting requests beyond which Embed fails with ErrQueueFull (default 64)
	Clock    func() time.Time // default time.Now
	OnStep   func(d time.Duration, seqs, tokens int)
}

// Embedder batches embedding requests: each step packs the inputs of the requests in flight, in
// the order they came, into one forward of up to StepTokens tokens, so that many small requests
// share a step and a large one is spread over several. A request's inputs are never split, and
// each fits a step alone (MaxTokens). It runs on a Loop, as the Scheduler does: FIFO admission,
// cancellation and shutdown at step boundaries.
type Embedder struct {
	m    EmbedModel
	loop *Loop[*embedJob]

	// Owned by the loop.
	active []*embedJob
	toks   []int32
	lens   []int
	owner  []*embedJob // the job of each sequence of the step
	out    []float32
}

// embedJob is one request: its inputs, their embeddings as they come, and how it ended.
type embedJob struct {
	inputs [][]int32
	vecs   [][]float32
	next   int // the first input not yet in a step
	filled int // embeddings computed, for inputs[:filled]
	dead   bool
	err    error
	cause  atomic.Int32
	done   chan struct{}
	once   sync.Once
}

func (j *embedJob) finish(err error) {
	j.once.Do(func() {
		j.err, j.dead = err, true
		close(j.done)
	})
}

// NewEmbedder makes an embedding scheduler over m; run its loop with Run.
func NewEmbedder(m EmbedModel, cfg EmbedConfig) (*Embedder, error) {
	if m == nil || m.Dim() <= 0 || m.StepTokens() <= 0 || m.MaxTokens() <= 0 || m.MaxTokens() > m.StepTokens() {
		return nil, errors.New("sched: embedding model reports no width, step or sequence length")
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = 64
	}
	e := &Embedder{m: m, toks: make([]int32, 0, m.StepTokens())}
	var err error
	e.loop, err = NewLoop[*embedJob]((*embedWork)(e), LoopConfig{MaxQueue: cfg.MaxQueue, Clock: cfg.Clock, Name: "embed step", OnStep: cfg.OnStep})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Dim is the width of the embeddings.
func (e *Embedder) Dim() int { return e.m.Dim() }

// MaxTokens is the most tokens one input may have.
func (e *Embedder) MaxTokens() int { return e.m.MaxTokens() }

// Run is the step loop; see Scheduler.Run.
func (e *Embedder) Run(ctx context.Context) error { return e.loop.Run(ctx) }

// Close ends every request queued or in flight (ErrClosed) and waits for Run to return.
func (e *Embedder) Close() error { return e.loop.Close() }

// Stats is the loop's counters.
func (e *Embedder) Stats() LoopStats { return e.loop.Stats() }

// Embed returns the embeddings of inputs, one per input, waiting for the steps that compute
// them. Errors: ErrInvalid (an empty input, or one longer than MaxTokens), ErrQueueFull,
// ErrClosed, ctx.Err() when ctx ends first.
func (e *Embedder) Embed(ctx context.Context, inputs [][]int32) ([][]float32, error) {
	if len(inputs) == 0 {
		return nil, fmt.Errorf("%w: no inputs", ErrInvalid)
	}
	for i, in := range inputs {
		if len(in) == 0 || len(in) > e.m.MaxTokens() {
			return nil, fmt.Errorf("%w: input %d has %d tokens, want 1..%d", ErrInvalid, i, len(in), e.m.MaxTokens())
		}
	}
	j := &embedJob{inputs: inputs, vecs: make([][]float32, len(inputs)), done: make(chan struct{})}
	if err := e.loop.Enqueue(j); err != nil {
		return nil, err
	}
	select {
	case <-j.done:
	case <-ctx.Done():
		j.cause.Store(causeCancel)
		e.loop.Wake()
		<-j.done
		return nil, ctx.Err()
	}
	if j.err != nil {
		return nil, j.err
	}
	return j.vecs, nil
}

type embedWork Embedder

func (w *embedWork) Reap(time.Time) {
	e := (*Embedder)(w)
	for _, j := range e.active {
		if j.cause.Load() != causeNone {
			j.finish(context.Canceled)
		}
	}
	e.compact()
}

func (w *embedWork) Expire(j *embedJob, _ time.Time) bool {
	if j.cause.Load() == causeNone {
		return false
	}
	j.finish(context.Canceled)
	return true
}

func (w *embedWork) Admit(j *embedJob) bool {
	w.active = append(w.active, j)
	return true
}

func (w *embedWork) Abort(j *embedJob) { j.finish(ErrClosed) }

func (w *embedWork) Shutdown() {
	for _, j := range w.active {
		j.finish(ErrClosed)
	}
	w.active = w.active[:0]
}

func (w *embedWork) Step(time.Time) (seqs, tokens int, busy bool) { return (*Embedder)(w).step() }

// compact drops the jobs that ended.
func (e *Embedder) compact() {
	k := 0
	for _, j := range e.active {
		if !j.dead {
			e.active[k] = j
			k++
		}
	}
	clear(e.active[k:])
	e.active = e.active[:k]
}

// step packs the next inputs of the jobs in flight, oldest first, into one forward.
func (e *Embedder) step() (seqs, tokens int, busy bool) {
	if len(e.active) == 0 {
		return 0, 0, false
	}
	e.toks, e.lens, e.owner = e.toks[:0], e.lens[:0], e.owner[:0]
	room := e.m.StepTokens()
pack:
	for _, j := range e.active {
		for ; j.next < len(j.inputs); j.next++ {
			in := j.inputs[j.next]
			if len(in) > room {
				break pack
			}
			e.toks = append(e.toks, in...)
			e.lens = append(e.lens, len(in))
			e.owner = append(e.owner, j)
			room -= len(in)
		}
	}
	dim := e.m.Dim()
	if need := len(e.lens) * dim; cap(e.out) < need {
		e.out = make([]float32, need)
	}
	out := e.out[:len(e.lens)*dim]
	if err := e.m.Embed(e.toks, e.lens, out); err != nil {
		for _, j := range e.owner {
			j.finish(fmt.Errorf("sched: embedding step: %w", err))
		}
		e.compact()
		return len(e.lens), len(e.toks), true
	}
	for i, j := range e.owner {
		// A job's inputs enter steps in order.
		j.vecs[j.filled] = append([]float32(nil), out[i*dim:(i+1)*dim]...)
		if j.filled++; j.filled == len(j.vecs) {
			j.finish(nil)
		}
	}
	e.compact()
	return len(e.lens), len(e.toks), true
}
