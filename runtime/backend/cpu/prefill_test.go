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

// BenchmarkPrefill110M runs the prompt-processing step of the 110M-parameter LLaMA shape (dim
// 768, hidden 2048, 12 layers of 12 heads, vocabulary 32000) for a 512-token prompt with 2
// threads: every layer's operations over all tokens, then the output matrix for the last token
// only. It reports tokens/s and GFLOP/s. Layers share their weight matrices (prompt processing is
// bound by arithmetic, not by weight traffic), so setting up costs little.
func BenchmarkPrefill110M(b *testing.B) {
	if !cpu.Available() {
		b.Skip(cpu.ErrNotBuilt)
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.Q8_0, tensor.Q4_0, tensor.Q4_K} {
		b.Run(dt.String(), func(b *testing.B) { benchPrefill(b, dt, 512) })
	}
}

func benchPrefill(b *testing.B, dt tensor.DType, n int) {
	const dim, hidden, layers, heads, vocab, bs = 768, 2048, 12, 12, 32000, 16
	const hd = dim / heads
	be, err := New(backend.Options{Threads: 2})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	r := rand.New(rand.NewPCG(1, uint64(dt)))
	weight := func(dt tensor.DType, rows, cols int) backend.Tensor {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = float32(r.NormFloat64() * 0.02)
		}
		rs, _ := dt.RowSize(int64(cols))
		data := make([]byte, rows*int(rs))
		for i := 0; i < rows; i++ {
			if err := quant.Quantize(dt, v[i*cols:(i+1)*cols], data[i*int(rs):(i+1)*int(rs)]); err != nil {
				b.Fatal(err)
			}
		}
		t, err := be.Load(dt, rows, cols, data)
		if err != nil {
			b.Fatal(err)
		}
		return t
	}
	act := func(rows, cols int) backend.Tensor {
		t, err := be.Alloc(tensor.F32, rows, cols)
		if err != nil {
			b.Fatal(err)
		}
		return t
	}
	outDT := dt
	if dt.Quantized() && dt != tensor.Q8_0 {
		outDT = tensor.Q6_K
	}
	wq, wk, wv, wo := weight(dt, dim, dim), weight(dt, dim, dim), weight(dt, dim, dim), weight(dt, dim, dim)
	w1, w3, w2 := weight(dt, hidden, dim), weight(dt, hidden, dim), weight(dt, dim, hidden)
	out := weight(outDT, vocab, dim)
	norm := act(1, dim)
	ones := make([]float32, dim)
	for i := range ones {
		ones[i] = 1
	}
	must(b, be.Write(norm, 0, ones))
	x, xn, q, k, v, att, o := act(n, dim), act(n, dim), act(n, dim), act(n, dim), act(n, dim), act(n, dim), act(n, dim)
	gate, up, logits := act(n, hidden), act(n, hidden), act(1, vocab)
	xv := make([]float32, n*dim)
	for i := range xv {
		xv[i] = float32(r.NormFloat64())
	}
	kv, err := be.NewKV(backend.KVConfig{Layers: layers, Slots: (n + bs - 1) / bs * bs, Width: dim, BlockSize: bs, DType: tensor.F16})
	if err != nil {
		b.Fatal(err)
	}
	bt := &backend.Batch{Seqs: []backend.Seq{{Start: 0, Count: n, CtxLen: n}}}
	for i := 0; i < n; i++ {
		bt.Pos = append(bt.Pos, int32(i))
		bt.Slot = append(bt.Slot, int32(i))
	}
	for i := 0; i < (n+bs-1)/bs; i++ {
		bt.Seqs[0].Blocks = append(bt.Seqs[0].Blocks, int32(i))
	}
	rope := backend.RoPE{Mode: backend.RoPENormal, HeadDim: hd, Dims: hd, Base: 10000, FreqScale: 1}
	attn := backend.Attn{NHead: heads, NKVHead: heads, HeadDim: hd, Scale: float32(1 / math.Sqrt(hd))}
	last, err := be.View(xn, n-1, 1)
	if err != nil {
		b.Fatal(err)
	}
	host := make([]float32, vocab)
	step := func() error {
		if err := be.Write(x, 0, xv); err != nil {
			return err
		}
		for l := 0; l < layers; l++ {
			for _, err := range []error{
				be.RMSNorm(xn, x, norm, 1e-5),
				be.MatMul(q, xn, wq), be.MatMul(k, xn, wk), be.MatMul(v, xn, wv),
				be.Rope(q, heads, rope, bt), be.Rope(k, heads, rope, bt),
				be.StoreKV(kv, l, k, v, bt),
				be.Attention(att, q, kv, l, attn, bt),
				be.MatMul(o, att, wo), be.AddRows(x, x, o),
				be.RMSNorm(xn, x, norm, 1e-5),
				be.MatMul(gate, xn, w1), be.MatMul(up, xn, w3), be.SwiGLU(gate, gate, up),
				be.MatMul(o, gate, w2), be.AddRows(x, x, o),
			} {
				if err != nil {
					return err
				}
			}
		}
		if err := be.RMSNorm(xn, x, norm, 1e-5); err != nil {
			return err
		}
		if err := be.MatMul(logits, last, out); err != nil {
			return err
		}
		return be.Read(logits, 0, host)
	}
	must(b, step())
	b.ReportAllocs()
	for b.Loop() {
		if err := step(); err != nil {
			b.Fatal(err)
		}
	}
	s := b.Elapsed().Seconds() / float64(b.N)
	flops := float64(layers) * (2*float64(n)*(4*dim*dim+3*dim*hidden) + 2*2*float64(n)*float64(n+1)/2*dim)
	b.ReportMetric(float64(n)/s, "tokens/s")
	b.ReportMetric(flops/s/1e9, "GFLOP/s")
}
