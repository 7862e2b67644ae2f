// Package asr schedules speech recognition: the requests and results every recogniser family
// shares (Params, Result, Segment, Token, Word; SRT and WebVTT), the Recognizer interface the
// server and the command line use for any family, and each family's jobs. Whisper (NewWhisper)
// transcribes 30-second windows, encoding them pipelined with batched decoding, with beam search,
// best-of sampling and temperature fallback (runtime/decode) and language detection.
//
// Every recogniser is stepped by a sched.Loop, as the language models are: a bounded FIFO queue
// with admission from its head (queue, request), cancellation at step boundaries, one goroutine
// stepping everything admitted in batches, and per-step accounting (Config.OnStep, Stats). A
// family adds its job type and its sched.Work; the queue, the checks of the audio (checkAudio),
// the assembly of results (newResult, interpolate) and the live sessions (Live) are shared.
//
// Live transcription (Live) turns a stream of samples into partial and final text. Session is
// the Live of any Transcriber: it transcribes a sliding buffer again and again and settles text
// by local agreement. A family that decodes incrementally by nature (a streaming transducer)
// implements Streamer, and NewLive opens its own sessions instead: Parakeet's encode the stream
// in chunks (SessionConfig.Chunk, 1.6 s by default) with left context (LeftContext, 2 s) and a
// look-ahead (RightContext, 480 ms), keep each chunk's own encoder frames, and carry the
// decoder's state from chunk to chunk, so every token is decoded once. A chunk is a job of the
// recogniser's loop like a transcription (queue bound, cancellation, Close): the chunks of
// every stream waiting are encoded in one call and decoded in the same steps. An utterance ends
// on Commit, or when the decoder has seen Silence (600 ms) of blank frames after its last token.
//
// The models themselves (weights, forward passes) are in runtime/models/<family>, which import
// nothing of this package.
package asr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/sched"
)

// ErrQueueFull is returned when a recogniser's queue is full; the caller may retry later.
var ErrQueueFull = errors.New("asr: too many transcriptions queued")

// ErrClosed is returned for work submitted to, or cut short by, a closed recogniser.
var ErrClosed = errors.New("asr: recognizer closed")

// ErrBadRequest marks errors caused by the request: its parameters, or its audio.
var ErrBadRequest = errors.New("bad request")

// Transcriber transcribes recordings: 16 kHz mono samples. onSegment, if not nil, is called
// (from the recogniser's goroutine; it must not block) with each segment as it is finished.
type Transcriber interface {
	Transcribe(ctx context.Context, samples []float32, p Params, onSegment func(Segment)) (*Result, error)
}

// Recognizer is a speech recognition model scheduled for many requests at once: what the server
// and the command line use of any family. Whisper is one.
type Recognizer interface {
	Transcriber
	// TranscribeSource transcribes the recording src reads (an upload as an audio.File). The
	// transcription takes its place in the queue, or fails with ErrQueueFull, before src is
	// opened; once admitted it reads src as it goes, holding a bounded stretch of it whatever the
	// recording's length, and stops within a stretch when ctx ends. A recording of no samples is
	// an empty transcription. Errors reading src are returned as they are (audio.ErrCorrupt,
	// audio.ErrTooLong...). onSegment is as Transcribe's.
	TranscribeSource(ctx context.Context, src audio.Source, p Params, onSegment func(Segment)) (*Result, error)
	// DetectLanguage returns the probability of every language the model knows for the start of
	// samples. A model that cannot tell answers an error wrapping ErrBadRequest.
	DetectLanguage(ctx context.Context, samples []float32) ([]LangProb, error)
	// ResolveLanguage checks a requested language against the model: "" or "auto" means detect it
	// (code "", or the only language of a model that knows one); an ISO 639-1 code or an English
	// name gives its code. Errors wrap ErrBadRequest.
	ResolveLanguage(lang string) (code string, err error)
	// IsSpecial reports whether token id of a result is not text (timestamps, control tokens).
	IsSpecial(id int32) bool
	// Stats returns a snapshot of the scheduler's counters, for metrics. Safe from any goroutine.
	Stats() Stats
	// Close stops the recogniser; transcriptions in flight fail with ErrClosed.
	Close() error
}

