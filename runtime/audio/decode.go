package audio

import (
	"errors"
	"fmt"
	"mime"
	"strings"
	"time"
)

var (
	// ErrUnsupported reports input that is not in a format Decode handles (a server answers 415).
	ErrUnsupported = errors.New("unsupported audio format")
	// ErrCorrupt reports input in a supported format that is malformed or truncated.
	ErrCorrupt = errors.New("corrupt audio")
	// ErrTooLong reports audio longer than the decoder's duration limit.
	ErrTooLong = errors.New("audio too long")
)

// DefaultMaxDuration bounds decoded audio when Options.MaxDuration is zero: two hours are 115.2M
// samples (461 MB) at 16 kHz.
const DefaultMaxDuration = 2 * time.Hour

// Options controls DecodeWith.
type Options struct {
	// MaxDuration bounds the decoded length; longer input fails with ErrTooLong before the
	// excess is decoded. Zero means DefaultMaxDuration; negative is invalid.
	MaxDuration time.Duration
	// ContentType, if set (e.g. from an HTTP header), is used when the bytes alone do not
	// identify the format: an MP3 stream without a tag that starts mid-frame, or a reason to
	// call unrecognised bytes corrupt (a supported type was declared) rather than unsupported.
	ContentType string
	// SampleRate is the rate of the decoded samples, in [MinRate, MaxRate] Hz: input at another
	// rate is resampled to it once, input at this rate is not resampled. Zero means SampleRate
	// (16 kHz, what the recognisers take).
	SampleRate int
}

// Format names a container and codec Decode reads.
type Format string

const (
	FormatWAV    Format = "wav"        // RIFF, RIFX, RF64 or BW64 WAVE: integer/float PCM, A-law, µ-law
	FormatFLAC   Format = "flac"       // native FLAC
	FormatMP3    Format = "mp3"        // MPEG-1/2 layer III
	FormatVorbis Format = "ogg/vorbis" // Vorbis in Ogg, first logical stream
	FormatOpus   Format = "ogg/opus"   // Opus in Ogg (RFC 7845), mono or stereo
)

// Info describes the input as stored, before mixing down and resampling.
type Info struct {
	Format        Format
	Codec         string        // "pcm_s16le", "pcm_f32be", "pcm_mulaw", "flac", "mp3", "vorbis", "opus", ...
	SampleRate    int           // Hz; for Opus the 48 kHz coding rate
	Channels      int           // channels mixed down by averaging
	BitsPerSample int           // stored resolution for PCM and FLAC (valid bits); 0 for lossy codecs
	Frames        int64         // decoded samples per channel at SampleRate
	Duration      time.Duration // Frames / SampleRate
}

// Decode decodes an audio file to 16 kHz mono float32 with default options.
func Decode(data []byte) ([]float32, Info, error) {
	return DecodeWith(data, Options{})
}

// DecodeWith decodes an audio file to mono float32 at opt.SampleRate (16 kHz by default): the
// format is sniffed from the bytes (opt.ContentType only helps where they are ambiguous),
// channels are averaged and the result is resampled with Resampler. 16-bit PCM maps to float as
// s16·2⁻¹⁵ exactly, and input at the output rate is not resampled, so a 16 kHz mono PCM16 WAV
// yields exactly what whisper.cpp reads. It is
// NewDecoder read to the end: the same samples, in one slice.
func DecodeWith(data []byte, opt Options) ([]float32, Info, error) {
	d, err := NewDecoder(data, opt)
	if err != nil {
		return nil, Info{}, err
	}
	// The output is sized from the header only where the input's size proves it (PCM);
	// otherwise the first allocation is capped at 4 samples per input byte, and the output grows
	// as decoding proves more.
	var out []float32
	if d.declared > 0 {
		n := d.rs.OutLen(d.declared)
		if !d.confirmed {
			n = min(n, 4*int64(len(data)))
		}
		out = make([]float32, 0, n)
	}
	out, err = d.readAll(out)
	if err != nil {
		return nil, Info{}, err
	}
	return out, d.Info(), nil
}

