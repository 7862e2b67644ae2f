package audio

import (
	"fmt"
	"math"
)

// realFFT computes the power spectrum |X[k]|², k = 0..n/2, of a real frame of even length n. The
// frame is packed into a complex sequence of length m = n/2 (even samples real, odd samples
// imaginary), transformed by a mixed-radix self-sorting (Stockham) FFT and split into the
// spectrum of the real frame. Radices 4, 2, 3 and 5 have dedicated butterflies; any other prime
// factor takes a direct O(p²) butterfly. A realFFT is immutable after newRealFFT and safe for
// concurrent use; each caller brings its own scratch.
type realFFT struct {
	n, m   int
	stages []fftStage
	split  []complex128 // [m+1] exp(-2πi k/n)
}

// fftStage is one radix-p pass: it combines p transforms of length l/p into transforms of
// length l; r = m/l transforms of length l exist after it.
type fftStage struct {
	p, lq, r int
	tw       []complex128 // [lq, p-1]: exp(-2πi s·k/l) for k < lq, s = 1..p-1
	wp       []complex128 // [p] exp(-2πi j/p), used by the generic butterfly
}

func newRealFFT(n int) (*realFFT, error) {
	if n < 2 || n%2 != 0 {
		return nil, fmt.Errorf("audio: fft length %d is not a positive even number", n)
	}
	f := &realFFT{n: n, m: n / 2}
	m := f.m
	var radices []int
	for r := m; r > 1; {
		switch {
		case r%4 == 0:
			radices = append(radices, 4)
			r /= 4
		case r%2 == 0:
			radices = append(radices, 2)
			r /= 2
		default:
			p := 3
			for r%p != 0 {
				p += 2
			}
			radices = append(radices, p)
			r /= p
		}
	}
	lq := 1
	for _, p := range radices {
		l := lq * p
		st := fftStage{p: p, lq: lq, r: m / l, tw: make([]complex128, lq*(p-1))}
		for k := 0; k < lq; k++ {
			for s := 1; s < p; s++ {
				st.tw[k*(p-1)+s-1] = cis(-2 * math.Pi * float64(s*k) / float64(l))
			}
		}
		if p > 5 {
			st.wp = make([]complex128, p)
			for j := range st.wp {
				st.wp[j] = cis(-2 * math.Pi * float64(j) / float64(p))
			}
		}
		f.stages = append(f.stages, st)
		lq = l
	}
	f.split = make([]complex128, m+1)
	for k := range f.split {
		f.split[k] = cis(-2 * math.Pi * float64(k) / float64(n))
	}
	return f, nil
}

func cis(t float64) complex128 {
	s, c := math.Sincos(t)
	return complex(c, s)
}

// power writes |X[k]|² for k = 0..n/2 into dst ([n/2+1]). z holds the frame packed as
// z[j] = x[2j] + i·x[2j+1] ([n/2]) and is overwritten, as is tmp ([n/2]).
func (f *realFFT) power(dst []float64, z, tmp []complex128) {
	m := f.m
	dst = dst[:m+1]
	z, tmp = z[:m], tmp[:m]
	x, y := z, tmp
	for i := range f.stages {
		f.stages[i].run(x, y)
		x, y = y, x
	}
	// x holds Z = FFT_m(z). With E = (Z[k] + conj Z[m-k])/2 and O = (Z[k] - conj Z[m-k])/(2i),
	// the spectrum of the real frame is X[k] = E + exp(-2πi k/n)·O.
	for k := 0; k <= m/2; k++ {
		a := x[k%m]
		b := x[(m-k)%m]
		// k and m-k are computed together: they share a and b.
		bc := complex(real(b), -imag(b))
		e := (a + bc) * 0.5
		d := (a - bc) * 0.5
		o := complex(imag(d), -real(d))
		v := e + f.split[k]*o
		dst[k] = real(v)*real(v) + imag(v)*imag(v)
		if k2 := m - k; k2 != k {
			ac := complex(real(a), -imag(a))
			e2 := (b + ac) * 0.5
			d2 := (b - ac) * 0.5
			o2 := complex(imag(d2), -real(d2))
			v2 := e2 + f.split[k2]*o2
			dst[k2] = real(v2)*real(v2) + imag(v2)*imag(v2)
		}
	}
}

