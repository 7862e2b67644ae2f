package audio

import (
	"fmt"
	"math"
	"runtime"
	"sync"
)

// Whisper's front end: 16 kHz input, 400-sample (25 ms) frames every 160 samples (10 ms), 30 s
// windows of 3000 frames.
const (
	SampleRate   = 16000                    // Hz, the rate Decode produces and LogMel expects
	FrameLength  = 400                      // samples per analysis frame (n_fft)
	HopLength    = 160                      // samples between frames
	FreqBins     = FrameLength/2 + 1        // power-spectrum bins per frame: 201
	ChunkSamples = 30 * SampleRate          // samples in one 30 s window
	WindowFrames = ChunkSamples / HopLength // frames the encoder takes at a time: 3000
)

const (
	padReflect    = FrameLength / 2 // samples reflected in front of the audio
	maxMelBins    = 1024            // bound on MelFilters.NMel
	logFloor      = 1e-10           // power floor before log10
	logFloorValue = -10             // log10(logFloor), the value of an all-zero frame
	melRange      = 8               // decades kept below the global maximum
	minChunk      = 32              // frames below which another worker is not worth starting
)

// MelFilters is a mel filter bank as stored in a Whisper model file: NMel triangular filters
// over the FreqBins bins of a FrameLength-point power spectrum.
type MelFilters struct {
	NMel int
	NFFT int       // bins per filter; must be FreqBins
	Data []float32 // [NMel, NFFT]
}

// MelFrames is the number of frames LogMel returns for n samples: the audio is followed by 30 s
// of silence, so every frame offset inside the audio has a full window after it.
func MelFrames(n int) int { return (n + ChunkSamples) / HopLength }

// MelContentFrames is the number of frames that overlap the audio itself (whisper.cpp's
// whisper_n_len): 1 + (n + 200 - 400) / 160, truncated toward zero as in C.
func MelContentFrames(n int) int { return 1 + (n+padReflect-FrameLength)/HopLength }

// melConsts is what every LogMel call shares: the FFT plan and the window.
var melConsts = sync.OnceValue(func() *melShared {
	f, err := newRealFFT(FrameLength)
	if err != nil {
		panic(err) // FrameLength is a constant even number
	}
	s := &melShared{fft: f}
	// whisper.cpp's periodic Hann window: float32(0.5·(1 - cosf(2πi/400))), the cosine taken of
	// the angle rounded to float32 and rounded to float32 itself.
	for i := range s.hann {
		a := float32(2 * math.Pi * float64(i) / FrameLength)
		c := float32(math.Cos(float64(a)))
		s.hann[i] = float64(float32(0.5 * (1 - float64(c))))
	}
	return s
})

type melShared struct {
	fft  *realFFT
	hann [FrameLength]float64
}

// sparseFilters keeps, per mel bin, only the span of nonzero weights: Whisper's 80 filters have
// 391 nonzero weights out of 16080, and a zero weight adds exactly nothing to the sum.
type sparseFilters struct {
	lo   []int       // [nMel] first bin with a nonzero weight
	w    [][]float64 // [nMel][hi-lo+1] weights from lo on
	nMel int
}

func (f MelFilters) sparse() (*sparseFilters, error) {
	if f.NFFT != FreqBins {
		return nil, fmt.Errorf("audio: mel filters have %d bins, want %d (a %d-point frame)", f.NFFT, FreqBins, FrameLength)
	}
	if f.NMel < 1 || f.NMel > maxMelBins {
		return nil, fmt.Errorf("audio: mel filters: %d mel bins, want 1..%d", f.NMel, maxMelBins)
	}
	if len(f.Data) != f.NMel*f.NFFT {
		return nil, fmt.Errorf("audio: mel filters: %d weights, want %d×%d", len(f.Data), f.NMel, f.NFFT)
	}
	s := &sparseFilters{lo: make([]int, f.NMel), w: make([][]float64, f.NMel), nMel: f.NMel}
	hi := make([]int, f.NMel)
	total := 0
	for j := 0; j < f.NMel; j++ {
		row := f.Data[j*f.NFFT : (j+1)*f.NFFT]
		s.lo[j], hi[j] = 0, -1
		for k, v := range row {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("audio: mel filters: weight [%d, %d] is %v", j, k, v)
			}
			if v != 0 {
				if hi[j] < 0 {
					s.lo[j] = k
				}
				hi[j] = k
			}
		}
		total += hi[j] - s.lo[j] + 1
	}
	all := make([]float64, total)
	for j := 0; j < f.NMel; j++ {
		w := all[:hi[j]-s.lo[j]+1]
		all = all[len(w):]
		for k := range w {
			w[k] = float64(f.Data[j*f.NFFT+s.lo[j]+k])
		}
		s.w[j] = w
	}
	return s, nil
}

