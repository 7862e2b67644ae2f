package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// StreamConfig configures live transcription at GET /v1/audio/stream (protocol: docs/streaming.md).
type StreamConfig struct {
	// MaxSessions bounds the sessions open at once; one more is answered 429 before the
	// WebSocket upgrade. 0 means 16.
	MaxSessions int
	// MaxBacklog bounds the audio received but not yet taken up by the session (a client sending
	// faster than the transcriber keeps up); beyond it the session gets an "error" event with
	// code "backlog" and is closed with 1008 (policy violation). 0 means 10 s.
	MaxBacklog time.Duration
	// IdleTimeout closes a session that sends no message for this long ("error" event
	// "idle_timeout", close 1008). 0 means 30 s.
	IdleTimeout time.Duration
	// MaxMessageBytes bounds one message; a larger one closes the session with 1009. 0 means 1 MiB.
	MaxMessageBytes int64
	// Session tunes the live transcription (Step, Silence, SilenceRMS, MaxBuffer, ...); Params,
	// IsSpecial and PromptBytes come from the model and the request.
	Session asr.SessionConfig
}

func (c *StreamConfig) setDefaults() error {
	if c.MaxSessions < 0 || c.MaxBacklog < 0 || c.IdleTimeout < 0 || c.MaxMessageBytes < 0 {
		return errors.New("server: negative stream limit")
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 16
	}
	if c.MaxBacklog == 0 {
		c.MaxBacklog = 10 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 30 * time.Second
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 1 << 20
	}
	return nil
}

// clientEvent is a JSON text message from the client.
type clientEvent struct {
	Type  string `json:"type"`  // "audio", "commit" or "close"
	Audio string `json:"audio"` // base64 PCM16LE, for "audio"
}

type errorEvent struct {
	Type    string `json:"type"` // "error"
	Code    string `json:"code"`
	Message string `json:"message"`
}

type readyEvent struct {
	Type       string `json:"type"` // "ready"
	Model      string `json:"model"`
	SampleRate int    `json:"sample_rate"`
}

// item is one entry of a session's inbox: audio, or a commit or close request after it.
type item struct {
	pcm []float32
	op  string // "", "commit", "close" or opShutdown
}

// opShutdown is the item a server shutdown queues after the audio a session has received: the
// session transcribes that audio to its end, sends the final text, and closes with 1001.
const opShutdown = "shutdown"

// liveSet is the open live sessions, which a graceful shutdown lets finish.
type liveSet struct {
	mu       sync.Mutex
	open     map[*live]struct{}
	draining bool
	wg       sync.WaitGroup
}

// add registers lv; false once the server is shutting down.
func (ls *liveSet) add(lv *live) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.draining {
		return false
	}
	if ls.open == nil {
		ls.open = map[*live]struct{}{}
	}
	ls.open[lv] = struct{}{}
	ls.wg.Add(1)
	return true
}

func (ls *liveSet) remove(lv *live) {
	ls.mu.Lock()
	delete(ls.open, lv)
	ls.mu.Unlock()
	ls.wg.Done()
}

func (ls *liveSet) isDraining() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.draining
}

// list returns the open sessions; drain also refuses new ones from now on.
func (ls *liveSet) list(drain bool) []*live {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.draining = ls.draining || drain
	out := make([]*live, 0, len(ls.open))
	for lv := range ls.open {
		out = append(out, lv)
	}
	return out
}

