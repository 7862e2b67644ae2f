package vec

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestExpf compares Expf with float64 exp over the range log-probabilities and attention
// scores take, in fine steps, at the underflow edge and at ±Inf. Bound: 3e-7 relative (2 ulp of
// float32).
func TestExpf(t *testing.T) {
	var worst float64
	for x := float32(-87.3); x <= 10; x += 0.000731 {
		want := math.Exp(float64(x))
		got := float64(Expf(x))
		if rel := math.Abs(got-want) / want; rel > worst {
			worst = rel
		}
	}
	t.Logf("max relative error %.3g", worst)
	if worst > 3e-7 {
		t.Errorf("Expf is off by %.3g relative", worst)
	}
	if Expf(float32(math.Inf(-1))) != 0 || Expf(-100) != 0 || Expf(0) != 1 || !math.IsInf(float64(Expf(100)), 1) {
		t.Errorf("Expf(-Inf) %v, Expf(-100) %v, Expf(0) %v, Expf(100) %v", Expf(float32(math.Inf(-1))), Expf(-100), Expf(0), Expf(100))
	}
}

// TestExpSum checks the dispatched expSum (assembly where the CPU allows) and its Go form
// against float64 exp of the same float32 argument x[i]-m, over arguments from 0 down past the
// point (-87.34) below which both return 0, which spans float32's subnormal results. The result
// is a Taylor polynomial of degree 7 (truncation below 6e-9 relative) after a range reduction
// and about ten float32 operations: within 8·2^-24 relative, or 2^-148 absolute for subnormal
// results. The sum is the float64 sum of the results, up to the order of additions.
func TestExpSum(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 17))
	const m = 3.25
	for _, n := range []int{1, 7, 8, 9, 17, 64, 1000} {
		x := make([]float32, n)
		for i := range x {
			x[i] = m - float32(r.Float64()*95)
			if i%5 == 0 {
				x[i] = m - float32(r.Float64()*2)
			}
		}
		x[0] = m
		for _, impl := range []struct {
			name string
			run  func(x []float32, m float32) float64
		}{{"ExpSum (" + Kernels + ")", ExpSum}, {"expSumGo", expSumGo}} {
			got := append([]float32(nil), x...)
			sum := impl.run(got, m)
			want := 0.0
			for i, v := range got {
				a := x[i] - m
				e := math.Exp(float64(a))
				if a < -87.33654 {
					e = 0
				}
				if d := math.Abs(float64(v) - e); d > 8*0x1p-24*e && d > 0x1p-148 {
					t.Fatalf("%s n=%d: exp(%v) = %v, want %v", impl.name, n, a, v, e)
				}
				want += float64(v)
			}
			if math.Abs(sum-want) > 1e-12*want {
				t.Fatalf("%s n=%d: sum %v, want %v", impl.name, n, sum, want)
			}
		}
	}
}

// TestExpSumInf: -Inf arguments (suppressed logits) give 0, in the vector body and the tail.
func TestExpSumInf(t *testing.T) {
	for _, impl := range []func([]float32, float32) float64{ExpSum, expSumGo} {
		x := make([]float32, 19)
		for i := range x {
			x[i] = float32(math.Inf(-1))
		}
		x[3], x[17] = 0, -1
		sum := impl(x, 0)
		if want := 1 + math.Exp(-1); math.Abs(sum-want) > 1e-6 || x[0] != 0 || x[18] != 0 || x[3] != 1 {
			t.Errorf("sum %v (want %v), x %v", sum, want, x)
		}
	}
}

func BenchmarkExpSum(b *testing.B) {
	x := make([]float32, 51864)
	for i := range x {
		x[i] = -float32(i%2000) / 100
	}
	buf := make([]float32, len(x))
	for _, impl := range []struct {
		name string
		f    func([]float32, float32) float64
	}{{"ExpSum-" + Kernels, ExpSum}, {"go", expSumGo}} {
		b.Run(impl.name, func(b *testing.B) {
			for range b.N {
				copy(buf, x)
				impl.f(buf, 0)
			}
		})
	}
}

