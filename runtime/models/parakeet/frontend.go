package parakeet

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/audio"
)

// Front-end constants of log_mel_spectrogram (parakeet.cpp:2792-2903), which are NeMo's
// AudioToMelSpectrogramPreprocessor settings for Parakeet.
const (
	preemphasis = 0.97
	logGuard    = 5.960464477539063e-08 // 2^-24, added to the mel energy before the log
	normEps     = 1e-5                  // added to the standard deviation
)

// MinSamples is the shortest clip the front end takes: the per-feature normalisation needs two
// frames inside the audio for a standard deviation (whisper.cpp divides by zero below it).
const MinSamples = 2 * HopLength

// FrontEnd computes the encoder's input from 16 kHz mono samples as whisper.cpp's
// log_mel_spectrogram does. It is immutable after NewFrontEnd and safe for concurrent use.
type FrontEnd struct {
	nfft, nMel int
	window     []float64   // [nfft]: the file's window at offset (nfft - len)/2, zeros around it
	lo         []int       // [nMel] first bin of filter m with a nonzero weight
	w          [][]float64 // [nMel][...] filter m's weights from lo[m] on
}

// NewFrontEnd returns the front end of f: its window, filter bank and FFT length.
func NewFrontEnd(f *File) (*FrontEnd, error) {
	h := f.HParams
	bins := h.NFFT/2 + 1
	if len(f.Filters) != h.NMels*bins || len(f.Window) > h.NFFT || h.NFFT < 2 || h.NFFT%2 != 0 {
		return nil, fmt.Errorf("parakeet: front end: %d filter weights and a %d-sample window do not fit n_mels %d and n_fft %d",
			len(f.Filters), len(f.Window), h.NMels, h.NFFT)
	}
	fe := &FrontEnd{nfft: h.NFFT, nMel: h.NMels, window: make([]float64, h.NFFT),
		lo: make([]int, h.NMels), w: make([][]float64, h.NMels)}
	if len(f.Window) == 0 {
		// parakeet_mel_cache::fill_hann_window (parakeet.cpp:498), periodic, of n_fft samples:
		// the cosine taken of the angle rounded to float32.
		for i := range fe.window {
			a := float32(2 * math.Pi * float64(i) / float64(h.NFFT))
			fe.window[i] = float64(float32(0.5 * (1 - float64(float32(math.Cos(float64(a)))))))
		}
	} else {
		off := (h.NFFT - len(f.Window)) / 2
		for i, v := range f.Window {
			fe.window[off+i] = float64(v)
		}
	}
	for m := 0; m < h.NMels; m++ {
		row := f.Filters[m*bins : (m+1)*bins]
		lo, hi := 0, -1
		for k, v := range row {
			if v != 0 {
				if hi < 0 {
					lo = k
				}
				hi = k
			}
		}
		fe.lo[m] = lo
		fe.w[m] = make([]float64, hi-lo+1)
		for k := range fe.w[m] {
			fe.w[m][k] = float64(row[lo+k])
		}
	}
	return fe, nil
}

// Mels is the number of mel bins per frame.
func (fe *FrontEnd) Mels() int { return fe.nMel }

// MelFrames is the number of mel frames for n samples: frames every HopLength samples over the
// audio padded with n_fft/2 zeros at each end, (n + n_fft - n_fft)/160 + 1.
func MelFrames(n int) int { return n/HopLength + 1 }

// LogMel computes the normalised log-mel spectrogram of samples (16 kHz mono, [-1, 1]) into dst,
// resized to [MelFrames(len(samples)), Mels()] (row = frame), and returns it. It follows
// log_mel_spectrogram (parakeet.cpp:2792-2903), which is NeMo's front end but for the last
// frame (see below):
//
//  1. pre-emphasis x[i] -= 0.97·x[i-1], from the end down to i = 1, in float32;
//  2. n_fft/2 zeros at each end; a frame every 160 samples; the window centred in the n_fft
//     frame;
//  3. power spectrum |X[k]|², mel energies through the filter bank, ln(energy + 2^-24), stored
//     as float32;
//  4. per mel bin, mean and standard deviation (n-1 denominator) over the first n/160 frames
//     (those inside the audio), then (x - mean)/(std + 1e-5) applied to every frame, the last
//     one included (NeMo zeroes frames past n/160; whisper.cpp does not).
//
// Spectra are computed in float64 (whisper.cpp uses its own float32 FFT; the two agree within
// 1e-3 on speech). Clips shorter than MinSamples are an error.
func (fe *FrontEnd) LogMel(dst, samples []float32) ([]float32, error) {
	dst, err := fe.RawLogMel(dst, samples)
	if err != nil {
		return nil, err
	}
	fe.Normalize(dst, len(samples)/HopLength, nil)
	return dst, nil
}