// Shutdown ends the live transcription sessions (GET /v1/audio/stream) gracefully, as
// http.Server.Shutdown does for requests, whose connections it does not track once upgraded:
// new sessions are refused (503), and each open session transcribes the audio it has received,
// sends its final text, and closes with 1001 and the "shutting_down" event. Sessions still open
// when ctx ends are closed at once, their transcription cancelled; Shutdown then returns
// ctx.Err(). It does not close the recognisers.
func (s *Server) Shutdown(ctx context.Context) error {
	for _, lv := range s.lives.list(true) {
		lv.push(item{op: opShutdown}, math.MaxInt)
	}
	done := make(chan struct{})
	go func() {
		s.lives.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	for _, lv := range s.lives.list(true) {
		lv.end(websocket.StatusGoingAway, "server shutting down", shuttingDown())
		lv.cancel()
	}
	select { // cancelled sessions end within a step of their recogniser; do not wait on a stuck one
	case <-done:
	case <-time.After(5 * time.Second):
	}
	return ctx.Err()
}

func shuttingDown() *errorEvent {
	return &errorEvent{Code: "shutting_down", Message: "The server is shutting down."}
}

// live is one WebSocket transcription session.
type live struct {
	s    *Server
	m    *speechServed
	c    *websocket.Conn
	sess asr.Live
	ri   *reqInfo

	mu      sync.Mutex
	inbox   []item
	backlog int // samples in inbox
	wake    chan struct{}
	cancel  context.CancelFunc // ends run's context

	// The session is idle when the client has sent nothing for the idle timeout and nothing of
	// its is being transcribed: a client waiting for the results of audio it sent faster than
	// the machine transcribes it is not idle. busy is set while the worker has taken items and
	// not finished them (guarded by mu, so that the timer sees inbox and busy together); idle
	// fires IdleTimeout after the last message or the last finished work.
	busy bool
	idle *time.Timer

	endOnce sync.Once
}

// audioStream upgrades to a WebSocket and runs a live transcription session.
func (s *Server) audioStream(w http.ResponseWriter, r *http.Request) {
	ri := info(r.Context())
	q := r.URL.Query()
	m, e := s.speechModel(q.Get("model"))
	if e != nil {
		writeError(w, e)
		return
	}
	lang, e := m.checkLanguage(strings.ToLower(q.Get("language")))
	if e != nil {
		writeError(w, e)
		return
	}
	cfg := s.cfg.Stream.Session
	cfg.Params = m.params
	cfg.Params.Language = lang
	cfg.Params.InitialPrompt = q.Get("prompt")
	cfg.Params.Timeout = 0
	cfg.IsSpecial = m.Recognizer.IsSpecial
	if s.lives.isDraining() {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: "The server is shutting down.", Type: typeServer, Code: strptr("shutting_down"), RetryAfter: 5})
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		w.Header().Set("Upgrade", "websocket")
		writeError(w, &apiError{Status: http.StatusUpgradeRequired, Message: "This endpoint speaks WebSocket: send a WebSocket upgrade request.", Type: typeInvalidRequest})
		return
	}
	if n := s.streams.Add(1); n > int64(s.cfg.Stream.MaxSessions) {
		s.streams.Add(-1)
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Message: "Too many live transcription sessions are open; retry shortly.", Type: typeRateLimit, Code: strptr("too_many_sessions"), RetryAfter: 1})
		return
	}
	defer s.streams.Add(-1)
	lv := &live{s: s, m: m, ri: ri, wake: make(chan struct{}, 1)}
	var tr asr.Transcriber = &meteredRecognizer{lv: lv}
	if _, ok := m.Recognizer.(asr.Streamer); ok {
		tr = &meteredStreamer{meteredRecognizer{lv: lv}}
	}
	sess, err := asr.NewLive(tr, cfg)
	if err != nil {
		writeError(w, invalid("", "Invalid session parameters: "+err.Error()))
		return
	}
	lv.sess = sess
	opts := &websocket.AcceptOptions{Subprotocols: acceptProtocols(r)}
	for _, o := range s.cfg.AllowedOrigins {
		if o == "*" {
			opts.InsecureSkipVerify = true
		} else if u, err := url.Parse(o); err == nil && u.Host != "" {
			opts.OriginPatterns = append(opts.OriginPatterns, u.Host)
		}
	}
	c, err := websocket.Accept(w, r, opts)
	if err != nil {
		ri.log.Info("websocket upgrade refused", "err", err)
		return
	}
	lv.c = c
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	c.SetReadLimit(s.cfg.Stream.MaxMessageBytes)
	lv.run(r.Context())
}

// meteredRecognizer is the session's transcriber: the model's recogniser, timed into the metrics.
type meteredRecognizer struct{ lv *live }

func (t *meteredRecognizer) Transcribe(ctx context.Context, pcm []float32, p asr.Params, f func(asr.Segment)) (*asr.Result, error) {
	t0 := time.Now()
	res, err := t.lv.m.Recognizer.Transcribe(ctx, pcm, p, f)
	t.lv.s.metrics.asrTime.WithLabelValues(t.lv.m.Name, "stream").Observe(time.Since(t0).Seconds())
	return res, err
}

// meteredStreamer is the meteredRecognizer of a recogniser that is an asr.Streamer: the session
// is the recogniser's own, each chunk it decodes timed into the metrics.
type meteredStreamer struct{ meteredRecognizer }

func (t *meteredStreamer) NewLive(cfg asr.SessionConfig) (asr.Live, error) {
	h := t.lv.s.metrics.asrTime.WithLabelValues(t.lv.m.Name, "stream")
	cfg.OnChunk = func(d time.Duration) { h.Observe(d.Seconds()) }
	return t.lv.m.Recognizer.(asr.Streamer).NewLive(cfg)
}

