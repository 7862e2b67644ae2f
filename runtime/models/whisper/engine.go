package whisper

import (
	"bytes"
	"compress/zlib"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/sched"
)

// ErrQueueFull is returned when the engine's queue is full; the caller may retry later.
var ErrQueueFull = errors.New("whisper: too many transcriptions queued")

// ErrClosed is returned for work submitted to, or cut short by, a closed engine.
var ErrClosed = errors.New("whisper: engine closed")

// EngineConfig sizes an Engine.
type EngineConfig struct {
	// MaxActive is the number of transcriptions decoded together; each may run up to
	// MaxDecoders hypotheses (beams or samples) in the same batched step.
	MaxActive int
	// MaxQueue is the number of transcriptions waiting beyond MaxActive.
	MaxQueue int
	// MelThreads computes features with this many goroutines per request (default 2).
	MelThreads int
	// EncodeBatch is the most windows (of different transcriptions) encoded in one batched
	// encoder call (default 1, at most MaxActive). On a CPU a window's encoder is compute-bound
	// and batching gains nothing, while a larger call delays the transcriptions whose windows
	// it holds until all are done; a GPU gains from larger batches.
	EncodeBatch int
	// OnStep, if set, is called after each step with its duration and the hypotheses and tokens
	// of its decoder batch (see sched.LoopConfig.OnStep).
	OnStep func(d time.Duration, seqs, tokens int)
	// Logger receives per-step records at sched.LevelTrace only; default discards.
	Logger *slog.Logger
}

// Engine transcribes many requests at once. It is scheduled by the machinery that schedules
// language models (sched.Loop): a bounded FIFO queue, admission from its head while fewer than
// MaxActive transcriptions run, cancellation at step boundaries, per-step metrics. The encoder
// and the decoder are two stages of a pipeline: while some transcriptions decode their windows,
// the next windows (of others, up to EncodeBatch in one batched call, longest waiting first) go
// through the encoder one stage a step (the convolutions, a block, the cross-attention
// projections), each step also stepping every decoding transcription's hypotheses through the
// decoder in one batched forward; so a decoding transcription waits a stage for its next token,
// not a window's encoder. With nothing decoding, a window is encoded in one step. Requests'
// features are computed by their own goroutines.
type Engine struct {
	m   *Model
	cfg EngineConfig
	enc *Encoder
	dec *Decoder
	tok *Vocab

	// drop lists the tokens the decoder's filters suppress by id (backend.Choice.Drop ranges
	// over it): the blank tokens of a window's first step (nBlank), those never produced
	// (nAlways), then the non-speech symbols.
	drop            []int32
	nBlank, nAlways int
	nMax            int // tokens sampled per window: n_text_ctx/2 - 4

	loop *sched.Loop[*job]
	mu   sync.Mutex
	shut bool

	// step state, owned by the loop goroutine
	active    []*job
	bb        kvcache.BatchBuilder
	toks      []int32
	outRows   []int32 // rows whose logits are read (language detection, sampling at a temperature)
	picks     []int32 // rows whose tokens the decoder chooses (backend.Choice), choices[i] for picks[i]
	choices   []backend.Choice
	chosen    []backend.Chosen // what was found of picks[i]
	chIDs     []int32          // picks[i]'s chK best tokens at chIDs[i*chK:], their log-probabilities at chLogp[i*chK:]
	chLogp    []float32
	chK       int
	cross     []*Cross
	owners    []*hyp
	logits    []float32
	cands     []beamCand
	topk      []tokData
	crosses   []*Cross // free cross-attention windows
	steps     uint64   // steps taken: when a transcription began to wait for its encoder
	encJobs   []*job   // the jobs of the encoder call in progress (nil: ended during it)
	encMels   [][]float32
	encOuts   []*Cross
	align     *aligner // word timing, made on first use
	alignErr  error    // why it could not be made
	alignToks []int32
	zw        *zlib.Writer // compression ratios
	zbuf      bytes.Buffer

	freeBlocks atomic.Int64 // cache blocks free after the last step
	nActive    atomic.Int64 // transcriptions being decoded
	inFlight   atomic.Int64 // transcriptions queued or running, from enqueue to finish

	// beamTrace, when set (tests), sees every beam-search step's live hypotheses.
	beamTrace func(step int, hyps []*hyp)
}

