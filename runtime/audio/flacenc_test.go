package audio

import (
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/mewkiz/flac"
)

// flacSignals are 16-bit signals that exercise every subframe kind: tones and noise (fixed
// predictors, several partitions and parameters), silence and a constant (constant
// subframes), full-scale noise (verbatim), a step and the extremes, and lengths that end in a
// short last block (1, 15 and 1,919 samples over whole blocks).
func flacSignals() map[string][]int16 {
	rng := rand.New(rand.NewPCG(7, 11))
	gen := func(n int, f func(i int) float64) []int16 {
		s := make([]int16, n)
		for i := range s {
			s[i] = int16(max(-32768, min(32767, math.Round(f(i)))))
		}
		return s
	}
	return map[string][]int16{
		"tone": gen(5*1920, func(i int) float64 { return 12000 * math.Sin(float64(i)*0.031) }),
		"speechy": gen(3*1920+1919, func(i int) float64 {
			return 8000*math.Sin(float64(i)*0.01)*math.Sin(float64(i)*0.2) + rng.NormFloat64()*300
		}),
		"silence":  gen(2*1920, func(int) float64 { return 0 }),
		"constant": gen(1920+15, func(int) float64 { return -1234 }),
		"noise":    gen(2*1920+1, func(int) float64 { return float64(rng.IntN(65536) - 32768) }),
		"extremes": gen(1920, func(i int) float64 { return []float64{32767, -32768}[i/7%2] }),
		"step":     gen(1920*2, func(i int) float64 { return float64(i/960*1000 - 2000) }),
		"one":      gen(1, func(int) float64 { return 5 }),
	}
}

func pcmBytes(s []int16) []byte {
	b := make([]byte, 2*len(s))
	for i, v := range s {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
	}
	return b
}

