// Package server owns Parley's OpenAI-compatible HTTP API: /v1/models, /v1/completions and
// /v1/chat/completions (chat prompts rendered from the model's chat template), with
// server-sent-event streaming, over one or more language models each run by its own
// sched.Scheduler; /v1/audio/transcriptions and /v1/audio/translations over Whisper engines, and
// live transcription over a WebSocket at /v1/audio/stream; plus /health and Prometheus /metrics.
// It validates every request before it reaches a scheduler and answers errors in OpenAI's shape;
// it never starts, stops or closes schedulers or models, which stay the caller's.
//
// A language model reaches the server through narrow interfaces (Model): a Tokenizer, its chat
// template's source, its context length and a Scheduler to submit requests to and stream their
// events from. Text crosses them once each way: prompts are encoded here (Tokenizer.Encode); the
// generated text, and the bytes of every token that log-probabilities name, arrive decoded in the
// scheduler's events (sched.Event's Text, Piece and TopPieces). The server decodes only what it
// echoes of a prompt given as token ids.
package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/parleyhq/parley/runtime/sched"
)

// Model is one served language model: what the server needs of it, and nothing more
// (models.LLM gives every piece: Text, ChatTemplate, TrainingContext).
type Model struct {
	Name         string    // id clients pass as "model"; unique within a Server
	Tokenizer    Tokenizer // encodes prompts (models.Text)
	ChatTemplate string    // Jinja source (tokenizer.chat_template); "": chat requests are answered 400 no_chat_template
	Sched        Scheduler // runs this model's requests (*sched.Scheduler); the caller runs its loop
	Ctx          int       // positions one sequence may hold, prompt plus generated (> 1)
}

// Tokenizer is a served model's text side, as models.Text gives it.
type Tokenizer interface {
	// Encode tokenizes a prompt as the model expects it: BOS first where the vocabulary adds
	// one, the text of special tokens read as those tokens.
	Encode(text string) ([]int32, error)
	// Decode is the text of ids, as the detokeniser writes it: an echoed prompt given as ids.
	Decode(ids []int32) string
	// Piece is the bytes id stands for (shared; not to be modified).
	Piece(id int32) []byte
	// VocabSize bounds the token ids a request may name.
	VocabSize() int
	// BOS is the begin-of-sequence token, and whether Encode puts it first.
	BOS() (id int32, added bool)
	// EOS is the end-of-sequence token.
	EOS() int32
	// Token is the vocabulary's text of id (a chat template's bos_token); "" outside it.
	Token(id int32) string
}

// Scheduler runs a model's generations: *sched.Scheduler.
type Scheduler interface {
	// Submit queues r; its events stream from the Stream.
	Submit(ctx context.Context, r *sched.Request) (*sched.Stream, error)
	// MaxSeqs is the most sequences one request may ask for.
	MaxSeqs() int
	// Stats is a snapshot for /metrics.
	Stats() sched.Stats
}

// Config configures a Server. The zero value serves without authentication or CORS.
type Config struct {
	// APIKey, when not empty, must be sent as "Authorization: Bearer <key>" on every request but
	// GET /health and CORS preflights.
	APIKey string
	// AllowedOrigins lists the origins browsers may call from ("*": any). Empty: none.
	AllowedOrigins []string
	// MaxBodyBytes bounds a request body; 0 means 4 MiB. Larger bodies are answered 413.
	MaxBodyBytes int64
	// BodyTimeout bounds the time a request body takes to arrive whole, from the end of its
	// headers: a client that sends headers and then trickles or stalls is answered 408 and loses
	// its connection. 0 means 5 minutes (25 MiB of audio at under 1 Mbit/s); negative, none.
	BodyTimeout time.Duration
	// RequestTimeout bounds one generation (its scheduler deadline); 0 means 10 minutes, and a
	// negative value means none. A generation cut by it finishes with finish_reason "length".
	RequestTimeout time.Duration
	// Logger receives one line per request and every error, each with the request id; nil
	// discards.
	Logger *slog.Logger
	// Steps, when set, holds per-step histograms fed by the schedulers' OnStep hooks; the server
	// exposes them at /metrics.
	Steps *StepMetrics

	// SpeechModels are served at /v1/audio/*; their names share one namespace with the LLMs.
	SpeechModels []*SpeechModel
	// MaxAudioBytes bounds an upload to /v1/audio/transcriptions and /translations; 0 means
	// 25 MiB (OpenAI's limit). Larger bodies are answered 413.
	MaxAudioBytes int64
	// MaxAudioDuration bounds the decoded length of an upload; 0 means 2 hours. Longer audio is
	// answered 400.
	MaxAudioDuration time.Duration
	// Stream configures /v1/audio/stream.
	Stream StreamConfig
}

