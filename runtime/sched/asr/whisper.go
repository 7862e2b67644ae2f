package asr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/whisper"
)

// Whisper transcribes many requests at once with a Whisper model. It is scheduled by the
// machinery that schedules language models (sched.Loop, through queue): a bounded FIFO queue,
// admission from its head while fewer than MaxActive transcriptions run, cancellation at step
// boundaries, per-step metrics. The encoder and the decoder are two stages of a pipeline: while
// some transcriptions decode their windows, the next windows (of others, up to EncodeBatch in one
// batched call, longest waiting first) go through the encoder one stage a step (the
// convolutions, a block, the cross-attention projections), each step also stepping every
// decoding transcription's hypotheses through the decoder in one batched forward; so a decoding
// transcription waits a stage for its next token, not a window's encoder. With nothing decoding,
// a window is encoded in one step. Requests' features are computed by their own goroutines.
type Whisper struct {
	m   *whisper.Model
	cfg Config
	enc *whisper.Encoder
	dec *whisper.Decoder
	tok *whisper.Vocab

	// drop lists the tokens the decoder's filters suppress by id (backend.Choice.Drop ranges
	// over it): the blank tokens of a window's first step (nBlank), those never produced
	// (nAlways), then the non-speech symbols.
	drop            []int32
	nBlank, nAlways int
	nMax            int // tokens sampled per window: n_text_ctx/2 - 4

	q    *queue[*job]
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
	cross     []*whisper.Cross
	owners    []*hyp
	logits    []float32
	beams     decode.Beams[tokData]
	best      decode.BestOf
	topk      []tokData
	crosses   []*whisper.Cross // free cross-attention windows
	steps     uint64           // steps taken: when a transcription began to wait for its encoder
	encJobs   []*job           // the jobs of the encoder call in progress (nil: ended during it)
	encMels   [][]float32
	encOuts   []*whisper.Cross
	align     *whisper.Aligner // word timing, made on first use
	alignErr  error            // why it could not be made
	alignToks []int32
	ratio     decode.Compression // compression ratios
	ids       []int32            // scratch: the token ids whose entropy is measured

	freeBlocks atomic.Int64 // cache blocks free after the last step
	nActive    atomic.Int64 // transcriptions being decoded

	// beamTrace, when set (tests), sees every beam-search step's live hypotheses.
	beamTrace func(step int, hyps []*hyp)
}

// Whisper is a Recognizer.
var _ Recognizer = (*Whisper)(nil)

// NewWhisper makes the scheduler of Whisper model m (MaxActive default 4) and starts its loop.
func NewWhisper(m *whisper.Model, cfg Config) (*Whisper, error) {
	cfg, err := cfg.withDefaults(4)
	if err != nil {
		return nil, err
	}
	tok, err := whisper.NewVocab(m)
	if err != nil {
		return nil, err
	}
	maxSeqs := cfg.MaxActive * MaxDecoders
	e := &Whisper{m: m, cfg: cfg, tok: tok, nMax: m.TextCtx/2 - 4}
	e.q, err = newQueue[*job]((*whisperWork)(e), cfg, "whisper step")
	if err != nil {
		return nil, err
	}
	e.enc, err = m.NewBatchEncoder(cfg.EncodeBatch)
	if err != nil {
		return nil, err
	}
	// A step holds one token per hypothesis, or a window's prompt (at most TextCtx/2 tokens of
	// context plus the start sequence) per transcription.
	e.dec, err = m.NewDecoder(whisper.DecoderConfig{StepTokens: maxSeqs + cfg.MaxActive*(m.TextCtx/2+8), MaxSeqs: maxSeqs,
		KVSlots: maxSeqs * m.TextCtx, BlockSize: 1})
	if err != nil {
		e.enc.Close()
		return nil, err
	}
	e.freeBlocks.Store(int64(e.dec.Pool().FreeBlocks()))
	e.logits = make([]float32, maxSeqs*m.NVocab)
	e.encMels = make([][]float32, cfg.EncodeBatch)
	for i := range e.encMels {
		e.encMels[i] = make([]float32, m.Mels*whisper.WindowFrames)
	}
	e.encJobs, e.encOuts = make([]*job, 0, cfg.EncodeBatch), make([]*whisper.Cross, 0, cfg.EncodeBatch)
	e.drop, e.nBlank, e.nAlways = dropList(tok, m.NVocab)
	e.picks, e.choices, e.chosen = make([]int32, 0, maxSeqs), make([]backend.Choice, 0, maxSeqs), make([]backend.Chosen, 0, maxSeqs)
	e.chIDs, e.chLogp = make([]int32, 0, maxSeqs*MaxDecoders), make([]float32, 0, maxSeqs*MaxDecoders)
	if !noLoop {
		go e.q.loop.Run(context.Background())
	}
	return e, nil
}

