package asr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/models/parakeet"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Parakeet transcribes many requests at once with a Parakeet TDT (or RNN-T) model, scheduled by
// the queue and loop every recogniser shares. A step encodes the whole clips of up to
// EncodeBatch waiting transcriptions in one batched encoder call, then advances every decoding
// transcription: one batched prediction-network call for all the tokens emitted in the last
// step, then rounds of joint rows (decode.TDT, greedy), one joint call a round for every
// transcription, until each emits its next token or reaches the end of its clip. The clip is
// encoded in one pass, as whisper.cpp's parakeet_full encodes it (local attention above
// parakeet.LocalAttentionFrames frames).
//
// A live stream's chunk (NewLive) is a job of the same loop: the chunks of every stream waiting
// are encoded in the same call as the clips (EncodeBatch bounds the clips alone), only each
// chunk's own frames are projected and decoded, and its stream's prediction-network state is
// loaded into a slot when it is admitted and saved when it ends.
//
// A transcription decodes greedily (decode.TDT), as whisper.cpp's parakeet-cli does, unless
// its Params.BeamSize is above 1: then it decodes with a frame-synchronous beam search
// (decode.TDTBeamSearch, hypotheses in the same state keeping the better one, so a score is the
// log-probability of one alignment), one round per step, its prediction steps in the same
// batched call as every other transcription's. Beside the beam, a search of width 1 (the greedy
// rule exactly) runs on the same rounds, and its hypothesis is returned instead of the beam's
// best when its score is higher, as NeMo keeps the greedy hypothesis among a beam search's
// candidates; so a beam transcription's score is never below the greedy one's. A live stream
// with a beam keeps both searches from chunk to chunk (see pstream). Temperatures and prompts
// are not used. Times come from the encoder frames of the tokens.
//
// On a backend that keeps greedy decoding on the device (backend.GreedyTransducer), greedy
// transcriptions and the chunks of greedy live streams decode there instead, many decisions a
// step (parakeet_device.go); on one that searches on the device (backend.BeamTransducer), beam
// transcriptions search there, both searches many rounds a step (parakeet_devbeam.go).
type Parakeet struct {
	m     *parakeet.Model
	cfg   Config
	rule  decode.TDT
	vocab *parakeet.Vocab

	q    *queue[*pjob]
	mu   sync.Mutex
	shut bool

	// step state, owned by the loop goroutine
	enc             *parakeet.Encoder // grown to the longest call seen
	dec             *parakeet.Decoder // one state slot per active transcription
	active          []*pjob
	freeSlots       []int32
	encJobs         []*pjob
	encMels         [][]float32
	tokIn, from, to []int32
	parts           []jpart               // the step's decoders on the host loop (jointRounds)
	groups          []parakeet.JointGroup // a round's joint requests, a group per decoder in it
	rows            []float32             // [MaxRows][Width] a round's joint rows
	jFrames, jSlots []int32               // [MaxRows] a round's joint requests
	projPool        []backend.Tensor      // projections of live streams' chunks, reused
	dev             *deviceLoop           // greedy transcriptions decoded on the device; nil: none (parakeet_device.go)
	dbeam           *beamLoop             // beam transcriptions searched on the device; nil: none (parakeet_devbeam.go)

	nActive            atomic.Int64
	encodeNS, decodeNS atomic.Int64 // time spent in the steps' encoding and decoding
}

// Parakeet is a Recognizer.
var _ Recognizer = (*Parakeet)(nil)

type pphase int

const (
	ppEncode pphase = iota // the clip waits for the encoder
	ppDecode               // greedy decoding
	ppDone
)

