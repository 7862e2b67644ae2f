package purego

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/runtime/quant"
)

// TestAxpy4 checks the dispatched axpy4 and axpy4F16 (assembly where the CPU allows) against
// float64 sums, for lengths around the 8-element vector width. Each output is one float32
// rounding of products and sums of five terms: within 8·2^-24 of the sum of their magnitudes.
func TestAxpy4(t *testing.T) {
	f16Once.Do(initF16Table)
	r := rand.New(rand.NewPCG(7, 11))
	t.Logf("kernels: %s", simdKernels)
	for _, n := range []int{1, 7, 8, 9, 16, 63, 64, 65, 128} {
		y := make([]float32, n)
		x := make([][]float32, 4)
		h := make([][]uint16, 4)
		for k := range x {
			x[k] = make([]float32, n)
			h[k] = make([]uint16, n)
			for i := range x[k] {
				h[k][i] = quant.F32ToF16(float32(r.NormFloat64()))
				x[k][i] = quant.F16ToF32(h[k][i])
			}
		}
		f := [4]float32{float32(r.NormFloat64()), float32(r.NormFloat64()), float32(r.NormFloat64()), float32(r.NormFloat64())}
		for i := range y {
			y[i] = float32(r.NormFloat64())
		}
		for _, impl := range []struct {
			name string
			run  func(y []float32)
		}{
			{"axpy4", func(y []float32) { axpy4(y, f[0], f[1], f[2], f[3], x[0], x[1], x[2], x[3]) }},
			{"axpy4Go", func(y []float32) { axpy4Go(y, f[0], f[1], f[2], f[3], x[0], x[1], x[2], x[3]) }},
			{"axpy4F16", func(y []float32) { axpy4F16(y, f[0], f[1], f[2], f[3], h[0], h[1], h[2], h[3]) }},
			{"axpy4F16Go", func(y []float32) { axpy4F16Go(y, f[0], f[1], f[2], f[3], h[0], h[1], h[2], h[3]) }},
		} {
			got := append([]float32(nil), y...)
			impl.run(got)
			for i := range got {
				want, mag := float64(y[i]), math.Abs(float64(y[i]))
				for k := range x {
					want += float64(f[k]) * float64(x[k][i])
					mag += math.Abs(float64(f[k]) * float64(x[k][i]))
				}
				if d := math.Abs(float64(got[i]) - want); d > 8*0x1p-24*mag {
					t.Fatalf("%s n=%d: y[%d] = %v, want %v", impl.name, n, i, got[i], want)
				}
			}
		}
	}
}

// TestScaleRoundF16 checks the dispatched scaleRoundF16 (assembly where the CPU allows) and its
// Go form against quant.F32ToF16 exactly, on values of every F16 range: normal, subnormal,
// below the smallest subnormal, overflowing, and exact ties between two F16 values.
func TestScaleRoundF16(t *testing.T) {
	f16Once.Do(initF16Table)
	r := rand.New(rand.NewPCG(3, 5))
	var src []float32
	for i := 0; i < 4096; i++ {
		e := r.Float64()*50 - 32 // magnitudes 2^-32 .. 2^18
		src = append(src, float32(math.Copysign(math.Exp2(e), r.NormFloat64())))
	}
	for i := 0; i < 512; i++ {
		// The midpoint between an F16 value and the next: exactly a tie in float32.
		h := uint16(r.IntN(0x7bff))
		src = append(src, (quant.F16ToF32(h)+quant.F16ToF32(h+1))/2, -(quant.F16ToF32(h)+quant.F16ToF32(h+1))/2)
	}
	src = append(src, 0, float32(math.Copysign(0, -1)), 65504, 65520, 65519.996, 0x1p-24, 0x1p-25, 0x1.000002p-25, 0x1p-26)
	for _, f := range []float32{1, 0.3, 1.0 / 3} {
		for _, n := range []int{1, 7, 8, 9, 31, len(src)} {
			for _, impl := range []struct {
				name string
				run  func(dst, src []float32, f float32)
			}{{"scaleRoundF16", scaleRoundF16}, {"scaleRoundF16Go", scaleRoundF16Go}} {
				dst := make([]float32, n)
				impl.run(dst, src, f)
				for i, got := range dst {
					want := quant.F16ToF32(quant.F32ToF16(src[i] * f))
					if math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%s(f %v, n %d): element %d (%v): %v, want %v", impl.name, f, n, i, src[i], got, want)
					}
				}
				inPlace := append([]float32(nil), src[:n]...)
				impl.run(inPlace, inPlace, f)
				for i := range inPlace {
					if math.Float32bits(inPlace[i]) != math.Float32bits(dst[i]) {
						t.Fatalf("%s in place (f %v, n %d): element %d differs", impl.name, f, n, i)
					}
				}
			}
		}
	}
}

