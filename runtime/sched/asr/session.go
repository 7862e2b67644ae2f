package asr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// SessionConfig configures a live session (Session, or a Streamer's). Zero fields take the
// defaults given.
type SessionConfig struct {
	// Params are the transcription parameters; NoContext and InitialPrompt are set by the
	// session (InitialPrompt here seeds the prompt until the first final text). Zero value:
	// DefaultParams().
	Params Params
	// Step is the new audio between hypotheses (default 1 s). When a transcription takes longer
	// than Step, the next one waits for as much audio as that transcription took, so a slow
	// transcriber falls behind by at most one transcription.
	Step time.Duration
	// MaxBuffer bounds the audio transcribed at once (default and most: 30 s, one Whisper
	// window). A buffer reaching it is finalized whole.
	MaxBuffer time.Duration
	// Silence is the quiet after speech that ends an utterance (default 600 ms; negative: never).
	Silence time.Duration
	// SilenceRMS is the root-mean-square level (samples in [-1, 1]) under which a 10 ms frame is
	// quiet (default 0.01, -40 dBFS).
	SilenceRMS float32
	// MinSpeech is the loud audio an utterance needs before it is transcribed (default 100 ms).
	MinSpeech time.Duration
	// IsSpecial tells the transcriber's non-text tokens (timestamps, end of text); nil: taken
	// from the transcriber when it has an IsSpecial method (a Recognizer), else every token is
	// text.
	IsSpecial func(id int32) bool
	// PromptBytes bounds the final text carried into the next prompt (default 200).
	PromptBytes int
	// Now is the clock (default time.Now).
	Now func() time.Time

	// Chunk, LeftContext and RightContext shape the encoding of a streaming recogniser's sessions
	// (a Streamer: Parakeet), rounded to whole encoder frames (80 ms): the audio is encoded Chunk
	// at a time (default 1.6 s, at most 30 s) with the LeftContext before it (default 2 s) and
	// the RightContext after it (default 480 ms; each at most 60 s, negative for none), of which
	// only the chunk's own frames are decoded. A chunk is decoded once its right context has
	// arrived, so text lags the audio by Chunk + RightContext at most, plus the time to decode
	// it. Session ignores them.
	Chunk, LeftContext, RightContext time.Duration
	// OnChunk, if set, is called after each chunk a Streamer's session decodes, with the time
	// from its submission to its end (queueing, encoding and decoding).
	OnChunk func(d time.Duration)
}

const (
	frameSamples = SampleRate / 100 // the energy detector's 10 ms frame
	leadSamples  = SampleRate / 5   // quiet kept before speech begins (200 ms)
)

// Session is the Live stream of any Transcriber: it turns a stream of 16 kHz mono samples into
// partial hypotheses and settled ("final") text by transcribing a sliding buffer again and again.
//
// Every Step of new audio the buffer (at most MaxBuffer, 30 s) is transcribed with NoContext set
// and the last final text as the initial prompt. Local agreement settles text: the longest common
// word prefix of the last two hypotheses is emitted as final and the buffer is cut at its last
// word's end; the rest of the newest hypothesis is the partial. An energy detector ends an
// utterance: after Silence of quiet following speech everything left is transcribed once more,
// emitted as final, and the session starts over. A session with nothing but quiet transcribes
// nothing.
//
// A Session does no I/O of its own and never sleeps: it is driven by Write, Commit and the
// Transcriber it is given, and reads time only from SessionConfig.Now, so it can be tested with a
// fake transcriber and a fake clock. Word times follow the transcriber's token times; with
// Whisper those are interpolated within a segment, so cuts land near, not exactly on, word
// boundaries. It is not safe for concurrent use.
type Session struct {
	tr  Transcriber
	cfg SessionConfig

	step, maxBuf, silence, minSpeech int // samples; silence < 0: no endpointing
	rms2                             float64

	buf      []float32 // [n] samples from absolute sample bufStart
	bufStart int64
	lastHyp  int64 // absolute sample count at the last hypothesis
	prev     []Word
	segs     []Segment // of the last transcription, whose words final reports
	partial  string
	prompt   string

	// energy detector
	frame    []float32 // incomplete frame
	speech   int       // loud samples since the utterance began
	trailing int       // quiet samples at the end of buf

	stats SessionStats
}

// SessionStats count a session's work.
type SessionStats struct {
	Transcriptions int           // calls to the transcriber
	Busy           time.Duration // time spent in them
	Audio          time.Duration // audio written
}

