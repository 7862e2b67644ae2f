package audio

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/mewkiz/flac"
	"github.com/mewkiz/flac/frame"
	"github.com/mewkiz/flac/meta"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestSharedWAVs decodes every recording listed in data/asr/manifest.jsonl (16 kHz mono PCM16):
// sample counts match the listed durations (rounded to the millisecond there) and every sample is a multiple of 2⁻¹⁵ in [-1, 1).
func TestSharedWAVs(t *testing.T) {
	dir := sharedtest.Path(t, "data/asr")
	f, err := os.Open(filepath.Join(dir, "manifest.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	var total time.Duration
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e struct {
			ID       string  `json:"id"`
			File     string  `json:"file"`
			Duration float64 `json:"duration"`
			SHA256   string  `json:"sha256"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, e.File))
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != e.SHA256 {
			t.Fatalf("%s: sha256 differs from the manifest", e.ID)
		}
		s, info, err := Decode(b)
		if err != nil {
			t.Fatalf("%s: %v", e.ID, err)
		}
		if info.Format != FormatWAV || info.Codec != "pcm_s16le" || info.SampleRate != SampleRate || info.Channels != 1 {
			t.Errorf("%s: %+v", e.ID, info)
		}
		// The manifest rounds durations to the millisecond.
		if d := float64(len(s))/SampleRate - e.Duration; math.Abs(d) > 0.0005+1.0/SampleRate || info.Frames != int64(len(s)) {
			t.Errorf("%s: %d samples (%d frames), manifest says %g s", e.ID, len(s), info.Frames, e.Duration)
		}
		for i, v := range s {
			if x := float64(v) * 32768; x != math.Trunc(x) || x < -32768 || x > 32767 {
				t.Fatalf("%s: sample %d = %v is not s16·2⁻¹⁵", e.ID, i, v)
			}
		}
		total += info.Duration
		n++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 55 {
		t.Errorf("%d recordings, want 55", n)
	}
	t.Logf("%d recordings, %v", n, total)
}

// testMusic is a deterministic stereo test signal at rate: a chirp and a tone on the left, an
// amplitude-modulated tone on the right, at 16-bit resolution.
func testMusic(rate, frames int) []byte {
	pay := make([]byte, frames*4)
	for i := 0; i < frames; i++ {
		tm := float64(i) / float64(rate)
		l := 0.3*math.Sin(2*math.Pi*(200*tm+300*tm*tm)) + 0.2*math.Sin(2*math.Pi*1234*tm)
		r := 0.3 * math.Sin(2*math.Pi*300*tm) * math.Sin(2*math.Pi*2*tm)
		binary.LittleEndian.PutUint16(pay[4*i:], uint16(int16(math.Round(l*32767))))
		binary.LittleEndian.PutUint16(pay[4*i+2:], uint16(int16(math.Round(r*32767))))
	}
	return pay
}

// toMono keeps channel 0 of 16-bit stereo frames.
func toMono(pay []byte) []byte {
	out := make([]byte, len(pay)/2)
	for i := 0; i < len(out)/2; i++ {
		copy(out[2*i:], pay[4*i:4*i+2])
	}
	return out
}

// snrDB is the signal-to-noise ratio of got against ref in dB.
func snrDB(ref, got []float32) float64 {
	var s, e float64
	for i := range ref {
		d := float64(got[i]) - float64(ref[i])
		s += float64(ref[i]) * float64(ref[i])
		e += d * d
	}
	return 10 * math.Log10(s/e)
}

// encodeFLAC writes 16-bit interleaved frames as FLAC with github.com/mewkiz/flac's encoder.
func encodeFLAC(t testing.TB, pay []byte, rate, channels int) []byte {
	t.Helper()
	n := len(pay) / (2 * channels)
	var buf bytes.Buffer
	info := &meta.StreamInfo{BlockSizeMin: 16, BlockSizeMax: 4096, SampleRate: uint32(rate),
		NChannels: uint8(channels), BitsPerSample: 16, NSamples: uint64(n)}
	enc, err := flac.NewEncoder(&buf, info)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < n; off += 4096 {
		bs := min(4096, n-off)
		fr := &frame.Frame{Header: frame.Header{HasFixedBlockSize: true, BlockSize: uint16(bs), SampleRate: uint32(rate),
			Channels: frame.Channels(channels - 1), BitsPerSample: 16}}
		for c := 0; c < channels; c++ {
			s := make([]int32, bs)
			for i := range s {
				s[i] = int32(int16(binary.LittleEndian.Uint16(pay[2*((off+i)*channels+c):])))
			}
			fr.Subframes = append(fr.Subframes, &frame.Subframe{SubHeader: frame.SubHeader{Pred: frame.PredVerbatim}, Samples: s, NSamples: bs})
		}
		if err := enc.WriteFrame(fr); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestFLACInProcess: FLAC written in the test decodes to exactly what the same PCM in a WAV
// decodes to (lossless), for mono and stereo, at 16 and 44.1 kHz.
func TestFLACInProcess(t *testing.T) {
	for _, c := range []struct{ rate, ch int }{{16000, 1}, {44100, 2}, {22050, 3}} {
		pay := testMusic(c.rate, c.rate/2+5)
		if c.ch == 1 {
			pay = toMono(pay)
		}
		if c.ch == 3 {
			pay = append(pay, pay[:len(pay)/2]...) // 3·n·2 bytes
		}
		wav := buildWAV(wavSpec{form: "RIFF", tag: wavePCM, channels: c.ch, rate: c.rate, width: 2}, pay)
		want, _, err := Decode(wav)
		if err != nil {
			t.Fatal(err)
		}
		got, info, err := Decode(encodeFLAC(t, pay, c.rate, c.ch))
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if info.Format != FormatFLAC || info.SampleRate != c.rate || info.Channels != c.ch || info.BitsPerSample != 16 {
			t.Errorf("%+v: info %+v", c, info)
		}
		if len(got) != len(want) {
			t.Fatalf("%+v: %d samples, want %d", c, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%+v: sample %d is %v, want %v", c, i, got[i], want[i])
			}
		}
	}
}

// tool runs a command-line encoder, skipping the test when it is not installed.
func tool(t *testing.T, name string, args ...string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s is not on PATH (Debian: apt-get install flac lame vorbis-tools opus-tools sox); this format is covered only with it", name)
	}
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// TestToolFormats encodes test WAVs with the reference command-line encoders and decodes the
// results. FLAC must match the WAV bit for bit. Lossy codecs must produce exactly as many
// samples as the WAV (encoder delay and padding trimmed: the LAME info frame for MP3, granule
// positions for Vorbis, pre-skip and granule positions for Opus), aligned with it: SNR at lag
// 0 of at least 20 dB for MP3 at 128 kbit/s and 25 dB for Vorbis q5 and Opus 64 kbit/s (the
// signal measures 26, 30 and 38 dB; a one-sample shift drops them below 10 dB).
func TestToolFormats(t *testing.T) {
	dir := t.TempDir()
	type enc struct {
		name, ext string
		args      func(in, out string) []string
		minSNR    float64 // 0: lossless
	}
	encs := []enc{
		{"flac", "flac", func(in, out string) []string { return []string{"-s", "-f", "-o", out, in} }, 0},
		{"lame", "mp3", func(in, out string) []string { return []string{"--quiet", "-b", "128", in, out} }, 20},
		{"oggenc", "ogg", func(in, out string) []string { return []string{"-Q", "-q", "5", "-o", out, in} }, 25},
		{"opusenc", "opus", func(in, out string) []string { return []string{"--quiet", "--bitrate", "64", in, out} }, 25},
	}
	for _, c := range []struct{ rate, ch int }{{44100, 2}, {16000, 1}, {48000, 2}, {22050, 1}} {
		pay := testMusic(c.rate, 2*c.rate+77)
		if c.ch == 1 {
			pay = toMono(pay)
		}
		wav := buildWAV(wavSpec{form: "RIFF", tag: wavePCM, channels: c.ch, rate: c.rate, width: 2}, pay)
		in := filepath.Join(dir, fmt.Sprintf("in-%d-%d.wav", c.rate, c.ch))
		if err := os.WriteFile(in, wav, 0o644); err != nil {
			t.Fatal(err)
		}
		ref, _, err := Decode(wav)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range encs {
			t.Run(fmt.Sprintf("%s/%d/ch%d", e.ext, c.rate, c.ch), func(t *testing.T) {
				out := filepath.Join(dir, fmt.Sprintf("out-%d-%d.%s", c.rate, c.ch, e.ext))
				tool(t, e.name, e.args(in, out)...)
				b, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				got, info, err := Decode(b)
				if err != nil {
					t.Fatal(err)
				}
				if info.Channels != c.ch || info.Frames == 0 {
					t.Errorf("info %+v", info)
				}
				if len(got) != len(ref) {
					t.Fatalf("%d samples, the WAV gives %d", len(got), len(ref))
				}
				snr := snrDB(ref, got)
				t.Logf("%+v: SNR %.1f dB", info, snr)
				if e.minSNR == 0 && !math.IsInf(snr, 1) {
					t.Errorf("lossless decode differs (SNR %.1f dB)", snr)
				}
				if snr < e.minSNR {
					t.Errorf("SNR %.1f dB < %.0f dB", snr, e.minSNR)
				}
				// At other output rates (24 kHz, which Opus decodes to directly, and 44.1 kHz,
				// which it does not: it is resampled from 48 kHz), the same holds against the WAV
				// decoded at that rate.
				for _, rate := range []int{24000, 44100} {
					ref, _, err := DecodeWith(wav, Options{SampleRate: rate})
					if err != nil {
						t.Fatal(err)
					}
					got, _, err := DecodeWith(b, Options{SampleRate: rate})
					if err != nil {
						t.Fatal(err)
					}
					// Opus codes everything at 48 kHz: a length that is not whole there is
					// rounded, which may leave one sample more at 44.1 kHz.
					if d := len(got) - len(ref); d != 0 && (e.ext != "opus" || d != 1 || rate == 24000) {
						t.Fatalf("at %d Hz: %d samples, the WAV gives %d", rate, len(got), len(ref))
					}
					got = got[:len(ref)]
					if snr := snrDB(ref, got); snr < e.minSNR || e.minSNR == 0 && !math.IsInf(snr, 1) {
						t.Errorf("at %d Hz: SNR %.1f dB, want %.0f", rate, snr, e.minSNR)
					}
				}
			})
		}
	}

	t.Run("mp3/no-info-frame", func(t *testing.T) {
		// Without the LAME info frame nothing says how much delay to trim: the output is longer
		// by the encoder and decoder delays (576 + 529 samples at 44.1 kHz, 401 at 16 kHz) and
		// the padding of the last frame, shifted by the same delay.
		in := filepath.Join(dir, "in-44100-2.wav")
		out := filepath.Join(dir, "notag.mp3")
		tool(t, "lame", "--quiet", "-t", "-b", "128", in, out)
		b, _ := os.ReadFile(out)
		got, _, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		ref, _, _ := Decode(mustRead(t, in))
		const lag = 401
		if len(got) < len(ref)+lag {
			t.Fatalf("%d samples, want at least %d", len(got), len(ref)+lag)
		}
		if snr := snrDB(ref, got[lag:]); snr < 20 {
			t.Errorf("SNR %.1f dB at the expected delay", snr)
		}
	})

	t.Run("mp3/8kHz", func(t *testing.T) {
		// lame writes MPEG-2.5 for 8 kHz, which go-mp3 does not decode.
		in := filepath.Join(dir, "in-8000.wav")
		os.WriteFile(in, buildWAV(wavSpec{form: "RIFF", tag: wavePCM, channels: 1, rate: 8000, width: 2}, toMono(testMusic(8000, 8000))), 0o644)
		out := filepath.Join(dir, "8k.mp3")
		tool(t, "lame", "--quiet", in, out)
		if _, _, err := Decode(mustRead(t, out)); !errors.Is(err, ErrUnsupported) {
			t.Errorf("MPEG-2.5: %v", err)
		} else {
			t.Log(err)
		}
	})

	t.Run("sox/g711", func(t *testing.T) {
		// Every A-law and µ-law code, expanded by sox to 16-bit PCM, must equal this package's
		// expansion.
		for _, tag := range []uint16{waveALaw, waveMuLaw} {
			codes := make([]byte, 512)
			for i := range codes {
				codes[i] = byte(i)
			}
			in := filepath.Join(dir, fmt.Sprintf("g711-%d.wav", tag))
			os.WriteFile(in, buildWAV(wavSpec{form: "RIFF", tag: tag, channels: 1, rate: SampleRate, width: 1}, codes), 0o644)
			out := filepath.Join(dir, fmt.Sprintf("g711-%d-s16.wav", tag))
			tool(t, "sox", in, "-e", "signed-integer", "-b", "16", out)
			want, _, err := Decode(mustRead(t, out))
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := Decode(mustRead(t, in))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("tag %d: %d samples, sox %d", tag, len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("tag %d code %#02x: %v, sox %v", tag, i%256, got[i]*32768, want[i]*32768)
				}
			}
		}
	})

	t.Run("sox/wav-variants", func(t *testing.T) {
		// sox writes WAVE_FORMAT_EXTENSIBLE for more than 16 bits or 2 channels; 16-bit values
		// convert to 24/32-bit integers and floats exactly.
		in := filepath.Join(dir, "in-44100-2.wav")
		ref, _, _ := Decode(mustRead(t, in))
		for _, args := range [][]string{
			{"-e", "signed-integer", "-b", "24"}, {"-e", "signed-integer", "-b", "32"},
			{"-e", "floating-point", "-b", "32"}, {"-e", "floating-point", "-b", "64"},
			{"-e", "unsigned-integer", "-b", "8"},
		} {
			out := filepath.Join(dir, "variant.wav")
			tool(t, "sox", append(append([]string{in}, args...), out)...)
			got, info, err := Decode(mustRead(t, out))
			if err != nil {
				t.Fatalf("%v: %v", args, err)
			}
			snr := snrDB(ref, got)
			t.Logf("%v: %+v, SNR %.1f dB", args, info, snr)
			if args[3] != "8" && !math.IsInf(snr, 1) {
				t.Errorf("%v: differs from the 16-bit source (SNR %.1f dB)", args, snr)
			}
			if args[3] == "8" && snr < 35 {
				t.Errorf("%v: SNR %.1f dB", args, snr)
			}
		}
	})
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSniff: formats this package does not decode are ErrUnsupported with a name; junk is
// ErrUnsupported unless a supported type was declared, which makes it ErrCorrupt. MP3 audio,
// known by a layer III frame header (after an ID3 tag or not), whose frames do not follow one
// another is ErrCorrupt.
func TestSniff(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	junk := make([]byte, 300)
	for i := range junk {
		junk[i] = byte(rng.IntN(256))
	}
	junk[0] = 0x42
	// MPEG-1 layer II, 128 kbit/s, 44.1 kHz: 417-byte frames.
	layer2 := make([]byte, 2000)
	for off := 0; off+4 <= len(layer2); off += 417 {
		copy(layer2[off:], []byte{0xff, 0xfd, 0x90, 0x00})
	}
	id3 := append([]byte("ID3\x04\x00\x00\x00\x00\x00\x05hello"), junk...)
	// An MPEG-1 layer III header (128 kbit/s, 44.1 kHz: a 417-byte frame) followed by noise in
	// which no second frame begins, but a would-be ADTS header and a layer II one do.
	mp3Noise := append([]byte{0xff, 0xfb, 0x90, 0x64}, make([]byte, 4000)...)
	for i := 4; i < len(mp3Noise); i++ {
		mp3Noise[i] = byte(rng.IntN(255)) // never 0xff: no header by chance
	}
	copy(mp3Noise[1000:], []byte{0xff, 0xf1, 0x50, 0x80})
	copy(mp3Noise[2000:], []byte{0xff, 0xfd, 0x90, 0x00})
	tag := []byte("ID3\x03\x00\x00\x00\x00\x00\x00")
	ogg := func(packet string) []byte {
		b := append([]byte("OggS\x00\x02"), make([]byte, 20)...)
		b = append(b, 1, byte(len(packet)))
		return append(b, packet...)
	}
	cases := []struct {
		name, ct string
		data     []byte
		want     error
	}{
		{"empty", "", nil, ErrCorrupt},
		{"junk", "", junk, ErrUnsupported},
		{"junk declared wav", "audio/wav", junk, ErrCorrupt},
		{"junk declared aac", "audio/aac", junk, ErrUnsupported},
		{"text", "", []byte("hello, world: this is not audio"), ErrUnsupported},
		{"AIFF", "", []byte("FORM\x00\x00\x10\x00AIFFCOMM"), ErrUnsupported},
		{"M4A", "", []byte("\x00\x00\x00\x20ftypM4A \x00\x00\x00\x00"), ErrUnsupported},
		{"WebM", "", []byte("\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01"), ErrUnsupported},
		{"ADTS AAC", "", []byte{0xff, 0xf1, 0x50, 0x80, 0x02, 0x1f, 0xfc}, ErrUnsupported},
		{"MP2", "", layer2, ErrUnsupported},
		{"ID3 then junk", "", id3, ErrUnsupported},
		{"MP3 frame then noise", "", mp3Noise, ErrCorrupt},
		{"ID3, MP3 frame then noise", "", append(tag, mp3Noise...), ErrCorrupt},
		{"ID3, junk, MP3 frame then noise", "", append(append(tag, junk...), mp3Noise...), ErrCorrupt},
		{"ID3 then an MP3 frame cut short", "", append(tag, mp3Noise[:300]...), ErrCorrupt},
		{"Ogg Speex", "", ogg("Speex   1.2"), ErrUnsupported},
		{"Ogg FLAC", "", ogg("\x7fFLAC\x01\x00"), ErrUnsupported},
		{"RIFF AVI", "", []byte("RIFF\x00\x00\x00\x00AVI LIST"), ErrUnsupported},
		{"truncated RIFF", "", []byte("RIFF\x00\x00"), ErrCorrupt},
		{"truncated FLAC", "", []byte("fLaC\x00\x00\x00\x22\x10"), ErrCorrupt},
		{"truncated Ogg Vorbis", "", ogg("\x01vorbis\x00"), ErrCorrupt},
		{"truncated Ogg Opus", "", ogg("OpusHead\x01\x01"), ErrCorrupt},
	}
	for _, c := range cases {
		_, _, err := DecodeWith(c.data, Options{ContentType: c.ct})
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
}

// TestID3Tagged: an ID3v2 tag in front of a WAV-less stream is skipped before sniffing; here a
// FLAC stream behind a tag.
func TestID3Tagged(t *testing.T) {
	pay := toMono(testMusic(SampleRate, 4000))
	f := encodeFLAC(t, pay, SampleRate, 1)
	tag := append([]byte("ID3\x03\x00\x00\x00\x00\x00\x0a"), make([]byte, 10)...)
	got, info, err := Decode(append(tag, f...))
	if err != nil || info.Format != FormatFLAC || len(got) != 4000 {
		t.Fatalf("%d samples, %+v, %v", len(got), info, err)
	}
}

// TestDecodeTooLong: every decoder stops at the duration limit.
func TestDecodeTooLong(t *testing.T) {
	pay := toMono(testMusic(SampleRate, 3*SampleRate))
	f := encodeFLAC(t, pay, SampleRate, 1)
	if _, _, err := DecodeWith(f, Options{MaxDuration: 2 * time.Second}); !errors.Is(err, ErrTooLong) {
		t.Errorf("flac: %v", err)
	}
	if _, _, err := DecodeWith(f, Options{MaxDuration: 3 * time.Second}); err != nil {
		t.Errorf("flac at the limit: %v", err)
	}
}

func TestPCM16ToFloat(t *testing.T) {
	b := []byte{0x00, 0x80, 0xff, 0x7f, 0x01, 0x00, 0xff, 0xff, 0x33}
	dst := make([]float32, 8)
	n := PCM16ToFloat(dst, b)
	want := []float32{-1, 32767.0 / 32768, 1.0 / 32768, -1.0 / 32768}
	if n != len(want) {
		t.Fatalf("%d samples, want %d", n, len(want))
	}
	for i, w := range want {
		if dst[i] != w {
			t.Errorf("sample %d: %v, want %v", i, dst[i], w)
		}
	}
	if n := PCM16ToFloat(dst[:2], b); n != 2 {
		t.Errorf("short dst: %d", n)
	}
}