// Config sizes a recogniser's scheduler.
type Config struct {
	// MaxActive is the number of transcriptions decoded together (each may run several
	// hypotheses in the same batched step).
	MaxActive int
	// MaxQueue is the number of transcriptions waiting beyond MaxActive.
	MaxQueue int
	// MelThreads computes features with this many goroutines per request (default 2).
	MelThreads int
	// EncodeBatch is the most stretches of audio (Whisper: 30 s windows, of different
	// transcriptions) encoded in one batched encoder call (default 1, at most MaxActive). On a
	// CPU a window's encoder is compute-bound and batching gains nothing, while a larger call
	// delays the transcriptions whose windows it holds until all are done; a GPU gains from
	// larger batches.
	EncodeBatch int
	// OnStep, if set, is called after each step with its duration and the hypotheses and tokens
	// of its decoder batch (see sched.LoopConfig.OnStep).
	OnStep func(d time.Duration, seqs, tokens int)
	// Logger receives per-step records at sched.LevelTrace only; default discards.
	Logger *slog.Logger
}

// withDefaults checks c and fills in its defaults, def transcriptions decoded together where
// MaxActive is not set.
func (c Config) withDefaults(def int) (Config, error) {
	if c.MaxActive <= 0 {
		c.MaxActive = def
	}
	if c.MaxQueue < 0 {
		return c, errors.New("asr: negative queue size")
	}
	if c.MelThreads <= 0 {
		c.MelThreads = 2
	}
	if c.EncodeBatch <= 0 {
		c.EncodeBatch = 1
	}
	if c.EncodeBatch > c.MaxActive {
		return c, fmt.Errorf("asr: %d windows encoded per step, more than the %d transcriptions decoded together", c.EncodeBatch, c.MaxActive)
	}
	return c, nil
}

// Stats is a snapshot of a recogniser's counters, for metrics: its loop's, and the transcriptions
// being decoded and the decoder cache's blocks as of the last step. EncodeTime and DecodeTime
// add up the time its steps spent in the encoder (with the joint's encoder projection) and in
// decoding (the prediction network, the joint and the search) since it started; Parakeet keeps
// them, Whisper leaves them zero.
type Stats struct {
	sched.LoopStats
	Active                     int
	KVBlocksUsed, KVBlocksFree int
	EncodeTime, DecodeTime     time.Duration
}

// checkAudio refuses samples that are no recording: none, or a NaN or infinite one (the caller's
// mistake, not a failure of the model's arithmetic).
func checkAudio(samples []float32) error {
	for i, v := range samples {
		if v-v != 0 { // NaN or ±Inf
			return fmt.Errorf("asr: %w: sample %d is %v", ErrBadRequest, i, v)
		}
	}
	if len(samples) == 0 {
		return fmt.Errorf("asr: %w: no audio samples", ErrBadRequest)
	}
	return nil
}

// request is what every job of a recogniser has: its caller's context, its end, and its place in
// the queue. A family's job embeds it.
type request struct {
	ctx      context.Context
	done     chan struct{}
	begin    chan struct{} // closed when the loop admits it to run (not when it ends it queued)
	err      error
	admitted atomic.Bool // taken from the queue by the loop
	counted  bool        // counted in the queue's inFlight
}

// start readies r for a caller whose context is ctx.
func (r *request) start(ctx context.Context) {
	r.ctx, r.done, r.begin = ctx, make(chan struct{}), make(chan struct{})
}

// run marks r admitted to run: its caller may start the work it does itself (reading audio).
func (r *request) run() {
	r.admitted.Store(true)
	close(r.begin)
}

func (r *request) base() *request { return r }

// queued is a recogniser's job type as its queue sees it.
type queued interface{ base() *request }

