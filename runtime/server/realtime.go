package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/runtime/sched/asr"
)

// StreamConfig configures live transcription over a WebSocket: GET /v1/audio/stream (protocol:
// docs/streaming.md) and GET /v1/realtime (OpenAI's Realtime transcription protocol,
// docs/realtime.md). The two share the limits below.
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

// item is one entry of a session's inbox: audio, or a request (commit, close, ...) after it.
type item struct {
	pcm []float32
	op  string // "" for audio alone, opShutdown, or one of the protocol's requests
	arg any    // the request's argument, where it has one
}

// liveProtocol is what a live endpoint's wire protocol adds to the session core (live): how
// client messages become inbox items, how the session's events and errors are sent, and what a
// request in the inbox does. The core calls hello before it reads, parse from the reading
// goroutine, events and do from the worker, and errorMessage from any of them (it keeps to
// what the others do not change).
type liveProtocol interface {
	// hello is the first event, sent once the session is open.
	hello() any
	// parse turns one client message into inbox items. A message the session survives may get a
	// reply, sent at once (an error event); one that ends it gets the close code and the
	// error event to send first.
	parse(typ websocket.MessageType, b []byte) (its []item, reply any, code websocket.StatusCode, fatal *errorEvent)
	// errorMessage is ev as the protocol sends it.
	errorMessage(ev *errorEvent) any
	// events sends the events of the session's stream; false when the session is over.
	events(ctx context.Context, evs []asr.Event) bool
	// do carries out a request from the inbox, the audio before it written to the stream;
	// false when the session is over.
	do(ctx context.Context, it item) bool
}

// errorEvent is an error the session reports: a code and a message for people.
type errorEvent struct {
	Type    string `json:"type"` // "error"
	Code    string `json:"code"`
	Message string `json:"message"`
}

// opShutdown is the item a server shutdown queues after the audio a session has received: the
// session transcribes that audio to its end, sends the final text, and closes with 1001.
const opShutdown = "shutdown"

// sessionSet is the open sessions of a WebSocket endpoint, which a graceful shutdown lets finish.
type sessionSet[T comparable] struct {
	mu       sync.Mutex
	open     map[T]struct{}
	draining bool
	wg       sync.WaitGroup
}

// add registers v; false once the server is shutting down.
func (ss *sessionSet[T]) add(v T) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.draining {
		return false
	}
	if ss.open == nil {
		ss.open = map[T]struct{}{}
	}
	ss.open[v] = struct{}{}
	ss.wg.Add(1)
	return true
}

func (ss *sessionSet[T]) remove(v T) {
	ss.mu.Lock()
	delete(ss.open, v)
	ss.mu.Unlock()
	ss.wg.Done()
}

func (ss *sessionSet[T]) isDraining() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.draining
}

// list returns the open sessions; drain also refuses new ones from now on.
func (ss *sessionSet[T]) list(drain bool) []T {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.draining = ss.draining || drain
	out := make([]T, 0, len(ss.open))
	for v := range ss.open {
		out = append(out, v)
	}
	return out
}

