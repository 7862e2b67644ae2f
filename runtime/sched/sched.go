// Package sched owns continuous batching: one goroutine (Scheduler.Run in the server; the
// command line's own, stepping it with Scheduler.Step) owns a model, its KV-cache block pool and
// every sequence in flight, and each step admits waiting requests, builds one batch from every
// decoding sequence's next token plus chunks of pending prompts, runs one forward pass, samples
// each sequence that produced logits and streams its tokens, decoded, to the requester: the
// scheduler is where generated tokens become text (Text).
//
// The machinery under it is shared by every kind of model: a Loop owns the bounded FIFO queue,
// admission from its head, cancellation and deadlines at step boundaries, shutdown and per-step
// accounting, and steps a Work. The Scheduler is the Work of language models; Whisper's scheduler
// (runtime/sched/asr) is another, whose step encodes a window for one transcription and runs one
// batched decoder forward over every transcription's hypotheses.
//
// Admission is conservative: a request leaves the FIFO queue only when the blocks for its whole
// prompt plus MaxTokens (for all of its N sequences) are free, and takes them at once. A running
// sequence therefore never runs out of cache, nothing is preempted, and the queue head is never
// overtaken, so no request starves and the loop cannot deadlock or thrash. The cost is that a
// request that stops early held blocks it did not need until it stopped.
//
// N > 1: the first sequence processes the whole prompt. When its prompt is done, the other N-1
// sequences fork its KV blocks up to F = the last block boundary before the final prompt token
// (kvcache.Seq.Fork shares whole blocks only) and each re-feeds prompt[F:] (1 to BlockSize
// tokens) to get logits of its own. Sequence 0 samples with seed Sampling.Seed itself (so that a
// one-sequence request reproduces the CLI's --seed) and sequence i > 0 with SeqSeed(Sampling.Seed,
// i), a mix of both: the sequences of seeds s and s+1 are unrelated, not shifted copies.
//
// Prefix cache (Config.PrefixCache): when the prompt of a sequence has been processed, its whole
// blocks (those holding prompt tokens only) stay in a cache keyed by their tokens and those before
// them. A later request whose prompt starts with the same whole blocks shares them (as Fork does)
// and feeds only the rest of its prompt: at least its last token, so that it gets logits. Only
// prefixes starting at position 0 are shared, since positions are absolute. Blocks that no
// running sequence holds are evicted, least recently used first, when admission needs them, and
// admission counts them as free, so the cache never makes a request wait.
//
// Prompt log-probabilities (Request.PromptLogprobs): sequence 0 of such a request reports, for
// every prompt token after the first, its log-probability given the tokens before it, read from
// the logits at the position before it (Event.Prompt). Its prompt chunks therefore need a logits
// row for every token fed, the prompt's last excepted (whose row is the usual sampling row, or
// none when MaxTokens is 0: scoring only). Rows are few (Model.MaxSeqs per step), so such a
// chunk is cut to the rows no other sequence of the step may need: every active sequence keeps
// one row of its own, and the rest are shared in turn by the scoring sequences, so a scoring
// sequence still feeds at least one token a step. It takes nothing from the prefix cache, since
// every position's logits have to be computed, but inserts its blocks as any other does.
package sched

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/kvcache"
)

// LevelTrace is the level of the scheduler's per-step log records.
const LevelTrace = slog.LevelDebug - 4

// Model is what the scheduler steps: one batched forward over the tokens of several sequences,
// whose KV-cache blocks come from Pool. *llama.Context satisfies it through LlamaModel.
type Model interface {
	Forward(tokens []int32, b *backend.Batch, out []int32, logits []float32) error
	Pool() *kvcache.Pool
	Vocab() int      // logits per row
	StepTokens() int // most tokens one Forward takes: the step width
	MaxSeqs() int    // most logit rows one Forward returns
}

// Picker is a Model that also finds the next token of some rows as the argmax of their logits
// itself (llama.Context.ForwardPick): ids[i] for batch row pick[i], -1 where the row holds a NaN
// or +Inf or no value above -Inf, with the logits of the rows in out as Forward gives them. The
// scheduler picks the tokens of greedy sequences that report no log-probabilities this way, so
// that a GPU hands over their ids, not their logits.
type Picker interface {
	ForwardPick(tokens []int32, b *backend.Batch, out []int32, logits []float32, pick, ids []int32) error
}

// Drawer is a Picker that also chooses the tokens of sampling rows where their logits are
// (llama.Context.ForwardDraw): draws[i] says how row pick[i]'s token is chosen (backend.Draw:
// the argmax where its Temperature is 0). DrawsWhereLogitsAre reports whether the draws are made
// there (a backend.Drawer: on a GPU, only the ids leave the device); the scheduler draws
// sampling sequences that have no logit bias, penalties or log-probabilities through ForwardDraw
// only then (decode.Sampler.Drawable), and samples the others from their logits.
type Drawer interface {
	Picker
	ForwardDraw(tokens []int32, b *backend.Batch, out []int32, logits []float32, pick []int32, draws []backend.Draw, ids []int32) error
	DrawsWhereLogitsAre() bool
}

// Text turns tokens into text and knows the end-of-generation set: the model's tokenizer
// (models.Text). The scheduler is where generated tokens become text.
type Text interface {
	Piece(id int32) []byte
	IsEOG(id int32) bool
}

