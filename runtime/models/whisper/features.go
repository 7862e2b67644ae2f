package whisper

import (
	"errors"

	"github.com/parleyhq/parley/runtime/audio"
)

// LogMel computes the log-mel spectrogram of 16 kHz mono samples with the model's filter bank:
// [Mels, nFrames], row = mel bin, with 30 s of padding after the audio.
func LogMel(samples []float32, m *Model, threads int) ([]float32, int, error) {
	if len(samples) == 0 {
		return nil, 0, errors.New("whisper: no audio samples")
	}
	return audio.LogMel(samples, m.melFilters(), threads)
}

// NewMelStream starts LogMel's frames computed as samples arrive (audio.MelStream), with the
// model's filter bank.
func NewMelStream(m *Model, threads int) (*audio.MelStream, error) {
	return audio.NewMelStream(m.melFilters(), threads)
}

func (m *Model) melFilters() audio.MelFilters {
	return audio.MelFilters{NMel: m.FilterMels, NFFT: m.FilterFFT, Data: m.Filters}
}
