package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestFewRowsAsOne: the fused kernels that take several activation rows through a quantised
// weight row at once (up to 8 with AVX-512, 4 with AVX2) give every row the float32 it gets
// alone, bit for bit, at every instruction set that has them: a sequence's logits do not depend
// on how many others share its step.
func TestFewRowsAsOne(t *testing.T) {
	if !cpu.Available() {
		t.Skip(cpu.ErrNotBuilt)
	}
	best := cpu.BestISA()
	defer cpu.SetISA(best)
	const m, k = 70, 512
	r := rand.New(rand.NewPCG(3, 4))
	for isa := shortISA(cpu.ISAAVX2, best); isa <= best; isa++ {
		if err := cpu.SetISA(isa); err != nil {
			t.Fatal(err)
		}
		b, err := New(backend.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, dt := range []tensor.DType{tensor.Q8_0, tensor.Q4_0, tensor.Q4_1, tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q6_K,
			tensor.IQ4_NL, tensor.IQ4_XS, tensor.Q2_K, tensor.Q3_K} {
			src := make([]float32, m*k)
			for i := range src {
				src[i] = float32(r.NormFloat64())
			}
			rowBytes, _ := dt.RowSize(k)
			data := make([]byte, m*int(rowBytes))
			for i := range m {
				must(t, quant.Quantize(dt, src[i*k:(i+1)*k], data[i*int(rowBytes):(i+1)*int(rowBytes)]))
			}
			w, err := b.Load(dt, m, k, data)
			must(t, err)
			for _, n := range []int{2, 3, 4, 7, 8} {
				xs := make([]float32, n*k)
				for i := range xs {
					xs[i] = float32(r.NormFloat64())
				}
				x, err1 := b.Alloc(tensor.F32, n, k)
				d, err2 := b.Alloc(tensor.F32, n, m)
				x1, err3 := b.Alloc(tensor.F32, 1, k)
				d1, err4 := b.Alloc(tensor.F32, 1, m)
				must(t, err1, err2, err3, err4, b.Write(x, 0, xs), b.MatMul(d, x, w))
				all := make([]float32, n*m)
				must(t, b.Read(d, 0, all))
				one := make([]float32, m)
				for i := range n {
					must(t, b.Write(x1, 0, xs[i*k:(i+1)*k]), b.MatMul(d1, x1, w), b.Read(d1, 0, one))
					for c := range m {
						if math.Float32bits(one[c]) != math.Float32bits(all[i*m+c]) {
							t.Fatalf("%v %v, %d rows: row %d, output %d: %v in the batch, %v alone", isa, dt, n, i, c, all[i*m+c], one[c])
						}
					}
				}
				must(t, x.Close(), d.Close(), x1.Close(), d1.Close())
			}
			must(t, w.Close())
		}
		must(t, b.Close())
	}
}

// TestRepacked: weights repacked for the interleaved kernels give every activation row the same
// float32 whatever the batch (1 to 33 rows: one kernel call or several) and the number of threads,
// bit for bit; the matrix's last group of sixteen rows is padded (m = 70, and m = 5: one group,
// mostly padding), and rows of one, two and nine blocks are covered, with the AVX-512 VNNI kernels
// and the AVX2 ones (every type at both levels, but Q2_K, Q3_K, IQ4_NL and IQ4_XS, which have
// AVX2 kernels only: with AVX-512 their rows serve). With the instruction set lowered below the
// interleaved kernels, MatMul falls back to the loaded rows and gives exactly what an unrepacked
// tensor does.
func TestRepacked(t *testing.T) {
	if !cpu.Available() {
		t.Skip(cpu.ErrNotBuilt)
	}
	best := cpu.BestISA()
	if best < cpu.ISAAVX2 {
		t.Skip("no interleaved kernels on this processor")
	}
	defer cpu.SetISA(best)
	r := rand.New(rand.NewPCG(5, 6))
	bs := map[int]*Backend{}
	for _, th := range []int{1, 3} {
		b, err := New(backend.Options{Threads: th})
		must(t, err)
		bs[th] = b.(*Backend)
		defer b.Close()
	}
	for isa := shortISA(cpu.ISAAVX2, best); isa <= best; isa++ {
		must(t, cpu.SetISA(isa))
		for _, m := range []int{5, 70} {
			testRepackedRows(t, r, bs, isa, m)
		}
	}
	must(t, cpu.SetISA(best))
	testNotRepacked(t, bs[1])
}

// testRepackedRows is TestRepacked for matrices of m rows at instruction set isa, the current one.
func testRepackedRows(t *testing.T, r *rand.Rand, bs map[int]*Backend, isa cpu.ISA, m int) {
	// product runs x [n, k] through w on b and returns the result.
	product := func(b *Backend, w backend.Tensor, xs []float32, n, k int) []float32 {
		x, err1 := b.Alloc(tensor.F32, n, k)
		d, err2 := b.Alloc(tensor.F32, n, m)
		out := make([]float32, n*m)
		must(t, err1, err2, b.Write(x, 0, xs), b.MatMul(d, x, w), b.Read(d, 0, out), x.Close(), d.Close())
		return out
	}
	for _, dt := range []tensor.DType{tensor.Q8_0, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K,
		tensor.IQ4_NL, tensor.IQ4_XS, tensor.Q2_K, tensor.Q3_K} {
		ks := []int{32, 64, 288, 512}
		if dt.BlockSize() == 256 {
			ks = []int{256, 768}
		}
		avx2Only := dt == tensor.IQ4_NL || dt == tensor.IQ4_XS || dt == tensor.Q2_K || dt == tensor.Q3_K
		if got, want := cpu.PackedAvailable(dt), !avx2Only || isa == cpu.ISAAVX2; got != want {
			t.Fatalf("%v %v: interleaved kernels available: %v, want %v", isa, dt, got, want)
		}
		if !cpu.PackedAvailable(dt) {
			continue
		}
		for _, k := range ks {
			src := make([]float32, m*k)
			for i := range src {
				src[i] = float32(r.NormFloat64())
			}
			rowBytes, _ := dt.RowSize(int64(k))
			data := make([]byte, m*int(rowBytes))
			for i := range m {
				must(t, quant.Quantize(dt, src[i*k:(i+1)*k], data[i*int(rowBytes):(i+1)*int(rowBytes)]))
			}
			if dt == tensor.Q8_0 {
				// The extreme codes, against activation blocks of ±127 (below): -128 (which ggml's
				// quantiser never writes, but a file may hold) in row 0's first block, 127 in row
				// 1's, and -128 at one place of every block of the other rows.
				for e := range 32 {
					data[2+e], data[int(rowBytes)+2+e] = 0x80, 0x7F
				}
				for i := 2; i < m; i++ {
					for b := range k / 32 {
						data[i*int(rowBytes)+34*b+2+(i+b)%32] = 0x80
					}
				}
			}
			ws := map[int]backend.Tensor{}
			for th, b := range bs {
				w, err := b.Load(dt, m, k, data)
				must(t, err)
				defer w.Close()
				ok, err := b.Repack(w)
				must(t, err)
				if !ok {
					t.Fatalf("%v: Repack did not repack", dt)
				}
				if ok, err := b.Repack(w); err != nil || !ok {
					t.Fatalf("%v: second Repack: %v, %v", dt, ok, err)
				}
				ws[th] = w
			}
			const nmax = 33
			xs := make([]float32, nmax*k)
			for i := range xs {
				xs[i] = float32(r.NormFloat64())
			}
			for e := range 32 { // activation codes 127 and -127: Q8_0's largest pair sums
				xs[e], xs[k+e] = 1, -1
			}
			alone := make([]float32, nmax*m)
			for i := range nmax {
				copy(alone[i*m:], product(bs[1], ws[1], xs[i*k:(i+1)*k], 1, k))
			}
			for _, th := range []int{1, 3} {
				for _, n := range []int{2, 3, 7, 8, 9, 17, 33} {
					got := product(bs[th], ws[th], xs[:n*k], n, k)
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(alone[i]) {
							t.Fatalf("%v %v k=%d, %d threads, %d rows: row %d, output %d: %v in the batch, %v alone",
								isa, dt, k, th, n, i/m, i%m, got[i], alone[i])
						}
					}
				}
			}
			// Against the row-layout kernels: the same exact integer block sums, scaled and added in
			// another order (the K-quants' scale products and minimum terms rounded once more), so
			// within a float32 sum's rounding of the block terms: (k/16+2)·2^-24·Σ|w·x|, with a
			// factor 4 for the activations' quantisation and the extra roundings.
			b := bs[1]
			plain, err := b.Load(dt, m, k, data)
			must(t, err)
			wf := make([]float32, m*k)
			for i := range m {
				must(t, quant.Dequantize(dt, data[i*int(rowBytes):(i+1)*int(rowBytes)], wf[i*k:(i+1)*k]))
			}
			rows := product(b, plain, xs, nmax, k)
			for i, want := range rows {
				s := 0.0
				for c := range k {
					s += math.Abs(float64(wf[(i%m)*k+c]) * float64(xs[(i/m)*k+c]))
				}
				if tol := 4 * float64(k/16+2) * 0x1p-24 * s; math.Abs(float64(alone[i]-want)) > tol {
					t.Fatalf("%v %v k=%d: row %d, output %d: %v repacked, %v in row layout (tolerance %.3g)", isa, dt, k, i/m, i%m, alone[i], want, tol)
				}
			}
			// Lowered below the interleaved kernels: the loaded rows serve, exactly as for an
			// unrepacked tensor.
			must(t, cpu.SetISA(cpu.ISAScalar))
			want := product(b, plain, xs[:5*k], 5, k)
			got := product(b, ws[1], xs[:5*k], 5, k)
			must(t, cpu.SetISA(isa), plain.Close())
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%v k=%d, scalar: output %d: %v repacked, %v loaded", dt, k, i, got[i], want[i])
				}
			}
		}
	}
}

