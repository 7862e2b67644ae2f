// Package tts runs speech synthesis jobs on a Pocket TTS model (runtime/models/pockettts): the
// text front end's chunks, each generated from a fresh copy of the voice state, the frame loop
// with upstream's stop rule (EOS, then FramesAfterEOS frames, or the chunk's frame budget), the
// flow head's sampling noise, and the streaming Mimi decoder turning each latent frame into
// audio as soon as it is made.
//
// A Synthesizer batches concurrent syntheses continuously on a sched.Loop: a bounded queue
// (ErrQueueFull), admission from its head while fewer than MaxActive syntheses run, and steps
// that advance every running synthesis by one latent frame: the chunks starting take their text
// passes and first frame steps in one pass over the FlowLM's weights (FlowLM.Start), the others
// one FlowLM frame step (backbone, EOS head and flow head), and one Mimi decoder step decodes
// the frames they made (on a goroutine of its own, overlapping the next step's FlowLM work, with
// Config.Decoder). Each frame goes to its caller as soon as it is decoded; a caller that falls
// behind holds back its own synthesis only. Cancellation (the caller's context, emit's error)
// takes effect at the next step.
package tts

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/pockettts"
	"github.com/parleyhq/parley/runtime/sched"
)

// DefaultTemperature is upstream's sampling temperature: the flow head starts from noise of
// variance Temperature.
const DefaultTemperature = 0.7

// DefaultKVSlots is the FlowLM cache a Synthesizer holds for each synthesis it runs at once, in
// positions: a voice prompt, a chunk's text (at most 50 tokens) and its frame budget (at most
// 234 frames for 50 tokens).
const DefaultKVSlots = 1024

// DefaultMaxActive is the number of syntheses a Synthesizer steps together by default.
const DefaultMaxActive = 4

// DefaultMaxQueue is the number of syntheses that may wait for a place by default.
const DefaultMaxQueue = 64

// frameBuffers is the number of decoded frames a synthesis may have waiting for its caller;
// beyond it the synthesis waits for the caller, the others go on.
const frameBuffers = 8

// ErrInput wraps the errors of a request that cannot be synthesised as given: an empty text, no
// voice or an unknown voice name, a bad temperature, recorded noise not in whole rows (a
// server answers 400).
var ErrInput = errors.New("tts: bad request")

// ErrNoiseExhausted is returned when recorded noise (Request.Noise) has fewer rows than the
// synthesis takes frame steps.
var ErrNoiseExhausted = errors.New("tts: the recorded noise has run out")

// ErrQueueFull is returned when MaxQueue syntheses are already waiting for a place.
var ErrQueueFull = errors.New("tts: too many syntheses queued")

// ErrClosed is returned for a synthesis queued or running when the Synthesizer closes, and for
// one submitted after.
var ErrClosed = errors.New("tts: synthesizer closed")

// Config sizes a Synthesizer.
type Config struct {
	// KVSlots is the FlowLM cache in positions, shared by the syntheses running at once; 0 means
	// DefaultKVSlots for each of MaxActive.
	KVSlots   int
	MaxActive int                   // syntheses stepped together; 0 means DefaultMaxActive
	MaxQueue  int                   // syntheses waiting beyond which Speak fails with ErrQueueFull; 0 means DefaultMaxQueue
	Text      pockettts.TextOptions // the text front end's settings (the checkpoint's)
	// Voices are the voice states requests may name (VoiceName): a checkpoint's predefined
	// voices, or voice files loaded at start.
	Voices map[string]*pockettts.Voice
	// Decoder, when not nil, runs the Mimi decoder on a goroutine of its own, so that each step's
	// FlowLM frame step (frame i+1) computes while the frames of the step before (frame i) are
	// decoded: a model of the same checkpoint loaded on a backend of its own (say one thread
	// each, on two cores). Nil decodes each step's frames after its frame step, on m.
	Decoder *pockettts.Model
}