// noLoop, set by tests, leaves the step loop to the caller.
var noLoop bool

// Model is the recogniser's model.
func (e *Whisper) Model() *whisper.Model { return e.m }

// Vocab is the model's tokenizer.
func (e *Whisper) Vocab() *whisper.Vocab { return e.tok }

// IsSpecial reports whether token id is not text: a timestamp or control token.
func (e *Whisper) IsSpecial(id int32) bool { return e.tok.IsSpecial(id) }

// Close stops the recogniser; transcriptions in flight fail with ErrClosed.
func (e *Whisper) Close() error {
	e.mu.Lock()
	if e.shut {
		e.mu.Unlock()
		return nil
	}
	e.shut = true
	e.mu.Unlock()
	e.q.loop.Close()
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

// Transcribe transcribes 16 kHz mono samples. onSegment, if not nil, is called (from the
// recogniser's goroutine; it must not block) with each segment as it is finished. It is
// TranscribeSource over the samples, refused at once when they hold no recording (checkAudio).
func (e *Whisper) Transcribe(ctx context.Context, samples []float32, p Params, onSegment func(Segment)) (*Result, error) {
	if err := checkAudio(samples); err != nil {
		return nil, err
	}
	return e.TranscribeSource(ctx, audio.Samples(samples), p, onSegment)
}

// TranscribeSource transcribes the recording src reads. The transcription takes its place in the
// queue, or fails with ErrQueueFull, before src is opened; once admitted, its features are
// computed in this goroutine as its windows need them (src is read twice: see features), holding
// two windows of log-mel whatever the recording's length, and checking ctx between seconds of
// audio. A recording of no samples is an empty transcription. Errors reading src are returned
// as they are (audio.ErrCorrupt, audio.ErrTooLong...).
func (e *Whisper) TranscribeSource(ctx context.Context, src audio.Source, p Params, onSegment func(Segment)) (*Result, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.Timeout)
		defer cancel()
	}
	j, err := e.submit(ctx, src, p, onSegment, false)
	if err != nil {
		return nil, err
	}
	return newResult(j.nSamples, j.segments, j.langCode), nil
}

// submit queues a job over src, computes its features once it is admitted, and waits for its end.
func (e *Whisper) submit(ctx context.Context, src audio.Source, p Params, onSegment func(Segment), detect bool) (*job, error) {
	if detect {
		p.Language = ""
	}
	j := &job{p: p, onSegment: onSegment, lang: -1, detectOnly: detect, ph: phScan}
	j.start(ctx)
	if err := e.setup(j); err != nil {
		return nil, err
	}
	j.feat = e.newFeatures(src)
	// A transcription waiting for its features leaves the loop idle: its caller's leaving must
	// wake it to end the transcription.
	defer context.AfterFunc(ctx, e.q.loop.Wake)()
	if err := e.q.enqueue(j); err != nil {
		return nil, err
	}
	j.feat.run(ctx, j.begin, j.done)
	if err := e.q.wait(ctx, j); err != nil {
		return nil, err
	}
	return j, nil
}

