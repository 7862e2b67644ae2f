package audio

import (
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// TestDecodeAtRate: Options.SampleRate sets the rate of the decoded samples. A 24 kHz 16-bit WAV
// decoded at 24 kHz is its samples exactly (s16·2⁻¹⁵, not resampled); 44.1 and 48 kHz WAVs are
// resampled once, straight to 24 kHz: the decoder's output equals one Resampler from the file's
// rate applied to its exact samples, bit for bit, and differs from a detour through 16 kHz. The
// streaming Decoder reads the same; an output rate out of range is an error.
func TestDecodeAtRate(t *testing.T) {
	const out = 24000
	rng := rand.New(rand.NewPCG(7, 9))
	for _, rate := range []int{24000, 44100, 48000} {
		n := rate * 3 / 2 // 1.5 s
		h, err := WAVHeader(int64(n), rate)
		if err != nil {
			t.Fatal(err)
		}
		file := h
		exact := make([]float32, n)
		for i := range exact {
			v := int16(rng.IntN(1<<16) - 1<<15)
			file = append(file, byte(v), byte(uint16(v)>>8))
			exact[i] = float32(v) / 32768
		}
		got, info, err := DecodeWith(file, Options{SampleRate: out})
		if err != nil {
			t.Fatalf("%d Hz: %v", rate, err)
		}
		if info.SampleRate != rate || info.Frames != int64(n) {
			t.Errorf("%d Hz: info %+v", rate, info)
		}
		want := exact
		if rate != out {
			rs, err := NewResampler(rate, out)
			if err != nil {
				t.Fatal(err)
			}
			want = rs.Flush(rs.Process(nil, exact))
			// the detour the decoder does not take: to 16 kHz, then to 24 kHz
			r1, _ := NewResampler(rate, SampleRate)
			r2, _ := NewResampler(SampleRate, out)
			detour := r2.Flush(r2.Process(nil, r1.Flush(r1.Process(nil, exact))))
			same := len(detour) == len(got)
			for i := 0; same && i < len(got); i++ {
				same = detour[i] == got[i]
			}
			if same {
				t.Errorf("%d Hz: the output equals the detour through 16 kHz", rate)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%d Hz: %d samples, want %d", rate, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%d Hz: sample %d is %v, want %v", rate, i, got[i], want[i])
			}
		}
		d, err := NewDecoder(file, Options{SampleRate: out})
		if err != nil {
			t.Fatal(err)
		}
		var streamed []float32
		buf := make([]float32, 1000)
		for {
			k, err := d.Read(buf)
			streamed = append(streamed, buf[:k]...)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if len(streamed) != len(got) {
			t.Fatalf("%d Hz: the Decoder reads %d samples, DecodeWith %d", rate, len(streamed), len(got))
		}
		for i := range got {
			if streamed[i] != got[i] {
				t.Fatalf("%d Hz: sample %d streamed %v, decoded %v", rate, i, streamed[i], got[i])
			}
		}
	}
	h, _ := WAVHeader(100, 24000)
	file := FloatToPCM16(h, make([]float32, 100))
	for _, r := range []int{-1, 500, MaxRate + 1} {
		if _, _, err := DecodeWith(file, Options{SampleRate: r}); err == nil {
			t.Errorf("output rate %d: no error", r)
		}
	}
}