// run applies one radix-p pass from x to y (both [m]). With r* = p·r, transform q (of r*) of
// length lq sits at x[k·r* + q]; the combined transform q' (of r) of length l = p·lq goes to
// y[(k + lq·j)·r + q'].
func (st *fftStage) run(x, y []complex128) {
	p, lq, r := st.p, st.lq, st.r
	rs := r * p
	switch p {
	case 2:
		for k := 0; k < lq; k++ {
			w1 := st.tw[k]
			in := x[k*rs : k*rs+rs]
			o0 := y[k*r : k*r+r]
			o1 := y[(k+lq)*r : (k+lq)*r+r]
			for q := 0; q < r; q++ {
				a0 := in[q]
				a1 := in[r+q] * w1
				o0[q] = a0 + a1
				o1[q] = a0 - a1
			}
		}
	case 4:
		for k := 0; k < lq; k++ {
			tw := st.tw[k*3 : k*3+3]
			in := x[k*rs : k*rs+rs]
			o0 := y[k*r : k*r+r]
			o1 := y[(k+lq)*r : (k+lq)*r+r]
			o2 := y[(k+2*lq)*r : (k+2*lq)*r+r]
			o3 := y[(k+3*lq)*r : (k+3*lq)*r+r]
			for q := 0; q < r; q++ {
				a0 := in[q]
				a1 := in[r+q] * tw[0]
				a2 := in[2*r+q] * tw[1]
				a3 := in[3*r+q] * tw[2]
				s02, d02 := a0+a2, a0-a2
				s13, d13 := a1+a3, a1-a3
				// -i·d13
				md := complex(imag(d13), -real(d13))
				o0[q] = s02 + s13
				o1[q] = d02 + md
				o2[q] = s02 - s13
				o3[q] = d02 - md
			}
		}
	case 3:
		const s3 = 0.86602540378443864676 // sin(2π/3)
		for k := 0; k < lq; k++ {
			tw := st.tw[k*2 : k*2+2]
			in := x[k*rs : k*rs+rs]
			o0 := y[k*r : k*r+r]
			o1 := y[(k+lq)*r : (k+lq)*r+r]
			o2 := y[(k+2*lq)*r : (k+2*lq)*r+r]
			for q := 0; q < r; q++ {
				a0 := in[q]
				a1 := in[r+q] * tw[0]
				a2 := in[2*r+q] * tw[1]
				t := a1 + a2
				u := a1 - a2
				c := a0 - t*0.5
				// -i·s3·u
				v := complex(s3*imag(u), -s3*real(u))
				o0[q] = a0 + t
				o1[q] = c + v
				o2[q] = c - v
			}
		}
	case 5:
		const (
			c1 = 0.30901699437494742410  // cos(2π/5)
			c2 = -0.80901699437494742410 // cos(4π/5)
			s1 = 0.95105651629515357212  // sin(2π/5)
			s2 = 0.58778525229247312917  // sin(4π/5)
		)
		for k := 0; k < lq; k++ {
			tw := st.tw[k*4 : k*4+4]
			in := x[k*rs : k*rs+rs]
			o0 := y[k*r : k*r+r]
			o1 := y[(k+lq)*r : (k+lq)*r+r]
			o2 := y[(k+2*lq)*r : (k+2*lq)*r+r]
			o3 := y[(k+3*lq)*r : (k+3*lq)*r+r]
			o4 := y[(k+4*lq)*r : (k+4*lq)*r+r]
			for q := 0; q < r; q++ {
				a0 := in[q]
				a1 := in[r+q] * tw[0]
				a2 := in[2*r+q] * tw[1]
				a3 := in[3*r+q] * tw[2]
				a4 := in[4*r+q] * tw[3]
				t1, t3 := a1+a4, a1-a4
				t2, t4 := a2+a3, a2-a3
				b1 := a0 + t1*c1 + t2*c2
				b2 := a0 + t1*c2 + t2*c1
				// u1 = s1·t3 + s2·t4, u2 = s2·t3 - s1·t4; outputs subtract/add i·u.
				u1 := t3*s1 + t4*s2
				u2 := t3*s2 - t4*s1
				iu1 := complex(-imag(u1), real(u1))
				iu2 := complex(-imag(u2), real(u2))
				o0[q] = a0 + t1 + t2
				o1[q] = b1 - iu1
				o4[q] = b1 + iu1
				o2[q] = b2 - iu2
				o3[q] = b2 + iu2
			}
		}
	default:
		pm := p - 1
		for k := 0; k < lq; k++ {
			tw := st.tw[k*pm : k*pm+pm]
			for q := 0; q < r; q++ {
				for j := 0; j < p; j++ {
					acc := x[k*rs+q]
					for s := 1; s < p; s++ {
						acc += x[k*rs+s*r+q] * tw[s-1] * st.wp[(s*j)%p]
					}
					y[(k+lq*j)*r+q] = acc
				}
			}
		}
	}
}
