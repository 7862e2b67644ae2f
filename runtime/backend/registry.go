package backend

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
)

// EnvVar names the environment variable that chooses a backend when no flag does.
const EnvVar = "PARLEY_BACKEND"

// Factory makes a backend. It returns an error (never panics) when the backend cannot run here:
// not built in, no device, no driver.
type Factory func(Options) (Backend, error)

type entry struct {
	name     string
	priority int // higher is preferred by "auto"
	factory  Factory
}

var (
	mu       sync.Mutex
	registry = map[string]entry{}
	aliases  = map[string]string{} // other name: registered name
	infos    = map[string]func() string{}
)

// RegisterInfo gives the backend called name a description of what it would run on here, for
// `parley version`: the CPU kernels' instruction set, the GPUs it sees or why it sees none. The
// function must not start the backend.
func RegisterInfo(name string, info func() string) {
	mu.Lock()
	defer mu.Unlock()
	infos[name] = info
}

// Info is the description of the backend called name (RegisterInfo); "" when it has none.
func Info(name string) string {
	mu.Lock()
	f := infos[name]
	mu.Unlock()
	if f == nil {
		return ""
	}
	return f()
}

// Register makes a backend available under name. "auto" prefers the backend of highest priority
// that starts. Backends call it from init functions.
func Register(name string, priority int, f Factory) {
	mu.Lock()
	defer mu.Unlock()
	registry[name] = entry{name, priority, f}
}

// Alias makes New, Choose and Canonical take alias for the backend registered as name (a name
// it was known by before). Names lists name alone.
func Alias(alias, name string) {
	mu.Lock()
	defer mu.Unlock()
	aliases[alias] = name
}

// Canonical returns the name the backend called name is registered under: name itself, or the
// backend's name when name is an alias of it.
func Canonical(name string) string {
	mu.Lock()
	defer mu.Unlock()
	if n, ok := aliases[name]; ok {
		return n
	}
	return name
}

// Names lists the registered backends, most preferred first.
func Names() []string {
	mu.Lock()
	defer mu.Unlock()
	es := make([]entry, 0, len(registry))
	for _, e := range registry {
		es = append(es, e)
	}
	sort.Slice(es, func(i, j int) bool {
		if es[i].priority != es[j].priority {
			return es[i].priority > es[j].priority
		}
		return es[i].name < es[j].name
	})
	names := make([]string, len(es))
	for i, e := range es {
		names[i] = e.name
	}
	return names
}

// Choose resolves the backend name to use: flag if set, else $PARLEY_BACKEND, else "auto"; an
// alias becomes the name it stands for (Canonical).
func Choose(flag string) string {
	if flag != "" {
		return Canonical(flag)
	}
	if v := strings.TrimSpace(os.Getenv(EnvVar)); v != "" {
		return Canonical(v)
	}
	return "auto"
}

// New starts the backend called name (or an alias of it), or for "auto" (or "") the most
// preferred one that starts. For "auto", the returned notes say which backends were skipped and
// why, for the caller to log.
func New(name string, opts Options) (b Backend, notes []string, err error) {
	if name == "" || name == "auto" {
		var errs []error
		for _, n := range Names() {
			mu.Lock()
			e := registry[n]
			mu.Unlock()
			b, err := e.factory(opts)
			if err == nil {
				return b, notes, nil
			}
			notes = append(notes, fmt.Sprintf("backend %s unavailable: %v", n, err))
			errs = append(errs, err)
		}
		return nil, notes, fmt.Errorf("no backend available: %w", errors.Join(errs...))
	}
	name = Canonical(name)
	mu.Lock()
	e, ok := registry[name]
	mu.Unlock()
	if !ok {
		if why := NotBuilt(name); why != "" {
			return nil, nil, fmt.Errorf("backend %s: %s", name, why)
		}
		return nil, nil, fmt.Errorf("unknown backend %q (have %s)", name, strings.Join(Names(), ", "))
	}
	b, err = e.factory(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("backend %s: %w", name, err)
	}
	return b, nil, nil
}

// NotBuilt says why name, a backend Parley has but this build was compiled without, is absent
// and how to build it in; "" when name is registered or is no backend of Parley's.
func NotBuilt(name string) string {
	mu.Lock()
	_, ok := registry[name]
	mu.Unlock()
	if ok || name != "cuda" {
		return ""
	}
	return "not in this build (build the CUDA library with scripts/cuda-build, then go build -tags cuda; cgo is needed)"
}