// TestDot4F16 checks the dispatched dot4F16 (assembly where the CPU allows) and its Go form
// against float64 sums. Products of F16 keys and F16-valued queries are exact in float32; the
// float32 sums over whole blocks of f16Block add at most (n+2)·2^-24 of Σ|products|. Shorter
// rows are summed in float64 and must equal the float64 sum rounded to float32 exactly.
func TestDot4F16(t *testing.T) {
	f16Once.Do(initF16Table)
	r := rand.New(rand.NewPCG(19, 23))
	for _, n := range []int{1, 7, 8, 9, 16, 31, 32, 33, 64, 72, 100, 128} {
		q := make([]float32, n)
		for i := range q {
			q[i] = quant.F16ToF32(quant.F32ToF16(float32(r.NormFloat64() * 2)))
		}
		k := make([][]uint16, 4)
		for j := range k {
			k[j] = make([]uint16, n)
			for i := range k[j] {
				k[j][i] = quant.F32ToF16(float32(r.NormFloat64()))
			}
		}
		for _, impl := range []struct {
			name string
			run  func(q []float32, k0, k1, k2, k3 []uint16) (s0, s1, s2, s3 float32)
		}{{"dot4F16", dot4F16}, {"dot4F16Go", dot4F16Go}} {
			s0, s1, s2, s3 := impl.run(q, k[0], k[1], k[2], k[3])
			for j, got := range []float32{s0, s1, s2, s3} {
				want, mag := 0.0, 0.0
				for i, v := range q {
					p := float64(v) * float64(quant.F16ToF32(k[j][i]))
					want += p
					mag += math.Abs(p)
				}
				if n < f16Block {
					if got != float32(want) {
						t.Fatalf("%s n=%d: row %d = %v, want %v (float64 sum)", impl.name, n, j, got, float32(want))
					}
				} else if d := math.Abs(float64(got) - want); d > float64(n+2)*0x1p-24*mag {
					t.Fatalf("%s n=%d: row %d = %v, want %v", impl.name, n, j, got, want)
				}
			}
		}
	}
}

