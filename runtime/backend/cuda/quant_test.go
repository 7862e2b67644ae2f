//go:build cuda && cgo && !nocgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/cpu"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestQuantizedMatchesCPU checks that products against quantised weights quantise the
// activations as the CPU backend does (as llama.cpp does: Q8_0 or Q8_1 blocks for the legacy
// types and IQ4_NL, Q8_K for the K-quants and IQ4_XS) and take the same integer products: decode products (eight
// activation rows or fewer, the matrix-vector kernel) and larger ones (the int8 tensor-core
// kernel: activation rows in partial and several tiles of 64, weight rows in partial and
// several tiles of 128, rows of several segments of eight chunks and, for the legacy types, a
// last segment of one chunk and rows whose size is not a multiple of four bytes, which are
// copied in half-words). The two backends' results may differ only
// by the order of their float sums, about 2^-24 of Σ|w·x| a few times over, bounded here by
// 1e-5 of it. Activations quantised otherwise (or not at all) move a result by about
// 2^-8/sqrt(k) of Σ|w·x|, 2.5e-4 at k = 256.
func TestQuantizedMatchesCPU(t *testing.T) {
	g := openGPU(t)
	c, err := cpu.New(backend.Options{Threads: 1})
	if err != nil {
		t.Skipf("cpu backend: %v", err)
	}
	defer c.Close()
	cases := []struct {
		name    string
		m, n, k int
	}{
		{"gemv", 37, 1, 512}, {"gemv", 37, 3, 512}, {"gemv", 37, 8, 512},
		{"mmq", 37, 9, 512}, {"mmq", 37, 70, 512}, {"mmq", 150, 24, 512}, {"mmq", 40, 17, 768}, {"mmq", 40, 17, 288},
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []tensor.DType{tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.Q8_0, tensor.IQ4_NL,
		tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K, tensor.IQ4_XS} {
		for _, tc := range cases {
			m, n, k := tc.m, tc.n, tc.k
			if _, err := dt.RowSize(int64(k)); err != nil {
				continue // k = 288 is not a whole number of blocks of 256
			}
			t.Run(fmt.Sprintf("%v/%s/%dx%dx%d", dt, tc.name, n, m, k), func(t *testing.T) {
				wf := randFloats(r, m*k, 1)
				rs, err := dt.RowSize(int64(k))
				if err != nil {
					t.Fatal(err)
				}
				raw := make([]byte, int(rs)*m)
				if err := quant.Quantize(dt, wf, raw); err != nil {
					t.Fatal(err)
				}
				wd := make([]float32, m*k)
				if err := quant.Dequantize(dt, raw, wd); err != nil {
					t.Fatal(err)
				}
				x := randFloats(r, n*k, 1)
				var got [2][]float32
				for i, be := range []backend.Backend{g, c} {
					w, err := be.Load(dt, m, k, raw)
					if err != nil {
						t.Fatal(err)
					}
					defer w.Close()
					xt, dst := upload(t, be, n, k, x), upload(t, be, n, m, nil)
					if err := be.MatMul(dst, xt, w); err != nil {
						t.Fatal(err)
					}
					got[i] = make([]float32, n*m)
					if err := be.Read(dst, 0, got[i]); err != nil {
						t.Fatal(err)
					}
				}
				for i := 0; i < n; i++ {
					for j := 0; j < m; j++ {
						abs := 0.0
						for l := 0; l < k; l++ {
							abs += math.Abs(float64(x[i*k+l]) * float64(wd[j*k+l]))
						}
						a, b := float64(got[0][i*m+j]), float64(got[1][i*m+j])
						if d := math.Abs(a - b); !(d <= 1e-5*abs) {
							t.Fatalf("[%d, %d]: cuda %v, cpu %v: %.3g apart, %.3g of Σ|w·x| (bound 1e-5)", i, j, a, b, d, d/abs)
						}
					}
				}
			})
		}
	}
}