// pjob is one transcription of a Parakeet recogniser.
type pjob struct {
	request
	p         Params
	onSegment func(Segment)
	mel       []float32
	melRows   int
	frames    int // encoder frames
	nSamples  int
	ph        pphase

	proj    backend.Tensor // [end-frame0, P] (or more rows): the joint's encoder projection of the frames kept
	skip    int            // encoder frames of the clip before the first one kept (a chunk's left context)
	frame0  int            // the frame, in the stream's count, of the first frame kept (proj's row 0)
	end     int            // the frame after the last one kept; decoding stops there
	stream  *pstream       // the live stream a chunk belongs to; nil for a transcription
	last    bool           // a chunk that ends its stream's epoch (Commit)
	slot    int32          // the decoder's state slot; -1 none
	started bool           // the prediction network has run on the blank
	pending bool           // tok waits for the prediction network
	tok     int32
	state   decode.TDTState
	toks    []parakeet.Token
	// A beam transcription (Params.BeamSize > 1): the beam over slots [slot, slot+2·MaxDecoders)
	// and the greedy search (width 1) over the two slots after them.
	beam, greedy *decode.TDTBeamSearch
	steps        []decode.TDTStep
	segs         []Segment

	onDevice bool // the transcription decodes on the device loop (parakeet_device.go) or beam loop
	onBeam   bool // the transcription searches on the device beam loop (parakeet_devbeam.go)
}

// NewParakeet makes the scheduler of Parakeet model m (MaxActive default 4) and starts its loop.
func NewParakeet(m *parakeet.Model, cfg Config) (*Parakeet, error) {
	cfg, err := cfg.withDefaults(4)
	if err != nil {
		return nil, err
	}
	h := m.HParams
	e := &Parakeet{m: m, cfg: cfg, vocab: m.Vocab,
		rule: decode.TDT{Blank: int32(h.NVocab), Durations: m.Durations, MaxSymbols: h.NMaxTokens}}
	if err := e.rule.Validate(); err != nil {
		return nil, err
	}
	e.dec, err = m.NewDecoder(cfg.MaxActive*pslotStride, cfg.MaxActive*(MaxDecoders+1))
	if err != nil {
		return nil, err
	}
	if e.dev, err = newDeviceLoop(m, cfg.MaxActive); err != nil {
		e.dec.Close()
		return nil, err
	}
	e.dbeam = newBeamLoop(m, cfg.MaxActive)
	e.q, err = newQueue[*pjob]((*parakeetWork)(e), cfg, "parakeet step")
	if err != nil {
		e.closeDevice()
		e.dec.Close()
		return nil, err
	}
	for s := cfg.MaxActive - 1; s >= 0; s-- {
		e.freeSlots = append(e.freeSlots, int32(s*pslotStride))
	}
	nRows := e.dec.MaxRows()
	e.rows = make([]float32, nRows*e.dec.Width())
	e.jFrames, e.jSlots = make([]int32, nRows), make([]int32, nRows)
	e.parts, e.groups = make([]jpart, 0, 2*cfg.MaxActive), make([]parakeet.JointGroup, 0, 2*cfg.MaxActive)
	e.encJobs, e.encMels = make([]*pjob, 0, cfg.EncodeBatch), make([][]float32, 0, cfg.EncodeBatch)
	nPred := e.dec.MaxRows()
	e.tokIn, e.from, e.to = make([]int32, 0, nPred), make([]int32, 0, nPred), make([]int32, 0, nPred)
	if !noLoop {
		go e.q.loop.Run(context.Background())
	}
	return e, nil
}

// pslotStride is the number of decoder slots each active job owns, from its slot on: one for a
// greedy transcription or a live chunk; a beam transcription's searches refer to all of them
// (2·MaxDecoders for the beam, 2 for the greedy search beside it).
const pslotStride = 2*MaxDecoders + 2

// greedySlots is the offset of a beam transcription's greedy search in its slots.
const greedySlots = 2 * MaxDecoders

// Model is the recogniser's model.
func (e *Parakeet) Model() *parakeet.Model { return e.m }

// IsSpecial reports whether token id is not text: a control piece (<unk>, <s>, </s>) or the
// blank.
func (e *Parakeet) IsSpecial(id int32) bool {
	p, ok := e.vocab.Piece(id)
	return !ok || p == "<unk>" || p == "<s>" || p == "</s>"
}