// Loading is the handler to serve while the models load (New needs them): every request is
// answered 503 with Retry-After, GET /health too, with the request id, CORS headers (cfg's
// AllowedOrigins; a preflight is answered as the server will) and a log line (cfg's Logger) as
// the server gives them.
func Loading(cfg Config) http.Handler {
	s := &Server{cfg: cfg, log: cfg.Logger, loading: true}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(s.serve)
}

// Server serves the API. Build it with New; it is safe for concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	keyHash []byte // sha256 of the API key; nil when there is none
	models  []*served
	byName  map[string]*served
	speech  []*speechServed
	speechN map[string]*speechServed
	streams atomic.Int64 // open /v1/audio/stream sessions
	lives   liveSet      // the same sessions, for Shutdown
	loading bool         // Loading's stand-in: every request but a preflight is answered 503
	ready   atomic.Bool
	metrics *metrics
	start   time.Time
	handler http.Handler
}

// served is a Model with what the server derives from it once.
type served struct {
	*Model
	ctx      int           // context in positions
	vocab    int           // token ids accepted in prompts and logit_bias
	tmpl     *chatTemplate // nil: no usable chat template
	tmplErr  string        // why there is none
	bosText  string
	addBOS   bool
	stripBOS bool
}

const (
	defaultBodyBytes   = 4 << 20
	defaultTimeout     = 10 * time.Minute
	defaultBodyTimeout = 5 * time.Minute
)

// New builds a Server over models. It parses each model's chat template; a model whose template
// is absent or does not parse still serves completions, and its chat requests are answered 400
// no_chat_template. The Server reports not ready (GET /health 503) until SetReady(true).
func New(cfg Config, models []*Model) (*Server, error) {
	if len(models) == 0 && len(cfg.SpeechModels) == 0 {
		return nil, errors.New("server: no models")
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("server: negative body limit %d", cfg.MaxBodyBytes)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = defaultBodyBytes
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = defaultTimeout
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = defaultBodyTimeout
	}
	s := &Server{cfg: cfg, log: cfg.Logger, byName: map[string]*served{}, start: time.Now()}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.APIKey != "" {
		h := sha256.Sum256([]byte(cfg.APIKey))
		s.keyHash = h[:]
	}
	for i, m := range models {
		switch {
		case m == nil || m.Tokenizer == nil || m.Sched == nil:
			return nil, fmt.Errorf("server: model %d: tokenizer and scheduler are required", i)
		case m.Name == "":
			return nil, fmt.Errorf("server: model %d: empty name", i)
		case s.byName[m.Name] != nil:
			return nil, fmt.Errorf("server: model %q listed twice", m.Name)
		case m.Ctx < 0:
			return nil, fmt.Errorf("server: model %q: negative context %d", m.Name, m.Ctx)
		}
		sv := &served{Model: m, ctx: m.Ctx, vocab: m.Tokenizer.VocabSize()}
		if sv.ctx <= 1 {
			return nil, fmt.Errorf("server: model %q: context of %d positions", m.Name, sv.ctx)
		}
		sv.loadTemplate(s.log)
		s.models = append(s.models, sv)
		s.byName[m.Name] = sv
	}
	if err := s.addSpeech(); err != nil {
		return nil, err
	}
	s.metrics = newMetrics(s.models, s.speech)
	if cfg.Steps != nil {
		if err := registerAll(s.metrics.reg, cfg.Steps.collectors()); err != nil {
			return nil, err
		}
	}
	s.handler = http.HandlerFunc(s.serve)
	return s, nil
}

