package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// endpoint is one route of the API.
type endpoint struct {
	method string // the method it takes (GET routes answer HEAD too); a path may have an endpoint per method
	path   string // its net/http.ServeMux path pattern; without the "..." of a wildcard, its metrics label
	handle func(*Server, http.ResponseWriter, *http.Request)
	body   bodyKind // what a POST may send
	// sub marks a path under another endpoint's wildcard, whose answer to other methods is
	// that endpoint's.
	sub bool
}

type bodyKind int

const (
	noBody    bodyKind = iota
	jsonBody           // up to Config.MaxBodyBytes
	audioBody          // up to Config.MaxAudioBytes
)

// endpoints is the API: the one list the routes, the answers to other methods and the metrics
// labels come from.
var endpoints = []endpoint{
	{http.MethodGet, "/health", (*Server).health, noBody, false},
	{http.MethodGet, "/metrics", (*Server).serveMetrics, noBody, false},
	{http.MethodGet, "/v1/models", (*Server).listModels, noBody, false},
	{http.MethodGet, "/v1/models/{model...}", (*Server).getModel, noBody, false},
	{http.MethodPost, "/v1/completions", (*Server).completions, jsonBody, false},
	{http.MethodPost, "/v1/chat/completions", (*Server).chat, jsonBody, false},
	{http.MethodPost, "/v1/embeddings", (*Server).embeddings, jsonBody, false},
	{http.MethodPost, "/v1/audio/transcriptions", (*Server).transcriptions, audioBody, false},
	{http.MethodPost, "/v1/audio/translations", (*Server).translations, audioBody, false},
	{http.MethodGet, "/v1/audio/stream", (*Server).audioStream, noBody, false},
	{http.MethodGet, "/v1/realtime", (*Server).realtime, noBody, false},
	{http.MethodPost, "/v1/realtime/client_secrets", (*Server).clientSecrets, jsonBody, false},
	{http.MethodPost, "/v1/realtime/transcription_sessions", (*Server).transcriptionSessions, jsonBody, false},
	{http.MethodPost, "/v1/audio/speech", (*Server).speak, jsonBody, false},
	{http.MethodGet, "/v1/audio/speech/stream", (*Server).speechStream, noBody, false},
	{http.MethodPost, "/v1/audio/voices", (*Server).uploadVoice, audioBody, false},
	{http.MethodGet, "/v1/audio/voices", (*Server).listVoices, noBody, false},
	{http.MethodDelete, "/v1/audio/voices/{id}", (*Server).deleteVoice, noBody, false},
	{http.MethodPost, "/v1/models/{model}/load", (*Server).loadModel, jsonBody, true},
	{http.MethodPost, "/v1/models/{model}/unload", (*Server).unloadModel, noBody, true},
}

// routes builds the mux of endpoints: "METHOD path" for each, the same path without a method
// for the 405 of every other method, and "/" for the 404 of every other path.
func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	allow := map[string][]string{} // the methods of each path
	var paths []string
	for _, ep := range endpoints {
		mux.HandleFunc(ep.method+" "+ep.path, s.bounded(ep))
		if ep.sub {
			continue
		}
		if allow[ep.path] == nil {
			paths = append(paths, ep.path)
		}
		allow[ep.path] = append(allow[ep.path], ep.method)
	}
	for _, p := range paths {
		methods := allow[p]
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", strings.Join(methods, ", "))
			writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Message: fmt.Sprintf("Method %s is not allowed on %s; use %s.", r.Method, r.URL.Path, strings.Join(methods, " or ")), Type: typeInvalidRequest})
		})
	}
	mux.HandleFunc("/", unknownURL)
	return mux
}

