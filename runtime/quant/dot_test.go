package quant

import (
	"math"
	"math/rand"
	"testing"

	"github.com/parleyhq/parley/runtime/tensor"
)

// kernelImpls lists, per weight type, the pure-Go implementation and the one dispatched at
// run time (assembly where the CPU has it, else the same Go function).
func kernelImpls() map[tensor.DType][2]func(int, []byte, []byte) float32 {
	return map[tensor.DType][2]func(int, []byte, []byte) float32{
		tensor.F32: {dotF32Go, dotF32Impl}, tensor.F16: {dotF16Go, dotF16Impl},
		tensor.BF16: {dotBF16Go, dotBF16Impl}, tensor.Q4_0: {dotQ4_0Go, dotQ4_0Impl},
		tensor.Q4_1: {dotQ4_1Go, dotQ4_1Impl}, tensor.Q5_0: {dotQ5_0Go, dotQ5_0Impl},
		tensor.Q5_1: {dotQ5_1Go, dotQ5_1Impl}, tensor.Q8_0: {dotQ8_0Go, dotQ8_0Impl},
		tensor.Q4_K: {dotQ4_KGo, dotQ4_KImpl}, tensor.Q5_K: {dotQ5_KGo, dotQ5_KImpl},
		tensor.Q6_K: {dotQ6_KGo, dotQ6_KImpl}, tensor.Q2_K: {dotQ2_KGo, dotQ2_KImpl},
		tensor.Q3_K: {dotQ3_KGo, dotQ3_KImpl}, tensor.IQ4_NL: {dotIQ4_NLGo, dotIQ4_NLImpl},
		tensor.IQ4_XS: {dotIQ4_XSGo, dotIQ4_XSImpl},
	}
}

// dotRef returns the float64 dot product of the dequantised rows and the tolerance a float32
// kernel is held to.
//
// Tolerance: kernels sum exact integer (or exact float16/bfloat16 product) terms per block
// and accumulate block results in float32; each accumulation step and each scale product
// rounds once, so the error is at most (steps+8) * 2^-24 * mag, where mag sums the
// magnitudes of every term a kernel adds (for Q4_1/Q5_1 and the K types the scaled part and
// the min part separately, since they are accumulated separately and may cancel). steps is
// the longest chain of float additions: blocks per row for the quantized types, n/4 for the
// float types (the Go kernels keep 4 partial sums; the assembly keeps more, so it is
// tighter). Q8_1 adds the error of its stored s = f16(d*sum(q)): up to |s|*2^-11 times |m|.
func dotRef(dt, vt tensor.DType, n int, w, x []byte) (ref, tol float64) {
	wa, wb := refDecode(dt, w, n)
	xa, _ := refDecode(vt, x, n)
	var mag float64
	for i := range n {
		ref += (wa[i] + wb[i]) * xa[i]
		mag += (math.Abs(wa[i]) + math.Abs(wb[i])) * math.Abs(xa[i])
	}
	steps := n / dt.BlockSize()
	if !dt.Quantized() {
		steps = n/4 + 1
	}
	tol = float64(steps+8) * math.Ldexp(mag, -24)
	if vt == tensor.Q8_1 {
		for b := 0; b < n/32; b++ {
			s := refHalf(u16at(x, 36*b+2))
			tol += math.Abs(wb[32*b]) * math.Abs(s) * math.Ldexp(1, -10)
		}
	}
	return ref, tol + 1e-30
}

func TestDotMatchesReference(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	impls := kernelImpls()
	for _, dt := range dotTypes {
		k, err := KernelFor(dt)
		if err != nil {
			t.Fatal(err)
		}
		bs := dt.BlockSize()
		counts := []int{1, 3, 7, 16}
		if bs == 1 {
			counts = []int{1, 3, 7, 8, 31, 33, 64, 100, 4096 + 5}
		}
		for _, nb := range counts {
			n := nb * bs
			for trial := range 8 {
				w := randBlocks(r, dt, nb)
				x := randBlocks(r, k.VecType, nb)
				if trial%2 == 1 { // activations as the quantizer writes them
					if err := Quantize(k.VecType, randFloats(r, n, 3), x); err != nil {
						t.Fatal(err)
					}
				}
				ref, tol := dotRef(dt, k.VecType, n, w, x)
				check := func(what string, got float32) {
					t.Helper()
					if d := math.Abs(float64(got) - ref); !(d <= tol) {
						t.Fatalf("%v %s n=%d trial %d: %g, want %g (diff %g > tol %g)", dt, what, n, trial, got, ref, d, tol)
					}
				}
				check("Kernel.Dot", k.Dot(n, w, x))
				check("pure Go", impls[dt][0](nb, w, x))
				check("dispatched ("+dotKernelSet+")", impls[dt][1](nb, w, x))
			}
		}
	}
}

