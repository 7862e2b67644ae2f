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
	for isa := cpu.ISAAVX2; isa <= best; isa++ {
		if err := cpu.SetISA(isa); err != nil {
			t.Fatal(err)
		}
		b, err := New(backend.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, dt := range []tensor.DType{tensor.Q8_0, tensor.Q4_0, tensor.Q4_1, tensor.Q4_K, tensor.Q6_K} {
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