// DetectLanguage is not available: a transducer has no language tokens.
func (e *Parakeet) DetectLanguage(context.Context, []float32) ([]LangProb, error) {
	return nil, fmt.Errorf("parakeet: %w: the model does not detect languages", ErrBadRequest)
}

// ResolveLanguage accepts any request: the model transcribes what it hears and cannot be told a
// language. "" and "auto" give "", a code is returned as given (lower case).
func (e *Parakeet) ResolveLanguage(lang string) (string, error) {
	if lang == "auto" {
		return "", nil
	}
	return strings.ToLower(lang), nil
}

// Close stops the recogniser; transcriptions in flight fail with ErrClosed.
func (e *Parakeet) Close() error {
	e.mu.Lock()
	if e.shut {
		e.mu.Unlock()
		return nil
	}
	e.shut = true
	e.mu.Unlock()
	e.q.loop.Close()
	errs := []error{e.closeDevice(), e.closeDeviceBeam(), e.dec.Close()}
	for _, t := range e.projPool {
		errs = append(errs, t.Close())
	}
	e.projPool = nil
	if e.enc != nil {
		errs = append(errs, e.enc.Close())
	}
	return errors.Join(errs...)
}

// Transcribe transcribes 16 kHz mono samples into one segment. onSegment, if not nil, is
// called (from the recogniser's goroutine; it must not block) with the segment when it is
// finished.
func (e *Parakeet) Transcribe(ctx context.Context, samples []float32, p Params, onSegment func(Segment)) (*Result, error) {
	if err := e.q.reserve(); err != nil {
		return nil, err
	}
	return e.transcribe(ctx, samples, p, onSegment)
}

// TranscribeSource transcribes the recording src reads. The transcription takes its place among
// those in flight, or fails with ErrQueueFull, before src is opened. The encoder takes a clip
// whole, so src is read into memory (checking ctx between seconds of audio) before the
// transcription is queued.
func (e *Parakeet) TranscribeSource(ctx context.Context, src audio.Source, p Params, onSegment func(Segment)) (*Result, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if err := e.q.reserve(); err != nil {
		return nil, err
	}
	samples, err := readSource(ctx, src)
	if err != nil {
		e.q.release()
		return nil, err
	}
	if len(samples) == 0 {
		e.q.release()
		return newResult(0, nil, ""), nil
	}
	return e.transcribe(ctx, samples, p, onSegment)
}

