package cuda

import (
	"testing"

	"github.com/parleyhq/parley/bindings/cuda/internal/srchash"
)

// TestNativeSourcesHash fails when the CUDA library's sources changed without go generate: the
// go command would otherwise keep linking binaries against the old archive.
func TestNativeSourcesHash(t *testing.T) {
	sum, err := srchash.Sum("../..")
	if err != nil {
		t.Skipf("CUDA sources not readable here: %v", err)
	}
	if sum != nativeSources {
		t.Fatalf("CUDA sources changed: run scripts/cuda-build and go generate ./bindings/cuda (have %s, generated for %s)", sum, nativeSources)
	}
}