// NewSession starts a session over tr.
func NewSession(tr Transcriber, cfg SessionConfig) (*Session, error) {
	if tr == nil {
		return nil, errors.New("asr: no transcriber")
	}
	if cfg.Params.BeamSize == 0 {
		cfg.Params = DefaultParams()
	}
	if err := cfg.Params.Validate(); err != nil {
		return nil, err
	}
	switch {
	case cfg.Step < 0 || cfg.MaxBuffer < 0 || cfg.MinSpeech < 0 || cfg.PromptBytes < 0:
		return nil, errors.New("asr: negative step, buffer, speech or prompt length")
	case cfg.SilenceRMS < 0 || cfg.SilenceRMS != cfg.SilenceRMS:
		return nil, fmt.Errorf("asr: silence level %v", cfg.SilenceRMS)
	}
	if cfg.Step == 0 {
		cfg.Step = time.Second
	}
	if cfg.MaxBuffer == 0 || cfg.MaxBuffer > 30*time.Second {
		cfg.MaxBuffer = 30 * time.Second
	}
	if cfg.Silence == 0 {
		cfg.Silence = 600 * time.Millisecond
	}
	if cfg.SilenceRMS == 0 {
		cfg.SilenceRMS = 0.01
	}
	if cfg.MinSpeech == 0 {
		cfg.MinSpeech = 100 * time.Millisecond
	}
	if cfg.PromptBytes == 0 {
		cfg.PromptBytes = 200
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.IsSpecial == nil {
		if v, ok := tr.(interface{ IsSpecial(id int32) bool }); ok {
			cfg.IsSpecial = v.IsSpecial
		}
	}
	s := &Session{tr: tr, cfg: cfg, step: samples(cfg.Step), maxBuf: samples(cfg.MaxBuffer),
		silence: samples(cfg.Silence), minSpeech: samples(cfg.MinSpeech),
		rms2: float64(cfg.SilenceRMS) * float64(cfg.SilenceRMS), prompt: cfg.Params.InitialPrompt}
	s.maxBuf = max(s.maxBuf, frameSamples)
	s.step = max(s.step, frameSamples)
	if cfg.Silence < 0 {
		s.silence = -1
	}
	return s, nil
}

func samples(d time.Duration) int { return int(d.Seconds() * SampleRate) }

// Stats returns the work done so far.
func (s *Session) Stats() SessionStats { return s.stats }

// Write adds samples (16 kHz mono in [-1, 1]) and returns the events they produce: finals of
// utterances that ended inside them, then at most one new hypothesis over the buffer, however
// much audio came at once. A transcriber error is returned as is; the session stays usable.
func (s *Session) Write(ctx context.Context, pcm []float32) ([]Event, error) {
	var evs []Event
	for len(pcm) > 0 {
		n := min(len(pcm), frameSamples-len(s.frame))
		s.frame = append(s.frame, pcm[:n]...)
		pcm = pcm[n:]
		if len(s.frame) < frameSamples {
			break
		}
		ev, err := s.addFrame(ctx)
		evs = append(evs, ev...)
		if err != nil {
			return evs, err
		}
	}
	if s.speech < s.minSpeech || s.total()-s.lastHyp < int64(s.step) {
		return evs, nil
	}
	ev, err := s.hypothesis(ctx)
	return append(evs, ev...), err
}

// Commit finalizes what the buffer holds, as if the utterance had ended.
func (s *Session) Commit(ctx context.Context) ([]Event, error) {
	if len(s.frame) > 0 {
		s.buf = append(s.buf, s.frame...)
		s.stats.Audio += time.Duration(len(s.frame)) * time.Second / SampleRate
		s.frame = s.frame[:0]
	}
	return s.finalize(ctx, 0)
}

func (s *Session) total() int64 { return s.bufStart + int64(len(s.buf)) }

// addFrame moves one complete 10 ms frame into the buffer and ends the utterance when it is due.
func (s *Session) addFrame(ctx context.Context) ([]Event, error) {
	var e float64
	for _, v := range s.frame {
		e += float64(v) * float64(v)
	}
	loud := e/float64(len(s.frame)) >= s.rms2
	s.buf = append(s.buf, s.frame...)
	s.stats.Audio += time.Duration(len(s.frame)) * time.Second / SampleRate
	s.frame = s.frame[:0]
	if loud {
		s.speech += frameSamples
		s.trailing = 0
	} else {
		s.trailing += frameSamples
	}
	switch {
	case s.speech < s.minSpeech && s.partial == "" && len(s.prev) == 0:
		// Nothing said yet: keep only a short lead-in.
		if over := len(s.buf) - leadSamples; over > 0 && s.trailing >= len(s.buf) {
			s.drop(over)
		}
		if len(s.buf) >= s.maxBuf {
			s.drop(len(s.buf) - leadSamples)
			s.speech = 0
		}
	case s.silence >= 0 && s.trailing >= s.silence && s.speech >= s.minSpeech:
		// Keep 200 ms of the quiet: Whisper ends words better with some.
		return s.finalize(ctx, max(0, s.trailing-leadSamples))
	case len(s.buf) >= s.maxBuf:
		return s.finalize(ctx, 0)
	}
	return nil, nil
}

// drop removes n samples from the front of the buffer.
func (s *Session) drop(n int) {
	n = min(n, len(s.buf))
	s.buf = s.buf[:copy(s.buf, s.buf[n:])]
	s.bufStart += int64(n)
}

func (s *Session) params() Params {
	p := s.cfg.Params
	p.NoContext = true
	p.InitialPrompt = s.prompt
	return p
}

// transcribe runs the transcriber over buf[:n] and returns its words in stream time, clamped to
// the audio given.
func (s *Session) transcribe(ctx context.Context, n int) ([]Word, error) {
	t0 := s.cfg.Now()
	res, err := s.tr.Transcribe(ctx, s.buf[:n], s.params(), nil)
	busy := s.cfg.Now().Sub(t0)
	s.stats.Transcriptions++
	s.stats.Busy += busy
	if err != nil {
		return nil, err
	}
	// Adapt: the next hypothesis waits for at least as much audio as this one took.
	s.step = max(samples(s.cfg.Step), samples(busy), frameSamples)
	off := float64(s.bufStart) / SampleRate
	end := off + float64(n)/SampleRate
	lang := res.Language // detected when the session's language is not set
	if lang == "" {
		lang = s.cfg.Params.Language
	}
	s.segs = res.Segments
	ws := Words(res.Segments, s.cfg.IsSpecial, lang)
	for i := range ws {
		w := &ws[i]
		w.Start = min(max(off+w.Start, off), end)
		w.End = min(max(off+w.End, w.Start), end)
	}
	return ws, nil
}

// hypothesis transcribes the buffer, settles the words it shares with the previous hypothesis
// and reports the rest as the partial.
func (s *Session) hypothesis(ctx context.Context) ([]Event, error) {
	s.lastHyp = s.total()
	ws, err := s.transcribe(ctx, len(s.buf))
	if err != nil {
		return nil, err
	}
	var evs []Event
	n := commonPrefix(s.prev, ws)
	if n > 0 {
		evs = append(evs, s.final(ws[:n]))
		cut := int64(math.Round(ws[n-1].End * SampleRate))
		s.drop(int(min(max(cut-s.bufStart, 0), int64(len(s.buf)))))
	}
	s.prev = append(s.prev[:0], ws[n:]...)
	if text := joinWords(s.prev); text != s.partial {
		s.partial = text
		ev := Event{Type: "partial", Text: text}
		if len(s.prev) > 0 {
			ev.Start, ev.End = s.prev[0].Start, s.prev[len(s.prev)-1].End
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

// finalize transcribes the buffer less its last skip samples, reports every word as final and
// starts a new utterance.
func (s *Session) finalize(ctx context.Context, skip int) ([]Event, error) {
	var evs []Event
	if s.speech >= s.minSpeech && len(s.buf)-skip > 0 {
		ws, err := s.transcribe(ctx, len(s.buf)-skip)
		if err != nil {
			return nil, err
		}
		if len(ws) > 0 || s.partial != "" {
			evs = append(evs, s.final(ws))
		}
	} else if s.partial != "" {
		evs = append(evs, s.final(nil))
	}
	s.drop(len(s.buf))
	s.lastHyp = s.total()
	s.prev, s.partial = s.prev[:0], ""
	s.speech, s.trailing = 0, 0
	return evs, nil
}

// final makes a final event of ws, the first words of the last transcription, and carries its
// text into the prompt. Its text is the words as the transcript spells them (joinWords), as the
// offline transcription has them; each segment's text is its words', trimmed.
func (s *Session) final(ws []Word) Event {
	sp := spell(ws)
	ev := Event{Type: "final", Text: strings.TrimSpace(sp), Segments: []LiveSegment{}, Tokens: liveTokens(s.segs, s.cfg.IsSpecial, len(sp))}
	if len(ws) == 0 {
		ev.Start = float64(s.bufStart) / SampleRate
		ev.End = ev.Start
		return ev
	}
	ev.Start, ev.End = ws[0].Start, ws[len(ws)-1].End
	for i := 0; i < len(ws); {
		j := i + 1
		for j < len(ws) && ws[j].seg == ws[i].seg {
			j++
		}
		ev.Segments = append(ev.Segments, LiveSegment{Text: joinWords(ws[i:j]), Start: ws[i].Start, End: ws[j-1].End})
		i = j
	}
	s.prompt = promptTail(strings.TrimSpace(s.prompt+sp), s.cfg.PromptBytes)
	return ev
}

// promptTail is the end of text in at most n bytes, beginning at a word where one begins in the
// first half of it, else at a character: text without spaces (Chinese, Japanese) has no word to
// begin at, and a cut at a byte could begin inside a UTF-8 sequence. A character's combining
// marks are not separated from it.
func promptTail(text string, n int) string {
	if len(text) <= n {
		return text
	}
	i := len(text) - n
	if text[i-1] == ' ' {
		return text[i:]
	}
	for i < len(text) {
		r, size := utf8.DecodeRuneInString(text[i:])
		if (r != utf8.RuneError || size > 1) && !unicode.Is(unicode.M, r) {
			break
		}
		i += size
	}
	t := text[i:]
	if k := strings.IndexByte(t, ' '); k >= 0 && k < len(t)/2 {
		t = t[k+1:]
	}
	return t
}