// Request is one synthesis.
type Request struct {
	Text  string
	Voice *pockettts.Voice
	// VoiceName names one of Config.Voices, when Voice is nil.
	VoiceName string
	// Temperature is the variance of the flow head's starting noise; 0 makes the synthesis
	// deterministic (x0 = 0). Negative means DefaultTemperature.
	Temperature float64
	// Seed seeds the noise when Noise is nil.
	Seed uint64
	// Noise, when not nil, is the flow head's x0 of every frame step in order, LatentDim values
	// a step, across the text's chunks (the step that ends a chunk at EOS included): recorded
	// noise, for comparing with a reference. Temperature does not scale it.
	Noise []float32
}

// Synthesizer generates speech with one model, batching the syntheses running at once.
type Synthesizer struct {
	m    *pockettts.Model
	tok  pockettts.Tokenizer
	cfg  Config
	loop *sched.Loop[*job]
	once sync.Once

	// mu is held while the model computes: by a step, and by CloneVoice.
	mu     sync.Mutex
	closed bool
	f      *pockettts.FlowLM
	dec    *pockettts.Decoder

	// Owned by the step goroutine.
	active    []*job
	slots     []int // free decoder slots
	stepJobs  []*job
	stepSeqs  []*kvcache.Seq
	decJobs   []*job // the frames of decSlots, lat and audio, and their buffers
	decBufs   [][]float32
	decSlots  []int
	pending   int        // frames being decoded on the decoder goroutine (Config.Decoder)
	decReq    chan int   // to the decoder goroutine: decode the first n frames of lat
	decDone   chan error // from it: the frames are in audio
	textToks  [][]int32  // the text of the chunks starting in a step (stepJobs[:len(textToks)])
	in, x0    []float32  // [MaxActive·latent]
	out, lat  []float32
	eos       []float32 // [MaxActive]
	audio     []float32 // [MaxActive·FrameSamples]
	frameRate float64
}

// New makes a Synthesizer over m, with the checkpoint's tokenizer, and starts its step loop.
// Close stops it.
func New(m *pockettts.Model, tok pockettts.Tokenizer, cfg Config) (*Synthesizer, error) {
	s, err := newSynthesizer(m, tok, cfg)
	if err != nil {
		return nil, err
	}
	go s.loop.Run(context.Background())
	return s, nil
}

// newSynthesizer makes a Synthesizer whose loop is not running.
func newSynthesizer(m *pockettts.Model, tok pockettts.Tokenizer, cfg Config) (*Synthesizer, error) {
	if tok == nil {
		return nil, errors.New("tts: the model has no tokenizer")
	}
	if cfg.MaxActive <= 0 {
		cfg.MaxActive = DefaultMaxActive
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = DefaultMaxQueue
	}
	if cfg.KVSlots <= 0 {
		cfg.KVSlots = DefaultKVSlots * cfg.MaxActive
	}
	mc := m.Config()
	if cfg.Text.FrameRate <= 0 {
		cfg.Text.FrameRate = mc.FrameRate()
	}
	dm := m
	if cfg.Decoder != nil {
		dm = cfg.Decoder
		dc := dm.Config()
		if dm.Backend() == m.Backend() {
			return nil, errors.New("tts: the decoder's model computes on the FlowLM's backend (it needs one of its own)")
		}
		if dc.LatentDim != mc.LatentDim || dc.FrameSamples() != mc.FrameSamples() || dc.SampleRate != mc.SampleRate || dc.MimiDim != mc.MimiDim {
			return nil, errors.New("tts: the decoder's model is not of the same checkpoint")
		}
	}
	f, err := m.NewFlowLM(pockettts.FlowLMConfig{StepTokens: 64, MaxSeqs: cfg.MaxActive, KVSlots: cfg.KVSlots})
	if err != nil {
		return nil, err
	}
	dec, err := dm.NewDecoder(cfg.MaxActive)
	if err != nil {
		f.Close()
		return nil, err
	}
	L, n := mc.LatentDim, cfg.MaxActive
	s := &Synthesizer{m: m, tok: tok, cfg: cfg, f: f, dec: dec,
		active: make([]*job, 0, n), slots: make([]int, 0, n),
		stepJobs: make([]*job, n), stepSeqs: make([]*kvcache.Seq, n), decJobs: make([]*job, n), decBufs: make([][]float32, n), decSlots: make([]int, n),
		textToks: make([][]int32, 0, n),
		in:       make([]float32, n*L), x0: make([]float32, n*L), out: make([]float32, n*L), lat: make([]float32, n*L),
		eos: make([]float32, n), audio: make([]float32, n*mc.FrameSamples()), frameRate: mc.FrameRate()}
	for i := n - 1; i >= 0; i-- {
		s.slots = append(s.slots, i)
	}
	s.loop, err = sched.NewLoop[*job](s.work(), sched.LoopConfig{MaxQueue: cfg.MaxQueue, Name: "tts step"})
	if err != nil {
		dec.Close()
		f.Close()
		return nil, err
	}
	if cfg.Decoder != nil {
		s.decReq, s.decDone = make(chan int), make(chan error, 1)
		go s.decode()
	}
	return s, nil
}

