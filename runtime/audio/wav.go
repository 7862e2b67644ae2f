package audio

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// WAVE format tags (mmreg.h).
const (
	wavePCM        = 0x0001
	waveFloat      = 0x0003
	waveALaw       = 0x0006
	waveMuLaw      = 0x0007
	waveExtensible = 0xfffe
)

var waveTagNames = map[uint16]string{
	0x0002: "Microsoft ADPCM",
	0x0011: "IMA ADPCM",
	0x0031: "GSM 6.10",
	0x0050: "MPEG layer I/II",
	0x0055: "MPEG layer III",
	0x00ff: "AAC",
	0x1610: "AAC (ADTS)",
	0xf1ac: "FLAC",
}

// sampleKind is how one stored sample maps to a number.
type sampleKind int

const (
	kindInt   sampleKind = iota // two's complement, unsigned when one byte
	kindFloat                   // IEEE 754
	kindALaw                    // G.711 A-law
	kindMuLaw                   // G.711 µ-law
)

// pcmLayout describes interleaved frames of fixed-size samples.
type pcmLayout struct {
	kind     sampleKind
	width    int // bytes per sample (container)
	be       bool
	channels int
}

// frameBytes is the size of one frame (one sample per channel).
func (p pcmLayout) frameBytes() int { return p.width * p.channels }

// openWAV reads RIFF (little-endian), RIFX (big-endian) and RF64/BW64 (64-bit sizes) WAVE
// files. Chunks may come in any order; unknown chunks are skipped. A data chunk whose size is
// 0xffffffff, or 0 in a file whose RIFF size is unset too (a writer that could not seek back),
// runs to the end of the input.
func openWAV(data []byte) (opened, error) {
	if len(data) < 12 {
		return opened{}, fmt.Errorf("audio: wav: %d-byte header: %w", len(data), ErrCorrupt)
	}
	var order binary.ByteOrder = binary.LittleEndian
	form := string(data[:4])
	if form == "RIFX" {
		order = binary.BigEndian
	}
	rf64 := form == "RF64" || form == "BW64"
	riffSize := order.Uint32(data[4:8])
	var fmtBody, body []byte
	var ds64Data uint64
	haveDS64 := false
	for off := 12; off+8 <= len(data); {
		id := string(data[off : off+4])
		size := uint64(order.Uint32(data[off+4 : off+8]))
		off += 8
		rest := uint64(len(data) - off)
		switch {
		case rf64 && id == "ds64":
			if size < 28 || size > rest {
				return opened{}, fmt.Errorf("audio: wav: ds64 chunk of %d bytes, %d present: %w", size, rest, ErrCorrupt)
			}
			ds64Data = binary.LittleEndian.Uint64(data[off+8 : off+16])
			haveDS64 = true
		case id == "data" && body == nil:
			switch {
			case rf64 && size == 0xffffffff:
				if !haveDS64 {
					return opened{}, fmt.Errorf("audio: wav: %s data size deferred to a missing ds64 chunk: %w", form, ErrCorrupt)
				}
				size = ds64Data
			case size == 0xffffffff, size == 0 && rest > 0 && (riffSize == 0 || riffSize == 0xffffffff):
				size = rest
			}
			if size > rest {
				return opened{}, fmt.Errorf("audio: wav: data chunk declares %d bytes, %d present: %w", size, rest, ErrCorrupt)
			}
			body = data[off : off+int(size)]
		case id == "fmt " && fmtBody == nil:
			if size > rest {
				return opened{}, fmt.Errorf("audio: wav: fmt chunk declares %d bytes, %d present: %w", size, rest, ErrCorrupt)
			}
			fmtBody = data[off : off+int(size)]
		}
		if fmtBody != nil && body != nil {
			break
		}
		if size > rest {
			return opened{}, fmt.Errorf("audio: wav: %q chunk declares %d bytes, %d present: %w", id, size, rest, ErrCorrupt)
		}
		off += int(size + size&1)
	}
	if fmtBody == nil {
		return opened{}, fmt.Errorf("audio: wav: no fmt chunk: %w", ErrCorrupt)
	}
	if body == nil {
		return opened{}, fmt.Errorf("audio: wav: no data chunk: %w", ErrCorrupt)
	}
	layout, rate, bits, err := parseWaveFormat(fmtBody, order)
	if err != nil {
		return opened{}, err
	}
	fb := layout.frameBytes()
	frames := len(body) / fb // a partial last frame is dropped
	// A block resamples to at most 2¹⁶ samples (fewer input frames at rates under 16 kHz).
	chunk := max(1, min(1<<16, (1<<16)*rate/SampleRate))
	return opened{
		info:     Info{Channels: layout.channels, BitsPerSample: bits, Codec: layout.codec()},
		rate:     rate,
		declared: int64(frames), confirmed: true,
		src: &pcmBlocks{layout: layout, body: body[:frames*fb], mono: make([]float32, min(frames, chunk))},
	}, nil
}