// NewEngine makes an engine for m and starts its loop.
func NewEngine(m *Model, cfg EngineConfig) (*Engine, error) {
	if cfg.MaxActive <= 0 {
		cfg.MaxActive = 4
	}
	if cfg.MaxQueue < 0 {
		return nil, errors.New("whisper: negative queue size")
	}
	if cfg.MelThreads <= 0 {
		cfg.MelThreads = 2
	}
	if cfg.EncodeBatch <= 0 {
		cfg.EncodeBatch = 1
	}
	if cfg.EncodeBatch > cfg.MaxActive {
		return nil, fmt.Errorf("whisper: %d windows encoded per step, more than the %d transcriptions decoded together", cfg.EncodeBatch, cfg.MaxActive)
	}
	tok, err := NewVocab(m)
	if err != nil {
		return nil, err
	}
	maxSeqs := cfg.MaxActive * MaxDecoders
	e := &Engine{m: m, cfg: cfg, tok: tok, nMax: m.TextCtx/2 - 4}
	// Requests wait in the loop's queue until its next step admits them, so it holds MaxActive
	// more than MaxQueue.
	e.loop, err = sched.NewLoop[*job]((*engineWork)(e), sched.LoopConfig{MaxQueue: cfg.MaxQueue + cfg.MaxActive,
		Logger: cfg.Logger, Name: "whisper step", OnStep: cfg.OnStep})
	if err != nil {
		return nil, err
	}
	e.enc, err = m.NewBatchEncoder(cfg.EncodeBatch)
	if err != nil {
		return nil, err
	}
	// A step holds one token per hypothesis, or a window's prompt (at most TextCtx/2 tokens of
	// context plus the start sequence) per transcription.
	e.dec, err = m.NewDecoder(DecoderConfig{MaxTokens: maxSeqs + cfg.MaxActive*(m.TextCtx/2+8), MaxSeqs: maxSeqs,
		KVSlots: maxSeqs * m.TextCtx, BlockSize: 1})
	if err != nil {
		e.enc.Close()
		return nil, err
	}
	e.freeBlocks.Store(int64(e.dec.Pool().FreeBlocks()))
	e.logits = make([]float32, maxSeqs*m.NVocab)
	e.encMels = make([][]float32, cfg.EncodeBatch)
	for i := range e.encMels {
		e.encMels[i] = make([]float32, m.Mels*WindowFrames)
	}
	e.encJobs, e.encOuts = make([]*job, 0, cfg.EncodeBatch), make([]*Cross, 0, cfg.EncodeBatch)
	e.drop, e.nBlank, e.nAlways = dropList(tok, m.NVocab)
	e.picks, e.choices, e.chosen = make([]int32, 0, maxSeqs), make([]backend.Choice, 0, maxSeqs), make([]backend.Chosen, 0, maxSeqs)
	e.chIDs, e.chLogp = make([]int32, 0, maxSeqs*MaxDecoders), make([]float32, 0, maxSeqs*MaxDecoders)
	if !noLoop {
		go e.loop.Run(context.Background())
	}
	return e, nil
}

// noLoop, set by tests, leaves the step loop to the caller.
var noLoop bool

// Model is the engine's model.
func (e *Engine) Model() *Model { return e.m }

// Vocab is the model's tokenizer.
func (e *Engine) Vocab() *Vocab { return e.tok }

// Close stops the engine; transcriptions in flight fail with ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.shut {
		e.mu.Unlock()
		return nil
	}
	e.shut = true
	e.mu.Unlock()
	e.loop.Close()
	var errs []error
	for _, c := range e.crosses {
		errs = append(errs, c.Close())
	}
	errs = append(errs, e.dec.Close(), e.enc.Close())
	if e.align != nil {
		errs = append(errs, e.align.Close())
	}
	return errors.Join(errs...)
}