// LogMel computes Whisper's log-mel spectrogram of 16 kHz mono samples exactly as whisper.cpp's
// log_mel_spectrogram does: reflect-pad 200 samples in front (samples[200..1]), append 30 s plus
// 200 samples of silence, take frames of 400 samples every 160 under a periodic Hann window,
// power spectrum over 201 bins, mel = filters · power, log10(max(mel, 1e-10)), clamp at the
// global maximum − 8, then (x + 4) / 4. Returns mel ([nMel, nFrames], row = mel bin) with
// nFrames = MelFrames(len(samples)); the encoder's input at frame offset o is
// MelWindow(dst, mel, nMel, nFrames, o, WindowFrames).
//
// Spectra are computed in float64 (whisper.cpp uses float32; the two agree within 3e-5 on
// speech). Clips shorter than 201 samples reflect what exists and zeros past it, where
// whisper.cpp would read past its buffer. Frames are spread over threads goroutines
// (GOMAXPROCS when threads ≤ 0); the result does not depend on threads.
func LogMel(samples []float32, f MelFilters, threads int) (mel []float32, nFrames int, err error) {
	sf, err := f.sparse()
	if err != nil {
		return nil, 0, err
	}
	n := len(samples)
	nFrames = MelFrames(n)
	mel = make([]float32, f.NMel*nFrames) // [nMel, nFrames]
	// Frames from nc on lie entirely in the appended silence; whisper.cpp fills them with
	// log10(1e-10) without transforming them, and so does this.
	nc := min((n+padReflect)/HopLength+1, nFrames)
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	workers := max(1, min(threads, (nc+minChunk-1)/minChunk))
	maxes := make([]float32, workers)
	sh := melConsts()
	per := (nc + workers - 1) / workers
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		i0, i1 := w*per, min(nc, (w+1)*per)
		run := func() {
			maxes[w] = melFrames(mel, nFrames, samples, sf, sh, i0, i1)
		}
		if w == workers-1 {
			run()
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); run() }()
	}
	wg.Wait()
	top := float32(math.Inf(-1))
	for _, m := range maxes {
		top = max(top, m)
	}
	if nc < nFrames {
		top = max(top, logFloorValue)
		for j := 0; j < f.NMel; j++ {
			row := mel[j*nFrames+nc : (j+1)*nFrames]
			for i := range row {
				row[i] = logFloorValue
			}
		}
	}
	parallelRows(f.NMel, workers, func(j0, j1 int) {
		ClampMel(mel[j0*nFrames:j1*nFrames], top)
	})
	return mel, nFrames, nil
}

// MelFloor is the value of a silent frame's every bin before ClampMel: log10 of the power floor.
// LogMel's frames that lie entirely in the silence appended to the audio hold it.
const MelFloor = logFloorValue

// ClampMel is LogMel's last step, applied to log10 mel energies in place: values below top − 8,
// top being the maximum over the whole spectrogram, are raised to it, then every value x becomes
// (x + 4) / 4. As in whisper.cpp, the maximum and the arithmetic are double, the stored values
// float.
func ClampMel(mel []float32, top float32) {
	floor := float64(top) - melRange
	floor32 := float64(float32(floor))
	for i, v := range mel {
		x := float64(v)
		if x < floor {
			x = floor32
		}
		mel[i] = float32((x + 4) / 4)
	}
}

// parallelRows calls fn over [0, n) split into at most workers contiguous ranges.
func parallelRows(n, workers int, fn func(j0, j1 int)) {
	workers = max(1, min(workers, n))
	per := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for j0 := per; j0 < n; j0 += per {
		wg.Add(1)
		go func(j0 int) { defer wg.Done(); fn(j0, min(n, j0+per)) }(j0)
	}
	fn(0, min(n, per))
	wg.Wait()
}

// melFrames writes log10 mel energies of frames [i0, i1) into mel ([nMel, nFrames]) and
// returns their maximum as stored (float32). It allocates its scratch once.
func melFrames(mel []float32, nFrames int, samples []float32, sf *sparseFilters, sh *melShared, i0, i1 int) float32 {
	top := float32(math.Inf(-1))
	if i0 >= i1 {
		return top
	}
	sc := newMelScratch()
	for i := i0; i < i1; i++ {
		top = max(top, sc.frame(mel[i:], nFrames, samples, 0, len(samples), i, sf, sh))
	}
	return top
}

// melScratch is one goroutine's work space for melScratch.frame.
type melScratch struct {
	z, tmp []complex128
	pow    []float64
}

func newMelScratch() *melScratch {
	const half = FrameLength / 2
	return &melScratch{z: make([]complex128, half), tmp: make([]complex128, half), pow: make([]float64, FreqBins)}
}

