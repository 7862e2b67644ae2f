package audio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/jfreymuth/oggvorbis"
	"github.com/pion/opus"
	"github.com/pion/opus/pkg/oggreader"
)

// openVorbis reads Ogg Vorbis with github.com/jfreymuth/oggvorbis (first logical stream). The
// duration is the last page's granule position, which the reader finds at the end of the input.
func openVorbis(data []byte) (opened, error) {
	r, err := oggvorbis.NewReader(bytes.NewReader(data))
	if err != nil {
		return opened{}, fmt.Errorf("audio: vorbis: %v: %w", err, ErrCorrupt)
	}
	ch := r.Channels()
	if ch < 1 {
		return opened{}, fmt.Errorf("audio: vorbis: %d channels: %w", ch, ErrCorrupt)
	}
	const chunk = 4096
	return opened{
		info:     Info{Codec: "vorbis", Channels: ch},
		rate:     r.SampleRate(),
		declared: max(r.Length(), 0),
		src:      &vorbisBlocks{r: r, ch: ch, buf: make([]float32, chunk*ch), mono: make([]float32, chunk)},
	}, nil
}

// vorbisBlocks reads a Vorbis stream up to 4096 samples at a time.
type vorbisBlocks struct {
	r      *oggvorbis.Reader
	ch     int
	frames int64 // decoded so far, for errors
	buf    []float32
	mono   []float32
}

func (v *vorbisBlocks) next() ([]float32, error) {
	n, err := v.r.Read(v.buf)
	n /= v.ch
	mixFloat(v.mono[:n], v.buf[:n*v.ch], v.ch)
	v.frames += int64(n)
	switch {
	case errors.Is(err, io.EOF):
		return v.mono[:n], io.EOF
	case err != nil:
		return v.mono[:n], fmt.Errorf("audio: vorbis: after %d samples: %v: %w", v.frames, err, ErrCorrupt)
	}
	return v.mono[:n], nil
}

// mixFloat averages interleaved float channels into dst.
func mixFloat(dst, src []float32, ch int) {
	if ch == 1 {
		copy(dst, src)
		return
	}
	for i := range dst {
		sum := 0.0
		for _, v := range src[i*ch : (i+1)*ch] {
			sum += float64(v)
		}
		dst[i] = float32(sum / float64(ch))
	}
}

// opusRate is the rate Opus is decoded at for output at rate: rate itself where Opus decodes to
// it (8, 12, 16, 24 or 48 kHz), else its 48 kHz, resampled from.
func opusRate(rate int) int {
	switch rate {
	case 8000, 12000, 16000, 24000, 48000:
		return rate
	}
	return 48000
}

// openOpus reads Ogg Opus (RFC 7845, mono or stereo) with github.com/pion/opus, decoding
// straight to opusRate(rate). The pre-skip is dropped, the end is trimmed to the last granule
// position and the header's output gain is applied. The duration the header states is the
// granule position of the input's last page.
func openOpus(data []byte, rate int) (opened, error) {
	or, hdr, err := oggreader.NewWith(bytes.NewReader(data))
	if err != nil {
		return opened{}, fmt.Errorf("audio: opus: %v: %w", err, ErrCorrupt)
	}
	ch := int(hdr.Channels)
	if ch < 1 || ch > 2 || hdr.ChannelMap != 0 {
		return opened{}, fmt.Errorf("audio: opus: %d channels, mapping family %d (only mono and stereo streams decode): %w", ch, hdr.ChannelMap, ErrUnsupported)
	}
	rate = opusRate(rate)
	ratio := int64(48000 / rate) // of the 48 kHz of granule positions over the decoded rate
	dec, err := opus.NewDecoderWithOutput(rate, ch)
	if err != nil {
		return opened{}, fmt.Errorf("audio: opus: %v: %w", err, ErrUnsupported)
	}
	b := &opusBlocks{end: -1, ratio: ratio, data: data, or: or, dec: dec, ch: ch, preSkip: int64(hdr.PreSkip), skip: int64(hdr.PreSkip) / ratio,
		gain: float32(math.Pow(10, float64(int16(hdr.OutputGain))/(20*256))),
		buf:  make([]float32, 5760*ch), // 120 ms, the longest packet, at 48 kHz
		mono: make([]float32, 5760)}
	o := opened{info: Info{Codec: "opus", Channels: ch, SampleRate: 48000}, rate: rate, src: b}
	if g, ok := lastOggGranule(data); ok {
		if n48 := g - int64(hdr.PreSkip); n48 > 0 {
			o.declared = (n48 + ratio - 1) / ratio
			o.info.Frames, o.info.Duration = n48, samplesDuration(n48, 48000)
		}
	}
	o.finish = func(info *Info, frames int64) {
		info.SampleRate = 48000
		info.Frames = frames * ratio
		if b.end >= 0 && frames == b.end {
			info.Frames = b.n48
		}
		info.Duration = samplesDuration(info.Frames, 48000)
	}
	return o, nil
}