func (m *served) loadTemplate(log *slog.Logger) {
	tk := m.Tokenizer
	bos, added := tk.BOS()
	m.bosText, m.addBOS = tk.Token(bos), added
	src := m.ChatTemplate
	if strings.TrimSpace(src) == "" {
		m.tmplErr = fmt.Sprintf("The model '%s' has no chat template (tokenizer.chat_template); use /v1/completions.", m.Name)
		return
	}
	t, err := parseChatTemplate(src, m.bosText, tk.Token(tk.EOS()))
	if err != nil {
		log.Warn("chat template does not parse", "model", m.Name, "err", err)
		m.tmplErr = fmt.Sprintf("The chat template of model '%s' could not be parsed; use /v1/completions.", m.Name)
		return
	}
	m.tmpl = t
}

// SetReady marks the server ready (GET /health 200) or not (503).
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// Handler returns the HTTP handler serving every endpoint. Streams last as long as generation:
// an http.Server carrying it should not set a WriteTimeout shorter than that.
func (s *Server) Handler() http.Handler { return s.handler }

// Registry returns the Prometheus registry behind /metrics, for adding collectors.
func (s *Server) Registry() *prometheus.Registry { return s.metrics.reg }

type ctxKey struct{}

// reqInfo travels with a request through its context.
type reqInfo struct {
	id     string // logged and echoed in X-Request-Id
	client bool   // id is the client's X-Request-Id, so not necessarily unique
	log    *slog.Logger
	start  time.Time
}

func info(ctx context.Context) *reqInfo {
	if ri, ok := ctx.Value(ctxKey{}).(*reqInfo); ok {
		return ri
	}
	return &reqInfo{id: "none", log: slog.New(slog.DiscardHandler), start: time.Now()}
}

// recorder remembers the status written and still lets http.ResponseController flush.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// requestID keeps a client's X-Request-Id when it is short and plain (client: true), else makes
// one.
func requestID(r *http.Request) (id string, client bool) {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 64 && !strings.ContainsFunc(id, func(c rune) bool {
		return !(c == '-' || c == '_' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z')
	}) {
		return id, true
	}
	return newID(), false
}

// newID returns 96 random bits in hex.
func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func randomSeed() uint64 {
	n, err := rand.Int(rand.Reader, new(big.Int).SetUint64(1<<63))
	if err != nil {
		return uint64(time.Now().UnixNano())
	}
	return n.Uint64()
}

var endpoints = []string{"/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics",
	"/v1/audio/transcriptions", "/v1/audio/translations", "/v1/audio/stream"}

func endpointLabel(path string) string {
	if slices.Contains(endpoints, path) {
		return path
	}
	if strings.HasPrefix(path, "/v1/models/") {
		return "/v1/models/{model}"
	}
	return "other"
}

// serve is the whole handler: request id, logging, metrics and panic recovery around CORS,
// authentication, the body limit and routing.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	ri := &reqInfo{start: time.Now()}
	ri.id, ri.client = requestID(r)
	ri.log = s.log.With("request_id", ri.id)
	w.Header().Set("X-Request-Id", ri.id)
	rec := &recorder{ResponseWriter: w}
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, ri))
	defer func() {
		if p := recover(); p != nil {
			ri.log.Error("panic serving request", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			if rec.status == 0 {
				writeError(rec, internalError())
			}
		}
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		ep := endpointLabel(r.URL.Path)
		d := time.Since(ri.start)
		if s.metrics != nil {
			s.metrics.requests.WithLabelValues(ep, strconv.Itoa(rec.status)).Inc()
			s.metrics.duration.WithLabelValues(ep).Observe(d.Seconds())
		}
		ri.log.Info("request", "method", r.Method, "path", r.URL.Path, "status", rec.status, "bytes", rec.bytes, "duration", d)
	}()
	s.route(rec, r)
}