// encodeStreamFLAC writes s as a whole stream (total and MD5 in STREAMINFO) or a streamed one (both
// unknown), fed in pieces of uneven sizes.
func encodeStreamFLAC(t *testing.T, s []int16, whole bool) []byte {
	t.Helper()
	e, err := NewFLACEncoder(24000, 1920)
	if err != nil {
		t.Fatal(err)
	}
	pcm := pcmBytes(s)
	var frames []byte
	for i, step := 0, 0; i < len(pcm); step++ {
		n := min(len(pcm)-i, 2*(1+step*517%3001))
		if frames, err = e.Append(frames, pcm[i:i+n]); err != nil {
			t.Fatal(err)
		}
		i += n
	}
	frames = e.Flush(frames)
	if e.Samples() != int64(len(s)) {
		t.Fatalf("Samples %d, want %d", e.Samples(), len(s))
	}
	var h []byte
	if whole {
		h, err = e.Header(e.Samples(), e.MD5())
	} else {
		h, err = e.Header(0, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return append(h, frames...)
}

// TestFLACEncoderRoundTrip: mewkiz/flac, which checks every frame's CRC-8 and CRC-16, decodes
// each stream to exactly the samples encoded, with the STREAMINFO given; the whole stream's MD5
// is the samples'; the encoding is smaller than the samples where they are predictable.
func TestFLACEncoderRoundTrip(t *testing.T) {
	for name, s := range flacSignals() {
		for _, whole := range []bool{true, false} {
			data := encodeStreamFLAC(t, s, whole)
			st, err := flac.New(bytes.NewReader(data))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			si := st.Info
			wantTotal := uint64(0)
			if whole {
				wantTotal = uint64(len(s))
			}
			if si.SampleRate != 24000 || si.NChannels != 1 || si.BitsPerSample != 16 || si.NSamples != wantTotal || si.BlockSizeMin != 1920 || si.BlockSizeMax != 1920 {
				t.Fatalf("%s: STREAMINFO %+v", name, si)
			}
			sum := md5.Sum(pcmBytes(s))
			if whole && !bytes.Equal(si.MD5sum[:], sum[:]) || !whole && si.MD5sum != [16]byte{} {
				t.Errorf("%s whole=%v: MD5 %x, samples' %x", name, whole, si.MD5sum, sum)
			}
			var got []int16
			for {
				fr, err := st.ParseNext()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("%s: frame after %d samples: %v", name, len(got), err)
				}
				for _, v := range fr.Subframes[0].Samples {
					got = append(got, int16(v))
				}
			}
			if len(got) != len(s) {
				t.Fatalf("%s: decoded %d samples, want %d", name, len(got), len(s))
			}
			for i := range s {
				if got[i] != s[i] {
					t.Fatalf("%s: sample %d is %d, want %d", name, i, got[i], s[i])
				}
			}
			if (name == "tone" || name == "silence") && len(data) > len(s) {
				t.Errorf("%s: %d bytes for %d samples", name, len(data), len(s))
			}
		}
	}
}

// TestFLACEncoderReferenceDecoder: the reference decoder (the flac command of libFLAC, when it
// is installed) tests each whole stream and decodes it to the samples encoded.
func TestFLACEncoderReferenceDecoder(t *testing.T) {
	bin, err := exec.LookPath("flac")
	if err != nil {
		t.Skip("the flac command is not installed")
	}
	dir := t.TempDir()
	for name, s := range flacSignals() {
		for _, whole := range []bool{true, false} {
			in := filepath.Join(dir, name+".flac")
			if err := os.WriteFile(in, encodeStreamFLAC(t, s, whole), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(bin, "-t", "-s", in).CombinedOutput(); err != nil {
				t.Errorf("%s whole=%v: flac -t: %v\n%s", name, whole, err, out)
				continue
			}
			raw := filepath.Join(dir, name+".raw")
			out, err := exec.Command(bin, "-d", "-s", "-f", "--force-raw-format", "--endian=little", "--sign=signed", "-o", raw, in).CombinedOutput()
			if err != nil {
				t.Errorf("%s: flac -d: %v\n%s", name, err, out)
				continue
			}
			got, err := os.ReadFile(raw)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, pcmBytes(s)) {
				t.Errorf("%s whole=%v: flac -d gives %d bytes unlike the %d encoded", name, whole, len(got), 2*len(s))
			}
		}
	}
}

// TestFLACEncoderDecode: Decode (the package's reader) reads an encoded stream as FLAC.
func TestFLACEncoderDecode(t *testing.T) {
	s := flacSignals()["tone"]
	got, info, err := Decode(encodeStreamFLAC(t, s, false))
	if err != nil {
		t.Fatal(err)
	}
	if info.Format != FormatFLAC || info.SampleRate != 24000 || info.Frames != int64(len(s)) || len(got) != len(s)*2/3 {
		t.Errorf("%+v, %d samples at 16 kHz", info, len(got))
	}
}

// TestFLACEncoderArguments: bad settings and odd byte counts are errors.
func TestFLACEncoderArguments(t *testing.T) {
	for _, c := range []struct{ rate, block int }{{0, 1920}, {1 << 20, 1920}, {24000, 15}, {24000, FLACBlockMax + 1}} {
		if _, err := NewFLACEncoder(c.rate, c.block); err == nil {
			t.Errorf("rate %d block %d: no error", c.rate, c.block)
		}
	}
	e, err := NewFLACEncoder(24000, 1920)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Append(nil, []byte{1, 2, 3}); err == nil {
		t.Error("3 bytes: no error")
	}
	if _, err := e.Header(-1, nil); err == nil {
		t.Error("negative total: no error")
	}
	if _, err := e.Header(0, []byte{1}); err == nil {
		t.Error("short MD5: no error")
	}
}

// TestFLACEncoderSteadyState: a block's frame allocates nothing once the output has room.
func TestFLACEncoderSteadyState(t *testing.T) {
	e, err := NewFLACEncoder(24000, 1920)
	if err != nil {
		t.Fatal(err)
	}
	pcm := pcmBytes(flacSignals()["speechy"][:1920])
	dst := make([]byte, 0, 1<<16)
	if n := testing.AllocsPerRun(20, func() { dst, _ = e.Append(dst[:0], pcm) }); n > 0 {
		t.Errorf("%v allocations a block", n)
	}
}
