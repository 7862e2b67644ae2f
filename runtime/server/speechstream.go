package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/sched/tts"
)

// SpeechStreamConfig configures live synthesis at GET /v1/audio/speech/stream (protocol:
// docs/streaming.md).
type SpeechStreamConfig struct {
	// MaxSessions bounds the sessions open at once; one more is answered 429 before the
	// WebSocket upgrade. 0 means 16.
	MaxSessions int
	// MaxText bounds the text received and not yet being synthesised, in characters; beyond it
	// the session gets an "error" event "text_overflow" and is closed with 1008. 0 means 4096.
	MaxText int
	// IdleTimeout closes a session that sends no message for this long while nothing of its is
	// being synthesised ("error" event "idle_timeout", close 1008). 0 means 30 s.
	IdleTimeout time.Duration
	// MaxMessageBytes bounds one message; a larger one closes the session with 1009. 0 means
	// 64 KiB.
	MaxMessageBytes int64
	// ClauseChars is the text after which, with no sentence's end in it yet, the text up to its
	// last clause boundary (",;:" and a space) is synthesised. 0 means 200.
	ClauseChars int
	// WriteTimeout bounds the write of one audio frame: a client that takes no audio for this
	// long loses its session (closed at once). 0 means 10 s.
	WriteTimeout time.Duration
}

func (c *SpeechStreamConfig) setDefaults() error {
	if c.MaxSessions < 0 || c.MaxText < 0 || c.IdleTimeout < 0 || c.MaxMessageBytes < 0 || c.ClauseChars < 0 || c.WriteTimeout < 0 {
		return errors.New("server: negative speech stream limit")
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 16
	}
	if c.MaxText == 0 {
		c.MaxText = maxSpeechInput
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 30 * time.Second
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 64 << 10
	}
	if c.ClauseChars == 0 {
		c.ClauseChars = 200
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 10 * time.Second
	}
	return nil
}

// speakEvent is a JSON text message from the client.
type speakEvent struct {
	Type string `json:"type"` // "config", "text", "flush", "cancel" or "close"
	Text string `json:"text"` // for "text"
	// ResponseFormat is the audio's format, for "config": "pcm", "wav" or "flac".
	ResponseFormat *string `json:"response_format"`
}

// liveFormats are the response formats of a live synthesis, as messages name them.
const liveFormats = "'pcm', 'wav' and 'flac'"

// liveFormat reports whether f is a response format of live synthesis.
func liveFormat(f string) bool { return f == "pcm" || f == "wav" || f == "flac" }

// liveEncoder turns a session's frames into its response format's bytes: 16-bit PCM as it is;
// a WAV stream (its header, with the sizes unknown, before the first frame); or a FLAC stream
// (its header, with the total and MD5 unknown, then one FLAC frame of speechBlock samples per
// frame). The binary messages of a session joined are one file of that format.
type liveEncoder struct {
	format  string
	rate    int
	started bool // the header is sent
	flac    *audio.FLACEncoder
	pcm     []byte
	buf     []byte
}

// header is what goes before the first frame: nil for PCM.
func (e *liveEncoder) header() ([]byte, error) {
	switch e.format {
	case "wav":
		return audio.WAVStreamHeader(e.rate)
	case "flac":
		var err error
		if e.flac, err = audio.NewFLACEncoder(e.rate, speechBlock); err != nil {
			return nil, err
		}
		return e.flac.Header(0, nil)
	}
	return nil, nil
}

// frame encodes one frame's samples; the bytes are reused by the next call.
func (e *liveEncoder) frame(a []float32) ([]byte, error) {
	e.pcm = audio.FloatToPCM16(e.pcm[:0], a)
	if e.flac == nil {
		return e.pcm, nil
	}
	var err error
	e.buf, err = e.flac.Append(e.buf[:0], e.pcm)
	return e.buf, err
}