// Transcribe transcribes 16 kHz mono samples. onSegment, if not nil, is called (from the engine's
// goroutine; it must not block) with each segment as it is finished.
func (e *Engine) Transcribe(ctx context.Context, samples []float32, p Params, onSegment func(Segment)) (*Result, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.Timeout)
		defer cancel()
	}
	j, err := e.submit(ctx, samples, p, onSegment, false)
	if err != nil {
		return nil, err
	}
	res := &Result{Duration: float64(len(samples)) / SampleRate, Segments: j.segments, Language: j.langCode}
	for _, s := range j.segments {
		res.Text += s.Text
	}
	if res.Segments == nil {
		res.Segments = []Segment{}
	}
	return res, nil
}

// submit queues a job and waits for it.
func (e *Engine) submit(ctx context.Context, samples []float32, p Params, onSegment func(Segment), detect bool) (*job, error) {
	if detect {
		p.Language = ""
	}
	for i, v := range samples {
		if v-v != 0 { // NaN or ±Inf
			return nil, fmt.Errorf("whisper: %w: sample %d is %v", ErrBadRequest, i, v)
		}
	}
	j := &job{ctx: ctx, p: p, onSegment: onSegment, done: make(chan struct{}), lang: -1, detectOnly: detect}
	if err := e.prepare(j, samples); err != nil {
		return nil, err
	}
	if detect && j.ph == phDone {
		return nil, fmt.Errorf("whisper: %w: audio too short to detect its language", ErrBadRequest)
	}
	if err := e.enqueue(j); err != nil {
		return nil, err
	}
	select {
	case <-j.done:
	case <-ctx.Done():
		if !j.admitted.Load() {
			// Still queued: the loop discards it when it gets there.
			return nil, ctx.Err()
		}
		<-j.done
	}
	if j.err != nil {
		return nil, j.err
	}
	return j, nil
}

// enqueue queues j unless MaxActive transcriptions run and MaxQueue wait already. A job counts
// from here until finish, not until the loop's next step notices that it ended, so that a caller
// whose transcription just returned can submit the next one at once.
func (e *Engine) enqueue(j *job) error {
	if n := e.inFlight.Add(1); n > int64(e.cfg.MaxQueue+e.cfg.MaxActive) {
		e.inFlight.Add(-1)
		return ErrQueueFull
	}
	j.counted = true
	err := e.loop.Enqueue(j)
	if err == nil {
		return nil
	}
	j.counted = false
	e.inFlight.Add(-1)
	if errors.Is(err, sched.ErrQueueFull) {
		return ErrQueueFull
	}
	return ErrClosed
}

// prepare computes the features and the fixed parts of the prompt in the caller's goroutine.
func (e *Engine) prepare(j *job, samples []float32) error {
	m := e.m
	mel, nFr, err := LogMel(samples, m, e.cfg.MelThreads)
	if err != nil {
		return err
	}
	j.mel, j.nMel, j.nFr, j.nSamples = mel, m.Mels, nFr, len(samples)
	j.seekEnd = max(0, audio.MelContentFrames(len(samples))) // whisper.cpp's n_len
	j.temps = j.temps[:0]
	if j.p.TemperatureInc > 0 {
		for t := j.p.Temperature; t < 1+1e-6; t += j.p.TemperatureInc {
			j.temps = append(j.temps, t)
		}
	} else {
		j.temps = append(j.temps, j.p.Temperature)
	}
	if j.lang, j.langCode, err = e.ResolveLanguage(j.p.Language); err != nil {
		return err
	}
	if j.p.Translate && !m.Multilingual() {
		return fmt.Errorf("whisper: %w: this model is English-only and cannot translate", ErrBadRequest)
	}
	if j.p.InitialPrompt != "" {
		pt := e.tok.Encode(j.p.InitialPrompt)
		if len(pt) > m.TextCtx/2 {
			pt = pt[len(pt)-m.TextCtx/2:]
		}
		j.promptPast = append(j.promptPast, pt...)
	}
	if j.seekEnd < deltaMin {
		j.ph = phDone
	}
	if !j.detectOnly {
		j.gateSilence(samples)
	}
	// A transcription that decodes no window (silent, or too short) still names its language,
	// as OpenAI's always does: a multilingual model detects it on the first window (padded as
	// every window is), and decodes nothing.
	if j.ph == phDone && j.lang < 0 && m.Multilingual() && !j.detectOnly && len(samples) > 0 {
		j.seek, j.ph, j.langOnly = 0, phEncode, true
	}
	return nil
}

