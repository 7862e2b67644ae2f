package backendtest

import (
	"fmt"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Bench runs benchmarks of the shapes a LLaMA decoder computes, for every weight type:
//
//	MatMul/GEMV768x768/<dtype>       one token through a 768x768 matrix (110M model decode)
//	MatMul/GEMV4096x4096/<dtype>     one token through a 4096x4096 matrix (7B model decode)
//	MatMul/GEMM512x768x768/<dtype>   512 tokens through a 768x768 matrix (prefill)
//	Attention/Decode512/<cache>      one token attending over 512 cached positions, 12 heads of 64
//	Decode110M/<dtype>               a whole decode step of the 110M model at position 127
//
// GEMV reports GB/s of weights streamed, GEMM GFLOP/s, Attention GB/s of cache read, Decode
// tokens/s; all report allocations.
func Bench(b *testing.B, newBackend func() (backend.Backend, error)) {
	be := open(b, newBackend)
	for _, sh := range []struct {
		name    string
		n, m, k int
	}{
		{"GEMV768x768", 1, 768, 768},
		{"GEMV4096x4096", 1, 4096, 4096},
		{"GEMM512x768x768", 512, 768, 768},
	} {
		for _, dt := range WeightDTypes {
			b.Run(fmt.Sprintf("MatMul/%s/%v", sh.name, dt), func(b *testing.B) {
				benchMatMul(b, be, dt, sh.n, sh.m, sh.k)
			})
		}
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16} {
		b.Run("Attention/Decode512/"+dt.String(), func(b *testing.B) {
			benchAttention(b, be, dt)
		})
	}
	for _, dt := range WeightDTypes {
		b.Run("Decode110M/"+dt.String(), func(b *testing.B) {
			benchDecode(b, be, dt)
		})
	}
}

func benchMatMul(b *testing.B, be backend.Backend, dt tensor.DType, n, m, k int) {
	r := rng(fmt.Sprintf("bench matmul %v %d %d", dt, m, k))
	data, _ := quantRows(b, dt, m, k, randVec(r, m*k, 0.5))
	w := load(b, be, dt, m, k, data)
	x := alloc(b, be, n, k, randVec(r, n*k, 1))
	dst := alloc(b, be, n, m, nil)
	row := make([]float32, m)
	must(b, be.MatMul(dst, x, w), "MatMul")
	b.ReportAllocs()
	for b.Loop() {
		if err := be.MatMul(dst, x, w); err != nil {
			b.Fatal(err)
		}
	}
	must(b, be.Read(dst, 0, row), "Read") // waits for issued work
	s := b.Elapsed().Seconds() / float64(b.N)
	if n == 1 {
		b.ReportMetric(float64(len(data))/s/1e9, "GB/s")
	}
	b.ReportMetric(2*float64(n*m*k)/s/1e9, "GFLOP/s")
}

func benchAttention(b *testing.B, be backend.Backend, dt tensor.DType) {
	const nh, hd, ctx, bs = 12, 64, 512, 16
	r := rng("bench attention")
	kv, err := be.NewKV(backend.KVConfig{Layers: 1, Slots: ctx, Width: nh * hd, BlockSize: bs, DType: dt})
	must(b, err, "NewKV")
	defer kv.Close()
	fillKV(b, be, kv, r)
	bt := decodeBatch(ctx, bs)
	a := backend.Attn{NHead: nh, NKVHead: nh, HeadDim: hd, Scale: 0.125}
	q := alloc(b, be, 1, nh*hd, randVec(r, nh*hd, 1))
	dst := alloc(b, be, 1, nh*hd, nil)
	out := make([]float32, nh*hd)
	b.ReportAllocs()
	for b.Loop() {
		if err := be.Attention(dst, q, kv, 0, a, bt); err != nil {
			b.Fatal(err)
		}
	}
	must(b, be.Read(dst, 0, out), "Read")
	elem := 4
	if dt == tensor.F16 {
		elem = 2
	}
	s := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(2*ctx*nh*hd*elem)/s/1e9, "GB/s")
}

// benchDecode decodes with the 110M shape. Like llama.cpp's quantiser, the output matrix stays
// Q8_0 for Q8_0 models and F32/F16/BF16 for those, and is Q6_K for the other quantised types.
func benchDecode(b *testing.B, be backend.Backend, dt tensor.DType) {
	out := dt
	if dt.Quantized() && dt != tensor.Q8_0 {
		out = tensor.Q6_K
	}
	m := newModel(b, be, llama110M, dt, out)
	defer m.close()
	must(b, m.step(), "decode step")
	b.ReportAllocs()
	for b.Loop() {
		if err := m.step(); err != nil {
			b.Fatal(err)
		}
	}
	s := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(1/s, "tokens/s")
	b.ReportMetric(m.weightBytes/s/1e9, "GB/s")
}
