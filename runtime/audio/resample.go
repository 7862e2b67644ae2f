package audio

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
)

// Resampler design. The kernel is a Kaiser-windowed sinc whose band edges follow the narrower of
// the two Nyquist bands B = min(in, out)/2: the passband reaches 0.9·B, the stopband starts at
// B, the cutoff sits midway. With 70 dB of stopband attenuation, everything above B (what would
// alias when downsampling, or the images when upsampling) is at least 60 dB down with margin,
// and the passband ripple is about ±0.003 dB.
const (
	resampleAtten    = 70.0    // dB, Kaiser design target
	resamplePassFrac = 0.9     // passband edge as a fraction of B
	maxExactTaps     = 1 << 20 // coefficients in an exact polyphase bank (phases × taps)
	interpPhases     = 256     // phases of the interpolated bank for rate pairs with too many phases
)

// Sample rates Decode and Resampler accept.
const (
	MinRate = 1000   // Hz
	MaxRate = 768000 // Hz
)

// Resampler converts a mono stream from one sample rate to another with a band-limited
// (Kaiser-windowed sinc, polyphase) filter. Output sample k sits at input time k·in/out; the
// filter is centred on it (zero phase), so the output is aligned with the input and has
// ceil(n·out/in) samples for n input samples once Flush has been called. Feeding the input in
// any chunking gives the same output as feeding it at once. When both rates are equal, samples
// pass through unchanged. A Resampler is not safe for concurrent use.
type Resampler struct {
	in, out int
	k       *kernel // nil when in == out
	buf     []float32
	base    int64 // input index of buf[0]
	nIn     int64 // input samples received
	next    int64 // index of the next output sample
	flushed bool
}

// kernel is an immutable polyphase filter bank for one rate pair, shared between Resamplers.
type kernel struct {
	l, m   int64     // out/in reduced: output k sits at input position k·m/l
	half   int       // taps on each side of the output position
	taps   int       // 2·half
	phases int       // rows in bank: l when exact, interpPhases+1 when interpolated
	exact  bool      // bank row p is phase p/l exactly; otherwise rows are interpolated
	bank   []float32 // [phases, taps]
}

// NewResampler returns a Resampler from inRate to outRate, both in [MinRate, MaxRate] Hz.
func NewResampler(inRate, outRate int) (*Resampler, error) {
	for _, r := range []int{inRate, outRate} {
		if r < MinRate || r > MaxRate {
			return nil, fmt.Errorf("audio: resampler: rate %d Hz outside [%d, %d]: %w", r, MinRate, MaxRate, ErrUnsupported)
		}
	}
	r := &Resampler{in: inRate, out: outRate}
	if inRate != outRate {
		r.k = kernelFor(inRate, outRate)
		// half-1 zeros stand for the silence before the first sample.
		r.buf = make([]float32, r.k.half-1, r.k.half-1+4096)
		r.base = -int64(r.k.half - 1)
	}
	return r, nil
}

// Resample converts a whole mono signal from inRate to SampleRate into a new slice (a copy
// when inRate is SampleRate).
func Resample(src []float32, inRate int) ([]float32, error) {
	r, err := NewResampler(inRate, SampleRate)
	if err != nil {
		return nil, err
	}
	dst := make([]float32, 0, r.OutLen(int64(len(src))))
	dst = r.Process(dst, src)
	return r.Flush(dst), nil
}

// OutLen is the number of output samples n input samples produce: ceil(n·out/in).
func (r *Resampler) OutLen(n int64) int64 {
	if r.k == nil {
		return n
	}
	return (n*r.k.l + r.k.m - 1) / r.k.m
}

// Process appends to dst the output samples that src completes and returns it. Samples whose
// filter reaches past the input received so far wait for more input or for Flush.
func (r *Resampler) Process(dst, src []float32) []float32 {
	if r.flushed {
		return dst
	}
	if r.k == nil {
		r.nIn += int64(len(src))
		return append(dst, src...)
	}
	r.buf = append(r.buf, src...)
	r.nIn += int64(len(src))
	return r.emit(dst, r.nIn)
}

// Flush appends the remaining output, treating the input as followed by silence, and ends the
// stream: later Process calls produce nothing.
func (r *Resampler) Flush(dst []float32) []float32 {
	if r.flushed || r.k == nil {
		r.flushed = true
		return dst
	}
	r.flushed = true
	r.buf = append(r.buf, make([]float32, r.k.half)...)
	return r.emit(dst, r.nIn+int64(r.k.half))
}

// emit produces outputs while their taps lie below input index avail and, once flushing, while
// fewer than ceil(nIn·l/m) have been produced.
func (r *Resampler) emit(dst []float32, avail int64) []float32 {
	k := r.k
	h := int64(k.half)
	// Output j is ready when ipos(j) + h < avail, i.e. j·m < (avail - h)·l.
	end := r.next
	if avail > h {
		end = max(end, ((avail-h)*k.l+k.m-1)/k.m)
	}
	if r.flushed {
		end = min(end, r.OutLen(r.nIn))
	}
	if n := int(end - r.next); n > 0 {
		dst = slices.Grow(dst, n)
		out := dst[len(dst) : len(dst)+n]
		first := r.next
		workers := min(runtime.GOMAXPROCS(0), n/parallelOutputs)
		if workers <= 1 {
			r.run(out, first)
		} else {
			per := (n + workers - 1) / workers
			var wg sync.WaitGroup
			for i := per; i < n; i += per {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					r.run(out[i:min(n, i+per)], first+int64(i))
				}(i)
			}
			r.run(out[:min(n, per)], first)
			wg.Wait()
		}
		dst = dst[:len(dst)+n]
		r.next = end
	}
	// Drop input no later output needs: output r.next starts at ipos(r.next) - h + 1.
	keep := (r.next*k.m)/k.l - h + 1
	if drop := int(min(keep-r.base, int64(len(r.buf)))); drop > 0 && drop >= len(r.buf)/2 {
		n := copy(r.buf, r.buf[drop:])
		r.buf = r.buf[:n]
		r.base += int64(drop)
	}
	return dst
}

