package audio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/jfreymuth/oggvorbis"
	"github.com/pion/opus"
	"github.com/pion/opus/pkg/oggreader"
)

// decodeVorbis reads Ogg Vorbis with github.com/jfreymuth/oggvorbis (first logical stream).
func decodeVorbis(data []byte, lim limits) ([]float32, Info, error) {
	r, err := oggvorbis.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, Info{}, fmt.Errorf("audio: vorbis: %v: %w", err, ErrCorrupt)
	}
	ch, rate := r.Channels(), r.SampleRate()
	if ch < 1 {
		return nil, Info{}, fmt.Errorf("audio: vorbis: %d channels: %w", ch, ErrCorrupt)
	}
	info := Info{Format: FormatVorbis, Codec: "vorbis", Channels: ch}
	// Length is the last page's granule position.
	s, err := newSink(rate, lim, max(r.Length(), 0), false)
	if err != nil {
		return nil, Info{}, err
	}
	const chunk = 4096
	buf := make([]float32, chunk*ch)
	mono := make([]float32, chunk)
	for {
		n, err := r.Read(buf)
		n /= ch
		if n > 0 {
			mixFloat(mono[:n], buf[:n*ch], ch)
			if err := s.push(mono[:n]); err != nil {
				return nil, Info{}, err
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, Info{}, fmt.Errorf("audio: vorbis: after %d samples: %v: %w", s.frames, err, ErrCorrupt)
		}
	}
	return s.finish(&info), info, nil
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

// decodeOpus reads Ogg Opus (RFC 7845, mono or stereo) with github.com/pion/opus, decoding
// straight to 16 kHz. The pre-skip is dropped, the end is trimmed to the last granule position
// and the header's output gain is applied.
func decodeOpus(data []byte, lim limits) ([]float32, Info, error) {
	or, hdr, err := oggreader.NewWith(bytes.NewReader(data))
	if err != nil {
		return nil, Info{}, fmt.Errorf("audio: opus: %v: %w", err, ErrCorrupt)
	}
	ch := int(hdr.Channels)
	if ch < 1 || ch > 2 || hdr.ChannelMap != 0 {
		return nil, Info{}, fmt.Errorf("audio: opus: %d channels, mapping family %d (only mono and stereo streams decode): %w", ch, hdr.ChannelMap, ErrUnsupported)
	}
	dec, err := opus.NewDecoderWithOutput(SampleRate, ch)
	if err != nil {
		return nil, Info{}, fmt.Errorf("audio: opus: %v: %w", err, ErrUnsupported)
	}
	info := Info{Format: FormatOpus, Codec: "opus", Channels: ch}
	s, err := newSink(SampleRate, lim, 0, false)
	if err != nil {
		return nil, Info{}, err
	}
	const ratio = 48000 / SampleRate // granule positions count 48 kHz samples
	skip := int64(hdr.PreSkip) / ratio
	gain := float32(math.Pow(10, float64(int16(hdr.OutputGain))/(20*256)))
	buf := make([]float32, 5760*ch) // 120 ms, the longest packet, at 48 kHz
	mono := make([]float32, 5760)
	var granule int64 = -1
	for first := true; ; first = false {
		pkt, ph, err := or.ParseNextPacket()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, Info{}, fmt.Errorf("audio: opus: after %d samples: %v: %w", s.frames, err, ErrCorrupt)
		}
		if first && bytes.HasPrefix(pkt, []byte("OpusTags")) {
			continue
		}
		if ph != nil && ph.GranulePosition != math.MaxUint64 {
			granule = int64(min(ph.GranulePosition, math.MaxInt64))
		}
		n, err := dec.DecodeToFloat32(pkt, buf)
		if err != nil {
			return nil, Info{}, fmt.Errorf("audio: opus: packet after %d samples: %v: %w", s.frames, err, ErrCorrupt)
		}
		if n < 0 || n > len(mono) {
			return nil, Info{}, fmt.Errorf("audio: opus: packet of %d samples: %w", n, ErrCorrupt)
		}
		mixFloat(mono[:n], buf[:n*ch], ch)
		out := mono[:n]
		if skip > 0 {
			d := int(min(skip, int64(n)))
			out = out[d:]
			skip -= int64(d)
		}
		if gain != 1 {
			for i := range out {
				out[i] *= gain
			}
		}
		if err := s.push(out); err != nil {
			return nil, Info{}, err
		}
	}
	samples := s.finish(&info)
	info.Frames = int64(len(samples)) * ratio
	if granule >= 0 {
		// The last granule position counts 48 kHz samples including the pre-skip; the 16 kHz
		// output keeps ceil(n/3) of n, as a resampler would.
		n48 := granule - int64(hdr.PreSkip)
		if end := (n48 + ratio - 1) / ratio; n48 >= 0 && end <= int64(len(samples)) {
			samples = samples[:end]
			info.Frames = n48
		}
	}
	info.SampleRate = 48000
	info.Duration = samplesDuration(info.Frames, 48000)
	return samples, info, nil
}
