package asr

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// Parakeet is a Streamer.
var _ Streamer = (*Parakeet)(nil)

// frameSamplesEnc is the audio of one encoder frame: 8 mel hops of 10 ms, 80 ms.
const frameSamplesEnc = parakeet.Subsampling * parakeet.HopLength

// The chunking of Parakeet's live streams unless SessionConfig says otherwise.
const (
	DefaultChunk        = 1600 * time.Millisecond
	DefaultLeftContext  = 2 * time.Second
	DefaultRightContext = 480 * time.Millisecond
	maxChunk            = 30 * time.Second
	maxContext          = 60 * time.Second
)

// pstream is a live stream of a Parakeet recogniser: buffered chunked inference, as NeMo runs
// models trained with full attention. The audio is encoded a chunk at a time, each chunk with
// the left context before it and the right context (look-ahead) after it, every sample of which
// goes through the front end and the encoder together; only the chunk's own encoder frames are
// kept. The decoder goes on from chunk to chunk (the prediction network's state, the last token,
// a duration that jumps past a chunk's end), so each token is decoded once. The front end's
// per-feature normalisation takes its statistics over the window and every log-mel frame heard
// before it in the epoch (melHistory), which brings the encoder's input nearer to a whole
// recording's than the window's alone would; a window that starts at the epoch's start has no
// history, so a stream whose left context covers the epoch encodes it exactly as offline
// transcription does. A stream with a beam (Params.BeamSize above 1) keeps its beam search
// instead (pbeam).
//
// Every chunk is a job of the recogniser's loop, like a transcription: the chunks of several
// streams waiting together are encoded in one call and decoded in the same steps.
//
// An utterance ends (a final event) when the decoder has seen Silence of frames, after its last
// token, with nothing but blanks, or on Commit. After a Commit the stream starts over: the
// decoder from its initial state, the encoder without left context. Partial events carry the
// text of the current utterance decoded so far, from the chunks' frames only (the right context
// is heard, not decoded), once per Write that decodes a chunk and changes it.
type pstream struct {
	e   *Parakeet
	cfg SessionConfig

	chunk, left, right int // samples, whole encoder frames
	silence            int // frames of blanks that end an utterance; -1: never

	audio  []float32 // the epoch's samples from audio0 on
	audio0 int
	next   int   // the epoch's sample where the next chunk begins (whole frames)
	offset int64 // stream samples before the epoch (ended by Commits)

	// the decoder, between chunks
	state   decode.TDTState
	started bool // the prediction network has run
	pending bool // tok waits for the prediction network
	tok     int32
	dstate  []float32 // the prediction network's state (Decoder.SaveState)
	b       *pbeam    // the beam search, if the stream has one (then state to dstate are unused)

	toks    []parakeet.Token // the current utterance's, frames counted in the epoch
	lastEnd int              // the frame after the utterance's last token
	partial string
	mel     []float32
	hist    melHistory // the statistics of the log-mel frames before the window, for its normalisation
}

