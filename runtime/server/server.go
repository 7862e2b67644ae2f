// Package server owns Parley's OpenAI-compatible HTTP API: /v1/models, /v1/completions and
// /v1/chat/completions (chat prompts rendered from the model's chat template), with
// server-sent-event streaming, over one or more language models each run by its own
// sched.Scheduler; /v1/audio/transcriptions and /v1/audio/translations over Whisper engines, and
// live transcription over a WebSocket at /v1/audio/stream; speech synthesis at /v1/audio/speech
// (WAV, FLAC or PCM, whole, streamed or as server-sent events), voices cloned from uploaded
// recordings at /v1/audio/voices, and live synthesis of text as it arrives over a WebSocket at
// /v1/audio/speech/stream; plus /health and Prometheus /metrics.
// It validates every request before it reaches a scheduler and answers errors in OpenAI's shape;
// it never starts, stops or closes the schedulers or models it is given, which stay the
// caller's. On-demand models (OnDemandModel) are the exception: the server's registry loads them
// on their first request through the caller's loader, and unloads them (Loaded.Close) when idle,
// when their memory is needed, or at CloseModels.
//
// A language model reaches the server through narrow interfaces (Model): a Tokenizer, its chat
// template's source, its context length and a Scheduler to submit requests to and stream their
// events from. Text crosses them once each way: prompts are encoded here (Tokenizer.Encode); the
// generated text, and the bytes of every token that log-probabilities name, arrive decoded in the
// scheduler's events (sched.Event's Text, Piece and TopPieces). Only an echoed prompt is turned
// back into text here (Tokenizer.Decode and Piece), which no scheduler does.
package server

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/parleyhq/parley/runtime/decode/grammar"
	"github.com/parleyhq/parley/runtime/sched"
)

// Model is one served language model: what the server needs of it, and nothing more
// (models.LLM gives every piece: Text, ChatTemplate, TrainingContext).
type Model struct {
	Name         string    // id clients pass as "model"; unique within a Server
	Tokenizer    Tokenizer // encodes prompts (models.Text)
	ChatTemplate string    // Jinja source (tokenizer.chat_template); "": chat requests are answered 400 no_chat_template
	Sched        Scheduler // runs this model's requests (*sched.Scheduler); the caller runs its loop; nil: an embedding model only
	Ctx          int       // positions one sequence may hold, prompt plus generated (> 1); with no Sched, the Embedder's MaxTokens
	// Embedder, when set, computes the model's embeddings (/v1/embeddings); the caller runs its
	// loop. Sched, Embedder or both.
	Embedder Embedder
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
	// Grammars is the cache of grammars compiled over the model's vocabulary, for
	// sched.Request.Grammar.
	Grammars() (*grammar.Cache, error)
}

