//go:build cuda && cgo && !nocgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	bcuda "github.com/parleyhq/parley/bindings/cuda"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The GPU's own benchmarks, in the shapes its targets are stated in (scripts/gpu-verify runs
// them beside PyTorch on the same machine and prints the ratios):
//
//	FlashAttention/prefill/B4xH32xS4096xD128  causal prefill over an F16 cache: TFLOP/s, counting
//	                                          2·B·H·S²·D (the causal half of the two products);
//	                                          mma/ on tensor cores (mma/bf16/ over a BF16
//	                                          cache), tf32/ over an F32 cache on tensor cores
//	                                          with TF32 inputs
//	GEMM/TF32/4096                            F32 weights through TF32 tensor cores: TFLOP/s
//	QuantGEMM/Q4_0/rows=N/f16|mmq             N activation rows against 4096 x 4096 quantised
//	                                          weights, expanded to F16 for cuBLAS
//	                                          (Options.QuantF16) or on the int8 tensor cores (the
//	                                          default): TFLOP/s
//	BeamStep/beams5/vocab51865|32000          one beam-search step (log-softmax, running scores,
//	                                          top 10 over beams × vocabulary) with its results on
//	                                          the host: µs a step

func gpuBench(b *testing.B) *Backend { return gpuBenchWith(b, Options{}) }

func gpuBenchWith(b *testing.B, o Options) *Backend {
	b.Helper()
	if _, err := bcuda.Devices(); err != nil {
		if requireGPU() {
			b.Fatalf("PARLEY_REQUIRE_GPU=1 but no GPU is usable: %v", err)
		}
		b.Skipf("no GPU: %v", err)
	}
	be, err := New(o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return be
}

func randFloats(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

// upload makes an F32 tensor [rows, cols] holding v (zeros when v is nil), closed when tb ends.
func upload(tb testing.TB, be backend.Backend, rows, cols int, v []float32) backend.Tensor {
	tb.Helper()
	t, err := be.Alloc(tensor.F32, rows, cols)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { t.Close() })
	if v != nil {
		if err := be.Write(t, 0, v); err != nil {
			tb.Fatal(err)
		}
	}
	return t
}

// randWeights loads m x k weights of type dt, normal values of deviation 0.02 converted to dt,
// closed when tb ends; it returns them and their size in bytes.
func randWeights(tb testing.TB, be backend.Backend, r *rand.Rand, dt tensor.DType, m, k int) (backend.Tensor, int) {
	tb.Helper()
	rs, err := dt.RowSize(int64(k))
	if err != nil {
		tb.Fatal(err)
	}
	data := make([]byte, m*int(rs))
	if err := quant.Quantize(dt, randFloats(r, m*k, 0.02), data); err != nil {
		tb.Fatal(err)
	}
	w, err := be.Load(dt, m, k, data)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { w.Close() })
	return w, len(data)
}