// flush is what ends the stream: a FLAC block left short, if any.
func (e *liveEncoder) flush() []byte {
	if e.flac == nil {
		return nil
	}
	e.buf = e.flac.Flush(e.buf[:0])
	return e.buf
}

// speakItem is one entry of a session's queue: text to speak, or an event to send once what
// is before it is spoken.
type speakItem struct {
	text string
	op   string // "": speak text; "flush", "cancel", "close" or opShutdown
}

// speakLive is one WebSocket synthesis session.
type speakLive struct {
	s     *Server
	m     *TTSModel
	voice voiceRef
	c     *websocket.Conn
	ri    *reqInfo
	cfg   *SpeechStreamConfig

	mu      sync.Mutex
	buf     strings.Builder // text received, not yet a whole sentence
	queue   []speakItem
	pending int  // characters in buf and queue
	busy    bool // the worker is speaking
	closing bool // "close" or a shutdown is queued: no more text is taken
	// stop cancels the text being spoken, for "cancel"
	stop context.CancelFunc
	wake chan struct{}
	idle *time.Timer

	cancel  context.CancelFunc // ends the session's context
	endOnce sync.Once
	// enc encodes the audio; its format is set before the worker speaks (a "config" event is
	// taken only before any text), and it is the worker's from then on.
	enc liveEncoder
	// configurable is true until the first event other than "config".
	configurable bool
	// stall is armed while a frame is written: a client that takes no frame for
	// WriteTimeout loses its session.
	stall *time.Timer
}

// speechStream upgrades to a WebSocket and runs a live synthesis session:
// GET /v1/audio/speech/stream?model=M&voice=V[&response_format=pcm|wav|flac].
func (s *Server) speechStream(w http.ResponseWriter, r *http.Request) {
	ri := info(r.Context())
	q := r.URL.Query()
	m, e := s.ttsModel(r, q.Get("model"), nil)
	if e != nil {
		writeError(w, e)
		return
	}
	if q.Get("voice") == "" {
		writeError(w, invalid("voice", "Missing required parameter: 'voice'."))
		return
	}
	voice, e := s.findVoice(m, q.Get("voice"))
	if e != nil {
		writeError(w, e)
		return
	}
	format := "pcm"
	if q.Has("response_format") {
		if format = q.Get("response_format"); !liveFormat(format) {
			writeError(w, invalidCode("response_format", "invalid_response_format", fmt.Sprintf("Invalid response_format %q: live synthesis sends %s.", format, liveFormats)))
			return
		}
	}
	cfg := &s.cfg.SpeechStream
	if s.speakSessions.isDraining() {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: "The server is shutting down.", Type: typeServer, Code: strptr("shutting_down"), RetryAfter: 5})
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		w.Header().Set("Upgrade", "websocket")
		writeError(w, &apiError{Status: http.StatusUpgradeRequired, Message: "This endpoint speaks WebSocket: send a WebSocket upgrade request.", Type: typeInvalidRequest})
		return
	}
	if n := s.speakers.Add(1); n > int64(cfg.MaxSessions) {
		s.speakers.Add(-1)
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Message: "Too many live synthesis sessions are open; retry shortly.", Type: typeRateLimit, Code: strptr("too_many_sessions"), RetryAfter: 1})
		return
	}
	defer s.speakers.Add(-1)
	c, err := websocket.Accept(w, r, s.acceptOptions(r))
	if err != nil {
		ri.log.Info("websocket upgrade refused", "err", err)
		return
	}
	c.SetReadLimit(cfg.MaxMessageBytes)
	s.metrics.speakers.Inc()
	defer s.metrics.speakers.Dec()
	sl := &speakLive{s: s, m: m, voice: voice, c: c, ri: ri, cfg: cfg, wake: make(chan struct{}, 1),
		enc: liveEncoder{format: format, rate: m.Synth.SampleRate()}, configurable: true}
	sl.run(r.Context(), q.Get("voice"))
}