// ResolveLanguage checks a requested language against the model. "" or "auto" means detect it
// (token -1; English-only models answer "en"); an ISO 639-1 code or an English name gives its
// token and code. Errors wrap ErrBadRequest.
func (e *Engine) ResolveLanguage(lang string) (tok int32, code string, err error) {
	if !e.m.Multilingual() {
		if lang != "" && lang != "auto" && lang != "en" && lang != "english" {
			return -1, "", fmt.Errorf("whisper: %w: this model is English-only; language %q is not available", ErrBadRequest, lang)
		}
		return -1, "en", nil
	}
	if lang == "" || lang == "auto" {
		return -1, "", nil
	}
	id, ok := e.tok.LangID(lang)
	if !ok {
		return -1, "", fmt.Errorf("whisper: %w: unknown language %q; use an ISO 639-1 code such as \"en\"", ErrBadRequest, lang)
	}
	return id, e.tok.LangCode(id), nil
}

// ErrBadRequest marks errors caused by the request's parameters.
var ErrBadRequest = errors.New("bad request")

// errNonFinite ends a transcription whose decoder produced logits that are not numbers.
var errNonFinite = errors.New("whisper: the model's output is not finite (are its weights corrupt?)")

// engineWork is the Engine as the Work its loop steps (sched.Work).
type engineWork Engine

func (w *engineWork) Reap(time.Time)                             { (*Engine)(w).reap() }
func (w *engineWork) Step(time.Time) (seqs, toks int, busy bool) { return (*Engine)(w).step() }
func (w *engineWork) Shutdown()                                  { (*Engine)(w).shutdown() }

func (w *engineWork) Admit(j *job) bool {
	e := (*Engine)(w)
	if len(e.active) >= e.cfg.MaxActive {
		return false
	}
	e.admit(j)
	return true
}

func (w *engineWork) Expire(j *job, _ time.Time) bool {
	if j.ctx.Err() == nil {
		return false
	}
	j.admitted.Store(true)
	(*Engine)(w).finish(j, nil)
	return true
}

func (w *engineWork) Abort(j *job) {
	j.admitted.Store(true)
	(*Engine)(w).finish(j, ErrClosed)
}

func (e *Engine) admit(j *job) {
	j.admitted.Store(true)
	j.encSince = e.steps
	if j.ph == phDone || j.ctx.Err() != nil {
		e.finish(j, nil)
		return
	}
	e.active = append(e.active, j)
}

// shutdown fails every active transcription with ErrClosed.
func (e *Engine) shutdown() {
	for _, j := range e.active {
		e.finish(j, ErrClosed)
	}
	clear(e.active)
	e.active = e.active[:0]
	e.nActive.Store(0)
	e.freeBlocks.Store(int64(e.dec.Pool().FreeBlocks()))
}

// finish releases a job's cache blocks and window and wakes its caller.
func (e *Engine) finish(j *job, err error) {
	if j.encPicked { // its window is in the encoder call in progress: not to be stored
		if i := slices.Index(e.encJobs, j); i >= 0 {
			e.encJobs[i], e.encOuts[i] = nil, nil
		}
		j.encPicked = false
	}
	for _, h := range j.hyps {
		h.seq.Release()
		h.spare.Release()
	}
	if j.cross != nil {
		e.crosses = append(e.crosses, j.cross)
		j.cross = nil
	}
	if err == nil && j.err == nil && j.ctx.Err() != nil {
		err = j.ctx.Err()
	}
	if err != nil {
		j.err = err
	}
	if j.counted {
		j.counted = false
		e.inFlight.Add(-1)
	}
	close(j.done)
	e.freeBlocks.Store(int64(e.dec.Pool().FreeBlocks()))
}

// FreeBlocks reports the decoder cache's free and total blocks as of the last step.
func (e *Engine) FreeBlocks() (free, total int) {
	return int(e.freeBlocks.Load()), e.dec.Pool().Blocks()
}