// bounded is ep's handler, its body bounded in size and in time.
func (s *Server) bounded(ep endpoint) http.HandlerFunc {
	limit := s.cfg.MaxBodyBytes
	if ep.body == audioBody {
		limit = s.cfg.MaxAudioBytes
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if ep.body != noBody {
			r.Body = http.MaxBytesReader(w, r.Body, limit)
			if s.cfg.BodyTimeout > 0 {
				r.Body = newDeadlineBody(w, r.Body, s.cfg.BodyTimeout)
			}
		}
		ep.handle(s, w, r)
	}
}

func unknownURL(w http.ResponseWriter, r *http.Request) {
	writeError(w, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("Unknown request URL: %s %s.", r.Method, r.URL.Path), Type: typeInvalidRequest, Code: strptr("unknown_url")})
}

// clean reports whether p is a path as the mux matches it (no "//", ".", ".." segments), so
// that any other is answered 404 rather than redirected.
func clean(p string) bool {
	if !strings.HasPrefix(p, "/") {
		return false
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// endpointLabel is the metrics label of r's endpoint: the path of the pattern it matched (or
// would have: a preflight, a request refused before routing), "other" for any other path.
func (s *Server) endpointLabel(r *http.Request) string {
	pat := r.Pattern
	if pat == "" && s.mux != nil && clean(r.URL.Path) {
		_, pat = s.mux.Handler(r)
	}
	if i := strings.IndexByte(pat, ' '); i >= 0 {
		pat = pat[i+1:] // the method
	}
	if pat == "" || pat == "/" {
		return "other"
	}
	return strings.ReplaceAll(pat, "...}", "}")
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	s.metrics.handler.ServeHTTP(w, r)
}

type ctxKey struct{}

// reqInfo travels with a request through its context.
type reqInfo struct {
	id     string // logged and echoed in X-Request-Id
	client bool   // id is the client's X-Request-Id, so not necessarily unique
	log    *slog.Logger
	start  time.Time
	// releases end the request's holds on on-demand models, once its answer is done.
	releases []func()
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

// serve is the whole handler: request id, logging, metrics and panic recovery around CORS,
// authentication, the body limit and routing.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	ri := &reqInfo{start: time.Now()}
	ri.id, ri.client = requestID(r)
	ri.log = s.log.With("request_id", ri.id)
	w.Header().Set("X-Request-Id", ri.id)
	rec := &recorder{ResponseWriter: w}
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, ri))
	if r.URL.Path != "/health" && r.URL.Path != "/metrics" {
		s.inflight.Add(1)
		defer s.inflight.Add(-1)
	}
	defer func() {
		for _, release := range ri.releases {
			release()
		}
		if p := recover(); p != nil {
			ri.log.Error("panic serving request", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			if rec.status == 0 {
				writeError(rec, internalError())
			}
		}
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		d := time.Since(ri.start)
		if s.metrics != nil {
			ep := s.endpointLabel(r)
			s.metrics.requests.WithLabelValues(ep, strconv.Itoa(rec.status)).Inc()
			s.metrics.duration.WithLabelValues(ep).Observe(d.Seconds())
		}
		ri.log.Info("request", "method", r.Method, "path", r.URL.Path, "status", rec.status, "bytes", rec.bytes, "duration", d)
	}()
	s.route(rec, r)
}

// route answers what comes before routing (a host not allowed, origins not allowed and CORS
// preflights, the loading stand-in, the API key, a server draining) and routes the rest.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if !s.hostAllowed(r.Host) {
		writeError(w, misdirected(r.Host))
		return
	}
	if s.preflight(w, r) {
		return
	}
	if s.loading {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"status":"loading","error":{"message":"models are loading","type":"server_error","param":null,"code":"loading"}}`+"\n")
		return
	}
	if s.keyHash != nil && r.URL.Path != "/health" && s.checkKey(w, r) {
		return
	}
	if s.draining.Load() && r.URL.Path != "/health" && r.URL.Path != "/metrics" {
		w.Header().Set("Connection", "close")
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: "The server is shutting down.", Type: typeServer, Code: strptr("shutting_down"), RetryAfter: 5})
		return
	}
	if !clean(r.URL.Path) {
		unknownURL(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}