// acceptOptions are the WebSocket handshake's: the subprotocols offered, and the origins of
// AllowedOrigins (the CORS check has already refused any other).
func (s *Server) acceptOptions(r *http.Request) *websocket.AcceptOptions {
	opts := &websocket.AcceptOptions{Subprotocols: acceptProtocols(r)}
	for _, o := range s.cfg.AllowedOrigins {
		if o == "*" {
			opts.InsecureSkipVerify = true
		} else if u, err := url.Parse(o); err == nil && u.Host != "" {
			opts.OriginPatterns = append(opts.OriginPatterns, u.Host)
		}
	}
	return opts
}

func (sl *speakLive) send(ctx context.Context, v any) error { return wsSendJSON(ctx, sl.c, v) }

// end sends ev (if not nil) and closes the connection; only the first call does anything.
func (sl *speakLive) end(code websocket.StatusCode, reason string, ev *errorEvent) {
	sl.endOnce.Do(func() {
		if ev != nil {
			ev.Type = "error"
			sl.ri.log.Info("speech stream closed", "model", sl.m.Name, "code", ev.Code, "reason", ev.Message)
			sl.send(context.Background(), ev)
		}
		sl.c.Close(code, reason)
	})
}

type speakReady struct {
	Type           string `json:"type"` // "ready", or "configured" in answer to "config"
	Model          string `json:"model"`
	Voice          string `json:"voice"`
	SampleRate     int    `json:"sample_rate"`
	Format         string `json:"format"`          // "pcm_s16le": the samples, in every response format
	ResponseFormat string `json:"response_format"` // "pcm", "wav" or "flac"
}

func (sl *speakLive) run(ctx context.Context, voiceName string) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sl.cancel = cancel
	if !sl.s.speakSessions.add(sl) {
		sl.end(websocket.StatusGoingAway, "server shutting down", shuttingDown())
		return
	}
	defer sl.s.speakSessions.remove(sl)
	sl.stall = time.AfterFunc(time.Hour, func() {
		sl.ri.log.Info("speech stream closed", "model", sl.m.Name, "reason", "the client took no audio for "+sl.cfg.WriteTimeout.String())
		cancel()
		sl.c.CloseNow()
	})
	sl.stall.Stop()
	defer sl.stall.Stop()
	sl.idle = time.AfterFunc(time.Hour, func() { // armed once "ready" is sent
		if sl.active() {
			sl.idle.Reset(sl.cfg.IdleTimeout)
			return
		}
		sl.end(websocket.StatusPolicyViolation, "idle timeout", &errorEvent{Code: "idle_timeout", Message: fmt.Sprintf("No message for %v.", sl.cfg.IdleTimeout)})
	})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sl.work(ctx)
	}()
	if err := sl.send(ctx, sl.ready("ready", voiceName)); err != nil {
		sl.end(websocket.StatusInternalError, "", nil)
	}
	sl.idle.Reset(sl.cfg.IdleTimeout)
	sl.read(ctx, voiceName)
	sl.idle.Stop()
	cancel()
	sl.mu.Lock()
	if sl.stop != nil {
		sl.stop()
	}
	sl.mu.Unlock()
	wg.Wait()
	sl.end(websocket.StatusNormalClosure, "", nil)
}

// ready is the "ready" event (or "configured", typ) of the session.
func (sl *speakLive) ready(typ, voiceName string) speakReady {
	return speakReady{Type: typ, Model: sl.m.Name, Voice: voiceName, SampleRate: sl.m.Synth.SampleRate(), Format: "pcm_s16le", ResponseFormat: sl.enc.format}
}