// frame writes the log10 mel energies of frame i, bin j at out[j*stride], and returns their
// maximum as stored (float32). buf holds samples [off, off+len(buf)) of audio of n samples: all
// that the frame reads of it (its 400 samples from i·160 − 200 on, and samples[1..200] reflected
// in front of the audio for the first frames).
func (sc *melScratch) frame(out []float32, stride int, buf []float32, off, n, i int, sf *sparseFilters, sh *melShared) float32 {
	top := float32(math.Inf(-1))
	z, tmp, pow := sc.z, sc.tmp, sc.pow
	o := i*HopLength - padReflect // index into the audio of the frame's first sample
	if o >= 0 && o+FrameLength <= n {
		x := buf[o-off : o-off+FrameLength]
		for j := range z {
			z[j] = complex(sh.hann[2*j]*float64(x[2*j]), sh.hann[2*j+1]*float64(x[2*j+1]))
		}
	} else {
		for j := range z {
			z[j] = complex(sh.hann[2*j]*paddedSample(buf, off, n, o+2*j), sh.hann[2*j+1]*paddedSample(buf, off, n, o+2*j+1))
		}
	}
	sh.fft.power(pow, z, tmp)
	for j := 0; j < sf.nMel; j++ {
		w := sf.w[j]
		p := pow[sf.lo[j] : sf.lo[j]+len(w)]
		sum := 0.0
		for k, c := range w {
			sum += p[k] * c
		}
		v := float32(math.Log10(max(sum, logFloor)))
		out[j*stride] = v
		top = max(top, v)
	}
	return top
}

// paddedSample is sample t of the audio after reflect padding: t < 0 mirrors sample −t (samples
// 1..200 reversed in front), t ≥ n is silence. buf holds samples [off, off+len(buf)) of the n.
func paddedSample(buf []float32, off, n, t int) float64 {
	if t < 0 {
		t = -t
	}
	if t >= n {
		return 0
	}
	return float64(buf[t-off])
}

// MelWindow copies frames [offset, offset+width) of mel ([nMel, nFrames]) into dst, resized to
// [nMel, width], and returns it. Frames past nFrames are zero, as in whisper.cpp's encoder input.
func MelWindow(dst, mel []float32, nMel, nFrames, offset, width int) ([]float32, error) {
	if nMel < 1 || nFrames < 0 || len(mel) != nMel*nFrames {
		return nil, fmt.Errorf("audio: mel window: %d values are not [%d, %d]", len(mel), nMel, nFrames)
	}
	if offset < 0 || width < 1 {
		return nil, fmt.Errorf("audio: mel window: offset %d, width %d", offset, width)
	}
	if cap(dst) < nMel*width {
		dst = make([]float32, nMel*width)
	}
	dst = dst[:nMel*width]
	i0 := min(offset, nFrames)
	i1 := min(offset+width, nFrames)
	for j := 0; j < nMel; j++ {
		row := dst[j*width : (j+1)*width]
		c := copy(row, mel[j*nFrames+i0:j*nFrames+i1])
		clear(row[c:])
	}
	return dst, nil
}

// SlaneyFilters returns the mel filter bank Whisper was trained with, for files that do not
// store one: librosa.filters.mel(sr=16000, n_fft=400, n_mels=nMel) with its defaults (Slaney's
// mel scale, linear below 1 kHz and logarithmic above, from 0 Hz to 8 kHz; each triangle
// normalised to unit area). It computes as librosa does, in float64, rounding each triangle's
// weight to float32 before scaling it and the scaled weight again, so the result is the filter
// bank OpenAI ships (mel_filters.npz) and whisper.cpp's files store.
func SlaneyFilters(nMel int) (MelFilters, error) {
	if nMel < 1 || nMel > maxMelBins {
		return MelFilters{}, fmt.Errorf("audio: %d mel bins is out of range (1 to %d)", nMel, maxMelBins)
	}
	// Variables, not constants: Go would fold constant expressions exactly, numpy rounds each step.
	fSp := 200.0 / 3 // Hz per mel below the break
	minLogHz := 1000.0
	minLogMel := minLogHz / fSp
	logStep := math.Log(6.4) / 27
	hzToMel := func(f float64) float64 {
		if f >= minLogHz {
			return minLogMel + math.Log(f/minLogHz)/logStep
		}
		return f / fSp
	}
	melToHz := func(m float64) float64 {
		if m >= minLogMel {
			return minLogHz * math.Exp(logStep*(m-minLogMel))
		}
		return fSp * m
	}
	// nMel+2 band edges evenly spaced in mel (numpy.linspace), and the FFT bins' frequencies.
	lo, hi := hzToMel(0), hzToMel(float64(SampleRate)/2)
	edges := make([]float64, nMel+2)
	step := (hi - lo) / float64(nMel+1)
	for i := range edges {
		edges[i] = melToHz(lo + float64(i)*step)
	}
	edges[nMel+1] = melToHz(hi)
	var freqs [FreqBins]float64 // numpy.fft.rfftfreq(400, 1/16000)
	d := 1.0 / SampleRate
	val := 1.0 / (FrameLength * d)
	for j := range freqs {
		freqs[j] = float64(j) * val
	}
	f := MelFilters{NMel: nMel, NFFT: FreqBins, Data: make([]float32, nMel*FreqBins)}
	for i := range nMel {
		d0, d1 := edges[i+1]-edges[i], edges[i+2]-edges[i+1]
		norm := 2 / (edges[i+2] - edges[i])
		for j, fr := range freqs {
			lower := -(edges[i] - fr) / d0
			upper := (edges[i+2] - fr) / d1
			w := float32(math.Max(0, math.Min(lower, upper)))
			f.Data[i*FreqBins+j] = float32(float64(w) * norm)
		}
	}
	return f, nil
}