// panicHook, when set, sees each panic a decoder turns into ErrCorrupt, with its stack, so that
// tests can tell a codec's panic from one in this package.
var panicHook func(p any, stack []byte)

// limits is what every decoder checks before it grows its output.
type limits struct {
	maxDur     time.Duration
	inputBytes int
}

// maxFrames is the most frames at rate that fit in the duration limit.
func (l limits) maxFrames(rate int) int64 {
	sec := int64(l.maxDur / time.Second)
	ns := int64(l.maxDur % time.Second)
	return sec*int64(rate) + ns*int64(rate)/int64(time.Second)
}

// samplesDuration is n samples at rate as a Duration, rounded to the nanosecond.
func samplesDuration(n int64, rate int) time.Duration {
	sec := n / int64(rate)
	rem := n % int64(rate)
	return time.Duration(sec)*time.Second + time.Duration((rem*int64(time.Second)+int64(rate)/2)/int64(rate))
}

// detect identifies the format and returns the bytes its decoder reads (ID3v2 tags in front of
// MP3 or FLAC removed).
func detect(data []byte, contentType string) (Format, []byte, error) {
	if len(data) == 0 {
		return "", nil, fmt.Errorf("audio: empty input: %w", ErrCorrupt)
	}
	f, body, err := sniff(data)
	if err != nil {
		return "", nil, err
	}
	if f != "" {
		return f, body, nil
	}
	declared := formatForContentType(contentType)
	if declared == FormatMP3 {
		// A headerless MP3 may start with a partial frame; the decoder resynchronises.
		return FormatMP3, body, nil
	}
	head := data[:min(len(data), 12)]
	if declared != "" {
		return "", nil, fmt.Errorf("audio: declared %s but the data is not %s (starts % x): %w", contentType, declared, head, ErrCorrupt)
	}
	if contentType != "" {
		return "", nil, fmt.Errorf("audio: content type %q, data starting % x: %w", contentType, head, ErrUnsupported)
	}
	return "", nil, fmt.Errorf("audio: unrecognised data starting % x: %w", head, ErrUnsupported)
}

func formatForContentType(ct string) Format {
	if ct == "" {
		return ""
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		mt = strings.ToLower(strings.TrimSpace(ct))
	}
	switch mt {
	case "audio/wav", "audio/wave", "audio/x-wav", "audio/vnd.wave", "audio/x-pn-wav":
		return FormatWAV
	case "audio/flac", "audio/x-flac":
		return FormatFLAC
	case "audio/mpeg", "audio/mp3", "audio/x-mp3", "audio/mpeg3", "audio/x-mpeg-3", "audio/mpa":
		return FormatMP3
	case "audio/ogg", "application/ogg", "audio/vorbis", "audio/x-vorbis+ogg":
		return FormatVorbis
	case "audio/opus", "audio/x-opus+ogg":
		return FormatOpus
	}
	return ""
}

