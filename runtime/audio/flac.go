package audio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/mewkiz/flac"
)

// decodeFLAC reads native FLAC with github.com/mewkiz/flac, which checks every frame's CRC.
func decodeFLAC(data []byte, lim limits) ([]float32, Info, error) {
	stream, err := flac.New(bytes.NewReader(data))
	if err != nil {
		return nil, Info{}, fmt.Errorf("audio: flac: %v: %w", err, ErrCorrupt)
	}
	si := stream.Info
	ch := int(si.NChannels)
	bps := int(si.BitsPerSample)
	if ch < 1 || bps < 4 || bps > 32 {
		return nil, Info{}, fmt.Errorf("audio: flac: %d channels of %d bits: %w", ch, bps, ErrCorrupt)
	}
	info := Info{Format: FormatFLAC, Codec: "flac", Channels: ch, BitsPerSample: bps}
	declared := int64(min(si.NSamples, math.MaxInt64))
	s, err := newSink(int(si.SampleRate), lim, declared, false)
	if err != nil {
		return nil, Info{}, err
	}
	scale := math.Ldexp(1, -(bps - 1))
	var mono []float32
	for {
		fr, err := stream.ParseNext()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, Info{}, fmt.Errorf("audio: flac: frame after %d samples: %v: %w", s.frames, err, ErrCorrupt)
		}
		if fr.Channels.Count() != ch || (fr.BitsPerSample != 0 && int(fr.BitsPerSample) != bps) ||
			(fr.SampleRate != 0 && fr.SampleRate != si.SampleRate) {
			return nil, Info{}, fmt.Errorf("audio: flac: frame after %d samples has %d channels, %d bits, %d Hz; stream has %d, %d, %d: %w",
				s.frames, fr.Channels.Count(), fr.BitsPerSample, fr.SampleRate, ch, bps, si.SampleRate, ErrUnsupported)
		}
		n := int(fr.BlockSize)
		if err := s.check(n); err != nil {
			return nil, Info{}, err
		}
		for _, sub := range fr.Subframes {
			if len(sub.Samples) != n {
				return nil, Info{}, fmt.Errorf("audio: flac: subframe of %d samples in a %d-sample frame: %w", len(sub.Samples), n, ErrCorrupt)
			}
		}
		if cap(mono) < n {
			mono = make([]float32, n)
		}
		mono = mono[:n]
		for i := range mono {
			var sum int64
			for _, sub := range fr.Subframes {
				sum += int64(sub.Samples[i])
			}
			mono[i] = float32(float64(sum) * scale / float64(ch))
		}
		if err := s.push(mono); err != nil {
			return nil, Info{}, err
		}
	}
	return s.finish(&info), info, nil
}