// Load reports the transcriptions being decoded and those waiting.
func (e *Engine) Load() (active, queued int) {
	return int(e.nActive.Load()), e.loop.Queued()
}

// Stats is a snapshot of an Engine's counters, for metrics: its loop's, and the
// transcriptions being decoded and the decoder cache's blocks as of the last step.
type Stats struct {
	sched.LoopStats
	Active                     int
	KVBlocksUsed, KVBlocksFree int
}

// Stats returns a snapshot of the engine's counters. Safe from any goroutine.
func (e *Engine) Stats() Stats {
	free, total := e.FreeBlocks()
	return Stats{LoopStats: e.loop.Stats(), Active: int(e.nActive.Load()), KVBlocksUsed: total - free, KVBlocksFree: free}
}

// reap ends the transcriptions that are finished or whose context is done.
func (e *Engine) reap() {
	k := 0
	for _, j := range e.active {
		if err := j.ctx.Err(); err != nil {
			e.finish(j, err)
			continue
		}
		if j.ph == phDone {
			e.finish(j, nil)
			continue
		}
		e.active[k] = j
		k++
	}
	clear(e.active[k:])
	e.active = e.active[:k]
}

// step advances every active transcription: advances the encoder (see encodeSome), then runs one
// batched decoder forward over all decoding hypotheses and processes its logits. It
// reports the hypotheses and tokens of the decoder batch, and false when no transcription is
// active.
func (e *Engine) step() (seqs, tokens int, busy bool) {
	seqs, tokens, busy = e.stepAll()
	e.freeBlocks.Store(int64(e.dec.Pool().FreeBlocks()))
	return seqs, tokens, busy
}

func (e *Engine) stepAll() (seqs, tokens int, busy bool) {
	e.steps++
	e.nActive.Store(int64(len(e.active)))
	if len(e.active) == 0 {
		return 0, 0, false
	}
	e.encodeSome()
	e.bb.Reset()
	e.toks, e.outRows, e.cross, e.owners = e.toks[:0], e.outRows[:0], e.cross[:0], e.owners[:0]
	e.picks, e.choices, e.chK = e.picks[:0], e.choices[:0], 1
	for _, j := range e.active {
		if j.ph == phDone || j.ph == phEncode {
			continue
		}
		for _, h := range j.hyps[:j.nHyp] {
			if !h.live() || len(h.pending) == 0 {
				continue
			}
			if err := h.seq.Reserve(len(h.pending)); err != nil {
				j.err = fmt.Errorf("whisper: decoder cache: %w", err)
				j.ph = phDone
				break
			}
			if h.seq.Len()+len(h.pending) > e.m.TextCtx {
				h.failed = true
				continue
			}
			if err := e.bb.Add(h.seq, len(h.pending)); err != nil {
				j.err = err
				j.ph = phDone
				break
			}
			e.toks = append(e.toks, h.pending...)
			// Tokens are chosen where the logits are (on a GPU only they leave the device);
			// language detection reads its row.
			last := int32(len(e.toks) - 1)
			switch temp := j.temps[j.tempIdx]; {
			case j.ph == phDetect:
				h.picked, h.row = false, len(e.outRows)
				e.outRows = append(e.outRows, last)
			case temp == 0:
				e.pick(j, h, last)
				e.chK = max(e.chK, j.p.BeamSize)
			default:
				e.pick(j, h, last)
				if j.ph == phPrompt {
					// The other candidates draw their first tokens from the prompt's row too.
					for _, o := range j.hyps[1:j.nHyp] {
						e.pick(j, o, last)
					}
				}
			}
			e.cross = append(e.cross, j.cross)
			e.owners = append(e.owners, h)
		}
	}
	if len(e.toks) == 0 {
		for _, j := range e.active {
			if j.ph == phDecode {
				e.endWindow(j)
			}
		}
		return 0, 0, true
	}
	lg := e.logits[:len(e.outRows)*e.m.NVocab]
	np := len(e.picks)
	e.chosen, e.chIDs, e.chLogp = e.chosen[:np], e.chIDs[:np*e.chK], e.chLogp[:np*e.chK]
	if err := e.dec.ForwardChoose(e.toks, e.bb.Batch(), e.cross, e.outRows, lg, e.picks, e.choices, e.drop, e.chK,
		e.chosen, e.chIDs, e.chLogp); err != nil {
		for _, j := range e.active {
			j.err, j.ph = err, phDone
		}
		return len(e.owners), len(e.toks), true
	}
	for _, h := range e.owners {
		h.seq.Advance(len(h.pending))
		h.pending = h.pending[:0]
	}
	for _, j := range e.active {
		switch j.ph {
		case phDetect:
			e.afterDetect(j)
		case phPrompt:
			e.afterPrompt(j)
		case phDecode:
			e.afterStep(j)
		}
	}
	return len(e.owners), len(e.toks), true
}