// sniff returns the format the bytes carry and the part its decoder reads; an error wrapping
// ErrUnsupported names a format it recognises but cannot decode, one wrapping ErrCorrupt a
// format it decodes, recognised, but malformed. A format of "" and no error: unrecognised.
func sniff(data []byte) (Format, []byte, error) {
	has := func(off int, s string) bool {
		return len(data) >= off+len(s) && string(data[off:off+len(s)]) == s
	}
	unsupported := func(what string) (Format, []byte, error) {
		return "", nil, fmt.Errorf("audio: %s: %w", what, ErrUnsupported)
	}
	switch {
	case (has(0, "RIFF") || has(0, "RIFX") || has(0, "RF64") || has(0, "BW64")) && (has(8, "WAVE") || len(data) < 12):
		return FormatWAV, data, nil
	case has(0, "fLaC"):
		return FormatFLAC, data, nil
	case has(0, "OggS"):
		return sniffOgg(data)
	case has(0, "FORM") && (has(8, "AIFF") || has(8, "AIFC")):
		return unsupported("AIFF")
	case has(4, "ftyp"):
		return unsupported("MP4/M4A (AAC or ALAC)")
	case has(0, "\x1a\x45\xdf\xa3"):
		return unsupported("Matroska/WebM")
	case has(0, "#!AMR"):
		return unsupported("AMR")
	case has(0, "caff"):
		return unsupported("Core Audio (CAF)")
	case has(0, "MThd"):
		return unsupported("MIDI")
	case has(0, ".snd"):
		return unsupported("Sun/NeXT audio (.au)")
	case has(0, "wvpk"):
		return unsupported("WavPack")
	case has(0, "MAC "):
		return unsupported("Monkey's Audio")
	case has(0, "RIFF") && has(8, "AVI "):
		return unsupported("AVI")
	case has(0, "RIFF"):
		return unsupported(fmt.Sprintf("RIFF form %q", data[8:min(len(data), 12)]))
	}
	body := skipID3v2(data)
	tagged := len(body) < len(data)
	if len(body) >= 4 && string(body[:4]) == "fLaC" {
		return FormatFLAC, body, nil
	}
	return sniffMPEG(body, tagged)
}

// skipID3v2 drops ID3v2 tags (possibly several) from the front of data.
func skipID3v2(data []byte) []byte {
	for len(data) >= 10 && string(data[:3]) == "ID3" && data[3] < 0xff && data[4] < 0xff &&
		data[6]|data[7]|data[8]|data[9] < 0x80 {
		n := 10 + (int(data[6])<<21 | int(data[7])<<14 | int(data[8])<<7 | int(data[9]))
		if data[5]&0x10 != 0 {
			n += 10 // footer
		}
		if n > len(data) {
			return data[len(data):]
		}
		data = data[n:]
	}
	return data
}

func sniffOgg(data []byte) (Format, []byte, error) {
	// The first page carries the first packet of the first logical stream: 27-byte header,
	// segment table, then the packet.
	if len(data) < 28 {
		return FormatVorbis, data, nil // the decoder reports the truncation
	}
	nseg := int(data[26])
	if len(data) < 27+nseg {
		return FormatVorbis, data, nil
	}
	p := data[27+nseg:]
	has := func(s string) bool { return len(p) >= len(s) && string(p[:len(s)]) == s }
	what := ""
	switch {
	case has("\x01vorbis"):
		return FormatVorbis, data, nil
	case has("OpusHead"):
		return FormatOpus, data, nil
	case has("\x7fFLAC"):
		what = "FLAC in Ogg"
	case has("Speex   "):
		what = "Ogg Speex"
	case has("\x80theora"):
		what = "Ogg Theora (video)"
	default:
		what = fmt.Sprintf("Ogg stream with an unknown codec (first packet % x)", p[:min(len(p), 8)])
	}
	return "", nil, fmt.Errorf("audio: %s: %w", what, ErrUnsupported)
}

// mpegHeader is a parsed MPEG audio frame header.
type mpegHeader struct {
	version    int // 1, 2, or 25 for MPEG-2.5
	layer      int // 1, 2 or 3
	rate       int
	channels   int
	frameBytes int // 0 for free format
	samples    int // samples per channel in the frame
	crc        bool
}

var (
	mpegRates = [3][3]int{{44100, 48000, 32000}, {22050, 24000, 16000}, {11025, 12000, 8000}}
	// kbit/s for layer III; index 0 is free format, 15 invalid.
	mp3Kbps1 = [15]int{0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320}
	mp3Kbps2 = [15]int{0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160}
)