// read takes the client's messages until the connection ends or a message ends the session.
func (sl *speakLive) read(ctx context.Context, voiceName string) {
	for {
		typ, b, err := sl.c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) == -1 && ctx.Err() == nil && !errors.Is(err, io.EOF) &&
				!errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) {
				sl.end(websocket.StatusProtocolError, "protocol error", nil)
			}
			return
		}
		sl.idle.Reset(sl.cfg.IdleTimeout)
		if typ == websocket.MessageBinary {
			sl.end(websocket.StatusUnsupportedData, "unsupported_data", &errorEvent{Code: "unsupported_data", Message: "Binary messages are not taken: send text as {\"type\":\"text\",\"text\":...}."})
			return
		}
		var ev speakEvent
		if err := json.Unmarshal(b, &ev); err != nil {
			sl.end(websocket.StatusInvalidFramePayloadData, "invalid_json", &errorEvent{Code: "invalid_json", Message: "A text message is not a JSON event."})
			return
		}
		switch ev.Type {
		case "config", "text", "flush", "cancel", "close":
		default:
			sl.end(websocket.StatusUnsupportedData, "unknown_event", &errorEvent{Code: "unknown_event", Message: fmt.Sprintf("Unknown event type %q: want config, text, flush, cancel or close.", ev.Type)})
			return
		}
		if ev.Type != "text" && ev.Text != "" {
			sl.end(websocket.StatusPolicyViolation, "invalid_event", &errorEvent{Code: "invalid_event", Message: fmt.Sprintf("A %q event carries no text.", ev.Type)})
			return
		}
		if ev.Type != "config" && ev.ResponseFormat != nil {
			sl.end(websocket.StatusPolicyViolation, "invalid_event", &errorEvent{Code: "invalid_event", Message: fmt.Sprintf("A %q event carries no response_format: send it in a \"config\" event first, or in the URL's query.", ev.Type)})
			return
		}
		if ev.Type == "config" {
			if ev := sl.configure(ev); ev != nil {
				sl.end(websocket.StatusPolicyViolation, ev.Code, ev)
				return
			}
			if err := sl.send(ctx, sl.ready("configured", voiceName)); err != nil {
				return
			}
			continue
		}
		if ok, ev := sl.take(ev); !ok {
			sl.end(websocket.StatusPolicyViolation, ev.Code, ev)
			return
		}
	}
}

// configure applies a "config" event: the error to end the session with, if it cannot.
func (sl *speakLive) configure(ev speakEvent) *errorEvent {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	switch {
	case !sl.configurable:
		return &errorEvent{Code: "invalid_event", Message: "A \"config\" event comes before any other event."}
	case ev.ResponseFormat == nil:
		return &errorEvent{Code: "invalid_event", Message: "A \"config\" event needs a response_format."}
	case !liveFormat(*ev.ResponseFormat):
		return &errorEvent{Code: "invalid_response_format", Message: fmt.Sprintf("Invalid response_format %q: live synthesis sends %s.", *ev.ResponseFormat, liveFormats)}
	}
	sl.enc.format = *ev.ResponseFormat
	return nil
}

// take applies one client event to the buffer and queue; false (with the event to send) when
// it breaks the session's limits.
func (sl *speakLive) take(ev speakEvent) (bool, *errorEvent) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	sl.configurable = false
	if sl.closing {
		return true, nil // after "close", the rest is ignored
	}
	switch ev.Type {
	case "text":
		if !utf8.ValidString(ev.Text) {
			return false, &errorEvent{Code: "invalid_text", Message: "The text is not valid UTF-8."}
		}
		n := utf8.RuneCountInString(ev.Text)
		if sl.pending+n > sl.cfg.MaxText {
			return false, &errorEvent{Code: "text_overflow", Message: fmt.Sprintf("More than %d characters of text are waiting to be spoken: send text no faster than it is spoken, or flush.", sl.cfg.MaxText)}
		}
		sl.pending += n
		sl.buf.WriteString(ev.Text)
		head, rest := splitSpeakable(sl.buf.String(), sl.cfg.ClauseChars)
		if head != "" {
			sl.buf.Reset()
			sl.buf.WriteString(rest)
			sl.enqueue(head)
		}
	case "flush", "close":
		sl.enqueue(sl.buf.String())
		sl.buf.Reset()
		sl.queue = append(sl.queue, speakItem{op: ev.Type})
		sl.closing = ev.Type == "close"
	case "cancel":
		sl.buf.Reset()
		sl.queue = append(sl.queue[:0], speakItem{op: "cancel"})
		sl.pending = 0
		if sl.stop != nil {
			sl.stop()
		}
	}
	select {
	case sl.wake <- struct{}{}:
	default:
	}
	return true, nil
}