func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if origin := r.Header.Get("Origin"); origin != "" {
		allowed := s.originAllowed(origin)
		h := w.Header()
		h.Add("Vary", "Origin") // the answer differs between origins, allowed or not
		if allowed {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Expose-Headers", "X-Request-Id, Retry-After")
		}
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Add("Vary", "Access-Control-Request-Method, Access-Control-Request-Headers")
			if !allowed {
				writeError(w, &apiError{Status: http.StatusForbidden, Message: "Origin not allowed.", Type: typeInvalidRequest})
				return
			}
			h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
			h.Set("Access-Control-Allow-Headers", allowHeaders(r.Header.Values("Access-Control-Request-Headers")))
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	if s.loading {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"status":"loading","error":{"message":"models are loading","type":"server_error","param":null,"code":"loading"}}`+"\n")
		return
	}
	if s.keyHash != nil && r.URL.Path != "/health" && !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="parley"`)
		writeError(w, &apiError{Status: http.StatusUnauthorized, Message: "Incorrect API key provided.", Type: typeInvalidRequest, Code: strptr("invalid_api_key")})
		return
	}
	path := r.URL.Path
	var h func(http.ResponseWriter, *http.Request)
	method := http.MethodGet
	switch {
	case path == "/health":
		h = s.health
	case path == "/metrics":
		h = s.metrics.handler.ServeHTTP
	case path == "/v1/models":
		h = s.listModels
	case strings.HasPrefix(path, "/v1/models/"):
		h = s.getModel
	case path == "/v1/completions":
		h, method = s.completions, http.MethodPost
	case path == "/v1/chat/completions":
		h, method = s.chat, http.MethodPost
	case path == "/v1/audio/transcriptions":
		h, method = s.transcriptions, http.MethodPost
	case path == "/v1/audio/translations":
		h, method = s.translations, http.MethodPost
	case path == "/v1/audio/stream":
		h = s.audioStream
	default:
		writeError(w, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("Unknown request URL: %s %s.", r.Method, path), Type: typeInvalidRequest, Code: strptr("unknown_url")})
		return
	}
	if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
		w.Header().Set("Allow", method)
		writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Message: fmt.Sprintf("Method %s is not allowed on %s; use %s.", r.Method, path, method), Type: typeInvalidRequest})
		return
	}
	if method == http.MethodPost {
		limit := s.cfg.MaxBodyBytes
		if strings.HasPrefix(path, "/v1/audio/") {
			limit = s.cfg.MaxAudioBytes
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		if s.cfg.BodyTimeout > 0 {
			r.Body = newDeadlineBody(w, r.Body, s.cfg.BodyTimeout)
		}
	}
	h(w, r)
}

// deadlineBody is a request body that must arrive whole by a deadline, set on the connection's
// reads. Once the body has been read to its end (or failed otherwise) the deadline is lifted, so
// that it does not end the connection under a long response. Past the deadline it stays, and the
// answer closes the connection: net/http would otherwise read what is left of the body before
// answering, waiting on the very client that stalled.
type deadlineBody struct {
	io.ReadCloser
	w      http.ResponseWriter
	rc     *http.ResponseController
	lifted bool
}

func newDeadlineBody(w http.ResponseWriter, body io.ReadCloser, d time.Duration) io.ReadCloser {
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(d)) != nil {
		return body // a writer that cannot (a test's recorder)
	}
	return &deadlineBody{ReadCloser: body, w: w, rc: rc}
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.lifted = true // for good: the connection ends with the answer
		b.w.Header().Set("Connection", "close")
	case err != nil:
		b.lift()
	}
	return n, err
}

func (b *deadlineBody) Close() error {
	b.lift()
	return b.ReadCloser.Close()
}

func (b *deadlineBody) lift() {
	if !b.lifted {
		b.lifted = true
		b.rc.SetReadDeadline(time.Time{})
	}
}