func (lv *live) send(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return lv.c.Write(wctx, websocket.MessageText, b)
}

// end sends ev (if not nil) and closes the connection with code and reason; only the first call
// does anything, and later calls wait for it to finish.
func (lv *live) end(code websocket.StatusCode, reason string, ev *errorEvent) {
	lv.endOnce.Do(func() {
		if ev != nil {
			ev.Type = "error"
			lv.ri.log.Info("stream closed", "model", lv.m.Name, "code", ev.Code, "reason", ev.Message)
			lv.send(context.Background(), ev)
		}
		lv.c.Close(code, reason)
	})
}

func (lv *live) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lv.cancel = cancel
	if !lv.s.lives.add(lv) {
		lv.end(websocket.StatusGoingAway, "server shutting down", shuttingDown())
		return
	}
	defer lv.s.lives.remove(lv)
	cfg := &lv.s.cfg.Stream
	lv.idle = time.AfterFunc(time.Hour, func() { // armed below, once "ready" is sent
		if lv.active() {
			lv.idle.Reset(cfg.IdleTimeout)
			return
		}
		lv.end(websocket.StatusPolicyViolation, "idle timeout", &errorEvent{Code: "idle_timeout", Message: fmt.Sprintf("No message for %v.", cfg.IdleTimeout)})
	})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		lv.work(ctx)
	}()
	if err := lv.send(ctx, readyEvent{Type: "ready", Model: lv.m.Name, SampleRate: asr.SampleRate}); err != nil {
		lv.end(websocket.StatusInternalError, "", nil)
	}
	// The client's time to speak starts once it has been told the session is ready.
	lv.idle.Reset(cfg.IdleTimeout)
	lv.read(ctx, int(cfg.MaxBacklog.Seconds()*asr.SampleRate))
	lv.idle.Stop()
	cancel()
	wg.Wait()
	lv.end(websocket.StatusNormalClosure, "", nil)
}

// read queues the client's messages until the connection ends or a message ends the session.
func (lv *live) read(ctx context.Context, maxBacklog int) {
	closing := false
	for {
		typ, b, err := lv.c.Read(ctx)
		if err != nil {
			// Not a close from the client, nor the connection going away, nor the session
			// ending: a frame that breaks the protocol (the library closes with 1002 for most
			// such frames itself, but not for an unmasked one).
			if websocket.CloseStatus(err) == -1 && ctx.Err() == nil && !errors.Is(err, io.EOF) &&
				!errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) {
				lv.end(websocket.StatusProtocolError, "protocol error", nil)
			}
			return
		}
		lv.idle.Reset(lv.s.cfg.Stream.IdleTimeout)
		if closing {
			continue
		}
		it, code, ev := parseMessage(typ, b)
		if ev != nil {
			lv.end(code, ev.Code, ev)
			return
		}
		closing = it.op == "close"
		if !lv.push(it, maxBacklog) {
			lv.end(websocket.StatusPolicyViolation, "backlog", &errorEvent{Code: "backlog",
				Message: fmt.Sprintf("More than %v of audio is waiting: send audio no faster than real time.", lv.s.cfg.Stream.MaxBacklog)})
			return
		}
	}
}

// parseMessage reads one client message; a bad one yields the error event and close code.
func parseMessage(typ websocket.MessageType, b []byte) (item, websocket.StatusCode, *errorEvent) {
	if typ == websocket.MessageBinary {
		pcm, err := pcm16(b)
		if err != nil {
			return item{}, websocket.StatusInvalidFramePayloadData, &errorEvent{Code: "invalid_audio", Message: err.Error()}
		}
		return item{pcm: pcm}, 0, nil
	}
	var ev clientEvent
	if err := json.Unmarshal(b, &ev); err != nil {
		return item{}, websocket.StatusInvalidFramePayloadData, &errorEvent{Code: "invalid_json", Message: "A text message is not a JSON event."}
	}
	switch ev.Type {
	case "audio":
		raw, err := base64.StdEncoding.DecodeString(ev.Audio)
		if err != nil {
			return item{}, websocket.StatusInvalidFramePayloadData, &errorEvent{Code: "invalid_audio", Message: "The audio field is not base64."}
		}
		pcm, err := pcm16(raw)
		if err != nil {
			return item{}, websocket.StatusInvalidFramePayloadData, &errorEvent{Code: "invalid_audio", Message: err.Error()}
		}
		return item{pcm: pcm}, 0, nil
	case "commit", "close":
		return item{op: ev.Type}, 0, nil
	}
	return item{}, websocket.StatusUnsupportedData, &errorEvent{Code: "unknown_event", Message: fmt.Sprintf("Unknown event type %q: want audio, commit or close.", ev.Type)}
}

