package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const defaultLoadTimeout = 5 * time.Minute

// addOnDemand builds the registry of cfg's on-demand models.
func (s *Server) addOnDemand() error {
	cfg := &s.cfg
	if cfg.MaxMemory < 0 {
		return fmt.Errorf("server: negative memory budget %d", cfg.MaxMemory)
	}
	if cfg.LoadTimeout == 0 {
		cfg.LoadTimeout = defaultLoadTimeout
	}
	timeout := max(cfg.LoadTimeout, 0)
	r, err := newRegistry(cfg.OnDemand, cfg.MaxMemory, timeout, s.log)
	if err != nil {
		return err
	}
	for _, e := range r.list {
		if s.byName[e.Name] != nil || s.speechN[e.Name] != nil || s.ttsN[e.Name] != nil {
			return fmt.Errorf("server: model %q listed twice", e.Name)
		}
		if e.Kind == KindSpeechSynthesis {
			s.voices[e.Name] = newVoiceStore(s.cfg.Voices, e.Name)
		}
	}
	r.prepare = s.prepare
	s.reg = r
	return nil
}

// prepare derives what the server needs of a loaded on-demand model, as New does of a static one.
func (s *Server) prepare(e *entry, l *Loaded) error {
	switch e.Kind {
	case KindLLM, KindEmbedding:
		if l.Model == nil {
			return errors.New("the loader gave no language or embedding model")
		}
		l.Model.Name = e.Name
		sv, err := newServed(l.Model, s.log)
		if err != nil {
			return err
		}
		e.sv = sv
	case KindSpeechRecognition:
		if l.Speech == nil || l.Speech.Recognizer == nil {
			return errors.New("the loader gave no speech recognition model")
		}
		l.Speech.Name = e.Name
		ss, err := newSpeechServed(l.Speech)
		if err != nil {
			return err
		}
		e.ss = ss
	case KindSpeechSynthesis:
		if l.TTS == nil || l.TTS.Synth == nil {
			return errors.New("the loader gave no speech synthesis model")
		}
		l.TTS.Name = e.Name
		if st, ok := l.TTS.Synth.(VoiceStorer); ok {
			if err := s.voices[e.Name].load(st, e.Name, s.log); err != nil {
				return err
			}
		}
	}
	return nil
}

// kindOf is the kind of the named model, static or on demand; "" for none.
func (s *Server) kindOf(name string) ModelKind {
	switch {
	case s.byName[name] != nil && s.byName[name].Sched == nil:
		return KindEmbedding
	case s.byName[name] != nil:
		return KindLLM
	case s.speechN[name] != nil:
		return KindSpeechRecognition
	case s.ttsN[name] != nil:
		return KindSpeechSynthesis
	}
	return s.reg.kind(name)
}

// acquire loads the named on-demand model if it is not loaded and holds it until r's response
// is done. keep is the request's keep_alive, if any.
func (s *Server) acquire(r *http.Request, name string, keep json.RawMessage) (*entry, *apiError) {
	d, e := parseKeepAlive(keep)
	if e != nil {
		return nil, e
	}
	ent, err := s.reg.acquire(r.Context(), name, d)
	if err != nil {
		return nil, loadError(name, err)
	}
	ri := info(r.Context())
	ri.releases = append(ri.releases, func() { s.reg.release(ent) })
	return ent, nil
}

// loadError is the client's answer to a model that could not be had.
func loadError(name string, err error) *apiError {
	switch {
	case errors.Is(err, errLoadTimeout):
		return &apiError{Status: http.StatusServiceUnavailable, Message: fmt.Sprintf("The model '%s' is loading, or waiting for memory; retry shortly.", name), Type: typeUnavailable, Code: strptr("model_loading"), RetryAfter: 5}
	case errors.Is(err, errTooLarge):
		msg := err.Error()
		_, detail, _ := strings.Cut(msg, ": ")
		return &apiError{Status: http.StatusServiceUnavailable, Message: fmt.Sprintf("The model '%s' cannot be loaded: it does not fit in the server's memory budget (%s).", name, detail), Type: typeUnavailable, Code: strptr("insufficient_memory")}
	case errors.Is(err, errClosed):
		return &apiError{Status: http.StatusServiceUnavailable, Message: "The server is shutting down.", Type: typeServer, Code: strptr("shutting_down"), RetryAfter: 5}
	case errors.Is(err, context.Canceled):
		return &apiError{Status: http.StatusServiceUnavailable, Message: "The request was cancelled.", Type: typeUnavailable}
	}
	return &apiError{Status: http.StatusInternalServerError, Message: fmt.Sprintf("The model '%s' could not be loaded: %v.", name, errors.Unwrap(err)), Type: typeServer, Code: strptr("model_load_failed")}
}

// parseKeepAlive reads a request's keep_alive, as Ollama takes it: a duration string ("5m",
// "1h30m"), or a number of seconds (as a number or a string); negative keeps the model loaded,
// 0 unloads it once the request is done. nil: not given.
func parseKeepAlive(raw json.RawMessage) (*time.Duration, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, invalid("keep_alive", "Invalid 'keep_alive'.")
	}
	var d time.Duration
	switch x := v.(type) {
	case float64:
		if math.IsNaN(x) || math.Abs(x) > 1e9 {
			return nil, invalid("keep_alive", "Invalid 'keep_alive': the number of seconds is out of range.")
		}
		d = time.Duration(x * float64(time.Second))
	case string:
		var err error
		if d, err = ParseKeepAlive(x); err != nil {
			return nil, invalid("keep_alive", fmt.Sprintf("Invalid 'keep_alive' %q: want a duration such as \"5m\", or seconds.", x))
		}
	default:
		return nil, invalid("keep_alive", "Invalid type for 'keep_alive': expected a duration string or a number of seconds.")
	}
	if d < 0 {
		d = -1
	}
	return &d, nil
}

