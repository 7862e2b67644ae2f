package audio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// wavSpec describes a WAVE file to build.
type wavSpec struct {
	form       string // "RIFF", "RIFX" or "RF64"
	tag        uint16 // format tag (the sub-format when extensible)
	extensible bool
	channels   int
	rate       int
	width      int // bytes per sample
	bits       int // wBitsPerSample; 0 means 8·width
	valid      int // valid bits (extensible); 0 means bits
}

type riffChunk struct {
	id   string
	body []byte
}

func (s wavSpec) order() binary.ByteOrder {
	if s.form == "RIFX" {
		return binary.BigEndian
	}
	return binary.LittleEndian
}

func (s wavSpec) fmtChunk() riffChunk {
	o := s.order()
	bits := s.bits
	if bits == 0 {
		bits = 8 * s.width
	}
	tag := s.tag
	if s.extensible {
		tag = waveExtensible
	}
	b := make([]byte, 16, 40)
	o.PutUint16(b[0:], tag)
	o.PutUint16(b[2:], uint16(s.channels))
	o.PutUint32(b[4:], uint32(s.rate))
	o.PutUint32(b[8:], uint32(s.rate*s.channels*s.width))
	o.PutUint16(b[12:], uint16(s.channels*s.width))
	o.PutUint16(b[14:], uint16(bits))
	if s.extensible {
		valid := s.valid
		if valid == 0 {
			valid = bits
		}
		b = b[:40]
		o.PutUint16(b[16:], 22)
		o.PutUint16(b[18:], uint16(valid))
		o.PutUint32(b[20:], 0)
		o.PutUint16(b[24:], s.tag)
		o.PutUint16(b[26:], 0)
		o.PutUint16(b[28:], 0)
		o.PutUint16(b[30:], 0x0010)
		copy(b[32:], "\x80\x00\x00\xaa\x00\x38\x9b\x71")
	}
	return riffChunk{"fmt ", b}
}

// buildRIFF writes the chunks after a form header; RF64 gets a ds64 chunk and 0xffffffff sizes.
func buildRIFF(form string, o binary.ByteOrder, chunks ...riffChunk) []byte {
	var b bytes.Buffer
	b.WriteString(form)
	b.Write(make([]byte, 4))
	b.WriteString("WAVE")
	rf64 := form == "RF64"
	if rf64 {
		ds := make([]byte, 28)
		for _, c := range chunks {
			if c.id == "data" {
				binary.LittleEndian.PutUint64(ds[8:], uint64(len(c.body)))
			}
		}
		chunks = append([]riffChunk{{"ds64", ds}}, chunks...)
	}
	for _, c := range chunks {
		b.WriteString(c.id)
		var sz [4]byte
		o.PutUint32(sz[:], uint32(len(c.body)))
		if rf64 && c.id == "data" {
			o.PutUint32(sz[:], 0xffffffff)
		}
		b.Write(sz[:])
		b.Write(c.body)
		if len(c.body)%2 == 1 {
			b.WriteByte(0)
		}
	}
	out := b.Bytes()
	size := uint32(len(out) - 8)
	if rf64 {
		size = 0xffffffff
	}
	o.PutUint32(out[4:], size)
	return out
}

func buildWAV(s wavSpec, payload []byte, extra ...riffChunk) []byte {
	return buildRIFF(s.form, s.order(), append(append([]riffChunk{s.fmtChunk()}, extra...), riffChunk{"data", payload})...)
}

// G.711 values from the ITU-T tables (16-bit scale): the extremes and the smallest steps. All
// 256 codes of both laws are compared with sox's expansion in TestToolFormats.
var g711Anchors = []struct {
	law  sampleKind
	code byte
	want int16
}{
	{kindMuLaw, 0xff, 0}, {kindMuLaw, 0x7f, 0}, {kindMuLaw, 0x80, 32124}, {kindMuLaw, 0x00, -32124},
	{kindALaw, 0xd5, 8}, {kindALaw, 0x55, -8}, {kindALaw, 0xaa, 32256}, {kindALaw, 0x2a, -32256},
}

func TestG711Anchors(t *testing.T) {
	for _, a := range g711Anchors {
		got := g711.ulaw[a.code]
		if a.law == kindALaw {
			got = g711.alaw[a.code]
		}
		if got != a.want {
			t.Errorf("law %d code %#02x: %d, want %d", a.law, a.code, got, a.want)
		}
	}
}

