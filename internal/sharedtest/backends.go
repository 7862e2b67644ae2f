package sharedtest

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
)

// Backends starts every registered backend that runs here (the test binary registers them by
// importing their packages, or runtime/backend/all): the pure-Go backend first (its kernels give
// a row the same arithmetic in any batch), then the native CPU backend, then any other (the GPU
// backend), so the last is the fastest; each with threads threads, closed when t ends.
//
// The GPU backend multiplies F32 weights in full F32 (PARLEY_CUDA_TF32=0), the arithmetic the
// reference tests bound; PARLEY_REQUIRE_GPU=1 makes a GPU backend that does not start a failure
// instead of a note. PARLEY_TEST_BACKENDS (comma-separated names, such as "cuda") limits the set.
func Backends(t testing.TB, threads int) []backend.Backend {
	t.Helper()
	var bs []backend.Backend
	only := strings.FieldsFunc(os.Getenv("PARLEY_TEST_BACKENDS"), func(r rune) bool { return r == ',' || r == ' ' })
	for i, n := range only {
		only[i] = backend.Canonical(n)
	}
	names := backend.Names()
	rank := func(n string) int {
		switch n {
		case "purego":
			return 0
		case "cpu":
			return 1
		}
		return 2
	}
	slices.SortStableFunc(names, func(a, b string) int { return rank(a) - rank(b) })
	for _, name := range names {
		if len(only) > 0 && !slices.Contains(only, name) {
			continue
		}
		if name == "cuda" {
			t.Setenv("PARLEY_CUDA_TF32", "0")
		}
		be, _, err := backend.New(name, backend.Options{Threads: threads})
		if err != nil {
			if name == "cuda" && os.Getenv("PARLEY_REQUIRE_GPU") == "1" {
				t.Fatalf("PARLEY_REQUIRE_GPU=1 but the cuda backend does not start: %v", err)
			}
			t.Logf("backend %s not tested: %v", name, err)
			continue
		}
		t.Cleanup(func() { be.Close() })
		bs = append(bs, be)
	}
	if len(bs) == 0 {
		t.Fatal("no backend available")
	}
	return bs
}

// Backend starts the backend called name with threads threads, closed when t ends, or skips t
// when this build or machine cannot run it.
func Backend(t testing.TB, name string, threads int) backend.Backend {
	t.Helper()
	be, _, err := backend.New(name, backend.Options{Threads: threads})
	if err != nil {
		t.Skipf("backend %s: %v", name, err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}