// Config configures a Scheduler. Zero fields take the defaults given.
type Config struct {
	MaxQueue   int              // waiting requests beyond which Submit fails with ErrQueueFull (default 64)
	StepTokens int              // token budget per step, decode tokens plus prompt chunks (default and most: Model.StepTokens())
	MaxActive  int              // most sequences in flight (default and most: min(Model.MaxSeqs(), StepTokens))
	MaxContext int              // if > 0, prompt+MaxTokens beyond it is ErrTooLong (the model's training context)
	Clock      func() time.Time // default time.Now
	Logger     *slog.Logger     // per-step records only at LevelTrace; default discards

	// PrefixCache keeps processed prompt blocks for reuse by later prompts with the same prefix
	// (see the package comment). Off by default.
	PrefixCache bool

	// OnStep, if set, is called after each step that ran a forward pass, with the step's duration,
	// the sequences and the tokens in its batch. It runs on the step loop's goroutine, which it
	// holds up: it must be fast and must not call the Scheduler.
	OnStep func(d time.Duration, seqs, tokens int)
}

// Request is one generation of N sequences sharing a prompt.
type Request struct {
	Prompt      []int32 // token ids, BOS included if wanted (copied by Submit)
	MaxTokens   int     // > 0 (or 0 with PromptLogprobs and N 1: score the prompt only); tokens generated per sequence at most
	Sampling    decode.Params
	Stop        []string
	IgnoreEOS   bool
	TopLogprobs int  // alternatives per token (0..decode.MaxTopLogprobs)
	Logprobs    bool // report Event.Logprob even when TopLogprobs is 0
	N           int  // sequences sharing the prompt (0 means 1); their prompt KV blocks are shared
	Deadline    time.Time

	// PromptLogprobs reports the log-probability of every prompt token after the first given
	// those before it (with TopLogprobs alternatives), as events of sequence 0 with Prompt set,
	// in prompt order, before any generated token's event. See the package comment.
	PromptLogprobs bool
}

// Reasons beyond decode's stop reasons.
const (
	ReasonCancelled                   = decode.StopCancelled
	ReasonTimeout   decode.StopReason = "timeout"
	ReasonError     decode.StopReason = "error"
)

// Event is one piece of a sequence's output. Tokens come decoded: Text is the output to show,
// Piece and TopPieces the bytes that log-probabilities name each token by, so that a receiver
// never turns a token into text itself.
type Event struct {
	Seq     int                   // which of the N sequences
	Prompt  bool                  // Token is a prompt token, scored (Request.PromptLogprobs): no Text, never Done
	Token   int32                 // -1 for a final text flush
	Piece   []byte                // Token's bytes (Text.Piece: shared, not to be modified); nil when Token is -1
	Text    []byte                // text safe to show now (owned by the receiver)
	Logprob float64               // when Request.Logprobs or TopLogprobs > 0
	Top     []decode.TokenLogprob // owned by the receiver
	// TopPieces are the bytes of Top's tokens, in order (the slice owned by the receiver, the
	// pieces shared as Piece).
	TopPieces [][]byte
	Done      bool              // last event of this sequence
	Reason    decode.StopReason // when Done: eos | stop | length | cancelled | timeout | error
	Err       error             // when Reason is error
}

// Usage counts a request's tokens: the prompt once, and every sampled token of every sequence
// (an end-of-generation token included).
type Usage struct{ PromptTokens, CompletionTokens int }

// Errors of Submit and Run.
var (
	ErrQueueFull = errors.New("sched: queue full")
	ErrTooLong   = errors.New("sched: prompt and token limit do not fit the KV cache")
	ErrClosed    = errors.New("sched: scheduler closed")
	ErrInvalid   = errors.New("sched: invalid request")
)

// Stats is a snapshot for metrics.
type Stats struct {
	Queued          int // requests waiting
	Active          int // sequences in flight
	KVBlocksUsed    int
	KVBlocksFree    int
	PromptTokens    uint64 // prompt tokens processed (re-fed tokens of forked sequences included, those from the prefix cache not)
	GeneratedTokens uint64
	Steps           uint64
	LastStep        time.Duration
	LastBatchTokens int
	LastBatchSeqs   int    // sequences in the last batch
	PrefixHitTokens uint64 // prompt tokens taken from the prefix cache instead of processed
	CachedBlocks    int    // blocks the prefix cache holds (counted in KVBlocksUsed; those no sequence shares are reclaimable)
	IdleBlocks      int    // the cached blocks no sequence shares: freed, least recently used first, when admission needs them
	BlockSize       int    // positions per KV-cache block
}

const (
	causeNone int32 = iota
	causeCancel
	causeTimeout
)

// Stream is the output of one request. Its events queue without bound, so the scheduler never
// waits on a receiver, and take memory only while they wait: a receiver that keeps up reuses one
// small buffer.
type Stream struct {
	mu    sync.Mutex
	buf   []Event // events not yet received, from head on
	head  int
	ended bool          // after the last event
	ready chan struct{} // one token: events arrived, or the stream ended

	cause   atomic.Int32
	s       *Scheduler
	usage   Usage
	stopCtx func() bool
	timer   *time.Timer // wakes the loop at the request's deadline, which it may otherwise sleep through
}

// put queues ev; last ends the stream after it.
func (st *Stream) put(ev Event, last bool) {
	st.mu.Lock()
	st.buf = append(st.buf, ev)
	st.ended = st.ended || last
	st.mu.Unlock()
	st.signal()
}

// end ends the stream.
func (st *Stream) end() {
	st.mu.Lock()
	st.ended = true
	st.mu.Unlock()
	st.signal()
}

func (st *Stream) signal() {
	select {
	case st.ready <- struct{}{}:
	default:
	}
}