// ParseKeepAlive reads a keep-alive: a duration ("5m", "-1s") or a number of seconds ("300",
// "-1").
func ParseKeepAlive(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsNaN(f) && math.Abs(f) <= 1e9 {
		return time.Duration(f * float64(time.Second)), nil
	}
	return time.ParseDuration(s)
}

// loadModel answers POST /v1/models/{model}/load: the model loaded (it then stays loaded for its
// keep-alive, or the request's keep_alive), with its state.
func (s *Server) loadModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	var keep json.RawMessage
	if body, e := readBody(r); e != nil {
		writeError(w, e)
		return
	} else if len(strings.TrimSpace(string(body))) > 0 {
		var req struct {
			KeepAlive json.RawMessage `json:"keep_alive"`
		}
		if e := decodeBody(body, &req); e != nil {
			writeError(w, e)
			return
		}
		keep = req.KeepAlive
	}
	if e := s.onDemand(name); e != nil {
		writeError(w, e)
		return
	}
	ent, e := s.acquire(r, name, keep)
	if e != nil {
		writeError(w, e)
		return
	}
	st := s.reg.state(ent.Name)
	st.State = stateLoaded // held by this request until it is answered
	writeJSON(w, s.stateObject(st))
}

// unloadModel answers POST /v1/models/{model}/unload: the model unloaded, or, while requests use
// it, 202 and unloaded once they end.
func (s *Server) unloadModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	if e := s.onDemand(name); e != nil {
		writeError(w, e)
		return
	}
	busy, err := s.reg.unload(r.Context(), name)
	if err != nil {
		writeError(w, loadError(name, err))
		return
	}
	obj := s.stateObject(s.reg.state(name))
	if busy {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		b, _ := json.Marshal(obj)
		w.Write(append(b, '\n'))
		return
	}
	writeJSON(w, obj)
}

// onDemand answers 404 for a name that is no model, and 400 for a model loaded at start, which
// the admin endpoints do not load or unload.
func (s *Server) onDemand(name string) *apiError {
	switch {
	case s.reg.kind(name) != "":
		return nil
	case s.kindOf(name) != "":
		return invalidCode("model", "model_not_on_demand", fmt.Sprintf("The model '%s' was loaded at start and stays loaded; only models of a models directory, or marked on-demand, load and unload.", name))
	}
	return notFound(name)
}

func notFound(name string) *apiError {
	return &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("The model '%s' does not exist.", name), Type: typeInvalidRequest, Param: strptr("model"), Code: strptr("model_not_found")}
}

// stateObject is an on-demand model's object in GET /v1/models.
func (s *Server) stateObject(st modelState) modelObject {
	o := modelObject{ID: st.Name, Object: "model", Created: s.start.Unix(), OwnedBy: "parley", Kind: st.Kind, State: st.State, OnDemand: true, LoadError: st.Error}
	if st.State == stateUnloading {
		o.State = stateLoaded // still in memory
	}
	if st.Bytes > 0 {
		o.MemoryBytes = st.Bytes
	}
	return o
}

// registryCollector reports the models loaded and each on-demand model's memory at scrape time.
type registryCollector struct {
	s *Server
}

var (
	descLoaded   = prometheus.NewDesc("parley_models_loaded", "Models loaded now, those loaded at start included.", nil, nil)
	descResident = prometheus.NewDesc("parley_model_memory_bytes", "Memory an on-demand model loaded now is accounted for under --max-memory (weights, caches and scratch, estimated from its file).", []string{"model"}, nil)
	descBudget   = prometheus.NewDesc("parley_model_memory_budget_bytes", "The memory budget of the on-demand models (0: none).", nil, nil)
)

func (c *registryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLoaded
	ch <- descResident
	ch <- descBudget
}

func (c *registryCollector) Collect(ch chan<- prometheus.Metric) {
	n := len(c.s.models) + len(c.s.speech) + len(c.s.ttsN)
	for _, st := range c.s.reg.states() {
		if st.State == stateLoaded || st.State == stateUnloading {
			n++
			ch <- prometheus.MustNewConstMetric(descResident, prometheus.GaugeValue, float64(st.Bytes), st.Name)
		}
	}
	ch <- prometheus.MustNewConstMetric(descLoaded, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(c.s.reg.budget))
}

// registerOnDemandMetrics adds the load and unload series.
func (s *Server) registerOnDemandMetrics() error {
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_model_loads_total", Help: "On-demand model loads, by model and result (ok, error)."}, []string{"model", "result"})
	unloads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_model_unloads_total", Help: "On-demand model unloads, by model."}, []string{"model"})
	took := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "parley_model_load_duration_seconds", Help: "Time an on-demand model took to load.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}, []string{"model"})
	if err := registerAll(s.metrics.reg, []prometheus.Collector{loads, unloads, took, &registryCollector{s: s}}); err != nil {
		return err
	}
	s.reg.onLoad = func(name string, d time.Duration, err error) {
		if err != nil {
			loads.WithLabelValues(name, "error").Inc()
			return
		}
		loads.WithLabelValues(name, "ok").Inc()
		took.WithLabelValues(name).Observe(d.Seconds())
	}
	s.reg.onUnload = func(name string) { unloads.WithLabelValues(name).Inc() }
	s.metrics.sched.loaded = s.reg.loadedModels
	return nil
}

// CloseModels unloads every on-demand model, waiting until the requests using them have ended,
// or until ctx ends; none loads after it. The caller calls it once the server has drained.
func (s *Server) CloseModels(ctx context.Context) error { return s.reg.close(ctx) }