// wait reads one element of t: Read waits for every operation issued before it.
func wait(b *testing.B, be *Backend, t backend.Tensor) {
	b.Helper()
	one := make([]float32, t.Cols())
	if err := be.Read(t, 0, one); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkFlashAttention(b *testing.B) {
	const batch, heads, seq, hd, bs = 4, 32, 4096, 128, 16
	for _, kern := range []struct {
		name string
		mma  bool
		dt   tensor.DType
	}{{"", false, tensor.F16}, {"mma/", true, tensor.F16}, {"mma/bf16/", true, tensor.BF16}, {"tf32/", true, tensor.F32}} {
		b.Run(fmt.Sprintf("prefill/%sB%dxH%dxS%dxD%d", kern.name, batch, heads, seq, hd), func(b *testing.B) {
			be := gpuBenchWith(b, Options{FlashMMA: kern.mma})
			n, width := batch*seq, heads*hd
			kv, err := be.NewKV(backend.KVConfig{Layers: 1, Slots: n, Width: width, BlockSize: bs, DType: kern.dt})
			if err != nil {
				b.Fatal(err)
			}
			defer kv.Close()
			bt := &backend.Batch{}
			per := seq / bs
			for s := range batch {
				blocks := make([]int32, per)
				for i := range blocks {
					blocks[i] = int32(s*per + i)
				}
				for p := range seq {
					bt.Pos = append(bt.Pos, int32(p))
					bt.Slot = append(bt.Slot, blocks[p/bs]*bs+int32(p%bs))
				}
				bt.Seqs = append(bt.Seqs, backend.Seq{Start: s * seq, Count: seq, CtxLen: seq, Blocks: blocks})
			}
			r := rand.New(rand.NewPCG(1, 2))
			k := upload(b, be, n, width, randFloats(r, n*width, 1))
			v := upload(b, be, n, width, randFloats(r, n*width, 1))
			if err := be.StoreKV(kv, 0, k, v, bt); err != nil {
				b.Fatal(err)
			}
			q := upload(b, be, n, width, randFloats(r, n*width, 1))
			dst := upload(b, be, n, width, nil)
			a := backend.Attn{NHead: heads, NKVHead: heads, HeadDim: hd, Scale: float32(1 / math.Sqrt(hd))}
			if err := be.Attention(dst, q, kv, 0, a, bt); err != nil { // warm-up
				b.Fatal(err)
			}
			wait(b, be, dst)
			b.ResetTimer()
			for range b.N {
				if err := be.Attention(dst, q, kv, 0, a, bt); err != nil {
					b.Fatal(err)
				}
			}
			wait(b, be, dst)
			s := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(2*batch*heads*float64(seq)*float64(seq)*hd/s/1e12, "TFLOP/s")
		})
	}
}

// timeMatMul returns the seconds one MatMul(dst, x, w) takes on the device, over b.N of them
// after one to warm up.
func timeMatMul(b *testing.B, be *Backend, dst, x, w backend.Tensor) float64 {
	if err := be.MatMul(dst, x, w); err != nil {
		b.Fatal(err)
	}
	wait(b, be, dst)
	b.ResetTimer()
	for range b.N {
		if err := be.MatMul(dst, x, w); err != nil {
			b.Fatal(err)
		}
	}
	wait(b, be, dst)
	return b.Elapsed().Seconds() / float64(b.N)
}

func BenchmarkGEMM(b *testing.B) {
	const n = 4096
	b.Run(fmt.Sprintf("TF32/%d", n), func(b *testing.B) {
		be := gpuBench(b)
		r := rand.New(rand.NewPCG(3, 4))
		w, err := be.Load(tensor.F32, n, n, unsafeBytes(randFloats(r, n*n, 1)))
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		x := upload(b, be, n, n, randFloats(r, n*n, 1))
		dst := upload(b, be, n, n, nil)
		s := timeMatMul(b, be, dst, x, w)
		b.ReportMetric(2*float64(n)*n*n/s/1e12, "TFLOP/s")
	})
}

// BenchmarkQuantGEMM multiplies batches of more than eight activation rows (continuous batching
// of many sequences, prompts) by 4096 x 4096 quantised weights both ways: weights expanded to F16
// for cuBLAS (Options.QuantF16) and the int8 tensor-core kernel (the default).
func BenchmarkQuantGEMM(b *testing.B) {
	const m, k = 4096, 4096
	for _, dt := range []tensor.DType{tensor.Q4_0, tensor.Q8_0, tensor.Q4_K} {
		for _, n := range []int{16, 64, 512} {
			for _, f16 := range []bool{true, false} {
				name := "mmq"
				if f16 {
					name = "f16"
				}
				b.Run(fmt.Sprintf("%v/rows=%d/%s", dt, n, name), func(b *testing.B) {
					be := gpuBenchWith(b, Options{QuantF16: f16})
					r := rand.New(rand.NewPCG(7, 8))
					w, _ := randWeights(b, be, r, dt, m, k)
					x := upload(b, be, n, k, randFloats(r, n*k, 1))
					dst := upload(b, be, n, m, nil)
					s := timeMatMul(b, be, dst, x, w)
					b.ReportMetric(2*float64(n)*m*k/s/1e12, "TFLOP/s")
				})
			}
		}
	}
}

// BenchmarkGEMV is a decode step's product against F16 and Q8_0 weights of the 1B shape's
// largest matrix (5632 x 2048), one activation row, in GB/s of weights read: against the
// device's copy bandwidth (gpu-verify's torch figures) it says how near the roofline decode runs.
func BenchmarkGEMV(b *testing.B) {
	const m, k = 5632, 2048
	for _, dt := range []tensor.DType{tensor.F16, tensor.Q8_0, tensor.Q4_K} {
		b.Run(fmt.Sprintf("%v/%dx%d", dt, m, k), func(b *testing.B) {
			be := gpuBench(b)
			r := rand.New(rand.NewPCG(5, 6))
			w, size := randWeights(b, be, r, dt, m, k)
			x := upload(b, be, 1, k, randFloats(r, k, 1))
			dst := upload(b, be, 1, m, nil)
			s := timeMatMul(b, be, dst, x, w)
			b.ReportMetric(float64(size)/s/1e9, "GB/s")
		})
	}
}

func BenchmarkBeamStep(b *testing.B) {
	const beams, k = 5, 10
	for _, vocab := range []int{51865, 32000} {
		b.Run(fmt.Sprintf("beams%d/vocab%d", beams, vocab), func(b *testing.B) {
			be := gpuBench(b)
			r := rand.New(rand.NewPCG(5, 6))
			x := upload(b, be, beams, vocab, randFloats(r, beams*vocab, 3))
			scores := []float32{-0.5, -1, -1.5, -2, -2.5}
			beam, tok := make([]int32, k), make([]int32, k)
			sc, norm := make([]float32, k), make([]float32, k)
			xt := x.(*Tensor)
			if err := be.BeamStep(xt, scores, 7, 1, beam, tok, sc, norm); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if err := be.BeamStep(xt, scores, 7, 1, beam, tok, sc, norm); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "µs/step")
		})
	}
}

// BenchmarkChoose times a Whisper beam-search step's choice on the device (backend.Chooser):
// five beams' rows of 51,865 logits, timestamps from 50,364, a drop list of 150 ids, a cut, the
// five best tokens of each row with their log-probabilities back on the host.
func BenchmarkChoose(b *testing.B) {
	const rows, vocab, split, k = 5, 51865, 50364, 5
	be := gpuBench(b)
	r := rand.New(rand.NewPCG(7, 8))
	x := upload(b, be, rows, vocab, randFloats(r, rows*vocab, 3))
	drop := make([]int32, 150)
	for i := range drop {
		drop[i] = int32(r.IntN(vocab))
	}
	choices := make([]backend.Choice, rows)
	for i := range choices {
		choices[i] = backend.Choice{Cut: [4][2]int32{{split, split + 40}}, Drop: [2]int32{2, 150}, Split: split, Probe: -1}
	}
	out := make([]backend.Chosen, rows)
	ids, logp := make([]int32, rows*k), make([]float32, rows*k)
	if err := be.Choose(x, 0, choices, drop, k, out, ids, logp); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if err := be.Choose(x, 0, choices, drop, k, out, ids, logp); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "µs/step")
}