// Next returns the request's next event, waiting for it until ctx is done (ctx.Err()). After
// every sequence's Done event it returns io.EOF.
func (st *Stream) Next(ctx context.Context) (Event, error) {
	for {
		st.mu.Lock()
		if st.head < len(st.buf) {
			ev := st.buf[st.head]
			st.buf[st.head] = Event{}
			if st.head++; st.head == len(st.buf) {
				st.buf, st.head = st.buf[:0], 0
			}
			st.mu.Unlock()
			return ev, nil
		}
		ended := st.ended
		st.mu.Unlock()
		if ended {
			return Event{}, io.EOF
		}
		select {
		case <-st.ready:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Ready reports whether Next would return at once: an event is waiting, or the stream has ended.
func (st *Stream) Ready() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.head < len(st.buf) || st.ended
}

// Events iterates over the request's events, waiting for each, up to its last.
func (st *Stream) Events() iter.Seq[Event] {
	return func(yield func(Event) bool) {
		for {
			ev, err := st.Next(context.Background())
			if err != nil || !yield(ev) {
				return
			}
		}
	}
}

// Usage is valid once Next has returned io.EOF.
func (st *Stream) Usage() Usage { return st.usage }

// MaxSeqs is the most sequences one request may ask for (Request.N): Config.MaxActive.
func (s *Scheduler) MaxSeqs() int { return s.cfg.MaxActive }

// Cancel ends the request at the next step boundary (Reason "cancelled"), releasing its blocks.
func (st *Stream) Cancel() {
	if st.cause.CompareAndSwap(causeNone, causeCancel) {
		st.s.wakeup()
	}
}

// request is one admitted or waiting request; owned by Run once queued.
type request struct {
	st        *Stream
	prompt    []int32
	maxTokens int
	topN      int
	logprobs  bool
	scores    bool // reports prompt log-probabilities (Request.PromptLogprobs)
	deadline  time.Time
	n         int
	length    int // positions each sequence needs: prompt + maxTokens - 1 (prompt when maxTokens is 0)
	fork      int // F: positions the other sequences share with the first
	blocks    int // blocks the whole request takes
	childOwn  int // blocks each forked sequence takes of its own
	promised  int // blocks promised to sequences not yet forked
	seqs      []*seqState
	ended     int // sequences that sent Done
}

type seqState struct {
	r        *request
	idx      int
	kv       *kvcache.Seq // nil until admitted (sequence 0) or forked (others)
	pin      *node        // deepest prefix-cache node whose path kv holds, if any
	feed     []int32      // prompt tokens still to process
	last     int32        // token to feed next when decoding
	decoding bool
	done     bool
	scores   bool // reports the log-probabilities of its prompt tokens (sequence 0 of a scoring request)
	nfeed    int  // tokens in the current batch
	pick     bool // its tokens are the argmax of its logits, found by the model (Picker)
	draw     bool // its tokens are drawn by the model (Drawer)
	sampler  *decode.Sampler
	stopper  *decode.Stopper
	topBuf   []decode.TokenLogprob
	textSlab []byte
	tops     *topSlab // where the events' alternatives are copied to, from ntop on
	ntop     int
}

const (
	textSlabSize = 2048
	topSlabSize  = 256 // at least decode.MaxTopLogprobs
)

// Scheduler steps many sequences through one Model. See the package comment.
type Scheduler struct {
	m      Model
	t      Text
	cfg    Config
	clock  func() time.Time
	log    *slog.Logger
	pool   *kvcache.Pool
	vocab  int
	eog    []int32
	bs     int
	blocks int

	loop *Loop[*request] // queue, admission order, step accounting, shutdown

	// Owned by Run.
	active   []*seqState
	ending   []*Stream // streams to end after the step is counted (flush)
	nseqs    int       // sequences of admitted requests, forked or not
	promised int
	bb       kvcache.BatchBuilder
	toks     []int32
	out      []int32
	rows     []*seqState
	part     []*seqState
	logits   []float32
	picker   Picker         // m, when it is one
	drawer   Drawer         // m, when it is one that draws where the logits are
	lout     []int32        // the batch rows of out whose logits are handed over
	pick     []int32        // and those whose token the model finds
	draws    []backend.Draw // how, for each of pick (when a row of the step is drawn)
	ndraw    int            // rows of the step that are drawn
	ids      []int32        // the tokens found for pick
	where    []int32        // for rows[i]: its row of logits (>= 0), or -1-k for ids[k]
	cache    *prefixCache   // nil when Config.PrefixCache is off
	maxRows  int            // most logit rows one step returns: Model.MaxSeqs and the logits buffer

	// Scoring rows of the step (Request.PromptLogprobs): batch row scoreOut[i] of sequence
	// scoreSeq[i] gives the log-probability of its prompt token scoreTok[i]; its logits follow
	// those of the sampling rows in lout.
	scoreOut  []int32
	scoreSeq  []*seqState
	scoreTok  []int32
	scoreBase int // the first scoring row's index in lout
	nscoring  int // scoring sequences in the step's batch

	promptTok, genTok, hitTok                     atomic.Uint64
	nActive, usedBlocks, cachedBlocks, idleBlocks atomic.Int32
}

// New makes a scheduler for m and t. The pool of m must be empty and is owned by the scheduler
// from now on.
func New(m Model, t Text, cfg Config) (*Scheduler, error) {
	if m == nil || t == nil {
		return nil, errors.New("sched: nil model or text")
	}
	pool := m.Pool()
	if pool == nil {
		return nil, errors.New("sched: model has no KV block pool")
	}
	vocab := m.Vocab()
	if vocab <= 0 || vocab > decode.MaxVocab || m.StepTokens() <= 0 || m.MaxSeqs() <= 0 {
		return nil, fmt.Errorf("sched: model reports vocabulary %d, %d tokens and %d rows per step", vocab, m.StepTokens(), m.MaxSeqs())
	}
	if cfg.StepTokens == 0 {
		cfg.StepTokens = m.StepTokens()
	}
	if cfg.StepTokens < 1 || cfg.StepTokens > m.StepTokens() {
		return nil, fmt.Errorf("sched: step budget %d outside 1..%d tokens", cfg.StepTokens, m.StepTokens())
	}
	most := min(m.MaxSeqs(), cfg.StepTokens)
	if cfg.MaxActive == 0 {
		cfg.MaxActive = most
	}
	if cfg.MaxActive < 1 || cfg.MaxActive > most {
		return nil, fmt.Errorf("sched: %d active sequences outside 1..%d (rows per step and step budget)", cfg.MaxActive, most)
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = 64
	}
	if cfg.MaxQueue < 0 || cfg.MaxContext < 0 {
		return nil, fmt.Errorf("sched: negative queue %d or context %d", cfg.MaxQueue, cfg.MaxContext)
	}
	s := &Scheduler{
		m: m, t: t, cfg: cfg, clock: cfg.Clock, log: cfg.Logger, pool: pool, vocab: vocab,
		bs: pool.BlockSize(), blocks: pool.Blocks(),
		active: make([]*seqState, 0, cfg.MaxActive),
		ending: make([]*Stream, 0, cfg.MaxActive),
		toks:   make([]int32, 0, cfg.StepTokens),
		out:    make([]int32, 0, cfg.MaxActive),
		rows:   make([]*seqState, 0, cfg.MaxActive),
		part:   make([]*seqState, 0, cfg.MaxActive),
		logits: make([]float32, cfg.MaxActive*vocab),
		lout:   make([]int32, 0, cfg.MaxActive),
		pick:   make([]int32, 0, cfg.MaxActive),
		draws:  make([]backend.Draw, 0, cfg.MaxActive),
		ids:    make([]int32, cfg.MaxActive),
		where:  make([]int32, 0, cfg.MaxActive),
	}
	s.maxRows = min(m.MaxSeqs(), len(s.logits)/vocab)
	s.scoreOut = make([]int32, 0, s.maxRows)
	s.scoreSeq = make([]*seqState, 0, s.maxRows)
	s.scoreTok = make([]int32, 0, s.maxRows)
	s.picker, _ = m.(Picker)
	if d, ok := m.(Drawer); ok && d.DrawsWhereLogitsAre() {
		s.drawer = d
	}
	if s.clock == nil {
		s.clock = time.Now
	}
	var err error
	s.loop, err = NewLoop[*request]((*llmWork)(s), LoopConfig{MaxQueue: cfg.MaxQueue, Clock: s.clock,
		Logger: cfg.Logger, Name: "sched step", OnStep: cfg.OnStep})
	if err != nil {
		return nil, err
	}
	if cfg.PrefixCache {
		s.cache = newPrefixCache(s.bs)
	}
	for id := range int32(vocab) {
		if t.IsEOG(id) {
			s.eog = append(s.eog, id)
		}
	}
	s.usedBlocks.Store(int32(s.blocks - pool.FreeBlocks()))
	return s, nil
}

func (s *Scheduler) wakeup() { s.loop.Wake() }

// Stats returns a snapshot of the scheduler's counters. Safe to call from any goroutine.
func (s *Scheduler) Stats() Stats {
	l := s.loop.Stats()
	used := int(s.usedBlocks.Load())
	return Stats{
		Queued: l.Queued, Active: int(s.nActive.Load()), KVBlocksUsed: used, KVBlocksFree: s.blocks - used,
		PromptTokens: s.promptTok.Load(), GeneratedTokens: s.genTok.Load(), Steps: l.Steps,
		LastStep: l.LastStep, LastBatchTokens: l.LastBatchTokens, LastBatchSeqs: l.LastBatchSeqs,
		PrefixHitTokens: s.hitTok.Load(), CachedBlocks: int(s.cachedBlocks.Load()),
		IdleBlocks: int(s.idleBlocks.Load()), BlockSize: s.bs,
	}
}

// Submit validates r and queues it. ErrQueueFull: MaxQueue requests are waiting; ErrTooLong: the
// prompt plus MaxTokens, for all N sequences, exceeds the whole pool (or Config.MaxContext);
// errors wrapping ErrInvalid: the request is malformed; ErrClosed: the scheduler is closing.
// When ctx is done the request ends as if cancelled ("timeout" if its deadline passed).
func (s *Scheduler) Submit(ctx context.Context, r *Request) (*Stream, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil request", ErrInvalid)
	}
	p := len(r.Prompt)
	n := r.N
	if n == 0 {
		n = 1
	}
	switch {
	case p == 0:
		return nil, fmt.Errorf("%w: empty prompt", ErrInvalid)
	case r.MaxTokens < 0 || (r.MaxTokens == 0 && !r.PromptLogprobs):
		return nil, fmt.Errorf("%w: token limit %d, want > 0", ErrInvalid, r.MaxTokens)
	case r.MaxTokens == 0 && n != 1:
		return nil, fmt.Errorf("%w: %d sequences scoring the prompt only (token limit 0), want 1", ErrInvalid, n)
	case n < 0 || n > s.cfg.MaxActive:
		return nil, fmt.Errorf("%w: %d sequences, want 1..%d", ErrInvalid, r.N, s.cfg.MaxActive)
	case r.TopLogprobs < 0 || r.TopLogprobs > decode.MaxTopLogprobs:
		return nil, fmt.Errorf("%w: %d top log-probabilities, want 0..%d", ErrInvalid, r.TopLogprobs, decode.MaxTopLogprobs)
	}
	for i, id := range r.Prompt {
		if id < 0 || int(id) >= s.vocab {
			return nil, fmt.Errorf("%w: prompt token %d is %d, outside the vocabulary of %d", ErrInvalid, i, id, s.vocab)
		}
	}
	slots := s.blocks * s.bs
	if p > slots || r.MaxTokens > slots || (s.cfg.MaxContext > 0 && p+r.MaxTokens > s.cfg.MaxContext) {
		return nil, fmt.Errorf("%w: %d prompt tokens and %d to generate, cache of %d positions", ErrTooLong, p, r.MaxTokens, slots)
	}
	q := &request{prompt: append([]int32(nil), r.Prompt...), maxTokens: r.MaxTokens, topN: r.TopLogprobs,
		logprobs: r.Logprobs || r.TopLogprobs > 0, scores: r.PromptLogprobs, deadline: r.Deadline, n: n,
		length: p + max(r.MaxTokens-1, 0)}
	q.blocks = s.pool.BlocksFor(q.length)
	if n > 1 {
		q.fork = (p - 1) / s.bs * s.bs
		q.childOwn = q.blocks - q.fork/s.bs
		q.blocks += (n - 1) * q.childOwn
	}
	if q.blocks > s.blocks {
		return nil, fmt.Errorf("%w: %d sequences of %d prompt tokens and %d to generate take %d blocks, the cache has %d", ErrTooLong, n, p, r.MaxTokens, q.blocks, s.blocks)
	}
	sp := r.Sampling
	sp.TopLogprobs = r.TopLogprobs
	sc := decode.StopConfig{VocabSize: s.vocab, Stop: r.Stop, MaxTokens: r.MaxTokens}
	if !r.IgnoreEOS {
		sc.EOG = s.eog
	}
	q.seqs = make([]*seqState, n)
	for i := range q.seqs {
		sp.Seed = SeqSeed(r.Sampling.Seed, i)
		smp, err := decode.NewSampler(sp, s.vocab)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if err := smp.AcceptPrompt(q.prompt); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		stp, err := decode.NewStopper(sc)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		_, drawable := smp.Drawable()
		q.seqs[i] = &seqState{r: q, idx: i, sampler: smp, stopper: stp, topBuf: make([]decode.TokenLogprob, 0, r.TopLogprobs),
			scores: r.PromptLogprobs && i == 0,
			pick:   s.picker != nil && smp.ArgmaxOnly() && !q.logprobs,
			draw:   s.drawer != nil && drawable && !q.logprobs}
	}
	st := &Stream{s: s, ready: make(chan struct{}, 1)}
	st.usage.PromptTokens = p
	q.st = st

	// The context watch is set up before the request is queued: once queued, the step loop owns
	// the stream's fields.
	if ctx != nil && ctx.Done() != nil {
		st.stopCtx = context.AfterFunc(ctx, func() {
			c := causeCancel
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				c = causeTimeout
			}
			if st.cause.CompareAndSwap(causeNone, c) {
				s.wakeup()
			}
		})
	}
	if !r.Deadline.IsZero() {
		st.timer = time.AfterFunc(time.Until(r.Deadline), s.wakeup)
	}
	if err := s.loop.Enqueue(q); err != nil {
		if st.stopCtx != nil {
			st.stopCtx()
		}
		if st.timer != nil {
			st.timer.Stop()
		}
		return nil, err
	}
	return st, nil
}