// testNotRepacked: nothing else is repacked: other types (F32, F16; Q2_K, Q3_K, IQ4_NL and IQ4_XS
// with AVX-512, which have AVX2 interleaved kernels only: their rows serve), views, activations.
func testNotRepacked(t *testing.T, b *Backend) {
	f32, err := b.Load(tensor.F32, 16, 32, make([]byte, 16*32*4))
	must(t, err)
	f16, err := b.Load(tensor.F16, 16, 32, make([]byte, 16*32*2))
	must(t, err)
	q8, err := b.Load(tensor.Q8_0, 32, 32, make([]byte, 32*34))
	must(t, err)
	q2, err := b.Load(tensor.Q2_K, 16, 256, make([]byte, 16*84))
	must(t, err)
	q3, err := b.Load(tensor.Q3_K, 16, 256, make([]byte, 16*110))
	must(t, err)
	nl, err := b.Load(tensor.IQ4_NL, 16, 256, make([]byte, 16*8*18))
	must(t, err)
	xs, err := b.Load(tensor.IQ4_XS, 16, 256, make([]byte, 16*136))
	must(t, err)
	view, err := b.View(q8, 16, 16)
	must(t, err)
	act, err := b.Alloc(tensor.F32, 16, 32)
	must(t, err)
	not := map[string]backend.Tensor{"F32": f32, "F16": f16, "view": view, "activation": act}
	if !cpu.PackedAvailable(tensor.IQ4_NL) {
		not["Q2_K"], not["Q3_K"], not["IQ4_NL"], not["IQ4_XS"] = q2, q3, nl, xs
	}
	for name, x := range not {
		if ok, err := b.Repack(x); ok || err != nil {
			t.Errorf("Repack(%s) = %v, %v; want false, nil", name, ok, err)
		}
	}
	must(t, f32.Close(), f16.Close(), q2.Close(), q3.Close(), nl.Close(), xs.Close(), view.Close(), q8.Close(), act.Close())
}

// TestRepackOff: with PARLEY_CPU_REPACK=0 a backend leaves weights as loaded.
func TestRepackOff(t *testing.T) {
	if !cpu.Available() {
		t.Skip(cpu.ErrNotBuilt)
	}
	t.Setenv("PARLEY_CPU_REPACK", "0")
	b, err := New(backend.Options{Threads: 1})
	must(t, err)
	defer b.Close()
	w, err := b.Load(tensor.Q8_0, 16, 32, make([]byte, 16*34))
	must(t, err)
	if ok, err := b.(*Backend).Repack(w); ok || err != nil {
		t.Fatalf("Repack with PARLEY_CPU_REPACK=0 = %v, %v; want false, nil", ok, err)
	}
}