// pick has the decoder choose hypothesis h's next token from the logits of batch row at (a draw
// from the hypothesis's own random stream at a temperature).
func (e *Engine) pick(j *job, h *hyp, at int32) {
	c := e.choice(j, h)
	if temp := j.temps[j.tempIdx]; temp > 0 {
		c.Temperature, c.Random = temp, h.rng.Uint64()
	}
	h.picked, h.row = true, len(e.picks)
	e.picks = append(e.picks, at)
	e.choices = append(e.choices, c)
}

func (e *Engine) row(h *hyp) []float32 {
	V := e.m.NVocab
	return e.logits[h.row*V : (h.row+1)*V]
}

// encodeSome advances the encoder. When no encoder call is in progress it begins one over the
// windows at seek of up to EncodeBatch transcriptions that need their encoder, those that have
// waited longest first (in admission order among equals). It then runs the call's stages (the
// convolutional stem, each block, the cross-attention projections) until the call completes,
// but only one stage a step while other transcriptions are decoding: their next decoder step
// waits for one stage instead of a whole window's encoder (a tiny window costs about as much as
// thirty eight-sequence decoder steps on a CPU; a stage, a sixth of that). A completed call sets
// each of its transcriptions up to decode its window.
func (e *Engine) encodeSome() {
	if len(e.encJobs) > 0 && !slices.ContainsFunc(e.encJobs, func(j *job) bool { return j != nil }) {
		e.encJobs, e.encOuts = e.encJobs[:0], e.encOuts[:0] // all of its transcriptions ended
	}
	if len(e.encJobs) == 0 && !e.beginEncode() {
		return
	}
	for {
		done, err := e.enc.Next()
		if err != nil || done {
			e.endEncode(err)
			return
		}
		if e.decoding() {
			return
		}
	}
}

// beginEncode begins an encoder call (see encodeSome) and reports whether it did.
func (e *Engine) beginEncode() bool {
	for len(e.encJobs) < e.cfg.EncodeBatch {
		var j *job
		for _, c := range e.active {
			if c.ph == phEncode && !c.encPicked && (j == nil || c.encSince < j.encSince) {
				j = c
			}
		}
		if j == nil {
			break
		}
		j.encPicked = true
		if err := e.window(j, e.encMels[len(e.encJobs)]); err != nil {
			j.err, j.ph = err, phDone
			continue
		}
		e.encJobs = append(e.encJobs, j)
		e.encOuts = append(e.encOuts, j.cross)
	}
	if len(e.encJobs) == 0 {
		return false
	}
	if err := e.enc.Begin(e.encMels[:len(e.encJobs)], e.encOuts); err != nil {
		e.endEncode(err)
		return false
	}
	return true
}

// endEncode ends the encoder call in progress: its transcriptions (those still running) fail
// with err, or go on to decode their windows.
func (e *Engine) endEncode(err error) {
	for _, j := range e.encJobs {
		if j == nil {
			continue
		}
		j.encPicked = false
		if err != nil {
			j.err, j.ph = err, phDone
			continue
		}
		e.encoded(j)
	}
	clear(e.encJobs)
	clear(e.encOuts)
	e.encJobs, e.encOuts = e.encJobs[:0], e.encOuts[:0]
}

// decoding reports whether some transcription has decoder work for this step.
func (e *Engine) decoding() bool {
	for _, j := range e.active {
		if j.ph == phDetect || j.ph == phPrompt || j.ph == phDecode {
			return true
		}
	}
	return false
}

