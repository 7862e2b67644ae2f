package audio

import (
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

// readStream reads s to its end in reads of the sizes sizes cycles through.
func readStream(s Stream, sizes ...int) ([]float32, error) {
	var out []float32
	buf := make([]float32, slices.Max(sizes))
	for i := 0; ; i++ {
		n, err := s.Read(buf[:sizes[i%len(sizes)]])
		out = append(out, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// streamTestFiles are files of each format this package can write or find encoders for, at
// rates that resample up, down and not at all.
func streamTestFiles(t *testing.T) map[string][]byte {
	files := map[string][]byte{}
	for _, c := range []struct{ rate, ch int }{{16000, 1}, {44100, 2}, {8000, 1}, {1000, 1}} {
		pay := testMusic(c.rate, 3*c.rate+77)
		if c.ch == 1 {
			pay = toMono(pay)
		}
		files["wav-"+strconv.Itoa(c.rate)] = buildWAV(wavSpec{form: "RIFF", tag: wavePCM, channels: c.ch, rate: c.rate, width: 2}, pay)
		files["flac-"+strconv.Itoa(c.rate)] = encodeFLAC(t, pay, c.rate, c.ch)
	}
	for i, s := range fuzzSeeds(t) { // with MP3, Vorbis and Opus where their encoders are installed
		files["seed-"+strconv.Itoa(i)] = s
	}
	return files
}

// TestDecoderStream: a Decoder read in blocks of any size yields exactly what DecodeWith
// returns, and so does every Open of a File, again and again; its Info at the end is
// DecodeWith's, and before the end states what the header declares.
func TestDecoderStream(t *testing.T) {
	for name, data := range streamTestFiles(t) {
		want, wantInfo, err := Decode(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, sizes := range [][]int{{1}, {7, 160, 3}, {4096}, {1 << 20}} {
			d, err := NewDecoder(data, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if hi := d.Info(); hi.Format != wantInfo.Format || hi.Channels != wantInfo.Channels || (hi.Frames != 0 && hi.Frames != wantInfo.Frames) {
				t.Errorf("%s: header info %+v, decoded %+v", name, hi, wantInfo)
			}
			got, err := readStream(d, sizes...)
			if err != nil {
				t.Fatalf("%s %v: %v", name, sizes, err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s, reads of %v: %d samples differ from DecodeWith's %d", name, sizes, len(got), len(want))
			}
			if d.Info() != wantInfo {
				t.Errorf("%s: info at the end %+v, DecodeWith's %+v", name, d.Info(), wantInfo)
			}
			if n, err := d.Read(make([]float32, 10)); n != 0 || err != io.EOF {
				t.Errorf("%s: read after the end: %d, %v", name, n, err)
			}
		}
		file, err := NewFile(data, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			s, err := file.Open()
			if err != nil {
				t.Fatal(err)
			}
			if got, err := readStream(s, 1000); err != nil || !slices.Equal(got, want) {
				t.Fatalf("%s: a File's stream: %d samples, %v; want %d", name, len(got), err, len(want))
			}
		}
	}
}

// TestHeaderLimits: a duration the header states beyond the limit fails in NewDecoder (nothing
// decoded), for PCM (the data size) and FLAC (STREAMINFO); a stream whose header does not state
// it fails while it is read, once past the limit.
func TestHeaderLimits(t *testing.T) {
	pay := toMono(testMusic(8000, 3*8000))
	for name, data := range map[string][]byte{
		"wav":  buildWAV(wavSpec{form: "RIFF", tag: wavePCM, channels: 1, rate: 8000, width: 2}, pay),
		"flac": encodeFLAC(t, pay, 8000, 1),
	} {
		if _, err := NewDecoder(data, Options{MaxDuration: 2 * time.Second}); !errors.Is(err, ErrTooLong) {
			t.Errorf("%s: 3 s under a 2 s limit: %v at the header, want ErrTooLong", name, err)
		}
		if _, err := NewFile(data, Options{MaxDuration: 3 * time.Second}); err != nil {
			t.Errorf("%s: 3 s under a 3 s limit: %v", name, err)
		}
	}
	// A FLAC stream whose STREAMINFO leaves the total unknown (0).
	flac := encodeFLAC(t, pay, 8000, 1)
	si := 8 // after "fLaC" and the metadata block header
	// STREAMINFO: min/max block (4), min/max frame (6), then 20 bits rate, 3 channels, 5 bits,
	// 36 bits of total samples: bytes 13..17 of the block hold the total's low 32 bits and its
	// top 4 share byte 13 with the bits per sample.
	flac[si+13] &^= 0x0f
	clear(flac[si+14 : si+18])
	d, err := NewDecoder(flac, Options{MaxDuration: 2 * time.Second})
	if err != nil {
		t.Fatalf("FLAC without a total: %v at the header", err)
	}
	if d.Info().Frames != 0 {
		t.Errorf("FLAC without a total: header info %+v", d.Info())
	}
	got, err := readStream(d, 4096)
	if !errors.Is(err, ErrTooLong) || len(got) > 2*SampleRate+4096 {
		t.Errorf("FLAC without a total, 3 s under a 2 s limit: %d samples read, %v; want ErrTooLong after at most the limit", len(got), err)
	}
}

// TestSamplesSource: Samples reads the slice it was given, from its start at every Open.
func TestSamplesSource(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := make([]float32, 10007)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	src := Samples(s)
	for range 2 {
		st, _ := src.Open()
		if got, err := readStream(st, 333, 1); err != nil || !slices.Equal(got, s) {
			t.Fatalf("%d samples, %v", len(got), err)
		}
	}
	st, _ := Samples(nil).Open()
	if n, err := st.Read(make([]float32, 4)); n != 0 || err != io.EOF {
		t.Errorf("no samples: %d, %v", n, err)
	}
}
