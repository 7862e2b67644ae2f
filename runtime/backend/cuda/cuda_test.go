//go:build cuda && cgo && !nocgo

package cuda

import (
	"errors"
	"os"
	"strings"
	"testing"

	bcuda "github.com/parleyhq/parley/bindings/cuda"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/backendtest"
	_ "github.com/parleyhq/parley/runtime/backend/cpu"
	_ "github.com/parleyhq/parley/runtime/backend/purego"
)

// requireGPU reports whether PARLEY_REQUIRE_GPU=1 makes a missing GPU a failure.
func requireGPU() bool { return os.Getenv("PARLEY_REQUIRE_GPU") == "1" }

// gpu skips t (or fails it under PARLEY_REQUIRE_GPU=1) when no GPU is usable.
func gpu(t *testing.T) {
	t.Helper()
	if _, err := bcuda.Devices(); err != nil {
		if requireGPU() {
			t.Fatalf("PARLEY_REQUIRE_GPU=1 but no GPU is usable: %v", err)
		}
		t.Skipf("no GPU: %v", err)
	}
}

// newExact starts a backend that multiplies F32 weights in full F32: the suite's F32 bounds are
// those of F32 arithmetic, which TF32 inputs (10-bit mantissas) exceed.
func newExact() (backend.Backend, error) { return New(Options{ExactF32: true}) }

// TestConformance runs the shared suite on GPU 0.
func TestConformance(t *testing.T) {
	gpu(t)
	if b, err := newExact(); err == nil {
		backendtest.AllFuncs(t, b)
		b.Close()
	}
	backendtest.Run(t, newExact)
	if n := bcuda.LiveBuffers(); n != 0 {
		t.Errorf("%d device buffers still allocated after every backend closed", n)
	}
}

// TestConformanceOtherKernels runs the suite again with the kernels that are not the default:
// attention over F16 caches on tensor cores, and products of more than eight rows by quantised
// weights expanded to F16.
func TestConformanceOtherKernels(t *testing.T) {
	gpu(t)
	backendtest.Run(t, func() (backend.Backend, error) { return New(Options{ExactF32: true, FlashMMA: true, QuantF16: true}) })
	if n := bcuda.LiveBuffers(); n != 0 {
		t.Errorf("%d device buffers still allocated after every backend closed", n)
	}
}

func BenchmarkBackend(b *testing.B) {
	if _, err := bcuda.Devices(); err != nil {
		b.Skipf("no GPU: %v", err)
	}
	backendtest.Bench(b, func() (backend.Backend, error) { return New(Options{}) })
}

// TestWithoutGPU checks what a machine without a usable GPU gets: New fails with an error that
// says why, and "auto" goes on to a CPU backend, noting why cuda was skipped.
func TestWithoutGPU(t *testing.T) {
	if _, err := bcuda.Devices(); err == nil {
		t.Skip("a GPU is present")
	}
	if requireGPU() {
		t.Fatal("PARLEY_REQUIRE_GPU=1 but no GPU is usable")
	}
	_, err := New(Options{})
	if err == nil {
		t.Fatal("New succeeded without a GPU")
	}
	if !errors.Is(err, bcuda.ErrNoDevice) || !strings.Contains(err.Error(), "NVIDIA") {
		t.Fatalf("New without a GPU: %q, want an error wrapping ErrNoDevice that names the cause", err)
	}
	t.Logf("New: %v", err)
	if _, _, err := backend.New("cuda", backend.Options{}); err == nil || !strings.Contains(err.Error(), "cuda") {
		t.Fatalf(`backend.New("cuda") without a GPU: %v`, err)
	}
	b, notes, err := backend.New("auto", backend.Options{Threads: 1})
	if err != nil {
		t.Fatalf(`backend.New("auto"): %v`, err)
	}
	defer b.Close()
	if b.Name() == "cuda" {
		t.Fatal(`backend.New("auto") chose cuda without a GPU`)
	}
	found := false
	for _, n := range notes {
		found = found || strings.Contains(n, "backend cuda unavailable")
	}
	if !found {
		t.Fatalf(`backend.New("auto") chose %s with notes %q, want one saying why cuda was skipped`, b.Name(), notes)
	}
	t.Logf("auto chose %s; notes: %q", b.Name(), notes)
}

// TestRegistered checks that cuda is registered and preferred over the CPU backends.
func TestRegistered(t *testing.T) {
	names := backend.Names()
	if len(names) == 0 || names[0] != "cuda" {
		t.Fatalf("backend.Names() = %q, want cuda first", names)
	}
}

// TestEnv checks the factory's environment variables.
func TestEnv(t *testing.T) {
	t.Setenv(EnvDevice, "x")
	if _, err := factory(backend.Options{}); err == nil || !strings.Contains(err.Error(), EnvDevice) {
		t.Fatalf("factory with %s=x: %v", EnvDevice, err)
	}
	t.Setenv(EnvDevice, "99")
	if _, err := factory(backend.Options{}); err == nil {
		t.Fatalf("factory with %s=99 succeeded", EnvDevice)
	}
	t.Setenv(EnvDevice, "")
	t.Setenv(EnvGraphs, "yes")
	if _, err := factory(backend.Options{}); err == nil || !strings.Contains(err.Error(), EnvGraphs) {
		t.Fatalf("factory with %s=yes: %v", EnvGraphs, err)
	}
	t.Setenv(EnvGraphs, "")
	t.Setenv(EnvFlash, "tensor")
	if _, err := factory(backend.Options{}); err == nil || !strings.Contains(err.Error(), EnvFlash) {
		t.Fatalf("factory with %s=tensor: %v", EnvFlash, err)
	}
	t.Setenv(EnvFlash, "")
	t.Setenv(EnvMMQ, "on")
	if _, err := factory(backend.Options{}); err == nil || !strings.Contains(err.Error(), EnvMMQ) {
		t.Fatalf("factory with %s=on: %v", EnvMMQ, err)
	}
}