// bodyTimedOut is the answer to a body that did not arrive in time.
func bodyTimedOut() *apiError {
	return &apiError{Status: http.StatusRequestTimeout, Message: "The request body did not arrive in time.", Type: typeInvalidRequest, Code: strptr("request_timeout")}
}

func (s *Server) originAllowed(origin string) bool {
	for _, o := range s.cfg.AllowedOrigins {
		if o == "*" || o == origin {
			return true
		}
	}
	return false
}

// baseHeaders are allowed to an allowed origin whatever its preflight asks for.
var baseHeaders = []string{"Authorization", "Content-Type", "X-Request-Id"}

// maxAllowHeaders bounds the header names a preflight answer repeats.
const maxAllowHeaders = 64

// allowHeaders answers a preflight's Access-Control-Request-Headers for an allowed origin: every
// header it names (clients such as OpenAI's send their own X-Stainless-* headers), since the API
// key, not a list of headers, guards the API. Entries that are not header names are ignored.
func allowHeaders(requested []string) string {
	names := slices.Clone(baseHeaders)
	seen := map[string]bool{}
	for _, n := range names {
		seen[strings.ToLower(n)] = true
	}
	for _, v := range requested {
		for n := range strings.SplitSeq(v, ",") {
			n = strings.TrimSpace(n)
			if len(names) == len(baseHeaders)+maxAllowHeaders {
				break
			}
			if n == "" || seen[strings.ToLower(n)] || strings.ContainsFunc(n, func(c rune) bool { return !isTokenChar(c) }) {
				continue
			}
			seen[strings.ToLower(n)] = true
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}

// isTokenChar reports whether c may appear in an HTTP token, such as a header name (RFC 9110
// section 5.6.2).
func isTokenChar(c rune) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || strings.ContainsRune("!#$%&'*+-.^_`|~", c)
}

// authorized reports whether r carries "Authorization: Bearer <key>"; the scheme is
// case-insensitive (RFC 9110 section 11.1).
func (s *Server) authorized(r *http.Request) bool {
	scheme, key, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(key)))
	return subtle.ConstantTimeCompare(h[:], s.keyHash) == 1
}

// readBody reads a POST body under the size limit.
func readBody(r *http.Request) ([]byte, *apiError) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("The request body is larger than %d bytes.", mb.Limit), Type: typeInvalidRequest, Code: strptr("request_too_large")}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, bodyTimedOut()
		}
		return nil, invalid("", "The request body could not be read.")
	}
	return b, nil
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if !s.ready.Load() {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"status":"loading"}`+"\n")
		return
	}
	writeJSON(w, map[string]string{"status": "ok"})
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) modelObject(m *served) modelObject {
	return modelObject{ID: m.Name, Object: "model", Created: s.start.Unix(), OwnedBy: "parley"}
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	data := make([]modelObject, 0, len(s.models)+len(s.speech))
	for _, m := range s.models {
		data = append(data, s.modelObject(m))
	}
	for _, m := range s.speech {
		data = append(data, modelObject{ID: m.Name, Object: "model", Created: s.start.Unix(), OwnedBy: "parley"})
	}
	writeJSON(w, struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{"list", data})
}

func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	if sm := s.speechN[name]; sm != nil {
		writeJSON(w, modelObject{ID: sm.Name, Object: "model", Created: s.start.Unix(), OwnedBy: "parley"})
		return
	}
	m, e := s.model(name)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, s.modelObject(m))
}

// model finds the named model; an empty name picks the only one when there is one.
func (s *Server) model(name string) (*served, *apiError) {
	if name == "" && len(s.models) == 1 {
		return s.models[0], nil
	}
	if m := s.byName[name]; m != nil {
		return m, nil
	}
	if name == "" {
		return nil, invalid("model", "Missing required parameter: 'model'.")
	}
	if s.speechN[name] != nil {
		return nil, invalidCode("model", "model_not_supported", fmt.Sprintf("The model '%s' is a speech recognition model; use /v1/audio/transcriptions.", name))
	}
	return nil, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("The model '%s' does not exist.", name), Type: typeInvalidRequest, Param: strptr("model"), Code: strptr("model_not_found")}
}
