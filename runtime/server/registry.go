package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// OnDemandModel is a model the server loads on its first request and unloads once it has been
// idle for its keep-alive, or sooner when another model needs its memory. The server learns no
// file format: Load opens the model, and the Loaded it returns says how to release it.
type OnDemandModel struct {
	Name string    // id clients pass as "model"; unique among all of a Server's models
	Kind ModelKind // what it serves, known before it is loaded
	// Bytes is the memory the model takes once loaded (weights, caches and scratch), estimated
	// before loading; the models loaded together stay within Config.MaxMemory.
	Bytes int64
	// KeepAlive is how long the model stays loaded after its last request ends: 0 unloads it
	// then, a negative value keeps it until its memory is needed. A request's keep_alive
	// replaces it from then on.
	KeepAlive time.Duration
	// Load opens the model. It runs once for all the requests that wait for it, on a goroutine
	// of its own; ctx ends when the server closes its models.
	Load func(ctx context.Context) (*Loaded, error)
}

// ModelKind is what a model serves, as GET /v1/models names it.
type ModelKind string

// Kinds of model.
const (
	KindLLM               ModelKind = "llm"                // /v1/completions, /v1/chat/completions (and /v1/embeddings when it has an Embedder)
	KindEmbedding         ModelKind = "embedding"          // /v1/embeddings
	KindSpeechRecognition ModelKind = "speech_recognition" // /v1/audio/transcriptions, /translations, /stream
	KindSpeechSynthesis   ModelKind = "speech_synthesis"   // /v1/audio/speech
)

// Loaded is a loaded on-demand model: the one of Model, Speech and TTS its Kind says, and how to
// release it.
type Loaded struct {
	Model  *Model
	Speech *SpeechModel
	TTS    *TTSModel
	// Close stops the model's schedulers and releases its memory; it runs once no request uses
	// the model.
	Close func()
}

// Model states, as GET /v1/models names them.
const (
	stateUnloaded  = "unloaded"
	stateLoading   = "loading"
	stateLoaded    = "loaded"
	stateUnloading = "unloading"
)

// Errors of registry.acquire.
var (
	errLoadTimeout = errors.New("load timeout")
	errTooLarge    = errors.New("model larger than the memory budget")
	errClosed      = errors.New("models closed")
)

// registry owns the on-demand models: name lookup, loading (one load however many requests
// wait), the references of requests in flight, idle timers, and eviction of the least recently
// used idle models when a load needs memory. Every field of an entry is guarded by mu.
type registry struct {
	mu      sync.Mutex
	entries map[string]*entry
	list    []*entry // in the order given
	budget  int64    // bytes the loaded models may take together; 0: no bound
	used    int64    // bytes of the models loading, loaded or unloading
	timeout time.Duration
	tick    uint64        // last use, for LRU order
	changed chan struct{} // closed, and replaced, when memory is freed or a model released
	closed  bool
	ctx     context.Context // the loads'; cancelled by close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // loads and unloads under way
	log     *slog.Logger
	// prepare derives what the server needs of a loaded model; an error fails the load.
	prepare func(e *entry, l *Loaded) error
	// onLoad and onUnload feed the metrics.
	onLoad   func(name string, took time.Duration, err error)
	onUnload func(name string)
}

type entry struct {
	OnDemandModel
	state   string
	loaded  *Loaded
	sv      *served       // set by prepare for an LLM or embedding model
	ss      *speechServed // set by prepare for a speech recognition model
	refs    int           // requests using the model, or waiting for its load
	last    uint64        // tick of its last use
	keep    time.Duration // keep-alive after the last request
	timer   *time.Timer
	timerID uint64 // the armed timer's; a stale one does nothing
	evict   bool   // unload as soon as no request uses it
	op      *pending
	lastErr error // the last load's failure, for GET /v1/models
}

// pending is a load or unload under way.
type pending struct {
	done chan struct{}
	load bool
	err  error // a failed load's
}

func newRegistry(models []*OnDemandModel, budget int64, timeout time.Duration, log *slog.Logger) (*registry, error) {
	r := &registry{entries: map[string]*entry{}, budget: budget, timeout: timeout, changed: make(chan struct{}), log: log}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	for i, m := range models {
		switch {
		case m == nil || m.Load == nil:
			return nil, fmt.Errorf("server: on-demand model %d: a loader is required", i)
		case m.Name == "":
			return nil, fmt.Errorf("server: on-demand model %d: empty name", i)
		case r.entries[m.Name] != nil:
			return nil, fmt.Errorf("server: model %q listed twice", m.Name)
		case m.Bytes < 0:
			return nil, fmt.Errorf("server: model %q: negative size %d", m.Name, m.Bytes)
		}
		switch m.Kind {
		case KindLLM, KindEmbedding, KindSpeechRecognition, KindSpeechSynthesis:
		default:
			return nil, fmt.Errorf("server: model %q: unknown kind %q", m.Name, m.Kind)
		}
		e := &entry{OnDemandModel: *m, state: stateUnloaded, keep: m.KeepAlive}
		r.entries[m.Name] = e
		r.list = append(r.list, e)
	}
	return r, nil
}