// SeqSeed is the sampling seed of sequence i of a request seeded with seed: seed itself for
// sequence 0, and for i > 0 the i-th output of SplitMix64 started at seed, so that no sequence
// of one seed repeats a sequence of a nearby seed (as seed+i would: seed 1's sequence 1 would be
// seed 2's sequence 0).
func SeqSeed(seed uint64, i int) uint64 {
	if i == 0 {
		return seed
	}
	z := seed + uint64(i)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Close stops accepting requests, ends those queued or in flight (Reason "cancelled") and waits
// for Run to return.
func (s *Scheduler) Close() error { return s.loop.Close() }

// Run is the step loop; it returns nil after Close, or ctx.Err() when ctx is done (ending every
// request with Reason "cancelled" and refusing new ones). It may be called once.
func (s *Scheduler) Run(ctx context.Context) error { return s.loop.Run(ctx) }

// Step runs one step of the loop on the caller's goroutine, for a caller that drives the
// scheduler itself instead of running Run (the command line, which serves one client): it ends
// the requests cancelled or past their deadline, admits what fits and runs one batch. The events
// of the step are in their streams when it returns, and a stream whose request ended in it has
// ended (Stream.Ready, Next). It reports whether there was anything to run. A scheduler is
// driven by Step or by Run, never both.
func (s *Scheduler) Step() bool { return s.loop.Step() }

// llmWork is the Scheduler as the Work its Loop steps.
type llmWork Scheduler

func (w *llmWork) Reap(now time.Time)                       { (*Scheduler)(w).reap(now) }
func (w *llmWork) Admit(r *request) bool                    { return (*Scheduler)(w).admit(r) }
func (w *llmWork) Step(time.Time) (seqs, toks int, ok bool) { return (*Scheduler)(w).step() }
func (w *llmWork) Abort(r *request)                         { (*Scheduler)(w).endRequest(r, ReasonCancelled, nil) }
func (w *llmWork) Shutdown()                                { (*Scheduler)(w).shutdown() }
func (w *llmWork) Flush()                                   { (*Scheduler)(w).flush() }

func (w *llmWork) Expire(r *request, now time.Time) bool {
	why := expired(r, now)
	if why == decode.NotStopped {
		return false
	}
	(*Scheduler)(w).endRequest(r, why, nil)
	return true
}

// shutdown ends every admitted request; the Loop has ended the queued ones.
func (s *Scheduler) shutdown() {
	for _, q := range s.active {
		if !q.done {
			s.endRequest(q.r, ReasonCancelled, nil)
		}
	}
	s.compact()
	if s.cache != nil {
		s.cache.clear()
	}
	s.publish()
	s.flush()
}

// expired reports why r must end now, if it must.
func expired(r *request, now time.Time) decode.StopReason {
	switch r.st.cause.Load() {
	case causeCancel:
		return ReasonCancelled
	case causeTimeout:
		return ReasonTimeout
	}
	if !r.deadline.IsZero() && !now.Before(r.deadline) {
		return ReasonTimeout
	}
	return decode.NotStopped
}

// step runs one forward pass over every admitted sequence (the Loop has reaped and admitted)
// and reports the sequences and tokens of its batch, and whether there was anything to run.
func (s *Scheduler) step() (seqs, tokens int, busy bool) {
	if len(s.active) == 0 {
		s.publish()
		return 0, 0, false
	}
	s.bb.Reset()
	s.toks, s.out, s.rows, s.part = s.toks[:0], s.out[:0], s.rows[:0], s.part[:0]
	for _, q := range s.active {
		if q.decoding {
			s.add(q, 1)
			s.toks = append(s.toks, q.last)
			s.out = append(s.out, int32(len(s.toks)-1))
			s.rows = append(s.rows, q)
		}
	}
	budget := s.cfg.StepTokens - len(s.toks)
	s.scoreOut, s.scoreSeq, s.scoreTok, s.nscoring = s.scoreOut[:0], s.scoreSeq[:0], s.scoreTok[:0], 0
	spare := s.maxRows - len(s.active) // logit rows beyond one for every active sequence
	for _, q := range s.active {
		if budget == 0 {
			break
		}
		if q.decoding || len(q.feed) == 0 {
			continue
		}
		k := min(budget, len(q.feed))
		if q.scores {
			// A row for every token fed (the prompt's last one's is its sampling row, if any):
			// its own and the spare ones left.
			k = min(k, 1+max(spare, 0))
			spare -= k - 1
			s.scoreChunk(q, k)
		}
		s.add(q, k)
		s.toks = append(s.toks, q.feed[:k]...)
		if k == len(q.feed) && q.r.maxTokens > 0 {
			s.out = append(s.out, int32(len(s.toks)-1))
			s.rows = append(s.rows, q)
		}
		budget -= k
	}
	if len(s.toks) == 0 {
		s.publish()
		return 0, 0, false
	}
	if err := s.forward(); err != nil {
		for _, q := range s.part {
			if !q.done {
				s.endRequest(q.r, ReasonError, err)
			}
		}
		return s.finishStep()
	}
	for _, q := range s.part {
		if err := q.kv.Advance(q.nfeed); err != nil {
			s.endRequest(q.r, ReasonError, err)
			continue
		}
		if !q.decoding {
			q.feed = q.feed[q.nfeed:]
			s.promptTok.Add(uint64(q.nfeed))
		}
	}
	if s.nscoring > 0 {
		s.scored()
	}
	for i, q := range s.rows {
		if q.done {
			continue
		}
		if !q.decoding && q.idx == 0 {
			if s.cache != nil {
				q.pin = s.cache.insert(q.pin, q.r.prompt, q.kv)
			}
			if q.r.n > 1 {
				s.forkChildren(q.r)
			}
		}
		if w := int(s.where[i]); w >= 0 {
			s.sample(q, s.logits[w*s.vocab:(w+1)*s.vocab])
		} else {
			s.picked(q, s.ids[-1-w])
		}
	}
	return s.finishStep()
}

// forward runs the step's batch through the model: the logits of the rows that sample from
// them, and, when the model is a Picker, the argmax of those that only need it, and when it is
// a Drawer, the draws of those it can draw (their logits stay where the model computed them: on
// a GPU, on the device).
func (s *Scheduler) forward() error {
	s.lout, s.pick, s.draws, s.where, s.ndraw = s.lout[:0], s.pick[:0], s.draws[:0], s.where[:0], 0
	for i, q := range s.rows {
		if q.pick || q.draw {
			var d backend.Draw // the argmax
			if q.draw {
				d, _ = q.sampler.Drawable()
				d.Random = q.sampler.NextRandom()
				s.ndraw++
			}
			s.where = append(s.where, int32(-1-len(s.pick)))
			s.pick = append(s.pick, s.out[i])
			s.draws = append(s.draws, d)
		} else {
			s.where = append(s.where, int32(len(s.lout)))
			s.lout = append(s.lout, s.out[i])
		}
	}
	s.scoreBase = len(s.lout)
	s.lout = append(s.lout, s.scoreOut...)
	logits := s.logits[:len(s.lout)*s.vocab]
	switch {
	case len(s.pick) == 0:
		return s.m.Forward(s.toks, s.bb.Batch(), s.lout, logits)
	case s.ndraw == 0:
		return s.picker.ForwardPick(s.toks, s.bb.Batch(), s.lout, logits, s.pick, s.ids[:len(s.pick)])
	}
	return s.drawer.ForwardDraw(s.toks, s.bb.Batch(), s.lout, logits, s.pick, s.draws, s.ids[:len(s.pick)])
}

// scoreChunk lists the scoring rows of the next k prompt tokens of q, a scoring sequence, about to
// be added to the batch: the row of each position but the prompt's last gives the
// log-probability of the prompt token after it.
func (s *Scheduler) scoreChunk(q *seqState, k int) {
	s.nscoring++
	p := len(q.r.prompt)
	at := p - len(q.feed) // the prompt index of the chunk's first token
	for j := range min(k, p-1-at) {
		s.scoreOut = append(s.scoreOut, int32(len(s.toks)+j))
		s.scoreSeq = append(s.scoreSeq, q)
		s.scoreTok = append(s.scoreTok, int32(at+j+1))
	}
}

// scored emits the prompt log-probabilities of the step's scoring rows, and ends the scoring
// sequences that generate nothing (MaxTokens 0) whose prompt is done.
func (s *Scheduler) scored() {
	for i, q := range s.scoreSeq {
		if q.done {
			continue
		}
		w := s.scoreBase + i
		s.emitPrompt(q, q.r.prompt[s.scoreTok[i]], s.logits[w*s.vocab:(w+1)*s.vocab])
	}
	for _, q := range s.part {
		if !q.scores || q.done || q.decoding || len(q.feed) > 0 || q.r.maxTokens > 0 {
			continue
		}
		if s.cache != nil {
			q.pin = s.cache.insert(q.pin, q.r.prompt, q.kv)
		}
		s.endSeq(q, decode.StopLength, nil)
	}
}

// emitPrompt emits the log-probability of prompt token id of q under the logits ([vocab]) of the
// position before it.
func (s *Scheduler) emitPrompt(q *seqState, id int32, lg []float32) {
	r := q.r
	ev := Event{Seq: q.idx, Prompt: true, Token: id, Piece: s.t.Piece(id)}
	if r.topN > 0 {
		ev.Logprob, q.topBuf = decode.Logprobs(lg, id, r.topN, q.topBuf[:0])
		ev.Top, ev.TopPieces = q.copyTop(s.t, q.topBuf)
	} else {
		ev.Logprob = decode.Logprob(lg, id)
	}
	r.st.put(ev, false)
}

// add puts k tokens of q into the batch being built; room was reserved at admission.
func (s *Scheduler) add(q *seqState, k int) {
	// BatchBuilder.Add fails only when room was not reserved, which admission rules out.
	_ = s.bb.Add(q.kv, k)
	q.nfeed = k
	s.part = append(s.part, q)
}

func (s *Scheduler) finishStep() (seqs, tokens int, busy bool) {
	s.compact()
	s.publish()
	return len(s.part), len(s.toks), true
}

func (s *Scheduler) publish() {
	s.nActive.Store(int32(len(s.active)))
	s.publishBlocks()
}

func (s *Scheduler) publishBlocks() {
	s.usedBlocks.Store(int32(s.blocks - s.pool.FreeBlocks()))
	if s.cache != nil {
		s.cachedBlocks.Store(int32(len(s.cache.nodes)))
		s.idleBlocks.Store(int32(s.cache.idle))
	}
}

// compact drops finished sequences from the active list, keeping order.
func (s *Scheduler) compact() {
	j := 0
	for _, q := range s.active {
		if !q.done {
			s.active[j] = q
			j++
		}
	}
	clear(s.active[j:])
	s.active = s.active[:j]
}

// reap ends the admitted requests that were cancelled or ran past their deadline.
func (s *Scheduler) reap(now time.Time) {
	for _, q := range s.active {
		if q.done {
			continue
		}
		if why := expired(q.r, now); why != decode.NotStopped {
			s.endRequest(q.r, why, nil)
		}
	}
	s.compact()
}

// admit moves r, at the head of the queue, into the active set if its blocks are free (or held
// by the prefix cache alone) and MaxActive allows, and reports whether it did.
func (s *Scheduler) admit(r *request) bool {
	if s.nseqs+r.n > s.cfg.MaxActive {
		return false
	}
	var hit *node
	shared := 0 // blocks taken from the cache
	avail := s.pool.FreeBlocks() - s.promised
	if s.cache != nil {
		if !r.scores { // a scoring sequence computes every position itself
			hit, shared = s.cache.match(r.prompt)
		}
		avail += s.cache.idle - idleOn(hit)
	}
	need := r.blocks - shared
	if avail < need {
		return false
	}
	s.nseqs += r.n
	q := r.seqs[0]
	if s.cache != nil {
		s.cache.pin(hit) // before evicting, so that the shared blocks stay
		for s.pool.FreeBlocks()-s.promised < need && s.cache.evict() {
		}
	}
	if hit != nil {
		q.kv = s.cache.share(hit)
		q.pin = hit
		s.hitTok.Add(uint64(q.kv.Len()))
	} else {
		q.kv = s.pool.NewSeq(r.length)
	}
	if err := q.kv.Reserve(r.length - q.kv.Len()); err != nil {
		// Unreachable: the free and reclaimable blocks were counted above.
		s.endRequest(r, ReasonError, err)
		return true
	}
	q.feed = r.prompt[q.kv.Len():]
	r.promised = (r.n - 1) * r.childOwn
	s.promised += r.promised
	s.active = append(s.active, q)
	return true
}

// forkChildren gives sequences 1..n-1 of r the first r.fork positions of sequence 0 and the rest
// of the prompt to re-feed.
func (s *Scheduler) forkChildren(r *request) {
	parent := r.seqs[0]
	for _, c := range r.seqs[1:] {
		if c.done {
			continue
		}
		c.kv = parent.kv.Fork(r.fork)
		if s.cache != nil {
			c.pin = ancestor(parent.pin, r.fork/s.bs)
			s.cache.pin(c.pin)
		}
		if err := c.kv.Reserve(r.length - c.kv.Len()); err != nil {
			s.endRequest(r, ReasonError, err)
			return
		}
		s.promised -= r.childOwn
		r.promised -= r.childOwn
		c.feed = r.prompt[c.kv.Len():]
		s.active = append(s.active, c)
	}
}

// sample draws q's next token from its logits ([vocab]) and emits its event.
func (s *Scheduler) sample(q *seqState, lg []float32) {
	id, err := q.sampler.Sample(lg)
	s.emit(q, id, err, lg)
}

// picked emits id, the token of q that the model found (-1: none).
func (s *Scheduler) picked(q *seqState, id int32) {
	var err error
	if id < 0 {
		err = fmt.Errorf("sched: %w", backend.ErrNoArgmax)
	}
	s.emit(q, id, err, nil)
}

// emit records q's next token id (or ends q with err) and emits its event; lg are its logits,
// nil when q reports no log-probabilities.
func (s *Scheduler) emit(q *seqState, id int32, err error, lg []float32) {
	r := q.r
	if err == nil {
		err = q.sampler.Accept(id)
	}
	if err != nil {
		s.endSeq(q, ReasonError, err)
		return
	}
	q.decoding = true
	q.last = id
	r.st.usage.CompletionTokens++
	s.genTok.Add(1)
	ev := Event{Seq: q.idx, Token: id, Piece: s.t.Piece(id)}
	if r.topN > 0 {
		ev.Logprob, q.topBuf = decode.Logprobs(lg, id, r.topN, q.topBuf[:0])
		ev.Top, ev.TopPieces = q.copyTop(s.t, q.topBuf)
	} else if r.logprobs {
		ev.Logprob = decode.Logprob(lg, id)
	}
	released, reason := q.stopper.PushBytes(id, ev.Piece)
	ev.Text = q.copyText(released)
	switch reason {
	case decode.NotStopped:
		r.st.put(ev, false)
		return
	case decode.StopEOS:
		ev = Event{Seq: q.idx, Token: -1, Text: ev.Text}
	}
	ev.Done, ev.Reason = true, reason
	s.closeSeq(q, ev)
}

func (q *seqState) copyText(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	if len(b) > cap(q.textSlab)-len(q.textSlab) {
		q.textSlab = make([]byte, 0, max(textSlabSize, len(b)))
	}
	i := len(q.textSlab)
	q.textSlab = append(q.textSlab, b...)
	return q.textSlab[i:len(q.textSlab):len(q.textSlab)]
}

// copyTop copies t for an event, with the pieces of its tokens.
func (q *seqState) copyTop(x Text, t []decode.TokenLogprob) ([]decode.TokenLogprob, [][]byte) {
	if len(t) == 0 {
		return nil, nil
	}
	if q.tops == nil || len(t) > topSlabSize-q.ntop {
		q.tops, q.ntop = new(topSlab), 0
	}
	i, n := q.ntop, q.ntop+len(t)
	copy(q.tops.top[i:n], t)
	for k, a := range t {
		q.tops.pieces[i+k] = x.Piece(a.ID)
	}
	q.ntop = n
	return q.tops.top[i:n:n], q.tops.pieces[i:n:n]
}

// topSlab holds the alternatives of many events and their pieces, index for index: one
// allocation for both.
type topSlab struct {
	top    [topSlabSize]decode.TokenLogprob
	pieces [topSlabSize][]byte
}

// A request's alternatives (at most decode.MaxTopLogprobs) fit one slab.
var _ [topSlabSize - decode.MaxTopLogprobs]struct{}

// endSeq ends one sequence early: its held-back text is flushed with the Done event.
func (s *Scheduler) endSeq(q *seqState, why decode.StopReason, err error) {
	ev := Event{Seq: q.idx, Token: -1, Done: true, Reason: why, Err: err}
	if q.decoding {
		ev.Text = q.copyText(q.stopper.Finish())
	}
	s.closeSeq(q, ev)
}

// closeSeq sends q's last event and releases its blocks; the stream closes with its last sequence.
func (s *Scheduler) closeSeq(q *seqState, ev Event) {
	r := q.r
	q.done = true
	r.st.put(ev, false)
	if q.kv != nil {
		q.kv.Release()
	}
	if q.pin != nil {
		s.cache.unpin(q.pin)
		q.pin = nil
	}
	s.publishBlocks() // so that Stats shows the blocks free once Events is closed
	r.ended++
	if r.ended < r.n {
		return
	}
	if r.promised > 0 {
		s.promised -= r.promised
		r.promised = 0
	}
	if r.seqs[0].kv != nil { // admitted
		s.nseqs -= r.n
	}
	if r.st.stopCtx != nil {
		r.st.stopCtx()
	}
	if r.st.timer != nil {
		r.st.timer.Stop()
	}
	s.ending = append(s.ending, r.st)
}

// flush ends the streams of the requests that ended since the last flush. The Loop calls it
// after counting each step, so that Stats includes a request's last step once its stream ends.
func (s *Scheduler) flush() {
	for i, st := range s.ending {
		st.end()
		s.ending[i] = nil
	}
	s.ending = s.ending[:0]
}

// endRequest ends every sequence of r not yet done.
func (s *Scheduler) endRequest(r *request, why decode.StopReason, err error) {
	for _, q := range r.seqs {
		if !q.done {
			s.endSeq(q, why, err)
		}
	}
}