// pcmBlocks reads a WAV's data chunk in blocks of len(mono) frames.
type pcmBlocks struct {
	layout pcmLayout
	body   []byte // whole frames not yet read
	mono   []float32
}

func (p *pcmBlocks) next() ([]float32, error) {
	fb := p.layout.frameBytes()
	n := min(len(p.mono), len(p.body)/fb)
	if n == 0 {
		return nil, io.EOF
	}
	p.layout.mix(p.mono[:n], p.body[:n*fb])
	p.body = p.body[n*fb:]
	if len(p.body) == 0 {
		return p.mono[:n], io.EOF
	}
	return p.mono[:n], nil
}

// parseWaveFormat reads a fmt chunk: WAVEFORMAT(EX) or WAVEFORMATEXTENSIBLE.
func parseWaveFormat(b []byte, order binary.ByteOrder) (pcmLayout, int, int, error) {
	if len(b) < 16 {
		return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: fmt chunk of %d bytes: %w", len(b), ErrCorrupt)
	}
	tag := order.Uint16(b[0:2])
	channels := int(order.Uint16(b[2:4]))
	rate := order.Uint32(b[4:8])
	blockAlign := int(order.Uint16(b[12:14]))
	bits := int(order.Uint16(b[14:16]))
	valid := bits
	if tag == waveExtensible {
		if len(b) < 40 || order.Uint16(b[16:18]) < 22 {
			return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: WAVE_FORMAT_EXTENSIBLE with a %d-byte fmt chunk: %w", len(b), ErrCorrupt)
		}
		valid = int(order.Uint16(b[18:20]))
		g := b[24:40]
		if order.Uint16(g[2:4]) != 0 || order.Uint16(g[4:6]) != 0 || order.Uint16(g[6:8]) != 0x0010 ||
			string(g[8:16]) != "\x80\x00\x00\xaa\x00\x38\x9b\x71" {
			return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: extensible sub-format % x: %w", g, ErrUnsupported)
		}
		tag = order.Uint16(g[0:2])
		if valid == 0 {
			valid = bits
		}
	}
	if channels == 0 {
		return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: zero channels: %w", ErrCorrupt)
	}
	if rate < MinRate || rate > MaxRate {
		return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: sample rate %d Hz outside [%d, %d]: %w", rate, MinRate, MaxRate, ErrUnsupported)
	}
	if blockAlign == 0 || blockAlign%channels != 0 {
		return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: block align %d for %d channels: %w", blockAlign, channels, ErrCorrupt)
	}
	l := pcmLayout{width: blockAlign / channels, channels: channels, be: order == binary.BigEndian}
	if bits == 0 || bits > 8*l.width || valid > bits {
		return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: %d bits (%d valid) in %d-byte samples: %w", bits, valid, l.width, ErrCorrupt)
	}
	switch tag {
	case wavePCM:
		if l.width > 4 {
			return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: %d-byte integer samples: %w", l.width, ErrUnsupported)
		}
		l.kind = kindInt
	case waveFloat:
		if l.width != 4 && l.width != 8 {
			return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: %d-byte float samples: %w", l.width, ErrUnsupported)
		}
		l.kind = kindFloat
		valid = 8 * l.width
	case waveALaw, waveMuLaw:
		if l.width != 1 {
			return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: G.711 in %d-byte samples: %w", l.width, ErrUnsupported)
		}
		l.kind = kindALaw
		if tag == waveMuLaw {
			l.kind = kindMuLaw
		}
	default:
		name := waveTagNames[tag]
		if name == "" {
			name = "unknown"
		}
		return pcmLayout{}, 0, 0, fmt.Errorf("audio: wav: format tag 0x%04x (%s): %w", tag, name, ErrUnsupported)
	}
	return l, int(rate), valid, nil
}

func (p pcmLayout) codec() string {
	end := "le"
	if p.be {
		end = "be"
	}
	switch p.kind {
	case kindFloat:
		return fmt.Sprintf("pcm_f%d%s", 8*p.width, end)
	case kindALaw:
		return "pcm_alaw"
	case kindMuLaw:
		return "pcm_mulaw"
	}
	if p.width == 1 {
		return "pcm_u8"
	}
	return fmt.Sprintf("pcm_s%d%s", 8*p.width, end)
}