// parallelOutputs is the number of outputs below which another goroutine is not worth starting.
const parallelOutputs = 16384

// run computes outputs first, first+1, ... into out; their taps are all in r.buf.
func (r *Resampler) run(out []float32, first int64) {
	k := r.k
	h := int64(k.half)
	for i := range out {
		num := (first + int64(i)) * k.m
		ipos := num / k.l
		start := int(ipos - h + 1 - r.base)
		x := r.buf[start : start+k.taps]
		phase := num % k.l
		if k.exact {
			out[i] = dot(k.bank[int(phase)*k.taps:][:k.taps], x)
			continue
		}
		pos := float64(phase) / float64(k.l) * interpPhases
		p0 := int(pos)
		w := float32(pos - float64(p0))
		a := dot(k.bank[p0*k.taps:][:k.taps], x)
		b := dot(k.bank[(p0+1)*k.taps:][:k.taps], x)
		out[i] = a + w*(b-a)
	}
}

// dot is Σ a[i]·b[i] over float32 with four partial sums.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// kernelSpec is the continuous filter for a rate pair, in input samples.
type kernelSpec struct {
	nu   float64 // cutoff in cycles per input sample
	beta float64 // Kaiser β
	half int     // window half-width in input samples
}

func specFor(inRate, outRate int) kernelSpec {
	b := float64(min(inRate, outRate)) / 2
	fc := (1 + resamplePassFrac) / 2 * b
	trans := (1 - resamplePassFrac) * b / float64(inRate) // cycles per input sample
	// Kaiser's estimates: length N = (A - 7.95) / (2.285·2π·Δf), β = 0.1102·(A - 8.7).
	n := (resampleAtten - 7.95) / (2.285 * 2 * math.Pi * trans)
	return kernelSpec{
		nu:   fc / float64(inRate),
		beta: 0.1102 * (resampleAtten - 8.7),
		half: int(math.Ceil(n/2)) + 1,
	}
}

// eval is the kernel at input-sample offset t from the output position.
func (s kernelSpec) eval(t float64) float64 {
	u := t / float64(s.half)
	if u <= -1 || u >= 1 {
		return 0
	}
	x := 2 * s.nu * t
	sinc := 1.0
	if x != 0 {
		sinc = math.Sin(math.Pi*x) / (math.Pi * x)
	}
	return 2 * s.nu * sinc * besselI0(s.beta*math.Sqrt(1-u*u)) / besselI0(s.beta)
}

// besselI0 is the modified Bessel function of the first kind, order 0, by its power series.
func besselI0(x float64) float64 {
	sum, term := 1.0, 1.0
	q := x * x / 4
	for k := 1; k < 200; k++ {
		term *= q / float64(k*k)
		sum += term
		if term < sum*1e-17 {
			break
		}
	}
	return sum
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func newKernel(inRate, outRate int) *kernel {
	s := specFor(inRate, outRate)
	g := gcd(int64(inRate), int64(outRate))
	k := &kernel{l: int64(outRate) / g, m: int64(inRate) / g, half: s.half, taps: 2 * s.half}
	k.exact = k.l*int64(k.taps) <= maxExactTaps
	if k.exact {
		k.phases = int(k.l)
	} else {
		k.phases = interpPhases + 1
	}
	k.bank = make([]float32, k.phases*k.taps)
	for p := 0; p < k.phases; p++ {
		var frac float64
		if k.exact {
			frac = float64(p) / float64(k.l)
		} else {
			frac = float64(p) / interpPhases
		}
		row := k.bank[p*k.taps : (p+1)*k.taps]
		// Tap j reads input ipos - half + 1 + j; the output sits at ipos + frac.
		for j := range row {
			row[j] = float32(s.eval(float64(j-s.half+1) - frac))
		}
	}
	return k
}

// kernels caches the banks of the first few rate pairs seen. Rates come from user input, so the
// cache is bounded in entries and in bank size (the common rates need at most 57600
// coefficients, 11025 Hz); other pairs build their bank per Resampler.
var kernels struct {
	sync.Mutex
	m map[[2]int]*kernel
}

const (
	maxCachedKernels = 16
	maxCachedBank    = 1 << 16
)

func kernelFor(inRate, outRate int) *kernel {
	key := [2]int{inRate, outRate}
	kernels.Lock()
	k := kernels.m[key]
	kernels.Unlock()
	if k != nil {
		return k
	}
	k = newKernel(inRate, outRate)
	kernels.Lock()
	if kernels.m == nil {
		kernels.m = make(map[[2]int]*kernel)
	}
	if len(kernels.m) < maxCachedKernels && len(k.bank) <= maxCachedBank {
		kernels.m[key] = k
	}
	kernels.Unlock()
	return k
}