// readSource reads all of src, checking ctx after every second of audio.
func readSource(ctx context.Context, src audio.Source) ([]float32, error) {
	st, err := src.Open()
	if err != nil {
		return nil, err
	}
	if c, ok := st.(io.Closer); ok {
		defer c.Close()
	}
	var out []float32
	buf := make([]float32, SampleRate)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := st.Read(buf)
		out = append(out, buf[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// transcribe is Transcribe in a place reserve took, which it uses or gives back.
func (e *Parakeet) transcribe(ctx context.Context, samples []float32, p Params, onSegment func(Segment)) (res *Result, err error) {
	queued := false
	defer func() {
		if !queued {
			e.q.release()
		}
	}()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.Translate {
		return nil, fmt.Errorf("parakeet: %w: the model cannot translate", ErrBadRequest)
	}
	lang, err := e.ResolveLanguage(p.Language)
	if err != nil {
		return nil, err
	}
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.Timeout)
		defer cancel()
	}
	if err := checkAudio(samples); err != nil {
		return nil, err
	}
	j := &pjob{p: p, onSegment: onSegment, nSamples: len(samples), slot: -1}
	j.start(ctx)
	if len(samples) < parakeet.MinSamples {
		j.ph = ppDone // too short for one frame of features: no text
	} else {
		h := e.m.HParams
		if j.mel, err = e.m.FrontEnd.LogMel(nil, samples); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		j.melRows = len(j.mel) / h.NMels
		j.frames = parakeet.EncoderFrames(j.melRows)
		j.end = j.frames
	}
	queued = true // enqueueReserved gives the place back if it cannot queue j
	if err := e.q.enqueueReserved(j); err != nil {
		return nil, err
	}
	if err := e.q.wait(ctx, j); err != nil {
		return nil, err
	}
	return newResult(len(samples), j.segs, lang), nil
}

// parakeetWork is the Parakeet scheduler as the Work its loop steps (sched.Work).
type parakeetWork Parakeet

func (w *parakeetWork) Reap(time.Time)                             { (*Parakeet)(w).reap() }
func (w *parakeetWork) Step(time.Time) (seqs, toks int, busy bool) { return (*Parakeet)(w).step() }
func (w *parakeetWork) Shutdown()                                  { (*Parakeet)(w).shutdown() }

func (w *parakeetWork) Admit(j *pjob) bool {
	e := (*Parakeet)(w)
	if len(e.active) >= e.cfg.MaxActive {
		return false
	}
	j.admitted.Store(true)
	if j.ph == ppDone || j.ctx.Err() != nil {
		e.finish(j, nil)
		return true
	}
	j.slot = e.freeSlots[len(e.freeSlots)-1]
	e.freeSlots = e.freeSlots[:len(e.freeSlots)-1]
	if j.stream != nil && j.started {
		// A chunk goes on from the stream's prediction-network state.
		if err := e.loadStream(j); err != nil {
			j.err = err
			e.finish(j, nil)
			return true
		}
	}
	e.active = append(e.active, j)
	return true
}

func (w *parakeetWork) Expire(j *pjob, _ time.Time) bool {
	if j.ctx.Err() == nil {
		return false
	}
	j.admitted.Store(true)
	(*Parakeet)(w).finish(j, nil)
	return true
}

func (w *parakeetWork) Abort(j *pjob) {
	j.admitted.Store(true)
	(*Parakeet)(w).finish(j, ErrClosed)
}

// shutdown fails every active transcription with ErrClosed.
func (e *Parakeet) shutdown() {
	for _, j := range e.active {
		e.finish(j, ErrClosed)
	}
	clear(e.active)
	e.active = e.active[:0]
	e.nActive.Store(0)
}

// finish releases a job's slot and projection and wakes its caller. A chunk that ends well
// first saves its stream's prediction-network state for the next one.
func (e *Parakeet) finish(j *pjob, err error) {
	if serr := e.stopDevice(j); err == nil && j.err == nil {
		err = serr
	}
	if j.stream != nil && err == nil && j.err == nil && j.slot >= 0 && (j.started || j.beam != nil) {
		err = e.saveStream(j)
	}
	if j.stream != nil && j.proj != nil {
		e.projPool = append(e.projPool, j.proj)
		j.proj = nil
	}
	if j.slot >= 0 {
		e.freeSlots = append(e.freeSlots, j.slot)
		j.slot = -1
	}
	if j.proj != nil {
		if cerr := j.proj.Close(); err == nil && j.err == nil {
			err = cerr
		}
		j.proj = nil
	}
	e.q.end(&j.request, err)
}

// Load reports the transcriptions being decoded and those waiting.
func (e *Parakeet) Load() (active, queued int) {
	return int(e.nActive.Load()), e.q.loop.Queued()
}

// Stats returns a snapshot of the recogniser's counters. Safe from any goroutine.
// Full reports whether a transcription submitted now would be refused with ErrQueueFull: a
// snapshot, which a server reads to refuse an upload before reading its body.
func (e *Parakeet) Full() bool { return e.q.full() }

func (e *Parakeet) Stats() Stats {
	return Stats{LoopStats: e.q.loop.Stats(), Active: int(e.nActive.Load()),
		EncodeTime: time.Duration(e.encodeNS.Load()), DecodeTime: time.Duration(e.decodeNS.Load())}
}

// reap ends the transcriptions that are finished or whose context is done.
func (e *Parakeet) reap() {
	e.active = reapActive(e.active, func(j *pjob) bool { return j.ph == ppDone }, e.finish)
}

// step encodes the clips of up to EncodeBatch waiting transcriptions, then advances every
// decoding one to its next emitted token. It reports the transcriptions decoded and the tokens
// they emitted, and false when none is active.
func (e *Parakeet) step() (seqs, tokens int, busy bool) {
	e.nActive.Store(int64(len(e.active)))
	if len(e.active) == 0 {
		return 0, 0, false
	}
	t0 := time.Now()
	e.encode()
	t1 := time.Now()
	seqs, tokens, busy = e.decodeStep()
	e.encodeNS.Add(int64(t1.Sub(t0)))
	e.decodeNS.Add(int64(time.Since(t1)))
	return seqs, tokens, busy
}

// encode runs the encoder in one call on the clips of the longest-waiting transcriptions (at
// most EncodeBatch) and the chunks of every live stream waiting, and keeps the joint projection
// of each one's frames.
func (e *Parakeet) encode() {
	e.encJobs, e.encMels = e.encJobs[:0], e.encMels[:0]
	maxMel, frames, clips := 0, 0, 0
	for _, j := range e.active {
		if j.ph != ppEncode {
			continue
		}
		if j.stream == nil {
			if clips == e.cfg.EncodeBatch {
				continue
			}
			clips++
		}
		e.encJobs, e.encMels = append(e.encJobs, j), append(e.encMels, j.mel)
		maxMel, frames = max(maxMel, j.melRows), frames+j.frames
	}
	if len(e.encJobs) == 0 {
		return
	}
	fail := func(err error) {
		for _, j := range e.encJobs {
			j.err, j.ph = fmt.Errorf("parakeet: %w", err), ppDone
		}
	}
	if e.enc == nil || e.enc.MaxMelFrames() < maxMel || e.enc.MaxFrames() < frames {
		if e.enc != nil {
			maxMel, frames = max(maxMel, e.enc.MaxMelFrames()), max(frames, e.enc.MaxFrames())
			e.enc.Close()
			e.enc = nil
		}
		enc, err := e.m.NewEncoder(maxMel, max(frames, parakeet.EncoderFrames(maxMel)))
		if err != nil {
			fail(err)
			return
		}
		e.enc = enc
	}
	out, err := e.enc.Encode(e.encMels)
	if err != nil {
		fail(err)
		return
	}
	at := 0
	for _, j := range e.encJobs {
		err := e.project(out, at, j)
		at += j.frames
		j.mel = nil
		if err != nil {
			j.err, j.ph = fmt.Errorf("parakeet: %w", err), ppDone
			continue
		}
		j.ph = ppDecode
		if j.stream == nil {
			if j.p.BeamSize > 1 {
				ok, err := e.startDeviceBeam(j)
				if !ok {
					err = e.startBeam(j)
				}
				if err != nil {
					j.err, j.ph = fmt.Errorf("parakeet: %w", err), ppDone
				}
				continue
			}
			j.toks = make([]parakeet.Token, 0, j.frames) // room for a token a frame: decoding steps need not grow it
			if ok, err := e.startDevice(j); ok {
				if err != nil {
					j.err, j.ph = fmt.Errorf("parakeet: %w", err), ppDone
				}
				continue
			}
			j.pending, j.tok = true, e.rule.Blank
		} else if j.beam != nil {
			if err := chunkFrames(j); err != nil {
				j.err, j.ph = fmt.Errorf("parakeet: %w", err), ppDone
			}
		} else if _, err := e.startDevice(j); err != nil {
			j.err, j.ph = fmt.Errorf("parakeet: %w", err), ppDone
		}
	}
}

// project writes the joint projection of the frames j keeps, rows [at+skip, at+skip+end-frame0)
// of the encoder's output, into j.proj: a tensor of its own for a transcription, one of the
// pool for a chunk.
func (e *Parakeet) project(out backend.Tensor, at int, j *pjob) error {
	be, P, n := e.m.Backend(), e.m.HParams.NPredDim, j.end-j.frame0
	v, err := be.View(out, at+j.skip, n)
	if err != nil {
		return err
	}
	defer v.Close()
	if j.stream == nil {
		if j.proj, err = be.Alloc(tensor.F32, n, P); err != nil {
			return err
		}
		return e.m.ProjectEncoder(j.proj, v)
	}
	for i, t := range e.projPool {
		if t.Rows() >= n {
			j.proj = t
			e.projPool[i] = e.projPool[len(e.projPool)-1]
			e.projPool = e.projPool[:len(e.projPool)-1]
			break
		}
	}
	if j.proj == nil {
		if j.proj, err = be.Alloc(tensor.F32, n, P); err != nil {
			return err
		}
	}
	dst, err := be.View(j.proj, 0, n)
	if err != nil {
		return err
	}
	defer dst.Close()
	return e.m.ProjectEncoder(dst, v)
}

// decodeStep runs the prediction network on every pending token in one call, then the joint
// rounds of every transcription decoding on the host loop (jointRounds: one joint call a round
// for all of them) until each emits a token or its clip ends, each search its rounds.
func (e *Parakeet) decodeStep() (seqs, tokens int, busy bool) {
	seqs, tokens = e.deviceStep()
	bs, bt := e.deviceBeamStep()
	seqs, tokens = seqs+bs, tokens+bt
	e.tokIn, e.from, e.to = e.tokIn[:0], e.from[:0], e.to[:0]
	for _, j := range e.active {
		if j.ph != ppDecode || j.onDevice {
			continue
		}
		if j.beam != nil {
			e.addPredictions(j.beam, j.slot)
			e.addPredictions(j.greedy, j.slot+greedySlots)
			continue
		}
		if j.pending {
			from := j.slot
			if !j.started {
				from = -1
			}
			e.tokIn, e.from, e.to = append(e.tokIn, j.tok), append(e.from, from), append(e.to, j.slot)
		}
	}
	if len(e.tokIn) > 0 {
		e.dec.SetLive(e.liveSlots()) // within the decoder's slots: no error
		if err := e.dec.Predict(e.tokIn, e.from, e.to); err != nil {
			for _, j := range e.active {
				if j.ph == ppDecode && (j.pending || j.beam != nil) {
					j.err, j.ph = err, ppDone
				}
			}
		}
	}
	e.parts = e.parts[:0]
	for _, j := range e.active {
		if j.ph != ppDecode || j.onDevice {
			continue
		}
		seqs++
		if j.beam != nil {
			e.parts = append(e.parts, jpart{j: j, s: j.beam, base: j.slot, first: true},
				jpart{j: j, s: j.greedy, base: j.slot + greedySlots, first: true})
			continue
		}
		j.started, j.pending = true, false
		e.parts = append(e.parts, jpart{j: j})
	}
	e.jointRounds()
	for _, j := range e.active {
		if j.ph != ppDecode || j.onDevice {
			continue
		}
		if j.beam != nil {
			tokens += e.endBeamStep(j)
			continue
		}
		if j.pending {
			tokens++
		}
		if j.state.Frame >= j.end {
			if j.stream == nil {
				e.emit(j)
			}
			j.ph = ppDone
		}
	}
	return seqs, tokens, true
}

// jpart is a decoder of a step's joint rounds: a greedy transcription or chunk (s nil), or one
// of the searches of a beam transcription or chunk, over j's slots from base.
type jpart struct {
	j     *pjob
	s     *decode.TDTBeamSearch
	base  int32
	first bool // the search has had no round this step
	in    bool // in the round being computed
	n     int  // its joint rows in the round
}

// wants reports whether p takes part in the next round: a greedy transcription until it emits a
// token or passes its last frame; a search in its first round if it is ready, then while it is
// ready and asks for no prediction step. Frames are counted in the stream (a chunk's first frame
// kept is frame0, its projection's row 0).
func (p *jpart) wants() bool {
	j := p.j
	if j.ph != ppDecode {
		return false // failed in an earlier round
	}
	if p.s == nil {
		return !j.pending && j.state.Frame < j.end
	}
	return p.s.Ready() && (p.first || len(p.s.Predictions()) == 0)
}

// jointRounds advances the step's decoders (e.parts) in lockstep: each round, the joint rows of
// every decoder that wants one (a greedy transcription's next frame, a search's rows of its
// round) in one call, then the greedy rule of each transcription and the round of each search;
// until none wants a round. A greedy transcription stops at its next emitted token (pending, for
// the next prediction step) or past its last frame. A decoder's rows and results are those it
// has alone; the rounds only put them in one call.
func (e *Parakeet) jointRounds() {
	W, maxRows := e.dec.Width(), e.dec.MaxRows()
	for round := 0; ; round++ {
		e.groups = e.groups[:0]
		rows, in := 0, 0
		for i := range e.parts {
			p := &e.parts[i]
			p.in, p.n = false, 0
			if !p.wants() {
				continue
			}
			j, k := p.j, 1
			if p.s != nil {
				k = len(p.s.Joints())
			}
			if rows > 0 && rows+k > maxRows {
				continue // the next round
			}
			if p.s == nil {
				e.jFrames[rows], e.jSlots[rows] = int32(j.state.Frame-j.frame0), j.slot
			} else {
				for i, r := range p.s.Joints() {
					e.jFrames[rows+i], e.jSlots[rows+i] = int32(r.Frame-j.frame0), p.base+r.Slot
				}
			}
			e.groups = append(e.groups, parakeet.JointGroup{Enc: j.proj, Frames: e.jFrames[rows : rows+k], Slots: e.jSlots[rows : rows+k]})
			p.in, p.n = true, k
			rows += k
			in++
		}
		if in == 0 {
			return
		}
		if parakeetJointHook != nil {
			parakeetJointHook(round, e.parts)
		}
		err := e.dec.JointMulti(e.rows[:rows*W], e.groups)
		at := 0
		for i := range e.parts {
			p := &e.parts[i]
			if !p.in {
				continue
			}
			j, out := p.j, e.rows[at*W:(at+p.n)*W]
			at += p.n
			if err != nil {
				j.err, j.ph = err, ppDone
				continue
			}
			if p.s != nil {
				p.first = false
				if err := p.s.Advance(out); err != nil {
					j.err, j.ph = errNonFiniteParakeet, ppDone
				}
				continue
			}
			st, err := e.rule.Step(&j.state, out)
			if err != nil {
				j.err, j.ph = errNonFiniteParakeet, ppDone
				continue
			}
			if st.Emit {
				j.toks = append(j.toks, parakeet.Token{ID: st.Token, Frame: st.Frame, DurIdx: st.DurIdx, Dur: st.Dur, P: st.P, PLog: st.PLog})
				j.pending, j.tok = true, st.Token
			}
		}
	}
}

// parakeetJointHook, set by tests, sees the step's decoders before each round's joint call (in
// marks those in the round, n their rows); round 0 is a step's first.
var parakeetJointHook func(round int, parts []jpart)

// startBeam sets up the searches of beam transcription j over its encoded frames.
func (e *Parakeet) startBeam(j *pjob) error {
	var err error
	if j.beam, err = decode.NewTDTBeamSearch(decode.TDTBeam{Rule: e.rule, Width: j.p.BeamSize, Merge: decode.MergeMax}); err != nil {
		return err
	}
	if j.greedy, err = decode.NewTDTBeamSearch(decode.TDTBeam{Rule: e.rule, Width: 1, Merge: decode.MergeMax}); err != nil {
		return err
	}
	for _, s := range [...]*decode.TDTBeamSearch{j.beam, j.greedy} {
		if err := s.AddFrames(j.frames); err != nil {
			return err
		}
		s.Finish()
	}
	return nil
}

// addPredictions adds the prediction steps of search s's round, its slots from base on, to the
// step's batch.
func (e *Parakeet) addPredictions(s *decode.TDTBeamSearch, base int32) {
	if !s.Ready() {
		return
	}
	for _, r := range s.Predictions() {
		from := r.From
		if from >= 0 {
			from += base
		}
		e.tokIn, e.from, e.to = append(e.tokIn, r.Token), append(e.from, from), append(e.to, base+r.To)
	}
}

// endBeamStep ends the step of beam transcription j, whose rounds jointRounds computed: when both
// searches are done it assembles j's result. It returns the prediction steps the next rounds ask
// for (the tokens the hypotheses emitted).
func (e *Parakeet) endBeamStep(j *pjob) int {
	n := 0
	for _, s := range [...]*decode.TDTBeamSearch{j.beam, j.greedy} {
		if s.Ready() {
			n += len(s.Predictions())
		}
	}
	if j.stream != nil {
		if !j.beam.Ready() && !j.greedy.Ready() {
			j.ph = ppDone // the chunk's frames are decoded
		}
		return n
	}
	if !j.beam.Done() || !j.greedy.Done() {
		return n
	}
	best, greedy := j.beam.Hyp(0).Score, j.greedy.Hyp(0).Score
	s := j.beam
	if greedy > best {
		s = j.greedy
	}
	j.steps = s.Tokens(0, j.steps[:0])
	j.toks = stepTokens(j.steps)
	if parakeetBeamHook != nil {
		parakeetBeamHook(j, best, greedy)
	}
	e.emit(j)
	j.ph = ppDone
	return n
}

// stepTokens returns the model's tokens of the search's emitted steps.
func stepTokens(steps []decode.TDTStep) []parakeet.Token {
	toks := make([]parakeet.Token, len(steps))
	for i, st := range steps {
		toks[i] = parakeet.Token{ID: st.Token, Frame: st.Frame, DurIdx: st.DurIdx, Dur: st.Dur, P: st.P, PLog: st.PLog}
	}
	return toks
}

// parakeetBeamHook, set by tests, sees every beam transcription as it ends, with the scores of
// the beam's best hypothesis and the greedy one (j.beam and j.greedy are nil for one searched on
// the device beam loop, parakeet_devbeam.go).
var parakeetBeamHook func(j *pjob, beam, greedy float64)

// errNonFiniteParakeet ends a transcription whose joint produced logits that are not numbers.
var errNonFiniteParakeet = errors.New("parakeet: the model's output is not finite (are its weights corrupt?)")

// emit turns j's tokens into its segment (none when they make no text), as whisper.cpp reports
// one pass over a clip: from 0 to the clip's end, token times from their frames and durations.
func (e *Parakeet) emit(j *pjob) {
	h := e.m.HParams
	s, ok := e.segment(j.toks, h.SegmentEnd(j.melRows, j.frames))
	if !ok {
		return
	}
	j.segs = append(j.segs, s)
	if j.onSegment != nil {
		j.onSegment(s)
	}
}

// segment makes the segment of toks, from 0 to end (10 ms units); ok is false when they make no
// text.
func (e *Parakeet) segment(toks []parakeet.Token, end int64) (Segment, bool) {
	seg, ok := e.vocab.Segment(toks, end)
	if !ok {
		return Segment{}, false
	}
	s := Segment{Start: float64(seg.T0) / 100, End: float64(seg.T1) / 100, Text: seg.Text, Tokens: make([]Token, len(seg.Tokens))}
	var text []byte
	var sum float64
	for i, t := range seg.Tokens {
		n := len(text)
		text = e.vocab.AppendText(text, t.ID, n == 0)
		s.Tokens[i] = Token{ID: t.ID, Text: string(text[n:]), P: t.P, PLog: t.PLog, T0: float64(t.T0) / 100, T1: float64(t.T1) / 100,
			Frame: int32(t.Frame), Duration: int32(t.Dur), HasFrame: true}
		sum += float64(t.PLog)
	}
	s.AvgLogprob = sum / float64(len(seg.Tokens))
	return s, true
}