// TestScores2 checks the dispatched scores2 and scores2F16 (assembly where the CPU allows) and
// their Go forms against float64 sums, over keys kstride apart (an odd stride), with two
// different query rows and with one row given twice. Products of F16 keys and F16-valued queries
// are exact in float32; float32 sums of hd products add at most (hd+2)·2^-24 of Σ|products|,
// and the scale one more rounding.
func TestScores2(t *testing.T) {
	f16Once.Do(initF16Table)
	r := rand.New(rand.NewPCG(29, 31))
	const scale = 0.37
	for _, hd := range []int{8, 32, 64, 96} {
		for _, nk := range []int{4, 8, 64} {
			kstride := hd + 5
			q := [2][]float32{make([]float32, hd), make([]float32, hd)}
			for _, row := range q {
				for i := range row {
					row[i] = quant.F16ToF32(quant.F32ToF16(float32(r.NormFloat64() * 2)))
				}
			}
			k32 := make([]float32, (nk-1)*kstride+hd)
			k16 := make([]uint16, len(k32))
			for i := range k32 {
				k16[i] = quant.F32ToF16(float32(r.NormFloat64()))
				k32[i] = quant.F16ToF32(k16[i])
			}
			for _, impl := range []struct {
				name string
				run  func(q0, q1 []float32, s0, s1 []float32)
			}{
				{"scores2", func(q0, q1, s0, s1 []float32) { scores2(q0, q1, k32, kstride, nk, scale, s0, s1) }},
				{"scores2Go", func(q0, q1, s0, s1 []float32) { scores2Go(q0, q1, k32, kstride, nk, scale, s0, s1) }},
				{"scores2F16", func(q0, q1, s0, s1 []float32) { scores2F16(q0, q1, k16, kstride, nk, scale, s0, s1) }},
				{"scores2F16Go", func(q0, q1, s0, s1 []float32) { scores2F16Go(q0, q1, k16, kstride, nk, scale, s0, s1) }},
			} {
				for _, same := range []bool{false, true} {
					q1 := q[1]
					if same {
						q1 = q[0]
					}
					s0, s1 := make([]float32, nk), make([]float32, nk)
					impl.run(q[0], q1, s0, s1)
					for r, pair := range [2]struct {
						q []float32
						s []float32
					}{{q[0], s0}, {q1, s1}} {
						for j, got := range pair.s {
							want, mag := 0.0, 0.0
							for d, v := range pair.q {
								p := float64(v) * float64(k32[j*kstride+d])
								want += p
								mag += math.Abs(p)
							}
							want *= scale
							if d := math.Abs(float64(got) - want); d > float64(hd+3)*0x1p-24*mag*scale {
								t.Fatalf("%s hd=%d nk=%d same=%v: row %d key %d = %v, want %v", impl.name, hd, nk, same, r, j, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// TestPV2 checks the dispatched pv2 and pv2F16 (assembly where the CPU allows) and their Go
// forms against float64 sums, over values vstride apart, for two rows and for one row given
// twice with the same weights. Each output is a float32 sum of nk+1 terms (products of a weight
// and an F16-valued value are exact in float64 but rounded in float32): within (nk+2)·2^-24 of
// the sum of their magnitudes.
func TestPV2(t *testing.T) {
	f16Once.Do(initF16Table)
	r := rand.New(rand.NewPCG(37, 41))
	for _, nk := range []int{1, 3, 64, 100} {
		vstride := pvWidth + 7
		v32 := make([]float32, (nk-1)*vstride+pvWidth)
		v16 := make([]uint16, len(v32))
		for i := range v32 {
			v16[i] = quant.F32ToF16(float32(r.NormFloat64()))
			v32[i] = quant.F16ToF32(v16[i])
		}
		p := [2][]float32{make([]float32, nk), make([]float32, nk)}
		o := [2][]float32{make([]float32, pvWidth), make([]float32, pvWidth)}
		for k := range p {
			for i := range p[k] {
				p[k][i] = float32(r.Float64())
			}
			for i := range o[k] {
				o[k][i] = float32(r.NormFloat64())
			}
		}
		for _, impl := range []struct {
			name string
			run  func(o0, o1, p0, p1 []float32)
		}{
			{"pv2", func(o0, o1, p0, p1 []float32) { pv2(o0, o1, p0, p1, v32, vstride, nk) }},
			{"pv2Go", func(o0, o1, p0, p1 []float32) { pv2Go(o0, o1, p0, p1, v32, vstride, nk) }},
			{"pv2F16", func(o0, o1, p0, p1 []float32) { pv2F16(o0, o1, p0, p1, v16, vstride, nk) }},
			{"pv2F16Go", func(o0, o1, p0, p1 []float32) { pv2F16Go(o0, o1, p0, p1, v16, vstride, nk) }},
		} {
			for _, same := range []bool{false, true} {
				g0 := append([]float32(nil), o[0]...)
				g1, p1, init1 := append([]float32(nil), o[1]...), p[1], o[1]
				if same {
					g1, p1, init1 = g0, p[0], o[0]
				}
				impl.run(g0, g1, p[0], p1)
				for k, c := range [2]struct {
					got, init, p []float32
				}{{g0, o[0], p[0]}, {g1, init1, p1}} {
					for d, got := range c.got {
						want, mag := float64(c.init[d]), math.Abs(float64(c.init[d]))
						for j, w := range c.p {
							x := float64(w) * float64(v32[j*vstride+d])
							want += x
							mag += math.Abs(x)
						}
						if diff := math.Abs(float64(got) - want); diff > float64(nk+2)*0x1p-24*mag {
							t.Fatalf("%s nk=%d same=%v: row %d element %d = %v, want %v", impl.name, nk, same, k, d, got, want)
						}
					}
				}
			}
		}
	}
}

// TestGELUKernel checks the dispatched gelu (assembly where the CPU allows) and its Go form
// against float64 x·σ(2u), u = sqrt(2/π)·(x + 0.044715·x³), for lengths around the vector width
// and values out to where exp(-2u) overflows or underflows float32 (results -0 and x). u takes
// about five float32 roundings, which moves exp(-2u) by |2u|·5·2^-24 relative, plus 8·2^-24 of
// the exp polynomial; that reaches the result scaled by σ(-2u), and 1+e, the division add
// three roundings. Where exp(-2u) passes 88 the assembly takes it as +Inf: the result is then
// below 2^-126·|x| in magnitude.
func TestGELUKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 47))
	for _, n := range []int{1, 7, 8, 9, 33, 100} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 4)
		}
		tails := []float32{-1e20, -100, -9.7, 9.7, 100, 1e20, -0.001, 0.001}
		for i := 0; i < n && i < len(tails); i++ {
			x[(i*5)%n] = tails[i]
		}
		for _, impl := range []struct {
			name string
			run  func(y, x []float32)
		}{{"gelu", gelu}, {"geluGo", geluGo}} {
			y := make([]float32, n)
			impl.run(y, x)
			inPlace := append([]float32(nil), x...)
			impl.run(inPlace, inPlace)
			for i, got := range y {
				xv := float64(x[i])
				u := math.Sqrt(2/math.Pi) * (xv + 0.044715*xv*xv*xv)
				want := xv / (1 + math.Exp(-2*u))
				sig := 1 / (1 + math.Exp(2*u))
				tol := math.Abs(want)*(sig*(10*math.Abs(u)+8)*0x1p-24+4*0x1p-24) + 0x1p-126*math.Abs(xv)
				if d := math.Abs(float64(got) - want); !(d <= tol) {
					t.Fatalf("%s n=%d: gelu(%v) = %v, want %v", impl.name, n, x[i], got, want)
				}
				if math.Float32bits(inPlace[i]) != math.Float32bits(got) {
					t.Fatalf("%s n=%d in place: element %d differs", impl.name, n, i)
				}
			}
		}
	}
}
