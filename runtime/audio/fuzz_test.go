package audio

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// panicSite is the function that raised the panic recorded in stack (runtime frames skipped).
func panicSite(stack []byte) string {
	lines := strings.Split(string(stack), "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "panic(") {
			continue
		}
		for _, f := range lines[i+1:] {
			if f == "" || strings.HasPrefix(f, "\t") || strings.HasPrefix(f, "runtime.") {
				continue
			}
			return f
		}
	}
	return ""
}

// fuzzSeeds are small valid files of every format: WAV variants and FLAC always, MP3, Vorbis
// and Opus when their encoders are installed.
func fuzzSeeds(f testing.TB) [][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	var seeds [][]byte
	for _, s := range []wavSpec{
		{form: "RIFF", tag: wavePCM, channels: 1, rate: 16000, width: 2},
		{form: "RIFF", tag: wavePCM, channels: 2, rate: 44100, width: 3},
		{form: "RIFX", tag: waveFloat, channels: 1, rate: 8000, width: 4},
		{form: "RF64", tag: waveMuLaw, channels: 2, rate: 8000, width: 1},
		{form: "RIFF", tag: wavePCM, extensible: true, channels: 3, rate: 48000, width: 4, bits: 32, valid: 24},
	} {
		pay, _ := samplePayload(s, 50, rng)
		seeds = append(seeds, buildWAV(s, pay))
	}
	pay := toMono(testMusic(SampleRate, 600))
	seeds = append(seeds, encodeFLAC(f, pay, SampleRate, 1))
	dir := f.TempDir()
	in := filepath.Join(dir, "in.wav")
	if err := os.WriteFile(in, buildWAV(wavSpec{form: "RIFF", tag: wavePCM, channels: 1, rate: SampleRate, width: 2}, pay), 0o644); err != nil {
		f.Fatal(err)
	}
	for _, c := range [][]string{
		{"lame", "--quiet", "-b", "32", in, "OUT.mp3"},
		{"oggenc", "-Q", "-q", "0", "-o", "OUT.ogg", in},
		{"opusenc", "--quiet", "--bitrate", "16", in, "OUT.opus"},
	} {
		if _, err := exec.LookPath(c[0]); err != nil {
			f.Logf("%s not on PATH: no seed from it", c[0])
			continue
		}
		out := ""
		for i, a := range c {
			if strings.HasPrefix(a, "OUT") {
				out = filepath.Join(dir, a)
				c[i] = out
			}
		}
		if err := exec.Command(c[0], c[1:]...).Run(); err != nil {
			f.Fatalf("%s: %v", c[0], err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	return seeds
}

// FuzzDecode: any input decodes or fails with one of the package's errors; nothing panics in
// this package (a panic inside a third-party codec is reported as ErrCorrupt, which is what it
// means); output respects the duration limit and is finite.
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s, "")
	}
	f.Add([]byte("RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00"), "audio/wav")
	f.Add([]byte{0xff, 0xfb, 0x90, 0x64}, "audio/mpeg")
	panicHook = func(p any, stack []byte) {
		if site := panicSite(stack); strings.HasPrefix(site, "github.com/parleyhq/parley/") {
			panic(p) // ours: let the fuzzer report it
		}
	}
	defer func() { panicHook = nil }()
	const limit = 20 * time.Second
	f.Fuzz(func(t *testing.T, data []byte, ct string) {
		s, info, err := DecodeWith(data, Options{MaxDuration: limit, ContentType: ct})
		if err != nil {
			if !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTooLong) {
				t.Fatalf("error wraps no package error: %v", err)
			}
			return
		}
		if info.Duration > limit || len(s) > int(limit.Seconds())*SampleRate+1 {
			t.Fatalf("%d samples, %+v over the %v limit", len(s), info, limit)
		}
		for i, v := range s {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("sample %d is %v (%+v)", i, v, info)
			}
		}
	})
}

// FuzzDecoderStream: a Decoder read in blocks of any size fails where DecodeWith fails, with an
// error of the same kind, and otherwise reads exactly DecodeWith's samples.
func FuzzDecoderStream(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s, uint16(1000))
	}
	f.Add([]byte("RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00"), uint16(1))
	panicHook = func(p any, stack []byte) {
		if site := panicSite(stack); strings.HasPrefix(site, "github.com/parleyhq/parley/") {
			panic(p)
		}
	}
	defer func() { panicHook = nil }()
	opt := Options{MaxDuration: 20 * time.Second}
	kind := func(err error) error {
		for _, k := range []error{ErrUnsupported, ErrCorrupt, ErrTooLong} {
			if errors.Is(err, k) {
				return k
			}
		}
		return err
	}
	f.Fuzz(func(t *testing.T, data []byte, size uint16) {
		want, _, werr := DecodeWith(data, opt)
		d, err := NewDecoder(data, opt)
		var got []float32
		if err == nil {
			got, err = readStream(d, int(size%8192)+1, 1)
		}
		if kind(err) != kind(werr) {
			t.Fatalf("stream: %v; DecodeWith: %v", err, werr)
		}
		if err == nil && !slices.Equal(got, want) {
			t.Fatalf("stream: %d samples, DecodeWith %d, not equal", len(got), len(want))
		}
	})
}