// The dispatched (assembly) and pure-Go kernels agree closely on long rows, where both differ
// from the float64 reference only by float32 accumulation order.
func TestDotImplsAgree(t *testing.T) {
	if dotKernelSet == "go" {
		t.Skip("no assembly kernels on this machine or build")
	}
	r := rand.New(rand.NewSource(6))
	for dt, f := range kernelImpls() {
		vt, _ := VecDotType(dt)
		n := 4096
		nb := n / dt.BlockSize()
		for range 20 {
			w := randBlocks(r, dt, nb)
			x := make([]byte, rowSize(t, vt, n))
			if err := Quantize(vt, randFloats(r, n, 1), x); err != nil {
				t.Fatal(err)
			}
			_, tol := dotRef(dt, vt, n, w, x)
			a, b := f[0](nb, w, x), f[1](nb, w, x)
			if d := math.Abs(float64(a) - float64(b)); d > 2*tol {
				t.Fatalf("%v: go %g, %s %g (diff %g > %g)", dt, a, dotKernelSet, b, d, 2*tol)
			}
		}
	}
}

func TestDotBadInput(t *testing.T) {
	for _, dt := range dotTypes {
		k, _ := KernelFor(dt)
		bs := dt.BlockSize()
		n := 2 * bs
		w := make([]byte, rowSize(t, dt, n))
		x := make([]byte, rowSize(t, k.VecType, n))
		if got := k.Dot(n, w, x); got != 0 {
			t.Errorf("%v: zero rows give %g", dt, got)
		}
		if got := k.Dot(0, nil, nil); got != 0 {
			t.Errorf("%v: empty rows give %g", dt, got)
		}
		bad := []struct {
			n    int
			w, x []byte
		}{{n, w[:len(w)-1], x}, {n, w, x[:len(x)-1]}, {-bs, w, x}, {n + bs, w, x}, {n, nil, nil}}
		if bs > 1 {
			bad = append(bad, struct {
				n    int
				w, x []byte
			}{n - 1, w, x})
		}
		for _, c := range bad {
			if got := k.Dot(c.n, c.w, c.x); !math.IsNaN(float64(got)) {
				t.Errorf("%v: Dot(%d, %d bytes, %d bytes) = %g, want NaN", dt, c.n, len(c.w), len(c.x), got)
			}
		}
		// Longer buffers are fine: only the first RowSize(n) bytes are read.
		if got := k.Dot(n, append(w, 1, 2, 3), append(x, 4, 5)); got != 0 {
			t.Errorf("%v: trailing bytes changed the result: %g", dt, got)
		}
	}
}

// A weight row quantised from floats and dotted with quantised activations stays close to
// the float dot product of the original values. The difference is dominated by quantisation
// error, not the kernel: with relative RMS errors ew (weights) and ex (activations), it is a
// sum of n independent terms of size about (ew+ex)*|w_i x_i|, so 5*(ew+ex)*sqrt(sum (w_i x_i)^2)
// is a five-sigma bound. ew, ex from TestQuantizeRoundTrip (rounded up).
func TestDotEndToEnd(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	relRMS := map[tensor.DType]float64{
		tensor.F32: 1e-7, tensor.F16: 3e-4, tensor.BF16: 3e-3, tensor.Q8_0: 0.009, tensor.Q8_1: 0.009,
		tensor.Q4_0: 0.16, tensor.Q4_1: 0.09, tensor.Q5_0: 0.07, tensor.Q5_1: 0.055,
		tensor.Q2_K: 0.36, tensor.Q3_K: 0.21, tensor.IQ4_NL: 0.11, tensor.IQ4_XS: 0.11,
		tensor.Q4_K: 0.1, tensor.Q5_K: 0.05, tensor.Q6_K: 0.03, tensor.Q8_K: 0.016,
	}
	for _, dt := range dotTypes {
		k, _ := KernelFor(dt)
		for trial := range 10 {
			n := 4096
			wf, xf := randFloats(r, n, 0.1), randFloats(r, n, 2)
			w := make([]byte, rowSize(t, dt, n))
			x := make([]byte, rowSize(t, k.VecType, n))
			if err := Quantize(dt, wf, w); err != nil {
				t.Fatal(err)
			}
			if err := Quantize(k.VecType, xf, x); err != nil {
				t.Fatal(err)
			}
			var ref, sq float64
			for i := range wf {
				p := float64(wf[i]) * float64(xf[i])
				ref += p
				sq += p * p
			}
			got := float64(k.Dot(n, w, x))
			bound := 5 * (relRMS[dt] + relRMS[k.VecType]) * math.Sqrt(sq)
			if math.Abs(got-ref) > bound {
				t.Errorf("%v trial %d: %g, float dot %g (bound %g)", dt, trial, got, ref, bound)
			}
		}
	}
}

