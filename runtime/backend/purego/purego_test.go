package purego

import (
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/backendtest"
)

func TestConformance(t *testing.T) {
	// One worker exercises the serial paths; three (more than this machine may have cores)
	// exercise the splitting of work among goroutines.
	for _, threads := range []int{1, 3} {
		t.Run(map[int]string{1: "Threads1", 3: "Threads3"}[threads], func(t *testing.T) {
			backendtest.Run(t, func() (backend.Backend, error) { return New(backend.Options{Threads: threads}) })
		})
	}
}

func TestRegistered(t *testing.T) {
	for _, name := range []string{"purego", "go"} { // "go": its former name, still taken
		b, _, err := backend.New(name, backend.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if b.Name() != "purego" {
			t.Fatalf("New(%q).Name() = %q", name, b.Name())
		}
		backendtest.AllFuncs(t, b)
	}
	if got := backend.Choose("go"); got != "purego" {
		t.Fatalf(`Choose("go") = %q`, got)
	}
	t.Setenv(backend.EnvVar, "go")
	if got := backend.Choose(""); got != "purego" {
		t.Fatalf(`Choose("") with %s=go: %q`, backend.EnvVar, got)
	}
}

func BenchmarkBackend(b *testing.B) {
	backendtest.Bench(b, func() (backend.Backend, error) { return New(backend.Options{}) })
}

// BenchmarkBackendOneThread measures the same shapes on one goroutine: the per-core cost,
// which contention from other processes on the machine disturbs less.
func BenchmarkBackendOneThread(b *testing.B) {
	backendtest.Bench(b, func() (backend.Backend, error) { return New(backend.Options{Threads: 1}) })
}