// setup checks the request's parameters against the model and computes the fixed parts of the
// prompt, before the transcription is queued.
func (e *Whisper) setup(j *job) error {
	m := e.m
	var err error
	j.temps = decode.Temperatures(j.temps[:0], j.p.Temperature, j.p.TemperatureInc)
	if j.lang, j.langCode, err = e.resolveLanguage(j.p.Language); err != nil {
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
	return nil
}

// plan sets j up once the first pass over its audio is over: the end of its windows, the
// silence gate, and whether any window is to be decoded.
func (e *Whisper) plan(j *job, n int, loud []uint64, err error) {
	if err != nil {
		j.err, j.ph = err, phDone
		return
	}
	j.nSamples = n
	j.seekEnd = max(0, audio.MelContentFrames(n)) // whisper.cpp's n_len
	j.ph = phEncode
	if n == 0 {
		j.ph = phDone
		return
	}
	if j.seekEnd < deltaMin {
		j.ph = phDone
	}
	if j.detectOnly {
		if j.ph == phDone {
			j.err = fmt.Errorf("whisper: %w: audio too short to detect its language", ErrBadRequest)
		}
		return
	}
	j.loud = loud
	if j.loud == nil {
		j.loud = []uint64{} // nothing loud: the gate is on all the same
	}
	j.skipSilence()
	// A transcription that decodes no window (silent, or too short) still names its language,
	// as OpenAI's always does: a multilingual model detects it on the first window (padded as
	// every window is), and decodes nothing.
	if j.ph == phDone && j.lang < 0 && e.m.Multilingual() {
		j.seek, j.ph, j.langOnly = 0, phEncode, true
	}
}

// ResolveLanguage checks a requested language against the model. "" or "auto" means detect it
// (English-only models answer "en"); an ISO 639-1 code or an English name gives its code. Errors
// wrap ErrBadRequest.
func (e *Whisper) ResolveLanguage(lang string) (code string, err error) {
	_, code, err = e.resolveLanguage(lang)
	return code, err
}

// resolveLanguage is ResolveLanguage with the language's token (-1: detect it).
func (e *Whisper) resolveLanguage(lang string) (tok int32, code string, err error) {
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

// errNonFinite ends a transcription whose decoder produced logits that are not numbers.
var errNonFinite = errors.New("whisper: the model's output is not finite (are its weights corrupt?)")

// whisperWork is the Whisper scheduler as the Work its loop steps (sched.Work).
type whisperWork Whisper

func (w *whisperWork) Reap(time.Time)                             { (*Whisper)(w).reap() }
func (w *whisperWork) Step(time.Time) (seqs, toks int, busy bool) { return (*Whisper)(w).step() }
func (w *whisperWork) Shutdown()                                  { (*Whisper)(w).shutdown() }

func (w *whisperWork) Admit(j *job) bool {
	e := (*Whisper)(w)
	if len(e.active) >= e.cfg.MaxActive {
		return false
	}
	e.admit(j)
	return true
}

func (w *whisperWork) Expire(j *job, _ time.Time) bool {
	if j.ctx.Err() == nil {
		return false
	}
	j.admitted.Store(true)
	(*Whisper)(w).finish(j, nil)
	return true
}

func (w *whisperWork) Abort(j *job) {
	j.admitted.Store(true)
	(*Whisper)(w).finish(j, ErrClosed)
}

func (e *Whisper) admit(j *job) {
	j.run()
	j.encSince = e.steps
	if j.ph == phDone || j.ctx.Err() != nil {
		e.finish(j, nil)
		return
	}
	e.active = append(e.active, j)
}

// shutdown fails every active transcription with ErrClosed.
func (e *Whisper) shutdown() {
	for _, j := range e.active {
		e.finish(j, ErrClosed)
	}
	clear(e.active)
	e.active = e.active[:0]
	e.nActive.Store(0)
	e.freeBlocks.Store(int64(e.dec.Pool().FreeBlocks()))
}

// finish releases a job's cache blocks and window and wakes its caller.
func (e *Whisper) finish(j *job, err error) {
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
	e.q.end(&j.request, err)
	e.freeBlocks.Store(int64(e.dec.Pool().FreeBlocks()))
}

// FreeBlocks reports the decoder cache's free and total blocks as of the last step.
func (e *Whisper) FreeBlocks() (free, total int) {
	return int(e.freeBlocks.Load()), e.dec.Pool().Blocks()
}

// Load reports the transcriptions being decoded and those waiting.
func (e *Whisper) Load() (active, queued int) {
	return int(e.nActive.Load()), e.q.loop.Queued()
}

// Stats returns a snapshot of the recogniser's counters. Safe from any goroutine.
// Full reports whether a transcription submitted now would be refused with ErrQueueFull: a
// snapshot, which a server reads to refuse an upload before reading its body.
func (e *Whisper) Full() bool { return e.q.full() }

func (e *Whisper) Stats() Stats {
	free, total := e.FreeBlocks()
	return Stats{LoopStats: e.q.loop.Stats(), Active: int(e.nActive.Load()), KVBlocksUsed: total - free, KVBlocksFree: free}
}

// reap ends the transcriptions that are finished or whose context is done.
func (e *Whisper) reap() {
	e.active = reapActive(e.active, func(j *job) bool { return j.ph == phDone }, e.finish)
}

// step advances every active transcription: advances the encoder (see encodeSome), then runs one
// batched decoder forward over all decoding hypotheses and processes its logits. It
// reports the hypotheses and tokens of the decoder batch, and false when no transcription is
// active.
func (e *Whisper) step() (seqs, tokens int, busy bool) {
	seqs, tokens, busy = e.stepAll()
	e.freeBlocks.Store(int64(e.dec.Pool().FreeBlocks()))
	return seqs, tokens, busy
}

func (e *Whisper) stepAll() (seqs, tokens int, busy bool) {
	e.steps++
	e.nActive.Store(int64(len(e.active)))
	if len(e.active) == 0 {
		return 0, 0, false
	}
	// A step that finds every transcription waiting for its features does nothing, and says so:
	// the loop then waits for a Wake (features.publish, or a caller leaving).
	busy = false
	for _, j := range e.active {
		if j.ph == phScan {
			if ok, n, loud, err := j.feat.scanDone(); ok {
				e.plan(j, n, loud, err)
				busy = true
			}
		}
	}
	busy = e.encodeSome() || busy
	e.bb.Reset()
	e.toks, e.outRows, e.cross, e.owners = e.toks[:0], e.outRows[:0], e.cross[:0], e.owners[:0]
	e.picks, e.choices, e.chK = e.picks[:0], e.choices[:0], 1
	for _, j := range e.active {
		if j.ph == phDone || j.ph == phEncode || j.ph == phScan {
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
				busy = true
			}
		}
		return 0, 0, busy || e.decoding()
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
func (e *Whisper) pick(j *job, h *hyp, at int32) {
	c := e.choice(j, h)
	if temp := j.temps[j.tempIdx]; temp > 0 {
		c.Temperature, c.Random = temp, h.rng.Uint64()
	}
	h.picked, h.row = true, len(e.picks)
	e.picks = append(e.picks, at)
	e.choices = append(e.choices, c)
}

func (e *Whisper) row(h *hyp) []float32 {
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
func (e *Whisper) encodeSome() (worked bool) {
	if len(e.encJobs) > 0 && !slices.ContainsFunc(e.encJobs, func(j *job) bool { return j != nil }) {
		e.encJobs, e.encOuts = e.encJobs[:0], e.encOuts[:0] // all of its transcriptions ended
	}
	if len(e.encJobs) == 0 {
		began, failed := e.beginEncode()
		if !began {
			return failed
		}
	}
	for {
		done, err := e.enc.Next()
		if err != nil || done {
			e.endEncode(err)
			return true
		}
		if e.decoding() {
			return true
		}
	}
}

// beginEncode begins an encoder call (see encodeSome) over the windows whose features are
// computed, and reports whether it did, and whether it ended transcriptions whose windows could
// not be had.
func (e *Whisper) beginEncode() (began, failed bool) {
	for len(e.encJobs) < e.cfg.EncodeBatch {
		var j *job
		for _, c := range e.active {
			if c.ph == phEncode && !c.encPicked && (j == nil || c.encSince < j.encSince) {
				if ok, err := c.feat.ready(c.seek); err != nil {
					c.err, c.ph, failed = err, phDone, true
					continue
				} else if !ok {
					continue
				}
				j = c
			}
		}
		if j == nil {
			break
		}
		j.encPicked = true
		if err := e.window(j, e.encMels[len(e.encJobs)]); err != nil {
			j.err, j.ph, failed = err, phDone, true
			continue
		}
		e.encJobs = append(e.encJobs, j)
		e.encOuts = append(e.encOuts, j.cross)
	}
	if len(e.encJobs) == 0 {
		return false, failed
	}
	if err := e.enc.Begin(e.encMels[:len(e.encJobs)], e.encOuts); err != nil {
		e.endEncode(err)
		return false, true
	}
	return true, failed
}

// endEncode ends the encoder call in progress: its transcriptions (those still running) fail
// with err, or go on to decode their windows.
func (e *Whisper) endEncode(err error) {
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
func (e *Whisper) decoding() bool {
	for _, j := range e.active {
		if j.ph == phDetect || j.ph == phPrompt || j.ph == phDecode {
			return true
		}
	}
	return false
}

// window gives j a cross-attention window and puts the log-mel of its window at j.seek in mel.
func (e *Whisper) window(j *job, mel []float32) error {
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
	j.feat.window(mel, j.seek)
	return nil
}

// encoded sets j up to decode the window just encoded: language detection first when it is
// still unknown, else the window's prompt.
func (e *Whisper) encoded(j *job) {
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

func (e *Whisper) firstHyp(j *job) *hyp {
	if len(j.hyps) == 0 {
		j.hyps = append(j.hyps, e.newHyp())
	}
	h := j.hyps[0]
	h.seq.Release()
	h.failed, h.completed = false, false
	return h
}

// afterDetect picks the most probable language token after [sot].
func (e *Whisper) afterDetect(j *job) {
	h := j.hyps[0]
	lg := e.row(h)
	best, bestV := int32(-1), float32(math.Inf(-1))
	for _, id := range e.tok.Langs() {
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
		langs := e.tok.Langs()
		j.langProbs = make([]LangProb, len(langs))
		for i, id := range langs {
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

// DetectLanguage returns the probability of every language the model knows for the first 30 s
// of samples, in the model's language order, as whisper.cpp's whisper_lang_auto_detect computes
// them (the decoder's first step after <|startoftranscript|>).
func (e *Whisper) DetectLanguage(ctx context.Context, samples []float32) ([]LangProb, error) {
	if !e.m.Multilingual() {
		return nil, fmt.Errorf("whisper: %w: this model is English-only", ErrBadRequest)
	}
	if err := checkAudio(samples); err != nil {
		return nil, err
	}
	j, err := e.submit(ctx, audio.Samples(samples), DefaultParams(), nil, true)
	if err != nil {
		return nil, err
	}
	return j.langProbs, nil
}

// afterPrompt records the no-speech probability and the first distribution, then forks the other
// hypotheses from the first.
func (e *Whisper) afterPrompt(j *job) {
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
func (e *Whisper) afterStep(j *job) {
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
func (e *Whisper) sample(j *job, temp float32, first bool) {
	i := j.step
	beam := temp == 0 && j.p.BeamSize > 1
	if beam {
		e.beams.Reset()
		for hi, h := range j.hyps[:j.nHyp] {
			if !h.live() || (first && hi > 0) {
				continue
			}
			e.topk = e.chosenTokens(h, j.p.BeamSize, e.topk)
			for _, d := range e.topk {
				e.beams.Add(hi, h.sumAll+float64(d.plog), d)
			}
		}
		cands := e.beams.Best(j.nHyp)
		// Give each live hypothesis the next best candidate; its cache becomes a fork of the
		// candidate's source (block size 1: an exact share, nothing recomputed).
		type assign struct {
			h   *hyp
			c   decode.Candidate[tokData]
			sum float64
			sd  int
			ts  bool
			rl  int
		}
		var as [MaxDecoders]assign
		na, ci := 0, 0
		for _, h := range j.hyps[:j.nHyp] {
			if !h.live() || ci >= len(cands) {
				continue
			}
			c := cands[ci]
			ci++
			src := j.hyps[c.From]
			as[na] = assign{h: h, c: c, sum: src.sumAll, sd: src.seekDelta, ts: src.hasTS, rl: src.resultLen}
			h.spare = src.seq.ForkInto(h.spare, src.seq.Len())
			h.next = append(append(h.next[:0], src.tokens...), c.Token)
			na++
		}
		for _, a := range as[:na] {
			h := a.h
			h.seq.Release()
			h.seq, h.spare = h.spare, h.seq
			h.tokens, h.next = h.next, h.tokens
			h.sumAll = a.sum + float64(a.c.Token.plog)
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