// mix converts len(dst) interleaved frames from src to mono: integer samples are scaled by
// 2^-(8·width-1) (so 16-bit s maps to s·2⁻¹⁵ exactly), A-law and µ-law expand to 16-bit values
// first, and channels are averaged in float64 before one rounding to float32. Non-finite float
// samples count as zero.
func (p pcmLayout) mix(dst []float32, src []byte) {
	ch := p.channels
	fch := float64(ch)
	if p.kind == kindInt && p.width == 2 && !p.be && ch == 1 {
		PCM16ToFloat(dst, src)
		return
	}
	w := p.width
	switch p.kind {
	case kindInt:
		scale := math.Ldexp(1, -(8*w - 1))
		get := intReader(w, p.be)
		for i := range dst {
			f := src[i*w*ch : (i+1)*w*ch]
			var sum int64
			for c := 0; c < ch; c++ {
				sum += get(f[c*w:])
			}
			dst[i] = float32(float64(sum) * scale / fch)
		}
	case kindFloat:
		for i := range dst {
			f := src[i*w*ch : (i+1)*w*ch]
			sum := 0.0
			for c := 0; c < ch; c++ {
				var v float64
				if w == 4 {
					u := binary.LittleEndian.Uint32(f[c*4:])
					if p.be {
						u = binary.BigEndian.Uint32(f[c*4:])
					}
					v = float64(math.Float32frombits(u))
				} else {
					u := binary.LittleEndian.Uint64(f[c*8:])
					if p.be {
						u = binary.BigEndian.Uint64(f[c*8:])
					}
					v = math.Float64frombits(u)
				}
				if math.IsNaN(v) || math.IsInf(v, 0) {
					v = 0
				}
				sum += v
			}
			// A double beyond float32's range would become ±Inf: it is held at the range's end.
			dst[i] = float32(max(-math.MaxFloat32, min(math.MaxFloat32, sum/fch)))
		}
	case kindALaw, kindMuLaw:
		tab := &g711.alaw
		if p.kind == kindMuLaw {
			tab = &g711.ulaw
		}
		for i := range dst {
			var sum int64
			for _, b := range src[i*ch : (i+1)*ch] {
				sum += int64(tab[b])
			}
			dst[i] = float32(float64(sum) * (1.0 / 32768) / fch)
		}
	}
}

// intReader returns a reader of one w-byte two's-complement sample (unsigned with offset 128
// when w is 1).
func intReader(w int, be bool) func([]byte) int64 {
	switch {
	case w == 1:
		return func(b []byte) int64 { return int64(b[0]) - 128 }
	case w == 2 && !be:
		return func(b []byte) int64 { return int64(int16(binary.LittleEndian.Uint16(b))) }
	case w == 2:
		return func(b []byte) int64 { return int64(int16(binary.BigEndian.Uint16(b))) }
	case w == 3 && !be:
		return func(b []byte) int64 { return int64(int32(uint32(b[0])<<8|uint32(b[1])<<16|uint32(b[2])<<24) >> 8) }
	case w == 3:
		return func(b []byte) int64 { return int64(int32(uint32(b[2])<<8|uint32(b[1])<<16|uint32(b[0])<<24) >> 8) }
	case !be:
		return func(b []byte) int64 { return int64(int32(binary.LittleEndian.Uint32(b))) }
	default:
		return func(b []byte) int64 { return int64(int32(binary.BigEndian.Uint32(b))) }
	}
}

// g711 holds the G.711 expansions to 16-bit linear values (A-law ±32256, µ-law ±32124), the
// same tables sox and ffmpeg use.
var g711 = func() (t struct{ alaw, ulaw [256]int16 }) {
	for i := 0; i < 256; i++ {
		a := byte(i) ^ 0x55
		v := int(a&0x0f) << 4
		switch seg := int(a&0x70) >> 4; seg {
		case 0:
			v += 8
		case 1:
			v += 0x108
		default:
			v = (v + 0x108) << (seg - 1)
		}
		if a&0x80 == 0 {
			v = -v
		}
		t.alaw[i] = int16(v)

		u := ^byte(i)
		m := (int(u&0x0f)<<3 + 0x84) << (int(u&0x70) >> 4)
		m -= 0x84
		if u&0x80 != 0 {
			m = -m
		}
		t.ulaw[i] = int16(m)
	}
	return t
}()
