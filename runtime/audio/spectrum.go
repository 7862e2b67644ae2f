package audio

import "fmt"

// PowerSpectrum computes the power spectrum |X[k]|², k = 0..n/2, of real frames of an even length
// n, in float64, with the FFT LogMel uses (any even n: radix 4, 2, 3 and 5 butterflies and a
// direct one for other primes). Front ends other than Whisper's (Parakeet's 512-point frames)
// build their spectrogram on it. It owns its scratch: use one per goroutine.
type PowerSpectrum struct {
	f      *realFFT
	z, tmp []complex128
}

// NewPowerSpectrum returns a PowerSpectrum for frames of n samples.
func NewPowerSpectrum(n int) (*PowerSpectrum, error) {
	f, err := newRealFFT(n)
	if err != nil {
		return nil, err
	}
	return &PowerSpectrum{f: f, z: make([]complex128, n/2), tmp: make([]complex128, n/2)}, nil
}

// Len is the frame length n.
func (p *PowerSpectrum) Len() int { return p.f.n }

// Power writes |X[k]|² of frame ([n]) into dst ([n/2+1]). It allocates nothing.
func (p *PowerSpectrum) Power(dst, frame []float64) error {
	n := p.f.n
	if len(frame) != n || len(dst) != n/2+1 {
		return fmt.Errorf("audio: power spectrum of %d points: frame of %d samples, %d bins (want %d and %d)",
			n, len(frame), len(dst), n, n/2+1)
	}
	for j := range p.z {
		p.z[j] = complex(frame[2*j], frame[2*j+1])
	}
	p.f.power(dst, p.z, p.tmp)
	return nil
}