// samplePayload makes frames of seeded random samples for s (full-scale extremes first) and
// the mono float32 signal they must decode to: each sample's exact value, averaged over the
// channels in float64, rounded once.
func samplePayload(s wavSpec, frames int, rng *rand.Rand) ([]byte, []float32) {
	o := s.order()
	w := s.width
	payload := make([]byte, frames*s.channels*w)
	mono := make([]float32, frames)
	bits := s.bits
	if bits == 0 {
		bits = 8 * w
	}
	for i := 0; i < frames; i++ {
		sum := 0.0
		for c := 0; c < s.channels; c++ {
			b := payload[(i*s.channels+c)*w:][:w]
			var v float64
			switch s.tag {
			case wavePCM:
				// A random value of `bits` bits, left-justified in the container.
				lim := int64(1) << (bits - 1)
				x := rng.Int64N(2*lim) - lim
				if i == 0 {
					x = -lim
				} else if i == 1 {
					x = lim - 1
				}
				x <<= 8*w - bits
				v = float64(x) / math.Ldexp(1, 8*w-1)
				switch w {
				case 1:
					b[0] = byte(x + 128)
				case 2:
					o.PutUint16(b, uint16(x))
				case 3:
					if o == binary.BigEndian {
						b[0], b[1], b[2] = byte(x>>16), byte(x>>8), byte(x)
					} else {
						b[0], b[1], b[2] = byte(x), byte(x>>8), byte(x>>16)
					}
				case 4:
					o.PutUint32(b, uint32(x))
				}
			case waveFloat:
				v = rng.Float64()*3 - 1.5
				special := i == 2 && c == 0
				if w == 4 {
					f := float32(v)
					v = float64(f)
					if special {
						f, v = float32(math.NaN()), 0
					}
					o.PutUint32(b, math.Float32bits(f))
				} else {
					if special {
						v = math.Inf(-1)
					}
					o.PutUint64(b, math.Float64bits(v))
					if special {
						v = 0
					}
				}
			case waveALaw, waveMuLaw:
				b[0] = byte(rng.IntN(256))
				tab := g711.alaw
				if s.tag == waveMuLaw {
					tab = g711.ulaw
				}
				v = float64(tab[b[0]]) / 32768
			}
			sum += v
		}
		mono[i] = float32(sum / float64(s.channels))
	}
	return payload, mono
}

func codecName(s wavSpec) string {
	end := "le"
	if s.form == "RIFX" {
		end = "be"
	}
	switch s.tag {
	case waveFloat:
		return fmt.Sprintf("pcm_f%d%s", 8*s.width, end)
	case waveALaw:
		return "pcm_alaw"
	case waveMuLaw:
		return "pcm_mulaw"
	}
	if s.width == 1 {
		return "pcm_u8"
	}
	return fmt.Sprintf("pcm_s%d%s", 8*s.width, end)
}

