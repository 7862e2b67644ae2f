package audio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/mewkiz/flac"
)

// openFLAC reads native FLAC with github.com/mewkiz/flac, which checks every frame's CRC.
func openFLAC(data []byte) (opened, error) {
	stream, err := flac.New(bytes.NewReader(data))
	if err != nil {
		return opened{}, fmt.Errorf("audio: flac: %v: %w", err, ErrCorrupt)
	}
	si := stream.Info
	ch := int(si.NChannels)
	bps := int(si.BitsPerSample)
	if ch < 1 || bps < 4 || bps > 32 {
		return opened{}, fmt.Errorf("audio: flac: %d channels of %d bits: %w", ch, bps, ErrCorrupt)
	}
	return opened{
		info:     Info{Codec: "flac", Channels: ch, BitsPerSample: bps},
		rate:     int(si.SampleRate),
		declared: int64(min(si.NSamples, math.MaxInt64)), // STREAMINFO's total, 0 when unknown
		src:      &flacBlocks{stream: stream, ch: ch, bps: bps, scale: math.Ldexp(1, -(bps - 1))},
	}, nil
}

// flacBlocks reads a FLAC stream a frame at a time.
type flacBlocks struct {
	stream  *flac.Stream
	ch, bps int
	scale   float64
	frames  int64 // decoded so far, for errors
	mono    []float32
}

func (f *flacBlocks) next() ([]float32, error) {
	si := f.stream.Info
	fr, err := f.stream.ParseNext()
	if errors.Is(err, io.EOF) {
		return nil, io.EOF
	}
	if err != nil {
		return nil, fmt.Errorf("audio: flac: frame after %d samples: %v: %w", f.frames, err, ErrCorrupt)
	}
	if fr.Channels.Count() != f.ch || (fr.BitsPerSample != 0 && int(fr.BitsPerSample) != f.bps) ||
		(fr.SampleRate != 0 && fr.SampleRate != si.SampleRate) {
		return nil, fmt.Errorf("audio: flac: frame after %d samples has %d channels, %d bits, %d Hz; stream has %d, %d, %d: %w",
			f.frames, fr.Channels.Count(), fr.BitsPerSample, fr.SampleRate, f.ch, f.bps, si.SampleRate, ErrUnsupported)
	}
	n := int(fr.BlockSize)
	for _, sub := range fr.Subframes {
		if len(sub.Samples) != n {
			return nil, fmt.Errorf("audio: flac: subframe of %d samples in a %d-sample frame: %w", len(sub.Samples), n, ErrCorrupt)
		}
	}
	if cap(f.mono) < n {
		f.mono = make([]float32, n)
	}
	mono := f.mono[:n]
	for i := range mono {
		var sum int64
		for _, sub := range fr.Subframes {
			sum += int64(sub.Samples[i])
		}
		mono[i] = float32(float64(sum) * f.scale / float64(f.ch))
	}
	f.frames += int64(n)
	return mono, nil
}