// enqueue queues text to speak, without white space at either end; the characters of text
// stay pending until the worker takes it, and white space alone is dropped.
func (sl *speakLive) enqueue(text string) {
	t := strings.TrimSpace(text)
	sl.pending -= utf8.RuneCountInString(text) - utf8.RuneCountInString(t)
	if t != "" {
		sl.queue = append(sl.queue, speakItem{text: t})
	}
}

// shutdown queues the end of a session for a server shutdown: what is buffered is spoken, then
// the session closes with 1001.
func (sl *speakLive) shutdown() {
	sl.mu.Lock()
	if !sl.closing {
		sl.enqueue(sl.buf.String())
		sl.buf.Reset()
		sl.closing = true
	}
	sl.queue = append(sl.queue, speakItem{op: opShutdown})
	sl.mu.Unlock()
	select {
	case sl.wake <- struct{}{}:
	default:
	}
}

// next takes the queue's head; ok is false when it is empty. A text item comes with the
// context its synthesis runs under, which "cancel" ends.
func (sl *speakLive) next(ctx context.Context) (it speakItem, pctx context.Context, ok bool) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if len(sl.queue) == 0 {
		sl.busy = false
		return it, nil, false
	}
	it = sl.queue[0]
	sl.queue = sl.queue[1:]
	sl.busy = true
	sl.pending -= utf8.RuneCountInString(it.text)
	if sl.stop != nil {
		sl.stop() // the context of the item before, which is done
	}
	pctx, sl.stop = context.WithCancel(ctx)
	return it, pctx, true
}

func (sl *speakLive) active() bool {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return sl.busy || len(sl.queue) > 0
}

type speakSegment struct {
	Type string `json:"type"` // "segment" or "skipped"
	Text string `json:"text"`
	// Message says why a text was skipped.
	Message string `json:"message,omitempty"`
}

// work speaks the queue until the session ends.
func (sl *speakLive) work(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sl.wake:
		}
		for {
			it, pctx, ok := sl.next(ctx)
			if !ok {
				sl.idle.Reset(sl.cfg.IdleTimeout)
				break
			}
			var err error
			switch it.op {
			case "":
				err = sl.speak(ctx, pctx, it.text)
			case "flush":
				err = sl.send(ctx, map[string]string{"type": "flushed"})
			case "cancel":
				err = sl.send(ctx, map[string]string{"type": "cancelled"})
			case "close":
				// A session that spoke nothing still sends its format's header: its binary
				// messages are an empty file of that format.
				if err := sl.start(ctx); err != nil && !errors.Is(err, errHeader) {
					return
				}
				if b := sl.enc.flush(); len(b) > 0 {
					if sl.writeAudio(ctx, b) != nil {
						return
					}
				}
				sl.send(ctx, map[string]string{"type": "done"})
				sl.end(websocket.StatusNormalClosure, "closed by the client", nil)
				return
			case opShutdown:
				sl.end(websocket.StatusGoingAway, "server shutting down", shuttingDown())
				return
			}
			if err != nil {
				return
			}
		}
	}
}

// errHeader wraps a failure to make the response format's header (not the connection's).
var errHeader = errors.New("the audio header")