// NewLive opens a live stream whose audio is encoded in chunks (SessionConfig.Chunk, with
// LeftContext and RightContext around it) and decoded once, as the stream goes; see pstream.
// The session's other fields that apply are Params (its language, for the words, and its
// BeamSize: above 1, a beam search, see pbeam), Silence (the
// blank frames that end an utterance; default 600 ms, negative never), IsSpecial and OnChunk.
func (e *Parakeet) NewLive(cfg SessionConfig) (Live, error) {
	if cfg.Params.BeamSize == 0 {
		lang := cfg.Params.Language
		cfg.Params = DefaultParams()
		cfg.Params.Language = lang
	}
	if err := cfg.Params.Validate(); err != nil {
		return nil, err
	}
	if cfg.Params.Translate {
		return nil, fmt.Errorf("parakeet: %w: the model cannot translate", ErrBadRequest)
	}
	if _, err := e.ResolveLanguage(cfg.Params.Language); err != nil {
		return nil, err
	}
	switch {
	case cfg.Chunk < 0:
		return nil, errors.New("asr: negative chunk")
	case cfg.Chunk > maxChunk || cfg.LeftContext > maxContext || cfg.RightContext > maxContext:
		return nil, fmt.Errorf("asr: a chunk of %v with %v of left and %v of right context (at most %v, %v and %v)",
			cfg.Chunk, cfg.LeftContext, cfg.RightContext, maxChunk, maxContext, maxContext)
	}
	if cfg.Chunk == 0 {
		cfg.Chunk = DefaultChunk
	}
	if cfg.LeftContext == 0 {
		cfg.LeftContext = DefaultLeftContext
	}
	if cfg.RightContext == 0 {
		cfg.RightContext = DefaultRightContext
	}
	if cfg.Silence == 0 {
		cfg.Silence = 600 * time.Millisecond
	}
	if cfg.IsSpecial == nil {
		cfg.IsSpecial = e.IsSpecial
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	frames := func(d time.Duration) int { return max(0, samples(d)+frameSamplesEnc/2) / frameSamplesEnc }
	s := &pstream{e: e, cfg: cfg, chunk: max(1, frames(cfg.Chunk)) * frameSamplesEnc,
		left: frames(cfg.LeftContext) * frameSamplesEnc, right: frames(cfg.RightContext) * frameSamplesEnc,
		silence: max(1, frames(cfg.Silence)), dstate: make([]float32, e.dec.StateSize()),
		hist: newMelHistory(e.m.FrontEnd)}
	if cfg.Silence < 0 {
		s.silence = -1
	}
	if w := cfg.Params.BeamSize; w > 1 || liveBeamAlways {
		var err error
		if s.b, err = newPBeam(e, w); err != nil {
			return nil, err
		}
	}
	s.reset()
	return s, nil
}

// reset starts the decoder over.
func (s *pstream) reset() {
	s.state, s.started, s.pending, s.tok = decode.TDTState{}, false, true, s.e.rule.Blank
	s.toks, s.lastEnd, s.partial = s.toks[:0], 0, ""
	if s.b != nil {
		s.b.reset()
	}
}

// liveBeamAlways, set by tests, gives every stream a beam search, of width 1 where
// Params.BeamSize is 1.
var liveBeamAlways bool

// total is the epoch's samples so far.
func (s *pstream) total() int { return s.audio0 + len(s.audio) }

// Write adds samples and decodes every chunk whose right context they complete: finals of the
// utterances that ended, then the partial when the current utterance's text changed. A failed
// chunk is returned as its error; the stream stays usable and decodes it again on the next call.
func (s *pstream) Write(ctx context.Context, pcm []float32) ([]Event, error) {
	if err := checkSamples(pcm); err != nil {
		return nil, err
	}
	s.audio = append(s.audio, pcm...)
	var evs []Event
	decoded := false
	for s.next+s.chunk+s.right <= s.total() {
		if err := s.decodeChunk(ctx, s.next+s.chunk, false); err != nil {
			return evs, err
		}
		decoded = true
		if ev, ok := s.endpoint(); ok {
			evs = append(evs, ev)
		}
	}
	s.trim()
	if decoded {
		if ev, ok := s.partialEvent(); ok {
			evs = append(evs, ev)
		}
	}
	return evs, nil
}

// Commit decodes what the stream holds to its end, reports it as final (when it holds text or a
// partial was reported) and starts over.
func (s *pstream) Commit(ctx context.Context) ([]Event, error) {
	evs, err := s.flush(ctx)
	if err != nil {
		return evs, err
	}
	if len(s.toks) > 0 || s.partial != "" {
		evs = append(evs, s.final())
	}
	s.offset += int64(s.total())
	s.audio, s.audio0, s.next = s.audio[:0], 0, 0
	s.hist.reset()
	s.reset()
	return evs, nil
}

// flush decodes the epoch's audio to its end: the chunks left, the last one with every frame
// of its window, ending utterances at the endpoints between them.
func (s *pstream) flush(ctx context.Context) ([]Event, error) {
	var evs []Event
	for s.total() > 0 {
		end := min(s.next+s.chunk, s.total())
		last := end == s.total()
		if err := s.decodeChunk(ctx, end, last); err != nil {
			return evs, err
		}
		if last {
			break
		}
		if ev, ok := s.endpoint(); ok {
			evs = append(evs, ev)
		}
	}
	return evs, nil
}

// checkSamples refuses samples that are not numbers.
func checkSamples(pcm []float32) error {
	for i, v := range pcm {
		if v-v != 0 {
			return fmt.Errorf("asr: %w: sample %d is %v", ErrBadRequest, i, v)
		}
	}
	return nil
}

// trim drops the audio no chunk needs any more: before the next chunk's left context.
func (s *pstream) trim() {
	if n := s.next - s.left - s.audio0; n > 0 {
		s.audio = s.audio[:copy(s.audio, s.audio[n:])]
		s.audio0 += n
	}
}

// decodeChunk decodes the chunk from next to end (epoch samples): it encodes the window from
// next-left to end+right (as much of it as there is) and decodes the frames of [next, end); the
// last chunk of an epoch (Commit) keeps every frame of its window from next on.
func (s *pstream) decodeChunk(ctx context.Context, end int, last bool) error {
	if err := ctx.Err(); err != nil {
		return err // a job queued now would hold a place until the loop discards it
	}
	j, err := s.chunkJob(ctx, end, last)
	if err != nil || j == nil {
		return err
	}
	t0 := s.cfg.Now()
	if err := s.e.q.enqueue(j); err != nil {
		return err
	}
	if err := s.e.q.wait(ctx, j); err != nil {
		if s.b != nil {
			s.b.restore() // the chunk may have run rounds
		}
		return err
	}
	if s.cfg.OnChunk != nil {
		s.cfg.OnChunk(s.cfg.Now().Sub(t0))
	}
	s.next = end
	if s.b != nil {
		s.beamChunkDone()
		return nil
	}
	s.state, s.started, s.pending, s.tok = j.state, j.started, j.pending, j.tok
	for _, t := range j.toks[len(s.toks):] {
		s.lastEnd = t.Frame + t.Dur
	}
	s.toks = j.toks
	return nil
}

// chunkJob makes the job of decodeChunk's chunk: its window's log-mel and the decoder's state;
// nil (and next moved on) when the window has no frame of the chunk.
func (s *pstream) chunkJob(ctx context.Context, end int, last bool) (*pjob, error) {
	e := s.e
	w0 := max(s.next-s.left, s.audio0)
	w1 := min(end+s.right, s.total())
	if last {
		w1 = s.total()
	}
	win := s.audio[w0-s.audio0 : w1-s.audio0]
	if len(win) < parakeet.MinSamples {
		s.next = end // too short for the front end: no frames
		return nil, nil
	}
	mel, err := s.hist.logMel(e.m.FrontEnd, s.mel, win, w0, max(0, end-s.left), last)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	s.mel = mel
	melRows := len(mel) / e.m.HParams.NMels
	frames := parakeet.EncoderFrames(melRows)
	f0 := s.next / frameSamplesEnc
	f1 := end / frameSamplesEnc
	if last {
		f1 = w0/frameSamplesEnc + frames
	}
	if f1 <= f0 {
		s.next = end
		return nil, nil
	}
	j := &pjob{p: s.cfg.Params, stream: s, slot: -1, mel: mel, melRows: melRows, frames: frames,
		skip: f0 - w0/frameSamplesEnc, frame0: f0, end: f1,
		state: s.state, started: s.started, pending: s.pending, tok: s.tok, toks: s.toks, last: last}
	if s.b != nil {
		j.beam, j.greedy, j.started, j.toks = s.b.beam, s.b.greedy, s.b.valid, nil
	}
	j.start(ctx)
	return j, nil
}

// endpoint ends the utterance when the frames decoded since its last token reach the silence.
func (s *pstream) endpoint() (Event, bool) {
	if s.silence < 0 || len(s.toks) == 0 || s.next/frameSamplesEnc-s.lastEnd < s.silence {
		return Event{}, false
	}
	return s.final(), true
}

// words returns the current utterance's words in stream time, within the audio so far.
func (s *pstream) words() []Word {
	seg, ok := s.e.segment(s.toks, 0)
	if !ok {
		return nil
	}
	off := float64(s.offset) / SampleRate
	end := off + float64(s.total())/SampleRate
	ws := Words([]Segment{seg}, s.cfg.IsSpecial, s.cfg.Params.Language)
	for i := range ws {
		w := &ws[i]
		w.Start = min(off+w.Start, end)
		w.End = min(max(off+w.End, w.Start), end)
	}
	return ws
}

// final reports the current utterance as final and starts the next one.
func (s *pstream) final() Event {
	ws := s.words()
	ev := Event{Type: "final", Text: joinWords(ws), Segments: []LiveSegment{}}
	if seg, ok := s.e.segment(s.toks, 0); ok && len(ws) > 0 {
		ev.Tokens = liveTokens([]Segment{seg}, s.cfg.IsSpecial, len(spell(ws)))
	}
	if len(ws) == 0 {
		ev.Start = float64(s.offset+int64(s.next)) / SampleRate
		ev.End = ev.Start
	} else {
		ev.Start, ev.End = ws[0].Start, ws[len(ws)-1].End
		ev.Segments = append(ev.Segments, LiveSegment{Text: ev.Text, Start: ev.Start, End: ev.End})
	}
	s.toks, s.partial = s.toks[:0], ""
	s.lastEnd = s.next / frameSamplesEnc
	if s.b != nil {
		s.beamRestart()
	}
	return ev
}

// partialEvent is the current utterance's text when it changed since the last one reported.
func (s *pstream) partialEvent() (Event, bool) {
	ws := s.words()
	text := joinWords(ws)
	if text == s.partial {
		return Event{}, false
	}
	s.partial = text
	ev := Event{Type: "partial", Text: text}
	if s.b != nil {
		ev.Stable = s.stableText()
	}
	if len(ws) > 0 {
		ev.Start, ev.End = ws[0].Start, ws[len(ws)-1].End
	}
	return ev, true
}