// TestMaxIndex checks Max and Index against plain loops on random rows of every length up to
// 200, with NaNs, infinities and signed zeros planted, and on rows of a vocabulary's size.
func TestMaxIndex(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for trial := 0; trial < 3000; trial++ {
		n := trial % 201
		if trial%50 == 0 {
			n = 32000 + trial%37
		}
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 3)
		}
		if n > 0 {
			switch trial % 7 {
			case 1:
				x[r.IntN(n)] = nan
			case 2:
				x[r.IntN(n)] = -inf
			case 3:
				x[r.IntN(n)] = inf
			case 4:
				for i := range x {
					x[i] = -inf
				}
			case 5:
				for i := range x {
					x[i] = float32(math.Copysign(0, float64(r.IntN(2)*2-1)))
				}
			case 6:
				x[r.IntN(n)], x[r.IntN(n)] = nan, inf
			}
		}
		m, hasNaN := Max(x)
		wm, wnan := maxGo(x)
		if m != wm || hasNaN != wnan {
			t.Fatalf("n=%d trial %d: Max = %v, %v; want %v, %v", n, trial, m, hasNaN, wm, wnan)
		}
		if n == 0 {
			continue
		}
		for _, v := range []float32{m, x[r.IntN(n)], 12345} {
			if got, want := Index(x, v), indexGo(x, v); got != want {
				t.Fatalf("n=%d trial %d: Index(%v) = %d, want %d", n, trial, v, got, want)
			}
		}
	}
}

func BenchmarkMaxIndex(b *testing.B) {
	x := make([]float32, 32000)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for b.Loop() {
		m, _ := Max(x)
		_ = Index(x, m)
	}
}

// TestSumExp: SumExp returns what ExpSum returns, bit for bit, and leaves x unchanged.
func TestSumExp(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for n := 0; n < 100; n++ {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 4)
		}
		if n > 2 {
			x[1] = float32(math.Inf(-1))
		}
		m, _ := Max(x)
		orig := append([]float32(nil), x...)
		got := SumExp(x, m)
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(orig[i]) {
				t.Fatalf("n=%d: SumExp changed x[%d]", n, i)
			}
		}
		if want := ExpSum(x, m); got != want && !(n == 0 && got == 0) {
			t.Fatalf("n=%d: SumExp = %v, ExpSum = %v", n, got, want)
		}
	}
}

// TestDots: every row's product against a float64 reference, within float32 rounding of the
// sum of magnitudes, for the assembly (head sizes that are multiples of 16) and Go paths.
func TestDots(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, hd := range []int{16, 48, 64, 80, 128, 7} {
		for _, rows := range []int{1, 3, 4, 9, 1500} {
			stride := hd + 5
			q := make([]float32, hd)
			k := make([]float32, (rows-1)*stride+hd)
			for i := range q {
				q[i] = float32(r.NormFloat64())
			}
			for i := range k {
				k[i] = float32(r.NormFloat64())
			}
			for _, impl := range []struct {
				name string
				f    func(dst, q, k []float32, stride int)
			}{{"dispatch", Dots}, {"go", dotsGo}} {
				dst := make([]float32, rows)
				impl.f(dst, q, k, stride)
				for i := range rows {
					want, mag := 0.0, 0.0
					for d := range hd {
						p := float64(q[d]) * float64(k[i*stride+d])
						want += p
						mag += math.Abs(p)
					}
					if d := math.Abs(float64(dst[i]) - want); d > 2*float64(hd)*0x1p-24*mag {
						t.Fatalf("%s hd=%d rows=%d: row %d is %v, want %v", impl.name, hd, rows, i, dst[i], want)
					}
				}
			}
		}
	}
	if !panics(func() { Dots(make([]float32, 3), make([]float32, 4), make([]float32, 11), 4) }) {
		t.Error("Dots with too short a k did not panic")
	}
}

func panics(f func()) (p bool) {
	defer func() { p = recover() != nil }()
	f()
	return false
}