// opusBlocks reads an Opus stream a packet at a time. Before the first packet it reads the
// stream's packets through to the end without decoding them, as the decoding will, for the last
// granule position: the output is trimmed to it (end samples; the rest of the last packet is
// padding), which a stream read once could only do by holding its output back.
type opusBlocks struct {
	data     []byte
	or       *oggreader.OggReader
	dec      opus.Decoder
	ch       int
	preSkip  int64
	skip     int64
	gain     float32
	frames   int64 // decoded so far, for errors
	scanned  bool
	ratio    int64 // 48 kHz over the decoded rate
	end, n48 int64 // samples at the decoded rate the last granule position keeps (-1: all), and at 48 kHz
	first    bool  // the first packet is yet to come
	buf      []float32
	mono     []float32
}

// scan finds the last granule position as the decoding loop will see it.
func (o *opusBlocks) scan() {
	o.scanned, o.first, o.end = true, true, -1
	or, _, err := oggreader.NewWith(bytes.NewReader(o.data))
	if err != nil {
		return
	}
	var granule int64 = -1
	for first := true; ; first = false {
		pkt, ph, err := or.ParseNextPacket()
		if err != nil {
			break // the end, or an error the decoding meets at the same packet
		}
		if first && bytes.HasPrefix(pkt, []byte("OpusTags")) {
			continue
		}
		if ph != nil && ph.GranulePosition != math.MaxUint64 {
			granule = int64(min(ph.GranulePosition, math.MaxInt64))
		}
	}
	if granule >= 0 {
		// The last granule position counts 48 kHz samples including the pre-skip; the decoded
		// rate keeps ceil(n/ratio) of n, as a resampler would.
		if n48 := granule - o.preSkip; n48 >= 0 {
			o.n48, o.end = n48, (n48+o.ratio-1)/o.ratio
		}
	}
}

func (o *opusBlocks) endAt() int64 { return o.end }

func (o *opusBlocks) next() ([]float32, error) {
	if !o.scanned {
		o.scan()
	}
	for {
		pkt, _, err := o.or.ParseNextPacket()
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		if err != nil {
			return nil, fmt.Errorf("audio: opus: after %d samples: %v: %w", o.frames, err, ErrCorrupt)
		}
		first := o.first
		o.first = false
		if first && bytes.HasPrefix(pkt, []byte("OpusTags")) {
			continue
		}
		n, err := o.dec.DecodeToFloat32(pkt, o.buf)
		if err != nil {
			return nil, fmt.Errorf("audio: opus: packet after %d samples: %v: %w", o.frames, err, ErrCorrupt)
		}
		if n < 0 || n > len(o.mono) {
			return nil, fmt.Errorf("audio: opus: packet of %d samples: %w", n, ErrCorrupt)
		}
		mixFloat(o.mono[:n], o.buf[:n*o.ch], o.ch)
		out := o.mono[:n]
		if o.skip > 0 {
			d := int(min(o.skip, int64(n)))
			out = out[d:]
			o.skip -= int64(d)
		}
		if o.gain != 1 {
			for i := range out {
				out[i] *= o.gain
			}
		}
		o.frames += int64(len(out))
		return out, nil
	}
}

// lastOggGranule is the granule position of the last complete page in data (looked for in the
// last 64 KiB and the longest page before them), ok false when there is none with a position.
func lastOggGranule(data []byte) (int64, bool) {
	const maxPage = 27 + 255 + 255*255
	lo := max(0, len(data)-(64<<10)-maxPage)
	for at := len(data) - 27; at >= lo; at-- {
		at = bytes.LastIndex(data[lo:at+4], []byte("OggS"))
		if at < 0 {
			return 0, false
		}
		at += lo
		h := data[at:]
		if len(h) < 27 || h[4] != 0 || len(h) < 27+int(h[26]) {
			continue
		}
		size := 27 + int(h[26])
		for _, s := range h[27 : 27+int(h[26])] {
			size += int(s)
		}
		g := binary.LittleEndian.Uint64(h[6:14])
		if size > len(h) || g == math.MaxUint64 {
			continue
		}
		return int64(min(g, math.MaxInt64)), true
	}
	return 0, false
}