// decode is the decoder goroutine (Config.Decoder): it decodes the frames the step goroutine
// hands it, until Close.
func (s *Synthesizer) decode() {
	mc := s.m.Config()
	L, F := mc.LatentDim, mc.FrameSamples()
	for n := range s.decReq {
		s.decDone <- s.dec.Step(s.decSlots[:n], s.lat[:n*L], s.audio[:n*F])
	}
}

// Close ends every synthesis queued or running (ErrClosed), stops the step loop and releases
// the Synthesizer's cache and decoder state; the model stays open.
func (s *Synthesizer) Close() error {
	var err error
	s.once.Do(func() {
		s.loop.Close() // Shutdown has waited for the frames being decoded
		if s.decReq != nil {
			close(s.decReq)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.closed = true
		err = errors.Join(s.dec.Close(), s.f.Close())
	})
	return err
}

// SampleRate is the audio's sample rate in Hz.
func (s *Synthesizer) SampleRate() int { c := s.m.Config(); return c.SampleRate }

// MaxActive is the number of syntheses stepped together.
func (s *Synthesizer) MaxActive() int { return s.cfg.MaxActive }

// Stats is a snapshot of the step loop's counters.
func (s *Synthesizer) Stats() sched.LoopStats { return s.loop.Stats() }

// Voices returns the names of Config.Voices, sorted.
func (s *Synthesizer) Voices() []string {
	names := make([]string, 0, len(s.cfg.Voices))
	for n := range s.cfg.Voices {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// FrameSamples is the number of samples each latent frame becomes.
func (s *Synthesizer) FrameSamples() int { c := s.m.Config(); return c.FrameSamples() }

// Chunks splits text as a synthesis of it will: the front end's chunks, each with its frame
// budget. It checks the text (ErrEmptyText and the front end's errors).
func (s *Synthesizer) Chunks(text string) ([]pockettts.Chunk, error) {
	return pockettts.SplitText(s.tok, text, s.cfg.Text)
}

// CloneVoice makes the voice state of a voice prompt (mono audio at SampleRate). It runs between
// two steps of the syntheses in flight, holding them up while it computes.
func (s *Synthesizer) CloneVoice(audio []float32) (*pockettts.Voice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	return s.f.CloneVoice(audio)
}

// noise supplies x0 of each frame step.
type noise struct {
	rec   []float32
	rng   *rand.Rand
	scale float64
}

func (n *noise) next(x0 []float32) error {
	switch {
	case n.rec != nil:
		if len(n.rec) < len(x0) {
			return ErrNoiseExhausted
		}
		copy(x0, n.rec)
		n.rec = n.rec[len(x0):]
	case n.scale == 0:
		clear(x0)
	default:
		for i := range x0 {
			x0[i] = float32(n.rng.NormFloat64() * n.scale)
		}
	}
	return nil
}

// job is one synthesis: what its caller hands over, and its place in the batch.
type job struct {
	ctx    context.Context
	chunks []pockettts.Chunk
	voice  *pockettts.Voice
	nz     noise
	quit   atomic.Bool    // the caller has stopped reading
	frames chan []float32 // decoded frames, in order; closed when the synthesis ends
	free   chan []float32 // frame buffers the caller is done with
	err    error          // why it ended (nil: done); written before frames is closed

	// Owned by the step goroutine once queued.
	ended   bool
	slot    int // decoder slot
	seq     *kvcache.Seq
	chunk   int  // the chunk being generated
	started bool // the chunk's voice is in seq
	fresh   bool // started, its text pass and first frame step to come (FlowLM.Start)
	step    int  // frame steps taken in the chunk
	eosStep int  // the step whose EOS logit crossed the threshold, or -1
	buf     []float32
	in      []float32 // the next frame step's input
}

// Speak synthesises r, calling emit with each frame's audio (FrameSamples samples at
// SampleRate, in [-1, 1] before clamping; the slice is reused after emit returns) as soon as it
// is decoded. An error from emit, or ctx's end, stops the synthesis and is returned. Errors
// besides: ErrInput, ErrNoiseExhausted, ErrQueueFull, ErrClosed.
func (s *Synthesizer) Speak(ctx context.Context, r Request, emit func(audio []float32) error) error {
	j, err := s.newJob(ctx, r)
	if err != nil {
		return err
	}
	switch err := s.loop.Enqueue(j); {
	case errors.Is(err, sched.ErrQueueFull):
		return ErrQueueFull
	case err != nil:
		return ErrClosed
	}
	stop := func() {
		j.quit.Store(true)
		s.loop.Wake()
	}
	done := ctx.Done()
	for {
		select {
		case a, ok := <-j.frames:
			if !ok {
				return j.err
			}
			if err := emit(a); err != nil {
				stop()
				return err
			}
			j.free <- a // never blocks: there are as many buffers as room
			s.loop.Wake()
		case <-done:
			stop()
			return ctx.Err()
		}
	}
}

// newJob checks r and makes its synthesis, ready to queue.
func (s *Synthesizer) newJob(ctx context.Context, r Request) (*job, error) {
	voice := r.Voice
	if voice == nil && r.VoiceName != "" {
		if voice = s.cfg.Voices[r.VoiceName]; voice == nil {
			return nil, fmt.Errorf("%w: no voice named %q (have %s)", ErrInput, r.VoiceName, strings.Join(s.Voices(), ", "))
		}
	}
	if voice == nil {
		return nil, fmt.Errorf("%w: no voice", ErrInput)
	}
	if math.IsNaN(r.Temperature) || math.IsInf(r.Temperature, 0) {
		return nil, fmt.Errorf("%w: temperature %v", ErrInput, r.Temperature)
	}
	chunks, err := s.Chunks(r.Text)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	temp := r.Temperature
	if temp < 0 {
		temp = DefaultTemperature
	}
	mc := s.m.Config()
	L, F := mc.LatentDim, mc.FrameSamples()
	if r.Noise != nil && len(r.Noise)%L != 0 {
		return nil, fmt.Errorf("%w: %d noise values are not whole rows of %d", ErrInput, len(r.Noise), L)
	}
	for _, c := range chunks {
		if need := voice.Positions + len(c.Tokens) + c.MaxFrames; need > s.cfg.KVSlots {
			return nil, fmt.Errorf("tts: the voice (%d positions), a chunk's %d tokens and its %d frames need %d cache positions, more than the %d there are",
				voice.Positions, len(c.Tokens), c.MaxFrames, need, s.cfg.KVSlots)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	j := &job{ctx: ctx, chunks: chunks, voice: voice, eosStep: -1,
		nz:     noise{rec: r.Noise, scale: math.Sqrt(temp), rng: rand.New(rand.NewPCG(r.Seed, 0x9e3779b97f4a7c15))},
		frames: make(chan []float32, frameBuffers), free: make(chan []float32, frameBuffers),
		seq: s.f.Pool().NewSeq(0), in: make([]float32, L)}
	bufs := make([]float32, frameBuffers*F)
	for i := range frameBuffers {
		j.free <- bufs[i*F : (i+1)*F : (i+1)*F]
	}
	return j, nil
}

// work is the Synthesizer's side of its loop, kept off its exported methods.
type work Synthesizer

func (s *Synthesizer) work() *work { return (*work)(s) }

// finish ends j with err, handing back what it holds.
func (w *work) finish(j *job, err error) {
	if j.ended {
		return
	}
	j.ended = true
	j.seq.Release()
	j.err = err
	close(j.frames)
}

// cancelled is why the caller of j has stopped, or nil.
func (j *job) cancelled() error {
	if err := j.ctx.Err(); err != nil {
		return err
	}
	if j.quit.Load() {
		return context.Canceled
	}
	return nil
}

func (w *work) Reap(time.Time) {
	for _, j := range w.active {
		if err := j.cancelled(); err != nil {
			w.finish(j, err)
		}
	}
	w.compact()
}

// compact drops the ended syntheses from the batch, freeing their decoder slots.
func (w *work) compact() {
	keep := w.active[:0]
	for _, j := range w.active {
		if j.ended {
			w.slots = append(w.slots, j.slot)
			continue
		}
		keep = append(keep, j)
	}
	clear(w.active[len(keep):])
	w.active = keep
}

func (w *work) Expire(j *job, _ time.Time) bool {
	if err := j.cancelled(); err != nil {
		w.finish(j, err)
		return true
	}
	return false
}

func (w *work) Admit(j *job) bool {
	if len(w.active) == w.cfg.MaxActive {
		return false
	}
	j.slot = w.slots[len(w.slots)-1]
	w.slots = w.slots[:len(w.slots)-1]
	w.active = append(w.active, j)
	return true
}

func (w *work) Abort(j *job) { w.finish(j, ErrClosed) }

func (w *work) Shutdown() {
	w.deliver()
	for _, j := range w.active {
		w.finish(j, ErrClosed)
	}
	w.compact()
}

// nextChunk ends j's chunk: the synthesis goes on with its next chunk at the next step, or ends.
func (w *work) nextChunk(j *job) {
	j.seq.Release()
	j.started = false
	if j.chunk++; j.chunk == len(j.chunks) {
		w.finish(j, nil)
	}
}

// startChunks stores the voice state of every synthesis starting a chunk; its text pass comes
// with its first frame step. A chunk waits while the cache has no room for it.
func (w *work) startChunks() {
	for _, j := range w.active {
		if j.ended || j.started {
			continue
		}
		for !j.ended && j.chunks[j.chunk].MaxFrames <= 0 {
			w.nextChunk(j) // a chunk without frames
		}
		if j.ended {
			continue
		}
		c := &j.chunks[j.chunk]
		if err := j.seq.Reserve(j.voice.Positions + len(c.Tokens) + c.MaxFrames); err != nil {
			if errors.Is(err, kvcache.ErrFull) {
				continue // room comes as other chunks end
			}
			w.finish(j, err)
			continue
		}
		if err := w.f.SetVoice(j.seq, j.voice); err != nil {
			w.finish(j, err)
			continue
		}
		if err := w.dec.Reset(j.slot); err != nil {
			w.finish(j, err)
			continue
		}
		j.started, j.fresh, j.step, j.eosStep = true, true, 0, -1
	}
}

// settled reports whether the step can go on while frames of the step before are decoded: no
// synthesis starts a chunk (which resets its decoder slot, maybe one that an ended synthesis
// left), none has made its chunk's last frame (which ends the chunk once delivered) and none
// runs out of recorded noise (which ends the synthesis after the frames it made).
func (w *work) settled() bool {
	for _, j := range w.active {
		if j.ended || !j.started || j.step == j.chunks[j.chunk].MaxFrames || (j.nz.rec != nil && len(j.nz.rec) < len(j.in)) {
			return false
		}
	}
	return true
}

// Step starts the chunks due, then takes one frame step of every synthesis whose caller has
// room for a frame and decodes the frames it makes. With Config.Decoder the frames are decoded
// while the next step's frame step runs, and delivered after it, but for a step that makes a
// chunk's first frame: its frames are delivered once decoded, keeping the first audio early.
func (w *work) Step(time.Time) (seqs, tokens int, busy bool) {
	if len(w.active) == 0 {
		return 0, 0, w.deliver() > 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	defer w.compact()
	delivered := 0
	if !w.settled() {
		delivered = w.deliver()
	}
	w.startChunks()
	L := w.m.Config().LatentDim
	// The chunks starting first (one Start: text passes and first frame steps), then the
	// syntheses in the middle of one (one Step).
	n, ns := 0, 0
	for _, fresh := range [2]bool{true, false} {
		for _, j := range w.active {
			if j.ended || !j.started || j.fresh != fresh || j.step == j.chunks[j.chunk].MaxFrames {
				continue
			}
			if j.buf == nil {
				select {
				case j.buf = <-j.free:
				default:
					continue // its caller has every buffer: it waits for them
				}
			}
			if err := j.nz.next(w.x0[n*L : (n+1)*L]); err != nil {
				w.finish(j, err)
				continue
			}
			if fresh {
				w.textToks = append(w.textToks, j.chunks[j.chunk].Tokens)
				tokens += len(j.chunks[j.chunk].Tokens)
			} else {
				copy(w.in[n*L:(n+1)*L], j.in)
			}
			w.stepJobs[n], w.stepSeqs[n] = j, j.seq
			n++
		}
		if fresh {
			ns = n
		}
	}
	if n == 0 {
		delivered += w.deliver()
		return 0, 0, delivered > 0
	}
	var startErr, stepErr error
	if ns > 0 {
		startErr = w.f.Start(w.stepSeqs[:ns], w.textToks, w.x0[:ns*L], w.out[:ns*L], w.eos[:ns])
		clear(w.textToks)
		w.textToks = w.textToks[:0]
	}
	if n > ns {
		stepErr = w.f.Step(w.stepSeqs[ns:n], w.in[ns*L:n*L], w.x0[ns*L:n*L], w.out[ns*L:n*L], w.eos[ns:n])
	}
	w.deliver() // the frames of the step before, decoded meanwhile
	nd, first := 0, false
	for i, j := range w.stepJobs[:n] {
		err := stepErr
		if i < ns {
			err = startErr
		}
		if err != nil {
			w.finish(j, err)
			continue
		}
		j.fresh = false
		c := &j.chunks[j.chunk]
		if j.eosStep < 0 && w.eos[i] > pockettts.EOSThreshold {
			j.eosStep = j.step
		}
		if j.eosStep >= 0 && j.step >= j.eosStep+c.FramesAfterEOS {
			w.nextChunk(j) // this step's latent is dropped
			continue
		}
		out := w.out[i*L : (i+1)*L]
		copy(j.in, out)
		copy(w.lat[nd*L:(nd+1)*L], out)
		w.decJobs[nd], w.decSlots[nd], w.decBufs[nd] = j, j.slot, j.buf
		j.buf = nil
		j.step++
		first = first || j.step == 1
		nd++
	}
	clear(w.stepJobs[:n])
	if nd > 0 {
		w.pending = nd
		if w.decReq != nil {
			w.decReq <- nd
		}
		if w.decReq == nil || first {
			w.deliver() // a chunk's first frame goes out at once
		}
	}
	return n, n + tokens, true
}

// deliver hands the frames being decoded to their callers, once decoded, ending the chunks whose
// last frame they are; it returns how many there were.
func (w *work) deliver() int {
	nd := w.pending
	if nd == 0 {
		return 0
	}
	w.pending = 0
	mc := w.m.Config()
	L, F := mc.LatentDim, mc.FrameSamples()
	var err error
	if w.decReq != nil {
		err = <-w.decDone
	} else {
		err = w.dec.Step(w.decSlots[:nd], w.lat[:nd*L], w.audio[:nd*F])
	}
	for i, j := range w.decJobs[:nd] {
		switch {
		case j.ended: // cancelled while its frame was decoded
		case err != nil:
			w.finish(j, err)
		default:
			buf := w.decBufs[i]
			copy(buf, w.audio[i*F:(i+1)*F])
			j.frames <- buf // never blocks: there are as many buffers as room
			if j.step == j.chunks[j.chunk].MaxFrames {
				w.nextChunk(j)
			}
		}
	}
	clear(w.decJobs[:nd])
	clear(w.decBufs[:nd])
	return nd
}
