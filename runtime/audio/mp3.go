package audio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/hajimehoshi/go-mp3"
)

// openMP3 reads MPEG-1/2 layer III with github.com/hajimehoshi/go-mp3, which always yields
// 16-bit stereo (mono duplicated). A LAME/Xing info frame's gapless fields, when present, trim
// the encoder delay and padding, and its frame count states the duration.
func openMP3(data []byte) (opened, error) {
	if n := len(data); n >= 128 && string(data[n-128:n-125]) == "TAG" {
		data = data[:n-128] // ID3v1
	}
	info := Info{Codec: "mp3", Channels: 2}
	var gap gapless
	if off, h, ok := firstMPEGFrame(data); ok {
		info.Channels = h.channels
		gap = parseGapless(data[off:], h)
	}
	// A reader without Seek keeps go-mp3 from scanning the whole input up front.
	d, err := mp3.NewDecoder(struct{ io.Reader }{bytes.NewReader(data)})
	if err != nil {
		return opened{}, fmt.Errorf("audio: mp3: %v: %w", err, ErrCorrupt)
	}
	b := &mp3Blocks{d: d, skip: gap.skip, keep: gap.total, buf: make([]byte, 4*4096), mono: make([]float32, 4096)}
	if b.keep <= 0 {
		b.keep = -1
	}
	return opened{info: info, rate: d.SampleRate(), declared: max(gap.total, 0), src: b}, nil
}

// mp3Blocks reads an MP3 stream 4096 samples at a time, dropping skip samples first and keeping
// keep (all when negative).
type mp3Blocks struct {
	d          *mp3.Decoder
	skip, keep int64
	frames     int64 // kept so far, for errors
	buf        []byte
	mono       []float32
}

func (m *mp3Blocks) next() ([]float32, error) {
	if m.keep == 0 {
		return nil, io.EOF
	}
	n, err := io.ReadFull(m.d, m.buf)
	n /= 4
	frames := m.mono[:n]
	for i := range frames {
		l := int16(binary.LittleEndian.Uint16(m.buf[4*i:]))
		r := int16(binary.LittleEndian.Uint16(m.buf[4*i+2:]))
		frames[i] = float32(int32(l)+int32(r)) * (1.0 / 65536)
	}
	if m.skip > 0 {
		k := int(min(m.skip, int64(len(frames))))
		frames = frames[k:]
		m.skip -= int64(k)
	}
	if m.keep >= 0 && int64(len(frames)) > m.keep {
		frames = frames[:m.keep]
	}
	if m.keep > 0 {
		m.keep -= int64(len(frames))
	}
	m.frames += int64(len(frames))
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return frames, io.EOF
	case err != nil:
		return frames, fmt.Errorf("audio: mp3: after %d samples: %v: %w", m.frames, err, ErrCorrupt)
	case m.keep == 0:
		return frames, io.EOF
	}
	return frames, nil
}

// firstMPEGFrame finds the first layer III frame header in the first 64 KiB.
func firstMPEGFrame(data []byte) (int, mpegHeader, bool) {
	for off := 0; off+4 <= len(data) && off < 64<<10; off++ {
		if h, ok := parseMPEGHeader(data[off:]); ok && h.layer == 3 && h.frameBytes > 0 {
			return off, h, true
		}
	}
	return 0, mpegHeader{}, false
}

// gapless is what a LAME info frame says about the stream: skip decoded samples to drop the
// info frame, the encoder delay and the decoder delay; total samples follow.
type gapless struct {
	skip  int64
	total int64 // 0 when unknown
}

// mp3DecoderDelay is the synthesis filter bank's delay in samples (528 + 1, as LAME and mpg123
// count it).
const mp3DecoderDelay = 529

// parseGapless reads a Xing/Info frame at the start of frame: after the header and side
// information come "Xing" or "Info", a flags word, optional frame count, byte count, TOC and
// quality, then the LAME extension whose bytes 21..23 hold the 12-bit encoder delay and padding.
func parseGapless(frame []byte, h mpegHeader) gapless {
	side := 32
	switch {
	case h.version == 1 && h.channels == 1:
		side = 17
	case h.version != 1 && h.channels == 1:
		side = 9
	case h.version != 1:
		side = 17
	}
	off := 4 + side
	if h.crc {
		off += 2
	}
	b := frame[:min(len(frame), h.frameBytes)]
	if len(b) < off+8 || (string(b[off:off+4]) != "Xing" && string(b[off:off+4]) != "Info") {
		return gapless{}
	}
	flags := binary.BigEndian.Uint32(b[off+4:])
	p := off + 8
	var nframes int64 = -1
	if flags&1 != 0 {
		if len(b) < p+4 {
			return gapless{}
		}
		nframes = int64(binary.BigEndian.Uint32(b[p:]))
		p += 4
	}
	for _, f := range []struct {
		bit uint32
		n   int
	}{{2, 4}, {4, 100}, {8, 4}} {
		if flags&f.bit != 0 {
			p += f.n
		}
	}
	// The info frame decodes to one frame of silence, which is dropped in any case.
	g := gapless{skip: int64(h.samples)}
	if len(b) < p+24 {
		return g
	}
	lame := b[p : p+24]
	delay := int64(lame[21])<<4 | int64(lame[22])>>4
	pad := int64(lame[22]&0x0f)<<8 | int64(lame[23])
	g.skip += delay + mp3DecoderDelay
	if nframes > 0 {
		if t := nframes*int64(h.samples) - delay - pad; t > 0 {
			g.total = t
		}
	}
	return g
}