// queue admits a recogniser's jobs to its sched.Loop: the bound on transcriptions in flight
// (MaxActive running and MaxQueue waiting, counted from enqueue to end, not until the loop's next
// step notices that one ended, so that a caller whose transcription just returned can submit the
// next one at once), the caller's wait, and the end of a job.
type queue[J queued] struct {
	loop     *sched.Loop[J]
	limit    int64
	inFlight atomic.Int64 // transcriptions queued or running
}

// newQueue makes the queue of a recogniser whose Work is w, sized by cfg. Requests wait in the
// loop's queue until its next step admits them, so it holds MaxActive more than MaxQueue.
func newQueue[J queued](w sched.Work[J], cfg Config, name string) (*queue[J], error) {
	q := &queue[J]{limit: int64(cfg.MaxQueue + cfg.MaxActive)}
	var err error
	q.loop, err = sched.NewLoop(w, sched.LoopConfig{MaxQueue: cfg.MaxQueue + cfg.MaxActive, Logger: cfg.Logger, Name: name, OnStep: cfg.OnStep})
	return q, err
}

// enqueue queues j unless the queue is full.
func (q *queue[J]) enqueue(j J) error {
	if err := q.reserve(); err != nil {
		return err
	}
	return q.enqueueReserved(j)
}

// reserve takes a place among the transcriptions in flight for one whose job is still to be
// made (its audio still to be read), or fails with ErrQueueFull; enqueueReserved then queues the
// job in that place, or release gives it back.
func (q *queue[J]) reserve() error {
	if n := q.inFlight.Add(1); n > q.limit {
		q.inFlight.Add(-1)
		return ErrQueueFull
	}
	return nil
}

// reapActive ends, with finish, the jobs of active whose context is done (with its error) or
// that done says are finished (nil), and returns the others, kept in order in active's memory.
func reapActive[J queued](active []J, done func(J) bool, finish func(J, error)) []J {
	k := 0
	for _, j := range active {
		if err := j.base().ctx.Err(); err != nil {
			finish(j, err)
			continue
		}
		if done(j) {
			finish(j, nil)
			continue
		}
		active[k] = j
		k++
	}
	clear(active[k:])
	return active[:k]
}

// full reports whether reserve would fail now (a snapshot).
func (q *queue[J]) full() bool { return q.inFlight.Load() >= q.limit }

// release gives back a place reserve took and no job used.
func (q *queue[J]) release() { q.inFlight.Add(-1) }

// enqueueReserved queues j in the place reserve took; the place is given back if j cannot be
// queued.
func (q *queue[J]) enqueueReserved(j J) error {
	r := j.base()
	r.counted = true
	err := q.loop.Enqueue(j)
	if err == nil {
		return nil
	}
	r.counted = false
	q.inFlight.Add(-1)
	if errors.Is(err, sched.ErrQueueFull) {
		return ErrQueueFull
	}
	return ErrClosed
}

// submit queues j and waits for its end (wait).
func (q *queue[J]) submit(ctx context.Context, j J) error {
	if err := q.enqueue(j); err != nil {
		return err
	}
	return q.wait(ctx, j)
}

// wait waits for the end of j, queued: its error, or ctx's when ctx ends while j is still queued
// (the loop discards it when it gets there).
func (q *queue[J]) wait(ctx context.Context, j J) error {
	r := j.base()
	select {
	case <-r.done:
	case <-ctx.Done():
		if !r.admitted.Load() {
			return ctx.Err()
		}
		<-r.done
	}
	return r.err
}

// end ends r with err (nil: its own error, or its context's if that ended) and wakes its caller.
func (q *queue[J]) end(r *request, err error) {
	if err == nil && r.err == nil && r.ctx.Err() != nil {
		err = r.ctx.Err()
	}
	if err != nil {
		r.err = err
	}
	if r.counted {
		r.counted = false
		q.inFlight.Add(-1)
	}
	close(r.done)
}