// Shutdown ends the live transcription sessions (GET /v1/audio/stream, /v1/realtime) and the
// live synthesis sessions (GET /v1/audio/speech/stream, which speak the text they have received
// and close with 1001 and "shutting_down") gracefully, as
// http.Server.Shutdown does for requests, whose connections it does not track once upgraded:
// new sessions are refused (503), and each open session transcribes the audio it has received,
// sends its final text, and closes with 1001 and the "shutting_down" event. Sessions still open
// when ctx ends are closed at once, their transcription cancelled; Shutdown then returns
// ctx.Err(). It does not close the recognisers.
func (s *Server) Shutdown(ctx context.Context) error {
	for _, lv := range s.lives.list(true) {
		lv.push(item{op: opShutdown}, math.MaxInt)
	}
	for _, sl := range s.speakSessions.list(true) {
		sl.shutdown()
	}
	done := make(chan struct{})
	go func() {
		s.lives.wg.Wait()
		s.speakSessions.wg.Wait()
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
	for _, sl := range s.speakSessions.list(true) {
		sl.end(websocket.StatusGoingAway, "server shutting down", shuttingDown())
		sl.cancel()
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

// live is one WebSocket transcription session: the core both live endpoints share (limits,
// backlog, idle timeout, shutdown, metrics), their wire protocols apart (proto).
type live struct {
	s     *Server
	m     *speechServed // set before the session opens, or by the worker under mu
	c     *websocket.Conn
	sess  asr.Live // the worker's; nil until the session has a model
	ri    *reqInfo
	req   *http.Request // the upgrade's: holds the on-demand models the session uses
	proto liveProtocol

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
	busy      bool
	receiving time.Time // when the client message being read began; zero when none is
	idle      *time.Timer

	endOnce sync.Once
}

// serveLive upgrades r to a WebSocket and runs lv over it, with the stream open makes when open
// is not nil (else the protocol opens one later): the checks and bookkeeping both live endpoints
// share.
func (s *Server) serveLive(w http.ResponseWriter, r *http.Request, lv *live, open func() (asr.Live, error)) {
	ri := lv.ri
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
	if open != nil {
		sess, err := open()
		if err != nil {
			writeError(w, invalid("", "Invalid session parameters: "+err.Error()))
			return
		}
		lv.sess = sess
	}
	c, err := websocket.Accept(w, r, s.acceptOptions(r))
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

// newLive is a session of proto, not yet open; m may be nil until the protocol sets it.
func (s *Server) newLive(r *http.Request, m *speechServed) *live {
	return &live{s: s, m: m, ri: info(r.Context()), req: r, wake: make(chan struct{}, 1)}
}

// setModel makes m the session's model; the worker's to call.
func (lv *live) setModel(m *speechServed) {
	lv.mu.Lock()
	lv.m = m
	lv.mu.Unlock()
}

// modelName is the session's model's name, "" before it has one.
func (lv *live) modelName() string {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if lv.m == nil {
		return ""
	}
	return lv.m.Name
}

// transcriber is the transcriber of a session of m: its recogniser timed into the metrics, and
// opening the recogniser's own sessions where it is an asr.Streamer.
func (lv *live) transcriber(m *speechServed) asr.Transcriber {
	t := meteredRecognizer{s: lv.s, m: m}
	if _, ok := m.Recognizer.(asr.Streamer); ok {
		return &meteredStreamer{t}
	}
	return &t
}

// meteredRecognizer is a session's transcriber: the model's recogniser, timed into the metrics.
type meteredRecognizer struct {
	s *Server
	m *speechServed
}

func (t *meteredRecognizer) Transcribe(ctx context.Context, pcm []float32, p asr.Params, f func(asr.Segment)) (*asr.Result, error) {
	t0 := time.Now()
	res, err := t.m.Recognizer.Transcribe(ctx, pcm, p, f)
	t.s.metrics.asrTime.WithLabelValues(t.m.Name, "stream").Observe(time.Since(t0).Seconds())
	return res, err
}

// meteredStreamer is the meteredRecognizer of a recogniser that is an asr.Streamer: the session
// is the recogniser's own, each chunk it decodes timed into the metrics.
type meteredStreamer struct{ meteredRecognizer }

func (t *meteredStreamer) NewLive(cfg asr.SessionConfig) (asr.Live, error) {
	h := t.s.metrics.asrTime.WithLabelValues(t.m.Name, "stream")
	cfg.OnChunk = func(d time.Duration) { h.Observe(d.Seconds()) }
	return t.m.Recognizer.(asr.Streamer).NewLive(cfg)
}

func (lv *live) send(ctx context.Context, v any) error { return wsSendJSON(ctx, lv.c, v) }

// wsSendJSON writes v to c as a JSON text message, giving up after 10 s.
func wsSendJSON(ctx context.Context, c *websocket.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.Write(wctx, websocket.MessageText, b)
}

// end sends ev (if not nil) and closes the connection with code and reason; only the first call
// does anything, and later calls wait for it to finish.
func (lv *live) end(code websocket.StatusCode, reason string, ev *errorEvent) {
	lv.endOnce.Do(func() {
		if ev != nil {
			lv.ri.log.Info("stream closed", "model", lv.modelName(), "code", ev.Code, "reason", ev.Message)
			lv.send(context.Background(), lv.proto.errorMessage(ev))
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
	if err := lv.send(ctx, lv.proto.hello()); err != nil {
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
		typ, b, err := lv.receive(ctx)
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
		its, reply, code, ev := lv.proto.parse(typ, b)
		if ev != nil {
			lv.end(code, ev.Code, ev)
			return
		}
		if reply != nil && lv.send(ctx, reply) != nil {
			return
		}
		for _, it := range its {
			closing = closing || it.op == "close"
			if !lv.push(it, maxBacklog) {
				lv.end(websocket.StatusPolicyViolation, "backlog", &errorEvent{Code: "backlog",
					Message: fmt.Sprintf("More than %v of audio is waiting: send audio no faster than real time.", lv.s.cfg.Stream.MaxBacklog)})
				return
			}
		}
	}
}

// receive reads the client's next message. A message being received keeps the session from
// idling: the idle timeout restarts when it begins, and does not end the session before it has
// arrived whole (a large one may take longer than the timeout to read), for maxReceive at most.
func (lv *live) receive(ctx context.Context) (websocket.MessageType, []byte, error) {
	typ, r, err := lv.c.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	lv.mu.Lock()
	lv.receiving = time.Now()
	lv.mu.Unlock()
	lv.idle.Reset(lv.s.cfg.Stream.IdleTimeout)
	b, err := io.ReadAll(r)
	lv.mu.Lock()
	lv.receiving = time.Time{}
	lv.mu.Unlock()
	return typ, b, err
}

// maxReceive bounds the time a message being received keeps a session from idling, when the
// idle timeout is shorter: a client that sends a message's first bytes and trickles the rest
// is idle after it.
const maxReceive = 10 * time.Second

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

// active reports whether the worker holds items, items wait in the inbox, or a message is
// being received.
func (lv *live) active() bool {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	receiving := !lv.receiving.IsZero() && time.Since(lv.receiving) < max(lv.s.cfg.Stream.IdleTimeout, maxReceive)
	return lv.busy || receiving || len(lv.inbox) > 0
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

// work runs the session over the inbox until ctx ends or a request ends the session.
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
			if !lv.proto.do(ctx, it) {
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

func (lv *live) write(ctx context.Context, pcm []float32) bool {
	if len(pcm) == 0 || lv.sess == nil {
		return true
	}
	lv.s.metrics.audioSec.WithLabelValues(lv.m.Name, "stream").Add(float64(len(pcm)) / asr.SampleRate)
	evs, err := lv.sess.Write(ctx, pcm)
	return lv.emit(ctx, evs, err)
}

// commit finalizes what the stream holds and emits its events.
func (lv *live) commit(ctx context.Context) bool {
	if lv.sess == nil {
		return true
	}
	evs, err := lv.sess.Commit(ctx)
	return lv.emit(ctx, evs, err)
}

// emit sends events through the protocol, then ends the session on err; false when the session
// is over.
func (lv *live) emit(ctx context.Context, evs []asr.Event, err error) bool {
	if len(evs) > 0 && !lv.proto.events(ctx, evs) {
		return false
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