func pcm16(b []byte) ([]float32, error) {
	if len(b)%2 != 0 {
		return nil, fmt.Errorf("audio of %d bytes is not whole 16-bit samples", len(b))
	}
	pcm := make([]float32, len(b)/2)
	audio.PCM16ToFloat(pcm, b)
	return pcm, nil
}

// push queues it for the worker; false when the backlog is over max.
func (lv *live) push(it item, max int) bool {
	lv.mu.Lock()
	lv.inbox = append(lv.inbox, it)
	lv.backlog += len(it.pcm)
	over := lv.backlog > max
	lv.mu.Unlock()
	select {
	case lv.wake <- struct{}{}:
	default:
	}
	return !over
}

func (lv *live) take() []item {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	its := lv.inbox
	lv.inbox, lv.backlog = nil, 0
	lv.busy = len(its) > 0
	return its
}

// active reports whether the worker holds items or items wait in the inbox.
func (lv *live) active() bool {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return lv.busy || len(lv.inbox) > 0
}

// done notes that the worker finished what it took: the idle timeout runs from now.
func (lv *live) done() {
	lv.mu.Lock()
	was := lv.busy
	lv.busy = false
	lv.mu.Unlock()
	if was {
		lv.idle.Reset(lv.s.cfg.Stream.IdleTimeout)
	}
}

// work runs the session over the inbox until ctx ends or the client asks to close.
func (lv *live) work(ctx context.Context) {
	var pcm []float32
	for {
		select {
		case <-ctx.Done():
			return
		case <-lv.wake:
		}
		for _, it := range lv.take() {
			pcm = append(pcm, it.pcm...)
			if it.op == "" {
				continue
			}
			if !lv.write(ctx, pcm) {
				return
			}
			pcm = pcm[:0]
			evs, err := lv.sess.Commit(ctx)
			if !lv.emit(ctx, evs, err) {
				return
			}
			switch it.op {
			case "close":
				lv.end(websocket.StatusNormalClosure, "closed by the client", nil)
				return
			case opShutdown:
				lv.end(websocket.StatusGoingAway, "server shutting down", shuttingDown())
				return
			}
		}
		if !lv.write(ctx, pcm) {
			return
		}
		pcm = pcm[:0]
		lv.done()
	}
}

// wireEvent is ev as it is sent: its times to the millisecond (asr.RoundTime).
func wireEvent(ev asr.Event) asr.Event {
	ev.Start, ev.End = asr.RoundTime(ev.Start), asr.RoundTime(ev.End)
	if ev.Segments != nil {
		segs := make([]asr.LiveSegment, len(ev.Segments))
		for i, sg := range ev.Segments {
			sg.Start, sg.End = asr.RoundTime(sg.Start), asr.RoundTime(sg.End)
			segs[i] = sg
		}
		ev.Segments = segs
	}
	return ev
}

func (lv *live) write(ctx context.Context, pcm []float32) bool {
	if len(pcm) == 0 {
		return true
	}
	lv.s.metrics.audioSec.WithLabelValues(lv.m.Name, "stream").Add(float64(len(pcm)) / asr.SampleRate)
	evs, err := lv.sess.Write(ctx, pcm)
	return lv.emit(ctx, evs, err)
}

// emit sends events, then ends the session on err; false when the session is over.
func (lv *live) emit(ctx context.Context, evs []asr.Event, err error) bool {
	for _, ev := range evs {
		if lv.send(ctx, wireEvent(ev)) != nil {
			return false
		}
	}
	switch {
	case err == nil:
		return true
	case ctx.Err() != nil:
	case errors.Is(err, asr.ErrQueueFull):
		lv.end(websocket.StatusTryAgainLater, "server busy", &errorEvent{Code: "busy", Message: "The server is busy; try again later."})
	case errors.Is(err, asr.ErrClosed):
		lv.end(websocket.StatusGoingAway, "server shutting down", shuttingDown())
	case errors.Is(err, asr.ErrBadRequest):
		lv.end(websocket.StatusPolicyViolation, "bad request", &errorEvent{Code: "invalid_request", Message: badRequestMessage(err)})
	default:
		lv.ri.log.Error("stream transcription failed", "model", lv.m.Name, "err", err)
		lv.end(websocket.StatusInternalError, "transcription failed", &errorEvent{Code: "internal_error", Message: "The transcription failed."})
	}
	return false
}