// TestWAVFormats decodes generated files of every sample format, byte order, container
// variant, channel count and several rates, and compares with the exact expected samples: at
// 16 kHz bit for bit, at other rates after Resample of the expected 16 kHz-less signal (the
// decoder resamples in chunks, which Resample must match bit for bit).
func TestWAVFormats(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	type enc struct {
		tag        uint16
		width      int
		bits       int
		valid      int
		extensible bool
	}
	encs := []enc{
		{wavePCM, 1, 0, 0, false}, {wavePCM, 2, 0, 0, false}, {wavePCM, 3, 0, 0, false}, {wavePCM, 4, 0, 0, false},
		{waveFloat, 4, 0, 0, false}, {waveFloat, 8, 0, 0, false}, {waveALaw, 1, 0, 0, false}, {waveMuLaw, 1, 0, 0, false},
		{wavePCM, 2, 12, 0, false}, // 12 valid bits left-justified in 16
		{wavePCM, 2, 0, 0, true},   // WAVE_FORMAT_EXTENSIBLE, PCM
		{wavePCM, 4, 32, 24, true}, // 24 valid bits in 32
		{waveFloat, 4, 0, 0, true}, // extensible float
		{waveMuLaw, 1, 0, 0, true}, // extensible µ-law
	}
	n := 0
	for _, form := range []string{"RIFF", "RIFX", "RF64"} {
		for _, e := range encs {
			for _, ch := range []int{1, 2, 3} {
				for _, rate := range []int{8000, 16000, 22050, 44100, 48000} {
					if form != "RIFF" && (ch == 3 || rate == 22050) {
						continue
					}
					s := wavSpec{form: form, tag: e.tag, extensible: e.extensible, channels: ch, rate: rate, width: e.width, bits: e.bits, valid: e.valid}
					name := fmt.Sprintf("%s/%s/bits%d-%d/ext=%v/ch%d/%d", form, codecName(s), e.bits, e.valid, e.extensible, ch, rate)
					frames := rate/20 + 3
					payload, mono := samplePayload(s, frames, rng)
					file := buildWAV(s, payload, riffChunk{"LIST", []byte("INFOISFT\x05\x00\x00\x00test\x00")})
					got, info, err := Decode(file)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					want := mono
					if rate != SampleRate {
						if want, err = Resample(mono, rate); err != nil {
							t.Fatal(err)
						}
					}
					if len(got) != len(want) {
						t.Fatalf("%s: %d samples, want %d", name, len(got), len(want))
					}
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s: sample %d is %v, want %v", name, i, got[i], want[i])
						}
					}
					wantBits := e.bits
					if e.valid != 0 {
						wantBits = e.valid
					}
					if wantBits == 0 {
						wantBits = 8 * e.width
					}
					wantInfo := Info{Format: FormatWAV, Codec: codecName(s), SampleRate: rate, Channels: ch, BitsPerSample: wantBits,
						Frames: int64(frames), Duration: time.Duration(float64(frames) / float64(rate) * 1e9).Round(time.Nanosecond)}
					if d := info.Duration - wantInfo.Duration; d < -1 || d > 1 {
						t.Fatalf("%s: duration %v, want %v", name, info.Duration, wantInfo.Duration)
					}
					info.Duration = wantInfo.Duration
					if info != wantInfo {
						t.Fatalf("%s: info %+v, want %+v", name, info, wantInfo)
					}
					n++
				}
			}
		}
	}
	t.Logf("%d files", n)
}

// TestWAVLayouts: chunk order, padding, unknown chunks, streamed sizes and trailing bytes.
func TestWAVLayouts(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	s := wavSpec{form: "RIFF", tag: wavePCM, channels: 1, rate: SampleRate, width: 2}
	payload, mono := samplePayload(s, 1001, rng)
	le := binary.LittleEndian
	odd := riffChunk{"junk", []byte{1, 2, 3}} // odd size: one pad byte follows
	cases := map[string][]byte{
		"data before fmt": buildRIFF("RIFF", le, riffChunk{"data", payload}, s.fmtChunk()),
		"odd chunk first": buildRIFF("RIFF", le, odd, s.fmtChunk(), odd, riffChunk{"fact", []byte{0xe9, 3, 0, 0}}, riffChunk{"data", payload}),
		"chunks after data": buildRIFF("RIFF", le, s.fmtChunk(), riffChunk{"data", payload},
			riffChunk{"LIST", make([]byte, 30)}),
		"partial last frame": buildRIFF("RIFF", le, s.fmtChunk(), riffChunk{"data", append(append([]byte{}, payload...), 0x7f)}),
	}
	streamed := buildWAV(s, payload)
	le.PutUint32(streamed[len(streamed)-len(payload)-4:], 0xffffffff)
	cases["data size 0xffffffff"] = streamed
	zero := buildWAV(s, payload)
	le.PutUint32(zero[4:], 0)
	le.PutUint32(zero[len(zero)-len(payload)-4:], 0)
	cases["data and RIFF size 0"] = zero
	for name, file := range cases {
		got, _, err := Decode(file)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(got) != len(mono) {
			t.Errorf("%s: %d samples, want %d", name, len(got), len(mono))
			continue
		}
		for i := range mono {
			if got[i] != mono[i] {
				t.Errorf("%s: sample %d is %v, want %v", name, i, got[i], mono[i])
				break
			}
		}
	}
	// An empty data chunk followed by other chunks in a file with a proper RIFF size is empty.
	empty := buildRIFF("RIFF", le, s.fmtChunk(), riffChunk{"data", nil}, riffChunk{"LIST", make([]byte, 8)})
	if got, info, err := Decode(empty); err != nil || len(got) != 0 || info.Frames != 0 {
		t.Errorf("empty data chunk: %d samples, %+v, %v", len(got), info, err)
	}
}

func TestWAVErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	s := wavSpec{form: "RIFF", tag: wavePCM, channels: 2, rate: 44100, width: 2}
	payload, _ := samplePayload(s, 500, rng)
	le := binary.LittleEndian
	good := buildWAV(s, payload)
	with := func(f func(b []byte) []byte) []byte { return f(append([]byte{}, good...)) }
	fmtAt := 12 + 8 // fmt body
	withSpec := func(f func(*wavSpec)) []byte {
		c := s
		f(&c)
		return buildWAV(c, payload)
	}
	cases := []struct {
		name string
		file []byte
		want error
	}{
		{"short header", good[:11], ErrCorrupt},
		{"truncated data", good[:len(good)-10], ErrCorrupt},
		{"no fmt", buildRIFF("RIFF", le, riffChunk{"data", payload}), ErrCorrupt},
		{"no data", buildRIFF("RIFF", le, s.fmtChunk()), ErrCorrupt},
		{"short fmt", buildRIFF("RIFF", le, riffChunk{"fmt ", make([]byte, 14)}, riffChunk{"data", payload}), ErrCorrupt},
		{"fmt past end", with(func(b []byte) []byte { le.PutUint32(b[16:], 1<<30); return b }), ErrCorrupt},
		{"zero channels", withSpec(func(c *wavSpec) { c.channels = 0; c.width = 2 }), ErrCorrupt},
		{"block align", with(func(b []byte) []byte { le.PutUint16(b[fmtAt+12:], 3); return b }), ErrCorrupt},
		{"bits over container", with(func(b []byte) []byte { le.PutUint16(b[fmtAt+14:], 17); return b }), ErrCorrupt},
		{"ADPCM", withSpec(func(c *wavSpec) { c.tag = 2 }), ErrUnsupported},
		{"MP3 in WAV", withSpec(func(c *wavSpec) { c.tag = 0x55 }), ErrUnsupported},
		{"rate 500", withSpec(func(c *wavSpec) { c.rate = 500 }), ErrUnsupported},
		{"rate 2 MHz", withSpec(func(c *wavSpec) { c.rate = 2000000 }), ErrUnsupported},
		{"40-bit PCM", withSpec(func(c *wavSpec) { c.width = 5 }), ErrUnsupported},
		{"16-bit float", withSpec(func(c *wavSpec) { c.tag = waveFloat }), ErrUnsupported},
		{"16-bit µ-law", withSpec(func(c *wavSpec) { c.tag = waveMuLaw }), ErrUnsupported},
		{"extensible GUID", with(func(b []byte) []byte {
			c := s
			c.extensible = true
			b = buildWAV(c, payload)
			b[fmtAt+24+10] ^= 1
			return b
		}), ErrUnsupported},
		{"RF64 without ds64", with(func(b []byte) []byte {
			copy(b, "RF64")
			le.PutUint32(b[len(b)-len(payload)-4:], 0xffffffff)
			return b
		}), ErrCorrupt},
	}
	for _, c := range cases {
		_, _, err := Decode(c.file)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
}

// TestMaxDuration: the limit is checked against the header before decoding, and a negative
// limit is refused.
func TestMaxDuration(t *testing.T) {
	s := wavSpec{form: "RIFF", tag: wavePCM, channels: 1, rate: 8000, width: 1}
	file := buildWAV(s, make([]byte, 8001))
	if _, _, err := DecodeWith(file, Options{MaxDuration: time.Second}); !errors.Is(err, ErrTooLong) {
		t.Errorf("8001 samples at 8 kHz under a 1 s limit: %v", err)
	}
	got, _, err := DecodeWith(buildWAV(s, make([]byte, 8000)), Options{MaxDuration: time.Second})
	if err != nil || len(got) != SampleRate {
		t.Errorf("8000 samples under a 1 s limit: %d samples, %v", len(got), err)
	}
	if _, _, err := DecodeWith(file, Options{MaxDuration: -1}); err == nil {
		t.Error("negative limit accepted")
	}
}

// TestFloat64Overflow: a double sample beyond float32's range (legal in a WAV of doubles) is held
// at the range's end; it must not become ±Inf, which the resampler would spread and the model
// could not take.
func TestFloat64Overflow(t *testing.T) {
	s := wavSpec{form: "RIFF", tag: waveFloat, channels: 1, rate: 44100, width: 8}
	pay := make([]byte, 8*44100)
	binary.LittleEndian.PutUint64(pay[8*1000:], math.Float64bits(1e39))
	binary.LittleEndian.PutUint64(pay[8*2000:], math.Float64bits(-1e300))
	samples, _, err := Decode(buildWAV(s, pay))
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range samples {
		if math.IsInf(float64(v), 0) || math.IsNaN(float64(v)) {
			t.Fatalf("sample %d is %v", i, v)
		}
	}
}
