package quant

import (
	"math/rand"
	"testing"
)

// BenchmarkDot: one 4096-element row per op; GB/s counts weight bytes read.
func BenchmarkDot(b *testing.B) {
	for _, dt := range dotTypes {
		for _, impl := range []string{"dispatch", "go"} {
			if impl == "go" && dotKernelSet == "go" {
				continue
			}
			b.Run(dt.String()+"/"+impl, func(b *testing.B) {
				const n = 4096
				r := rand.New(rand.NewSource(8))
				vt, _ := VecDotType(dt)
				w := make([]byte, rowSize(b, dt, n))
				x := make([]byte, rowSize(b, vt, n))
				if err := Quantize(dt, randFloats(r, n, 0.1), w); err != nil {
					b.Fatal(err)
				}
				if err := Quantize(vt, randFloats(r, n, 1), x); err != nil {
					b.Fatal(err)
				}
				f := kernelImpls()[dt][1]
				if impl == "go" {
					f = kernelImpls()[dt][0]
				}
				nb := n / dt.BlockSize()
				b.ReportAllocs()
				b.ResetTimer()
				var s float32
				for range b.N {
					s += f(nb, w, x)
				}
				sink = s
				sec := b.Elapsed().Seconds()
				b.ReportMetric(float64(len(w))*float64(b.N)/sec/1e9, "GB/s")
			})
		}
	}
}

var sink float32

// BenchmarkGEMV: a 768x768 weight matrix times one activation vector, single thread, through
// Kernel.Dot as a CPU backend calls it (activation converted once per op, included).
// GB/s counts weight bytes; GFLOP/s counts 2*768*768 per op.
func BenchmarkGEMV(b *testing.B) {
	for _, dt := range dotTypes {
		b.Run(dt.String(), func(b *testing.B) {
			const rows, cols = 768, 768
			r := rand.New(rand.NewSource(9))
			k, err := KernelFor(dt)
			if err != nil {
				b.Fatal(err)
			}
			rs := rowSize(b, dt, cols)
			w := make([]byte, rows*rs)
			if err := Quantize(dt, randFloats(r, rows*cols, 0.05), w); err != nil {
				b.Fatal(err)
			}
			xf := randFloats(r, cols, 1)
			x := make([]byte, rowSize(b, k.VecType, cols))
			y := make([]float32, rows)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := Quantize(k.VecType, xf, x); err != nil {
					b.Fatal(err)
				}
				for i := range y {
					y[i] = k.Dot(cols, w[i*rs:(i+1)*rs], x)
				}
			}
			sec := b.Elapsed().Seconds()
			b.ReportMetric(float64(len(w))*float64(b.N)/sec/1e9, "GB/s")
			b.ReportMetric(2*rows*cols*float64(b.N)/sec/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkQuantize: one 4096-element row per op (activation conversion for the Q8 types,
// weight conversion for the others); GB/s counts float32 input bytes.
func BenchmarkQuantize(b *testing.B) {
	for _, dt := range allTypes {
		b.Run(dt.String(), func(b *testing.B) {
			const n = 4096
			x := randFloats(rand.New(rand.NewSource(11)), n, 1)
			q := make([]byte, rowSize(b, dt, n))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := Quantize(dt, x, q); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(4*n*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}

// BenchmarkDequantize: one 4096-element row per op; GB/s counts float32 output bytes.
func BenchmarkDequantize(b *testing.B) {
	for _, dt := range allTypes {
		b.Run(dt.String(), func(b *testing.B) {
			const n = 4096
			q := make([]byte, rowSize(b, dt, n))
			if err := Quantize(dt, randFloats(rand.New(rand.NewSource(12)), n, 1), q); err != nil {
				b.Fatal(err)
			}
			y := make([]float32, n)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := Dequantize(dt, q, y); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(4*n*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}