// kind is the kind of the named model, "" when the registry has none of that name.
func (r *registry) kind(name string) ModelKind {
	if e := r.entries[name]; e != nil { // entries never changes after newRegistry
		return e.Kind
	}
	return ""
}

// notify wakes every acquire waiting for memory. mu is held.
func (r *registry) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// acquire returns the named model loaded and holds it for the caller until release, loading it
// first (one load for all the callers) and unloading the least recently used idle models when
// it needs their memory. keep, when not nil, becomes the model's keep-alive. It waits at most
// the registry's timeout (errLoadTimeout), or until ctx ends (its error); a failed load's error
// reaches every caller that waited for it, and the next acquire loads again.
func (r *registry) acquire(ctx context.Context, name string, keep *time.Duration) (*entry, error) {
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, r.timeout, errLoadTimeout)
		defer cancel()
	}
	e := r.entries[name]
	if e == nil {
		return nil, fmt.Errorf("no model %q", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if r.closed {
			return nil, errClosed
		}
		var wait <-chan struct{}
		switch e.state {
		case stateLoaded:
			if !e.evict {
				e.refs++
				r.touch(e, keep)
				return e, nil
			}
			wait = r.changed // it unloads once idle; then it loads again
		case stateLoading:
			e.refs++ // a reference taken now keeps the loaded model from its idle timer
			op := e.op
			if err := r.wait(ctx, op.done); err != nil {
				r.releaseLocked(e)
				return nil, err
			}
			if op.err != nil {
				e.refs--
				return nil, op.err
			}
			r.touch(e, keep)
			return e, nil
		case stateUnloading:
			wait = e.op.done
		case stateUnloaded:
			if r.budget > 0 && e.Bytes > r.budget {
				return nil, fmt.Errorf("%w: %s needs %s, the budget is %s", errTooLarge, name, fmtBytes(e.Bytes), fmtBytes(r.budget))
			}
			if r.makeRoom(e) {
				r.startLoad(e)
				continue
			}
			wait = r.changed
		}
		if err := r.wait(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// wait unlocks mu until ch is closed or ctx ends, and locks it again.
func (r *registry) wait(ctx context.Context, ch <-chan struct{}) error {
	r.mu.Unlock()
	defer r.mu.Lock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// touch marks e used now, stops its idle timer and sets its keep-alive. mu is held.
func (r *registry) touch(e *entry, keep *time.Duration) {
	r.tick++
	e.last = r.tick
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	if keep != nil {
		e.keep = *keep
	}
}

// makeRoom reports whether e fits in the budget beside the models that use memory; when it
// does not, it unloads idle models, least recently used first, and marks models in use to be
// unloaded once idle, as many as e needs, and e waits for them. mu is held.
func (r *registry) makeRoom(e *entry) bool {
	if r.budget == 0 || r.used+e.Bytes <= r.budget {
		return true
	}
	coming := int64(0) // bytes that unloads under way, or marked ones, will free
	var idle, busy []*entry
	for _, o := range r.list {
		switch {
		case o.state == stateUnloading || o.state == stateLoaded && o.evict:
			coming += o.Bytes
		case o.state == stateLoaded && o.refs == 0:
			idle = append(idle, o)
		case o.state == stateLoaded:
			busy = append(busy, o)
		}
	}
	byLRU := func(a, b *entry) int { return cmp.Compare(a.last, b.last) }
	slices.SortFunc(idle, byLRU)
	slices.SortFunc(busy, byLRU)
	for _, o := range append(idle, busy...) {
		if r.used-coming+e.Bytes <= r.budget {
			break
		}
		coming += o.Bytes
		if o.refs == 0 {
			r.log.Info("unloading model for memory", "model", o.Name, "for", e.Name)
			r.startUnload(o)
		} else {
			r.log.Info("model to be unloaded for memory once idle", "model", o.Name, "for", e.Name)
			o.evict = true
		}
	}
	return false
}

// startLoad begins loading e. mu is held.
func (r *registry) startLoad(e *entry) {
	op := &pending{done: make(chan struct{}), load: true}
	e.state, e.op, e.evict, e.keep = stateLoading, op, false, e.KeepAlive
	r.used += e.Bytes
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t0 := time.Now()
		l, err := safeLoad(r.ctx, e.Load)
		if err == nil && l == nil {
			err = errors.New("the loader returned no model")
		}
		if err == nil && r.prepare != nil {
			if err = r.prepare(e, l); err != nil && l.Close != nil {
				l.Close()
			}
		}
		took := time.Since(t0)
		if r.onLoad != nil {
			r.onLoad(e.Name, took, err)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			r.log.Error("model failed to load", "model", e.Name, "err", err)
			op.err = fmt.Errorf("model %s could not be loaded: %w", e.Name, err)
			e.state, e.op, e.lastErr, e.sv, e.ss = stateUnloaded, nil, err, nil, nil
			r.used -= e.Bytes
			close(op.done)
			r.notify()
			return
		}
		r.log.Info("model loaded on demand", "model", e.Name, "kind", e.Kind, "bytes", e.Bytes, "took", took.Round(time.Millisecond))
		e.state, e.op, e.loaded, e.lastErr = stateLoaded, nil, l, nil
		close(op.done)
		r.notify()
		if e.refs == 0 { // every waiter gave up, or an admin load
			r.idle(e)
		}
	}()
}

// safeLoad runs load, a panic turned into its error.
func safeLoad(ctx context.Context, load func(context.Context) (*Loaded, error)) (l *Loaded, err error) {
	defer func() {
		if p := recover(); p != nil {
			l, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	return load(ctx)
}

// release ends a use of e that acquire began.
func (r *registry) release(e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releaseLocked(e)
}

func (r *registry) releaseLocked(e *entry) {
	e.refs--
	if e.refs == 0 && e.state == stateLoaded {
		r.tick++
		e.last = r.tick
		r.idle(e)
	}
	r.notify()
}

// idle starts e's keep-alive, or unloads it when its time is up already. mu is held.
func (r *registry) idle(e *entry) {
	switch {
	case e.evict || e.keep == 0 || r.closed:
		r.startUnload(e)
	case e.keep > 0:
		r.tick++
		id := r.tick
		e.timerID = id
		e.timer = time.AfterFunc(e.keep, func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if e.timerID == id && e.timer != nil && e.state == stateLoaded && e.refs == 0 {
				e.timer = nil
				r.log.Info("unloading idle model", "model", e.Name, "keep_alive", e.keep)
				r.startUnload(e)
			}
		})
	}
}

// startUnload begins unloading e, which no request uses. mu is held.
func (r *registry) startUnload(e *entry) {
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	op := &pending{done: make(chan struct{})}
	l := e.loaded
	e.state, e.op, e.evict, e.loaded, e.sv, e.ss = stateUnloading, op, false, nil, nil, nil
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if l.Close != nil {
			l.Close()
		}
		if r.onUnload != nil {
			r.onUnload(e.Name)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		e.state, e.op = stateUnloaded, nil
		r.used -= e.Bytes
		close(op.done)
		r.notify()
	}()
}

// unload unloads the named model: at once when no request uses it (and waits until it has),
// else once the last one ends (busy: true).
func (r *registry) unload(ctx context.Context, name string) (busy bool, err error) {
	e := r.entries[name]
	if e == nil {
		return false, fmt.Errorf("no model %q", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		switch {
		case e.state == stateUnloaded:
			return false, nil
		case e.state == stateLoaded && e.refs == 0:
			r.startUnload(e)
		case e.state == stateLoaded || e.state == stateLoading:
			e.evict = true
			return true, nil
		}
		if err := r.wait(ctx, e.op.done); err != nil {
			return false, err
		}
	}
}

// modelState is one model's line in GET /v1/models.
type modelState struct {
	Name   string
	Kind   ModelKind
	State  string
	Bytes  int64
	Refs   int
	Error  string // the last load's failure
	Loaded bool
}

// states lists the models.
func (r *registry) states() []modelState {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]modelState, 0, len(r.list))
	for _, e := range r.list {
		st := modelState{Name: e.Name, Kind: e.Kind, State: e.state, Bytes: e.Bytes, Refs: e.refs, Loaded: e.state == stateLoaded}
		if e.lastErr != nil {
			st.Error = e.lastErr.Error()
		}
		out = append(out, st)
	}
	return out
}

// loadedModels are the language, embedding and speech recognition models loaded now, for their
// schedulers' metrics (whose Stats stay safe to read after an unload).
func (r *registry) loadedModels() (models []*served, speech []*speechServed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.list {
		switch {
		case e.state != stateLoaded:
		case e.sv != nil:
			models = append(models, e.sv)
		case e.ss != nil:
			speech = append(speech, e.ss)
		}
	}
	return models, speech
}

// loadedTTS are the text-to-speech models loaded now.
func (r *registry) loadedTTS() []*TTSModel {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*TTSModel
	for _, e := range r.list {
		if e.state == stateLoaded && e.loaded != nil && e.loaded.TTS != nil {
			out = append(out, e.loaded.TTS)
		}
	}
	return out
}

// state is the named model's line.
func (r *registry) state(name string) modelState {
	for _, st := range r.states() {
		if st.Name == name {
			return st
		}
	}
	return modelState{}
}

// close unloads every model, waiting until the requests using them have ended and the unloads
// are done, or until ctx ends; no model loads after it.
func (r *registry) close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	r.cancel()
	for _, e := range r.list {
		switch {
		case e.state == stateLoaded && e.refs == 0:
			r.startUnload(e)
		case e.state == stateLoaded:
			e.evict = true
		}
	}
	r.notify()
	r.mu.Unlock()
	done := make(chan struct{})
	go func() {
		// A model in use unloads at its release, a loading one when its load ends.
		for {
			r.mu.Lock()
			n := 0
			for _, e := range r.list {
				if e.state != stateUnloaded {
					n++
				}
			}
			ch := r.changed
			r.mu.Unlock()
			if n == 0 {
				break
			}
			<-ch
		}
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fmtBytes writes n in MiB, or GiB from 10 GiB.
func fmtBytes(n int64) string {
	if n >= 10<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
