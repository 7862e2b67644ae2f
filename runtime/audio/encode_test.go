package audio

import (
	"math"
	"testing"
)

// TestWAVWriteRoundTrip: a header and FloatToPCM16's samples decode back (16 kHz, so without
// resampling) to trunc(clamp(v)·32767)/32768, with NaN as silence.
func TestWAVWriteRoundTrip(t *testing.T) {
	x := []float32{0, 0.5, -0.5, 1, -1, 1.5, -2, 0.123456, -0.999, float32(math.NaN())}
	h, err := WAVHeader(int64(len(x)), SampleRate)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 44 {
		t.Fatalf("header of %d bytes, want 44", len(h))
	}
	got, info, err := Decode(FloatToPCM16(h, x))
	if err != nil {
		t.Fatal(err)
	}
	if info.SampleRate != SampleRate || info.Channels != 1 || info.BitsPerSample != 16 || info.Frames != int64(len(x)) {
		t.Fatalf("decoded as %+v", info)
	}
	want := []int16{0, 16383, -16383, 32767, -32767, 32767, -32767, 4045, -32734, 0}
	for i, w := range want {
		if got[i] != float32(w)/32768 {
			t.Errorf("sample %d (%v): %v, want %d/32768", i, x[i], got[i]*32768, w)
		}
	}
}

func TestWAVHeaderErrors(t *testing.T) {
	for _, c := range []struct {
		n    int64
		rate int
	}{{-1, 24000}, {MaxWAVSamples + 1, 24000}, {10, 0}, {10, -5}, {10, MaxRate + 1}} {
		if _, err := WAVHeader(c.n, c.rate); err == nil {
			t.Errorf("WAVHeader(%d, %d): no error", c.n, c.rate)
		}
	}
}