// F32 rows that are not 4-byte aligned take the byte-decoding path and give the same sum
// up to accumulation order (tolerance as in dotRef).
func TestDotF32Unaligned(t *testing.T) {
	r := rand.New(rand.NewSource(10))
	for _, n := range []int{1, 7, 8, 9, 100, 1027} {
		w := randBlocks(r, tensor.F32, n)
		x := randBlocks(r, tensor.F32, n)
		ref, tol := dotRef(tensor.F32, tensor.F32, n, w, x)
		wu := make([]byte, len(w)+1)[1:]
		copy(wu, w)
		for _, got := range []float32{dotF32Go(n, wu, x), dotF32Go(n, w, x), dotF32Bytes(n, w, x)} {
			if d := math.Abs(float64(got) - ref); d > tol {
				t.Fatalf("n=%d: %g, want %g (tol %g)", n, got, ref, tol)
			}
		}
	}
}

// TestDot4 checks the four-row kernels against the one-row kernel: every result must be the same
// float32, bit for bit, for row lengths from none to many blocks (odd and even block counts take
// different paths), several weight rows, rows padded apart, and the dispatched and Go forms
// alike; and arguments that do not fit are refused.
func TestDot4(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	goForms := map[tensor.DType]func(nb int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int){
		tensor.Q8_0: dot4Q8_0Go, tensor.Q4_0: dot4Q4_0Go,
	}
	for _, dt := range []tensor.DType{tensor.Q8_0, tensor.Q4_0} {
		k, err := KernelFor(dt)
		if err != nil {
			t.Fatal(err)
		}
		if k.Dot4 == nil {
			t.Fatalf("%v: no four-row kernel", dt)
		}
		impls := []struct {
			name string
			f    func(nb int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int)
		}{{"dispatched", nil}, {"go", goForms[dt]}}
		for _, n := range []int{0, 32, 64, 96, 288, 768, 4096} {
			for _, rows := range []int{1, 3, 8} {
				row := rowSize(t, dt, n)
				wRow := row + 18*r.Intn(2)
				w := make([]byte, (rows-1)*wRow+row)
				src := make([]float32, n)
				for q := range rows {
					for i := range src {
						src[i] = float32(r.NormFloat64())
					}
					if err := Quantize(dt, src, w[q*wRow:q*wRow+row]); err != nil {
						t.Fatal(err)
					}
				}
				xr := rowSize(t, k.VecType, n)
				xRow := xr + 34*r.Intn(3)
				x := make([]byte, 3*xRow+xr)
				for i := range 4 {
					for j := range src {
						src[j] = float32(r.NormFloat64() * 3)
					}
					if err := Quantize(k.VecType, src, x[i*xRow:i*xRow+xr]); err != nil {
						t.Fatal(err)
					}
				}
				ldd := rows + r.Intn(3)
				want := make([]float32, 3*ldd+rows)
				for q := range rows {
					for i := range 4 {
						want[i*ldd+q] = k.Dot(n, w[q*wRow:], x[i*xRow:])
					}
				}
				got := make([]float32, len(want))
				if !k.Dot4(n, w, wRow, rows, x, xRow, got, ldd) {
					t.Fatalf("%v n=%d rows=%d: refused", dt, n, rows)
				}
				for _, im := range impls {
					if im.name != "dispatched" {
						clear(got)
						im.f(n/32, w, wRow, rows, x, xRow, got, ldd)
					}
					for q := range rows {
						for i := range 4 {
							if g, w := got[i*ldd+q], want[i*ldd+q]; math.Float32bits(g) != math.Float32bits(w) {
								t.Errorf("%v n=%d %s: weight row %d, activation row %d: %v, one at a time %v", dt, n, im.name, q, i, g, w)
							}
						}
					}
				}
			}
		}
		row, xr := rowSize(t, dt, 64), rowSize(t, k.VecType, 64)
		w, x, dst := make([]byte, 2*row), make([]byte, 4*xr), make([]float32, 8)
		for _, c := range []struct {
			name          string
			n, wRow, rows int
			w, x          []byte
			xRow          int
			dst           []float32
			ldd           int
		}{
			{"n not whole blocks", 33, row, 2, w, x, xr, dst, 2},
			{"negative n", -32, row, 2, w, x, xr, dst, 2},
			{"weight rows overlapping", 64, row - 1, 2, w, x, xr, dst, 2},
			{"short weights", 64, row, 2, w[:2*row-1], x, xr, dst, 2},
			{"short activations", 64, row, 2, w, x[:len(x)-1], xr, dst, 2},
			{"activation rows overlapping", 64, row, 2, w, x, xr - 1, dst, 2},
			{"short output", 64, row, 2, w, x, xr, dst[:7], 2},
			{"output rows overlapping", 64, row, 2, w, x, xr, dst, 1},
		} {
			if k.Dot4(c.n, c.w, c.wRow, c.rows, c.x, c.xRow, c.dst, c.ldd) {
				t.Errorf("%s: accepted", c.name)
			}
		}
	}
}
