package audio

import (
	"encoding/binary"
	"math"
	"os"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// testFilters reads the mel filter bank from the shared Whisper test model: magic, 11 int32
// hyper-parameters, int32 n_mel, int32 n_fft, then n_mel·n_fft float32.
func testFilters(t testing.TB) MelFilters {
	t.Helper()
	b, err := os.ReadFile(sharedtest.Path(t, "models/asr/for-tests-ggml-tiny.en.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 56 || binary.LittleEndian.Uint32(b) != 0x67676d6c {
		t.Fatalf("not a ggml Whisper file (%d bytes)", len(b))
	}
	nMel := int(int32(binary.LittleEndian.Uint32(b[48:])))
	nFFT := int(int32(binary.LittleEndian.Uint32(b[52:])))
	if nMel <= 0 || nFFT <= 0 || len(b) < 56+4*nMel*nFFT {
		t.Fatalf("mel filters %d×%d do not fit in %d bytes", nMel, nFFT, len(b))
	}
	return MelFilters{NMel: nMel, NFFT: nFFT, Data: f32s(b[56 : 56+4*nMel*nFFT])}
}

func f32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func readF32(t testing.TB, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return f32s(b)
}

func decodeFile(t testing.TB, path string) ([]float32, Info) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, info, err := Decode(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return s, info
}
