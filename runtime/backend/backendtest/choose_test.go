package backendtest

import (
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/purego"
)

// TestChooseCheck runs the suite's Choose check on Choosing over the pure-Go backend (choosing by
// backend.ChooseRows, as the check's reference does), so that the check's cases, its count of
// refused and forced rows and its argument checks run without a GPU.
func TestChooseCheck(t *testing.T) {
	be, err := purego.New(backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	testChoose(t, &Choosing{Backend: be}, nil)
}