// Config configures a Server. The zero value serves without authentication or CORS.
type Config struct {
	// APIKey, when not empty, must be sent as "Authorization: Bearer <key>" on every request but
	// GET /health and CORS preflights.
	APIKey string
	// AllowedOrigins lists the origins browsers may call from ("*": any). Empty: none. A request
	// with an Origin header naming another origin is refused with 403 before any work.
	AllowedOrigins []string
	// CheckHost guards against DNS rebinding: when set, a request's Host must be a loopback name
	// (localhost, a name under .localhost, 127.0.0.0/8, ::1) or one of AllowedHosts, else it is
	// answered 421. A server listening on a loopback address sets it.
	CheckHost bool
	// AllowedHosts are the host names besides the loopback ones that requests may name when
	// CheckHost is set: a name, ".example.com" for it and its subdomains, "*" for any.
	AllowedHosts []string
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
	// TTSModels are served at /v1/audio/speech; their names share the same namespace.
	TTSModels []*TTSModel
	// MaxAudioBytes bounds an upload to /v1/audio/transcriptions and /translations; 0 means
	// 25 MiB (OpenAI's limit). Larger bodies are answered 413.
	MaxAudioBytes int64
	// MaxAudioDuration bounds the decoded length of an upload; 0 means 2 hours. Longer audio is
	// answered 400.
	MaxAudioDuration time.Duration
	// Stream configures /v1/audio/stream.
	Stream StreamConfig

	// OnDemand are the models loaded on their first request and unloaded when idle (or when
	// another needs their memory); their names share the one namespace. The server closes them
	// (CloseModels).
	OnDemand []*OnDemandModel
	// MaxMemory bounds the memory the on-demand models loaded at once take, by their
	// OnDemandModel.Bytes; 0: no bound.
	MaxMemory int64
	// LoadTimeout bounds the time a request waits for its on-demand model to load (or for
	// memory to load it in); it is then answered 503 with Retry-After. 0 means 5 minutes;
	// negative, none.
	LoadTimeout time.Duration
	// Voices bounds the voices uploaded to /v1/audio/voices.
	Voices VoiceConfig
	// SpeechStream configures live synthesis at /v1/audio/speech/stream.
	SpeechStream SpeechStreamConfig
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
	keyHash []byte    // sha256 of the API key; nil when there is none
	secrets rtSecrets // minted realtime client keys
	models  []*served
	byName  map[string]*served
	speech  []*speechServed
	speechN map[string]*speechServed
	streams atomic.Int64      // open /v1/audio/stream sessions
	lives   sessionSet[*live] // the same sessions, for Shutdown
	loading bool              // Loading's stand-in: every request but a preflight is answered 503
	ready   atomic.Bool
	// draining is set by Drain: /health answers "draining" and new requests 503.
	draining atomic.Bool
	inflight atomic.Int64 // requests being served, but /health and /metrics
	metrics  *metrics
	start    time.Time
	mux      *http.ServeMux // the endpoints (routes); nil while loading
	handler  http.Handler

	// ttsN are the text-to-speech models by name.
	ttsN map[string]*TTSModel
	reg  *registry // the on-demand models
	// voices are the voices uploaded to each text-to-speech model, by model name.
	voices map[string]*voiceStore
	// speakers counts the open live synthesis sessions (/v1/audio/speech/stream).
	speakers atomic.Int64
	// speakSessions are the same sessions, for Shutdown.
	speakSessions sessionSet[*speakLive]
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
	if len(models) == 0 && len(cfg.SpeechModels) == 0 && len(cfg.TTSModels) == 0 && len(cfg.OnDemand) == 0 {
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
		if m != nil && m.Name != "" && s.byName[m.Name] != nil {
			return nil, fmt.Errorf("server: model %q listed twice", m.Name)
		}
		sv, err := newServed(m, s.log)
		if err != nil {
			return nil, fmt.Errorf("server: model %d: %w", i, err)
		}
		s.models = append(s.models, sv)
		s.byName[m.Name] = sv
	}
	if err := s.addSpeech(); err != nil {
		return nil, err
	}
	if err := s.addTTS(); err != nil {
		return nil, err
	}
	if err := s.addOnDemand(); err != nil {
		return nil, err
	}
	s.metrics = newMetrics(s.models, s.speech)
	if err := s.registerOnDemandMetrics(); err != nil {
		return nil, err
	}
	if cfg.Steps != nil {
		if err := registerAll(s.metrics.reg, cfg.Steps.collectors()); err != nil {
			return nil, err
		}
	}
	s.mux = s.routes()
	s.handler = http.HandlerFunc(s.serve)
	return s, nil
}