// parseMPEGHeader decodes the 4 bytes at the start of b; ok is false when they are not a valid
// MPEG audio frame header. Sizes are computed for layer III only.
func parseMPEGHeader(b []byte) (h mpegHeader, ok bool) {
	if len(b) < 4 || b[0] != 0xff || b[1]&0xe0 != 0xe0 {
		return h, false
	}
	ver := int(b[1]>>3) & 3
	layer := int(b[1]>>1) & 3
	bri := int(b[2] >> 4)
	sri := int(b[2]>>2) & 3
	if ver == 1 || layer == 0 || bri == 15 || sri == 3 {
		return h, false
	}
	switch ver {
	case 3:
		h.version = 1
	case 2:
		h.version = 2
	default:
		h.version = 25
	}
	h.layer = 4 - layer
	vi := map[int]int{1: 0, 2: 1, 25: 2}[h.version]
	h.rate = mpegRates[vi][sri]
	h.channels = 2
	if b[3]>>6 == 3 {
		h.channels = 1
	}
	h.crc = b[1]&1 == 0
	if h.layer == 3 {
		pad := int(b[2]>>1) & 1
		if h.version == 1 {
			h.samples = 1152
			h.frameBytes = 144000*mp3Kbps1[bri]/h.rate + pad
		} else {
			h.samples = 576
			h.frameBytes = 72000*mp3Kbps2[bri]/h.rate + pad
		}
		if bri == 0 {
			h.frameBytes = 0
		}
	}
	return h, true
}

// sniffMPEG recognises MPEG audio (and ADTS AAC) at the start of data: a layer III header that is
// followed by another valid header where the first frame ends (or by the end of the data). After
// an ID3 tag, which marks the file as MPEG audio, the first frame is searched for. A layer III
// header that no frame follows, where none that is followed comes after it, is MP3 audio all the
// same, and corrupt: not given to the decoder, which takes the bytes after such a frame for the
// end of the stream (go-mp3 returns the one frame and no error). Once such a header is seen,
// later bytes that would pass for a header of a format not decoded (ADTS, layers I and II, free
// format) are taken for what they most likely are, noise in a damaged stream.
func sniffMPEG(data []byte, tagged bool) (Format, []byte, error) {
	limit := 1
	if tagged {
		limit = min(len(data), 64<<10)
	}
	lone := -1 // the offset of the first layer III header that no frame follows
	for off := 0; off < limit && off+4 <= len(data); off++ {
		b := data[off:]
		if b[0] != 0xff {
			continue
		}
		h, ok := parseMPEGHeader(b)
		what := ""
		switch {
		case b[1]&0xf6 == 0xf0:
			what = "AAC (ADTS)"
		case !ok:
			continue
		case h.layer != 3:
			what = fmt.Sprintf("MPEG-%d layer %s audio (only layer III is decoded)", h.version, strings.Repeat("I", h.layer))
		case h.frameBytes == 0:
			what = "free-format MP3"
		case h.frameBytes < len(b) && !followedByFrame(b, h):
			if lone < 0 {
				lone = off
			}
			continue
		case h.version == 25:
			return "", nil, fmt.Errorf("audio: MPEG-2.5 layer III audio (8, 11.025 or 12 kHz MP3): %w", ErrUnsupported)
		default:
			return FormatMP3, b, nil
		}
		if lone < 0 {
			return "", nil, fmt.Errorf("audio: %s: %w", what, ErrUnsupported)
		}
	}
	if lone >= 0 {
		return "", nil, fmt.Errorf("audio: mp3: no frame follows the layer III frame at byte %d: %w", lone, ErrCorrupt)
	}
	return "", data, nil
}

// followedByFrame reports whether a layer III header of the same MPEG version begins where the
// frame of header h, at the start of b, ends.
func followedByFrame(b []byte, h mpegHeader) bool {
	h2, ok := parseMPEGHeader(b[h.frameBytes:])
	return ok && h2.layer == 3 && h2.version == h.version
}