// RawLogMel is LogMel's steps 1 to 3: the log-mel spectrogram of samples before its
// normalisation.
func (fe *FrontEnd) RawLogMel(dst, samples []float32) ([]float32, error) {
	n := len(samples)
	if n < MinSamples {
		return nil, fmt.Errorf("parakeet: %d samples is too short: the front end needs at least %d (%d ms)", n, MinSamples, MinSamples*1000/SampleRate)
	}
	frames := MelFrames(n)
	if cap(dst) < frames*fe.nMel {
		dst = make([]float32, frames*fe.nMel)
	}
	dst = dst[:frames*fe.nMel]

	// The pre-emphasised audio with n_fft/2 zeros on each side.
	pad := fe.nfft / 2
	x := make([]float32, n+2*pad)
	copy(x[pad:], samples)
	for i := n - 1; i > 0; i-- {
		x[pad+i] -= preemphasis * x[pad+i-1]
	}

	ps, err := audio.NewPowerSpectrum(fe.nfft)
	if err != nil {
		return nil, err
	}
	frame := make([]float64, fe.nfft)
	pow := make([]float64, fe.nfft/2+1)
	for i := 0; i < frames; i++ {
		seg := x[i*HopLength : i*HopLength+fe.nfft]
		for j, w := range fe.window {
			frame[j] = w * float64(seg[j])
		}
		if err := ps.Power(pow, frame); err != nil {
			return nil, err
		}
		row := dst[i*fe.nMel : (i+1)*fe.nMel]
		for m, w := range fe.w {
			p := pow[fe.lo[m] : fe.lo[m]+len(w)]
			sum := 0.0
			for k, c := range w {
				sum += p[k] * c
			}
			row[m] = float32(math.Log(sum + logGuard))
		}
	}
	return dst, nil
}

// FeatureStats are per-feature statistics of raw log-mel frames (FrontEnd.RawLogMel), gathered
// one frame at a time (Welford's updates in float64): for a stream, the frames heard so far.
type FeatureStats struct {
	n        int
	mean, m2 []float64 // per mel bin: the mean, the sum of squared deviations from it
}

// NewFeatureStats returns empty statistics for fe's frames.
func (fe *FrontEnd) NewFeatureStats() *FeatureStats {
	return &FeatureStats{mean: make([]float64, fe.nMel), m2: make([]float64, fe.nMel)}
}

// Frames is the number of frames gathered.
func (st *FeatureStats) Frames() int { return st.n }

// Reset forgets every frame.
func (st *FeatureStats) Reset() {
	st.n = 0
	clear(st.mean)
	clear(st.m2)
}

// Add gathers the frames of rows (raw log-mel rows of the statistics' width).
func (st *FeatureStats) Add(rows []float32) {
	nm := len(st.mean)
	for r := 0; r+nm <= len(rows); r += nm {
		st.n++
		for m, v := range rows[r : r+nm] {
			d := float64(v) - st.mean[m]
			st.mean[m] += d / float64(st.n)
			st.m2[m] += d * (float64(v) - st.mean[m])
		}
	}
}

// Normalize is LogMel's step 4 on mel, a raw log-mel spectrogram (RawLogMel) of rows of
// Mels(): per mel bin, the mean and standard deviation of mel's first valid rows, together with
// the frames of hist (heard before mel's; nil or empty: none) when it has any, applied to every
// row of mel. Without history it is LogMel's normalisation exactly; with it, the two are
// combined as Chan et al.'s parallel variance does. valid plus hist's frames must be at least 2.
func (fe *FrontEnd) Normalize(mel []float32, valid int, hist *FeatureStats) {
	rows := len(mel) / fe.nMel
	for m := 0; m < fe.nMel; m++ {
		sum := 0.0
		for i := 0; i < valid; i++ {
			sum += float64(mel[i*fe.nMel+m])
		}
		mean := sum / float64(valid)
		sq := 0.0
		for i := 0; i < valid; i++ {
			d := float64(mel[i*fe.nMel+m]) - mean
			sq += d * d
		}
		cnt := float64(valid)
		if hist != nil && hist.n > 0 {
			na, nb := float64(hist.n), float64(valid)
			cnt = na + nb
			if valid == 0 {
				mean, sq = hist.mean[m], hist.m2[m]
			} else {
				d := mean - hist.mean[m]
				mean = hist.mean[m] + d*nb/cnt
				sq += hist.m2[m] + d*d*na*nb/cnt
			}
		}
		den := math.Sqrt(sq/(cnt-1)) + normEps
		for i := 0; i < rows; i++ {
			mel[i*fe.nMel+m] = float32((float64(mel[i*fe.nMel+m]) - mean) / den)
		}
	}
}
