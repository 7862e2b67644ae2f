package audio

import (
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
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

// TestWAVStreamHeader: a stream's header with unknown sizes decodes, by this package and by SoX
// when it is installed, to every sample that follows it.
func TestWAVStreamHeader(t *testing.T) {
	x := make([]float32, 4000)
	for i := range x {
		x[i] = float32(math.Sin(float64(i) * 0.05))
	}
	h, err := WAVStreamHeader(SampleRate)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 44 || binary.LittleEndian.Uint32(h[4:]) != math.MaxUint32 || binary.LittleEndian.Uint32(h[40:]) != math.MaxUint32 {
		t.Fatalf("header %x: want 44 bytes with RIFF and data sizes 0xFFFFFFFF", h)
	}
	data := FloatToPCM16(h, x)
	got, info, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if info.Frames != int64(len(x)) || len(got) != len(x) {
		t.Fatalf("decoded %d samples (%+v), want %d", len(got), info, len(x))
	}
	for i := range x {
		if want := float32(int16(x[i]*32767)) / 32768; got[i] != want {
			t.Fatalf("sample %d: %v, want %v", i, got[i], want)
		}
	}
	if _, err := WAVStreamHeader(0); err == nil {
		t.Error("rate 0: no error")
	}
	sox, err := exec.LookPath("sox")
	if err != nil {
		return
	}
	in := filepath.Join(t.TempDir(), "s.wav")
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sox, "--ignore-length", in, "-t", "raw", "-").Output()
	if err != nil {
		t.Fatalf("sox: %v", err)
	}
	if string(out) != string(data[44:]) {
		t.Errorf("sox reads %d bytes of samples, want %d", len(out), len(data)-44)
	}
}
