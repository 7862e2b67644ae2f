package whisper

import (
	"os"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

// RaceEnabled tells the external tests whether the race detector is on.
const RaceEnabled = raceEnabled

// LoadWAV reads a shared recording as 16 kHz samples.
func LoadWAV(t *testing.T, utt string) []float32 {
	t.Helper()
	b, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/"+utt+".wav"))
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := audio.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
