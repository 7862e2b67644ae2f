package modeltest

import (
	"slices"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/backendtest"
)

// RecordCase is a recording form of the pure-Go backend and the counts it must reach over the steps.
type RecordCase struct {
	Name string
	// Recorder's Backend is set to a fresh pure-Go backend.
	Recorder                   *backendtest.Recorder
	Records, Replays, Discards int
}

// NewGo returns a one-thread pure-Go backend, closed when t ends.
func NewGo(t testing.TB) backend.Backend {
	t.Helper()
	be, _, err := backend.New("go", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

// CheckRecorded runs steps (which returns every step's logits) on the pure-Go backend, then on
// each case's recorder (backendtest.Recorder, which records and replays steps as a GPU
// backend's graphs do), and requires the logits bit for bit the same and the recorder's counts.
func CheckRecorded(t *testing.T, steps func(*testing.T, backend.Backend) [][]float32, cases []RecordCase) {
	t.Helper()
	want := steps(t, NewGo(t))
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			rb := tc.Recorder
			rb.Backend = NewGo(t)
			got := steps(t, rb)
			for i := range want {
				if !slices.Equal(got[i], want[i]) {
					t.Fatalf("step %d: logits differ from the unrecorded run's", i)
				}
			}
			if rb.Records != tc.Records || rb.Replays != tc.Replays || rb.Discards != tc.Discards {
				t.Fatalf("records/replays/discards = %d/%d/%d, want %d/%d/%d", rb.Records, rb.Replays, rb.Discards, tc.Records, tc.Replays, tc.Discards)
			}
		})
	}
}