// window gives j a cross-attention window and puts the log-mel of its window at j.seek in mel.
func (e *Engine) window(j *job, mel []float32) error {
	if j.cross == nil {
		if n := len(e.crosses); n > 0 {
			j.cross, e.crosses = e.crosses[n-1], e.crosses[:n-1]
		} else {
			c, err := e.m.NewCross()
			if err != nil {
				return err
			}
			j.cross = c
		}
	}
	_, err := audio.MelWindow(mel, j.mel, j.nMel, j.nFr, j.seek, WindowFrames)
	return err
}

// encoded sets j up to decode the window just encoded: language detection first when it is
// still unknown, else the window's prompt.
func (e *Engine) encoded(j *job) {
	if j.seek > 0 && j.seek+500 >= j.seekEnd {
		j.promptPast = j.promptPast[:0]
	}
	if j.lang < 0 && e.m.Multilingual() {
		h := e.firstHyp(j)
		h.pending = append(h.pending[:0], e.tok.SOT)
		j.nHyp = 1
		j.ph = phDetect
		return
	}
	e.setupPrompt(j)
	e.attempt(j)
}

func (e *Engine) firstHyp(j *job) *hyp {
	if len(j.hyps) == 0 {
		j.hyps = append(j.hyps, e.newHyp())
	}
	h := j.hyps[0]
	h.seq.Release()
	h.failed, h.completed = false, false
	return h
}

// afterDetect picks the most probable language token after [sot].
func (e *Engine) afterDetect(j *job) {
	h := j.hyps[0]
	lg := e.row(h)
	best, bestV := int32(-1), float32(math.Inf(-1))
	for _, id := range e.tok.langs {
		if lg[id] > bestV {
			best, bestV = id, lg[id]
		}
	}
	h.seq.Release()
	// A NaN is never the best and -Inf never beats the start: no best language, or +Inf, means
	// logits that are not numbers (else the prompt would hold token -1, and the probabilities
	// below NaN).
	if best < 0 || math.IsInf(float64(bestV), 1) {
		j.err, j.ph = errNonFinite, phDone
		return
	}
	j.lang = best
	j.langCode = e.tok.LangCode(best)
	if j.langOnly {
		j.ph = phDone
		return
	}
	if j.detectOnly {
		// whisper_lang_auto_detect: a softmax over the 100 language slots after
		// <|startoftranscript|> (in models that know 99 languages the last slot is another
		// token, which whisper.cpp includes in the sum but which is never a language).
		var sum float64
		for i := int32(1); i <= 100 && int(e.tok.SOT+i) < len(lg); i++ {
			sum += math.Exp(float64(lg[e.tok.SOT+i] - bestV))
		}
		j.langProbs = make([]LangProb, len(e.tok.langs))
		for i, id := range e.tok.langs {
			j.langProbs[i] = LangProb{Code: e.tok.LangCode(id), P: math.Exp(float64(lg[id]-bestV)) / sum}
			if p := j.langProbs[i].P; p != p {
				j.langProbs, j.err = nil, errNonFinite
				break
			}
		}
		j.ph = phDone
		return
	}
	e.setupPrompt(j)
	e.attempt(j)
}

// LangProb is a language's probability in language detection.
type LangProb struct {
	Code string  `json:"language"`
	P    float64 `json:"probability"`
}

// DetectLanguage returns the probability of every language the model knows for the first 30 s
// of samples, in the model's language order, as whisper.cpp's whisper_lang_auto_detect computes
// them (the decoder's first step after <|startoftranscript|>).
func (e *Engine) DetectLanguage(ctx context.Context, samples []float32) ([]LangProb, error) {
	if !e.m.Multilingual() {
		return nil, fmt.Errorf("whisper: %w: this model is English-only", ErrBadRequest)
	}
	j, err := e.submit(ctx, samples, DefaultParams(), nil, true)
	if err != nil {
		return nil, err
	}
	return j.langProbs, nil
}