// start sends the response format's header before the session's first audio, once. An error
// wrapping errHeader is the header's; any other is the connection's.
func (sl *speakLive) start(ctx context.Context) error {
	if sl.enc.started {
		return nil
	}
	sl.enc.started = true
	h, err := sl.enc.header()
	if err != nil {
		return fmt.Errorf("%w: %w", errHeader, err)
	}
	if h == nil {
		return nil
	}
	return sl.writeAudio(ctx, h)
}

// speak synthesises one piece of text and sends its audio; an error ends the session.
func (sl *speakLive) speak(ctx, pctx context.Context, text string) error {
	if strings.TrimSpace(text) == "" {
		return nil
	}
	if err := sl.send(ctx, speakSegment{Type: "segment", Text: text}); err != nil {
		return err
	}
	r := tts.Request{Text: text, Temperature: -1}
	sl.voice.apply(&r)
	samples := 0   // sent
	var werr error // the connection's, which ends the session
	err := sl.m.Synth.Speak(pctx, r, func(a []float32) error {
		if err := pctx.Err(); err != nil {
			return err
		}
		if err := sl.start(ctx); err != nil {
			if !errors.Is(err, errHeader) {
				werr = err
			}
			return err
		}
		b, err := sl.enc.frame(a)
		if err != nil {
			return err
		}
		if len(b) > 0 {
			werr = sl.writeAudio(ctx, b)
		}
		if werr == nil {
			samples += len(a)
		}
		return werr
	})
	if samples > 0 {
		sl.s.metrics.speechSec.WithLabelValues(sl.m.Name, "stream").Add(float64(samples) / float64(sl.m.Synth.SampleRate()))
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil || werr != nil:
		return err
	case pctx.Err() != nil:
		return nil // cancelled by the client; "cancelled" follows
	case errors.Is(err, tts.ErrInput):
		return sl.send(ctx, speakSegment{Type: "skipped", Text: text, Message: speechInputMessage(err)})
	}
	sl.ri.log.Error("speech stream synthesis failed", "model", sl.m.Name, "err", err)
	sl.end(websocket.StatusInternalError, "synthesis failed", &errorEvent{Code: "internal_error", Message: "The synthesis failed."})
	return err
}

// writeAudio sends one binary message of audio. It is written under the session's context, not
// the piece's: a write whose context ends closes the connection, and "cancel" ends the piece's.
func (sl *speakLive) writeAudio(ctx context.Context, b []byte) error {
	sl.stall.Reset(sl.cfg.WriteTimeout)
	err := sl.c.Write(ctx, websocket.MessageBinary, b)
	sl.stall.Stop()
	return err
}

// splitSpeakable cuts text after its last sentence end (".", "!", "?", "…" and their
// full-width forms, with any closing quotes or brackets, followed by white space); with none,
// and at least clause characters, after its last clause boundary (",", ";", ":" and white
// space). head is what may be spoken now, rest what waits for more text.
func splitSpeakable(text string, clause int) (head, rest string) {
	cut := lastBoundary(text, ".!?…。！？")
	if cut < 0 && utf8.RuneCountInString(text) >= clause {
		cut = lastBoundary(text, ",;:，；：")
	}
	if cut < 0 {
		return "", text
	}
	return text[:cut], text[cut:]
}

// lastBoundary is the index just after the last of ends (and closing quotes and brackets) that
// white space follows; -1 if none does.
func lastBoundary(text, ends string) int {
	for i := len(text); i > 0; {
		r, n := utf8.DecodeLastRuneInString(text[:i])
		i -= n
		if !unicode.IsSpace(r) || i == 0 {
			continue
		}
		j := i
		for j > 0 {
			c, m := utf8.DecodeLastRuneInString(text[:j])
			if !strings.ContainsRune(`"')]»”’`, c) {
				break
			}
			j -= m
		}
		if c, _ := utf8.DecodeLastRuneInString(text[:j]); j > 0 && strings.ContainsRune(ends, c) {
			return i
		}
	}
	return -1
}
