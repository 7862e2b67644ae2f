package cpu

import (
	"testing"

	"github.com/parleyhq/parley/bindings/cpu/internal/nativehash"
)

// TestNativeSourcesHash fails when native/ changed without go generate: the go command would
// otherwise keep using C code compiled from the old sources.
func TestNativeSourcesHash(t *testing.T) {
	sum, err := nativehash.Sum("../../native")
	if err != nil {
		t.Skipf("native sources not readable here: %v", err)
	}
	if sum != nativeSources {
		t.Fatalf("native sources changed: run go generate ./bindings/cpu (have %s, generated for %s)", sum, nativeSources)
	}
}