// afterPrompt records the no-speech probability and the first distribution, then forks the other
// hypotheses from the first.
func (e *Engine) afterPrompt(j *job) {
	h0 := j.hyps[0]
	temp := j.temps[j.tempIdx]
	r := e.chosen[h0.row]
	if r.N < 1 {
		j.err, j.ph = errNonFinite, phDone
		return
	}
	j.noSpeech = float32(math.Exp(float64(r.Probe)))
	for _, h := range j.hyps[1:j.nHyp] {
		h.seq.Release()
		h.seq = h0.seq.ForkInto(h.seq, h0.seq.Len())
		if temp == 0 {
			h.row = h0.row // beams take their first candidates from the prompt's choice
		} else if e.chosen[h.row].N < 1 {
			j.err, j.ph = errNonFinite, phDone
			return
		}
	}
	j.ph = phDecode
	e.sample(j, temp, true)
}

// afterStep processes the logits of every live hypothesis and samples the next tokens.
func (e *Engine) afterStep(j *job) {
	temp := j.temps[j.tempIdx]
	for _, h := range j.hyps[:j.nHyp] {
		if h.live() && e.chosen[h.row].N < 1 {
			j.err, j.ph = errNonFinite, phDone
			return
		}
	}
	e.sample(j, temp, false)
}

// sample chooses each live hypothesis's next token from its processed row (first: all rows are
// hypothesis 0's), applies the end rules, and queues the tokens for the next step.
func (e *Engine) sample(j *job, temp float32, first bool) {
	i := j.step
	beam := temp == 0 && j.p.BeamSize > 1
	if beam {
		e.cands = e.cands[:0]
		for hi, h := range j.hyps[:j.nHyp] {
			if !h.live() || (first && hi > 0) {
				continue
			}
			e.topk = e.chosenTokens(h, j.p.BeamSize, e.topk)
			for _, d := range e.topk {
				e.cands = append(e.cands, beamCand{from: hi, tok: d, score: h.sumAll + float64(d.plog)})
			}
		}
		sortCands(e.cands)
		// Give each live hypothesis the next best candidate; its cache becomes a fork of the
		// candidate's source (block size 1: an exact share, nothing recomputed).
		type assign struct {
			h   *hyp
			c   beamCand
			sum float64
			sd  int
			ts  bool
			rl  int
		}
		var as [MaxDecoders]assign
		na, ci := 0, 0
		for _, h := range j.hyps[:j.nHyp] {
			if !h.live() || ci >= len(e.cands) {
				continue
			}
			c := e.cands[ci]
			ci++
			src := j.hyps[c.from]
			as[na] = assign{h: h, c: c, sum: src.sumAll, sd: src.seekDelta, ts: src.hasTS, rl: src.resultLen}
			h.spare = src.seq.ForkInto(h.spare, src.seq.Len())
			h.next = append(append(h.next[:0], src.tokens...), c.tok)
			na++
		}
		for _, a := range as[:na] {
			h := a.h
			h.seq.Release()
			h.seq, h.spare = h.spare, h.seq
			h.tokens, h.next = h.next, h.tokens
			h.sumAll = a.sum + float64(a.c.tok.plog)
			h.seekDelta, h.hasTS, h.resultLen = a.sd, a.ts, a.rl
		}
		for _, h := range j.hyps[:j.nHyp] {
			if h.live() && len(h.tokens) != i+1 { // no candidate was left for it
				h.failed = true
			}
		}
		if e.beamTrace != nil {
			e.beamTrace(i, j.hyps[:j.nHyp])
		}
	} else {
		for _, h := range j.hyps[:j.nHyp] {
			if !h.live() {
				continue
			}
			d := e.chosenTokens(h, 1, e.topk)[0]
			h.tokens = append(h.tokens, d)
			h.sumAll += float64(d.plog)
		}
	}
	live := false
	for _, h := range j.hyps[:j.nHyp] {
		if !h.live() {
			continue
		}
		e.accept(j, h, i)
		if h.live() {
			live = true
			h.pending = append(h.pending[:0], h.tokens[len(h.tokens)-1].id)
		}
	}
	j.step++
	if !live || j.step >= e.nMax {
		for _, h := range j.hyps[:j.nHyp] {
			if h.live() {
				h.failed = true
			}
		}
		e.endWindow(j)
	}
}