// newServed checks m and derives what the server needs of it.
func newServed(m *Model, log *slog.Logger) (*served, error) {
	switch {
	case m == nil || m.Tokenizer == nil || (m.Sched == nil && m.Embedder == nil):
		return nil, errors.New("a tokenizer and a scheduler or an embedder are required")
	case m.Name == "":
		return nil, errors.New("empty name")
	case m.Ctx < 0:
		return nil, fmt.Errorf("model %q: negative context %d", m.Name, m.Ctx)
	}
	sv := &served{Model: m, ctx: m.Ctx, vocab: m.Tokenizer.VocabSize()}
	if m.Sched == nil && sv.ctx == 0 {
		sv.ctx = m.Embedder.MaxTokens()
	}
	if sv.ctx <= 1 {
		return nil, fmt.Errorf("model %q: context of %d positions", m.Name, sv.ctx)
	}
	sv.loadTemplate(log)
	return sv, nil
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

// Drain begins the server's end: GET /health answers 503 {"status":"draining"} (a load balancer
// takes the instance out of rotation), every new request but /health and /metrics is answered
// 503 shutting_down, and Drain waits until the requests in flight, live transcriptions
// included, have ended, or until ctx is done (and returns its error). Shutdown is what tells live
// transcriptions to finish; the caller closes its listener once Drain returns, and /health
// answers "draining" until then.
func (s *Server) Drain(ctx context.Context) error {
	s.draining.Store(true)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for s.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"status":"draining"}`+"\n")
		return
	}
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
	// Parley's own: what the model serves, whether it is in memory, and for an on-demand model
	// the memory it takes loaded (estimated) and why its last load failed.
	Kind        ModelKind `json:"kind,omitempty"`
	State       string    `json:"state,omitempty"`
	OnDemand    bool      `json:"on_demand,omitempty"`
	MemoryBytes int64     `json:"memory_bytes,omitempty"`
	LoadError   string    `json:"load_error,omitempty"`
}

// staticObject is the object of a model loaded at start.
func (s *Server) staticObject(name string) modelObject {
	return modelObject{ID: name, Object: "model", Created: s.start.Unix(), OwnedBy: "parley", Kind: s.kindOf(name), State: stateLoaded}
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	data := make([]modelObject, 0, len(s.models)+len(s.speech)+len(s.cfg.TTSModels)+len(s.reg.list))
	for _, m := range s.models {
		data = append(data, s.staticObject(m.Name))
	}
	for _, m := range s.speech {
		data = append(data, s.staticObject(m.Name))
	}
	for _, m := range s.cfg.TTSModels {
		data = append(data, s.staticObject(m.Name))
	}
	for _, st := range s.reg.states() {
		data = append(data, s.stateObject(st))
	}
	writeJSON(w, struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{"list", data})
}

func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	switch {
	case s.speechN[name] != nil || s.ttsN[name] != nil || s.byName[name] != nil:
		writeJSON(w, s.staticObject(name))
		return
	case s.reg.kind(name) != "":
		writeJSON(w, s.stateObject(s.reg.state(name)))
		return
	}
	if i := strings.LastIndexByte(name, '/'); i >= 0 && (name[i:] == "/load" || name[i:] == "/unload") {
		// Another method on an admin endpoint, counted under that endpoint's label.
		r.Pattern = http.MethodPost + " /v1/models/{model}" + name[i:]
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Message: fmt.Sprintf("Method %s is not allowed on %s; use %s.", r.Method, r.URL.Path, http.MethodPost), Type: typeInvalidRequest})
		return
	}
	m, e := s.model(r, name, nil)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, s.staticObject(m.Name))
}

// genModel is model for a generation request: an embedding-only model is a 400.
func (s *Server) genModel(r *http.Request, name string, keep json.RawMessage) (*served, *apiError) {
	if s.reg.kind(name) == KindEmbedding {
		return nil, invalidCode("model", "model_not_supported", fmt.Sprintf("The model '%s' is an embedding model; use /v1/embeddings.", name))
	}
	m, e := s.model(r, name, keep)
	if e == nil && m.Sched == nil {
		return nil, invalidCode("model", "model_not_supported", fmt.Sprintf("The model '%s' is an embedding model; use /v1/embeddings.", m.Name))
	}
	return m, e
}

// model finds the named model, loading an on-demand one and holding it until r is answered
// (keep: the request's keep_alive); an empty name picks the only one when there is one.
func (s *Server) model(r *http.Request, name string, keep json.RawMessage) (*served, *apiError) {
	if name == "" && len(s.models) == 1 && len(s.reg.list) == 0 {
		return s.models[0], nil
	}
	if m := s.byName[name]; m != nil {
		return m, nil
	}
	if k := s.reg.kind(name); k == KindLLM || k == KindEmbedding {
		e, ae := s.acquire(r, name, keep)
		if ae != nil {
			return nil, ae
		}
		return e.sv, nil
	}
	if name == "" {
		return nil, invalid("model", "Missing required parameter: 'model'.")
	}
	if s.kindOf(name) == KindSpeechRecognition {
		return nil, invalidCode("model", "model_not_supported", fmt.Sprintf("The model '%s' is a speech recognition model; use /v1/audio/transcriptions.", name))
	}
	return nil, notFound(name)
}
