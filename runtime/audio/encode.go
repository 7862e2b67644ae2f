package audio

import (
	"encoding/binary"
	"fmt"
	"math"
)

// FloatToPCM16 appends x as little-endian signed 16-bit samples: trunc(clamp(v, -1, 1)·32767),
// the conversion of Pocket TTS's WAV writer (NaN becomes 0).
func FloatToPCM16(dst []byte, x []float32) []byte {
	for _, v := range x {
		var s int16
		if v == v {
			s = int16(float32(math.Max(-1, math.Min(1, float64(v)))) * 32767)
		}
		dst = binary.LittleEndian.AppendUint16(dst, uint16(s))
	}
	return dst
}

// MaxWAVSamples is the most 16-bit mono samples a RIFF WAV header can count.
const MaxWAVSamples = (math.MaxUint32 - 36) / 2

// WAVHeader returns the 44-byte header of a 16-bit PCM mono RIFF WAV file of n samples at rate
// Hz; the samples (FloatToPCM16's bytes) follow it.
func WAVHeader(n int64, rate int) ([]byte, error) {
	if n < 0 || n > MaxWAVSamples {
		return nil, fmt.Errorf("audio: %d samples do not fit a WAV file", n)
	}
	return wavHeader(36+uint32(2*n), uint32(2*n), rate)
}

// WAVStreamHeader returns the header of a 16-bit PCM mono WAV stream at rate Hz whose length
// is not known when the header is sent: the RIFF and data sizes are 0xFFFFFFFF, as ffmpeg and
// OpenAI's speech API write them, which readers (ffmpeg, SoX, this package's Decode) take as
// "to the end of the file".
func WAVStreamHeader(rate int) ([]byte, error) {
	return wavHeader(math.MaxUint32, math.MaxUint32, rate)
}

func wavHeader(riff, data uint32, rate int) ([]byte, error) {
	if rate <= 0 || rate > MaxRate {
		return nil, fmt.Errorf("audio: sample rate %d Hz outside (0, %d]", rate, MaxRate)
	}
	h := make([]byte, 0, 44)
	h = append(h, "RIFF"...)
	h = binary.LittleEndian.AppendUint32(h, riff)
	h = append(h, "WAVEfmt "...)
	h = binary.LittleEndian.AppendUint32(h, 16)
	h = binary.LittleEndian.AppendUint16(h, 1) // PCM
	h = binary.LittleEndian.AppendUint16(h, 1) // mono
	h = binary.LittleEndian.AppendUint32(h, uint32(rate))
	h = binary.LittleEndian.AppendUint32(h, uint32(2*rate)) // bytes per second
	h = binary.LittleEndian.AppendUint16(h, 2)              // bytes per frame
	h = binary.LittleEndian.AppendUint16(h, 16)
	h = append(h, "data"...)
	h = binary.LittleEndian.AppendUint32(h, data)
	return h, nil
}
