package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Bench runs benchmarks of the shapes a LLaMA decoder computes, for every weight type:
//
//	MatMul/GEMV768x768/<dtype>       one token through a 768x768 matrix (110M model decode)
//	MatMul/GEMV4096x4096/<dtype>     one token through a 4096x4096 matrix (7B model decode)
//	MatMul/GEMM512x768x768/<dtype>   512 tokens through a 768x768 matrix (prefill)
//	MatMul/GEMM<n>x2048x768/<dtype>  n = 4, 8, 16 tokens through the 110M model's feed-forward
//	                                 up projection (a server's batched decode step)
//	MatMul/GEMM8x32000x768/<dtype>   8 tokens through the 110M model's output matrix (26 MiB in
//	                                 Q8_0: streamed from memory or the last-level cache)
//	MatMul/GEMM<n>x51864x384/<dtype> n = 4, 8 tokens through Whisper tiny's output matrix (40 MiB
//	                                 in F16: concurrent transcriptions or beams in one step)
//	Attention/Decode512/<cache>      one token attending over 512 cached positions, 12 heads of 64
//	Attention/Decode8x160/6x48/<cache>  a batched decode step's attention for the 15M shape: 8
//	                                 sequences, each one token over 160 cached positions, 6 heads of 48
//	Decode110M/<dtype>               a whole decode step of the 110M model at position 127
//	FullAttention/<n>x<m>/<heads>x<dim>/<k,v>  Whisper's encoder self-attention: 1500 positions,
//	                                 6 heads of 64 (tiny) or 8 (base), F32 or F16 keys and values;
//	                                 1 or 5 rows against 1500: the decoder's cross-attention
//	LayerNorm/1500x384, GELU/1500x1536, Copy/F32toF16/1500x384, Im2Col1D/3000x384k3s2
//	                                 the encoder's other operations at Whisper tiny's widths
//
// GEMV reports GB/s of weights streamed, GEMM GFLOP/s, Attention GB/s of cache read, Decode
// tokens/s, FullAttention GFLOP/s (4·n·m·heads·dim: the two products), the element-wise
// operations GB/s of their operands read and written; all report allocations.
func Bench(b *testing.B, newBackend func() (backend.Backend, error)) {
	be := open(b, newBackend)
	for _, sh := range []struct {
		name    string
		n, m, k int
	}{
		{"GEMV768x768", 1, 768, 768},
		{"GEMV4096x4096", 1, 4096, 4096},
		{"GEMM512x768x768", 512, 768, 768},
		{"GEMM4x2048x768", 4, 2048, 768},
		{"GEMM8x2048x768", 8, 2048, 768},
		{"GEMM16x2048x768", 16, 2048, 768},
		{"GEMM8x32000x768", 8, 32000, 768},
		{"GEMM8x51864x384", 8, 51864, 384},
		{"GEMM4x51864x384", 4, 51864, 384},
	} {
		for _, dt := range WeightDTypes {
			b.Run(fmt.Sprintf("MatMul/%s/%v", sh.name, dt), func(b *testing.B) {
				benchMatMul(b, be, dt, sh.n, sh.m, sh.k)
			})
		}
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.BF16} {
		b.Run("Attention/Decode512/"+dt.String(), func(b *testing.B) {
			benchAttention(b, be, dt)
		})
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.BF16} {
		b.Run("Attention/Decode8x160/6x48/"+dt.String(), func(b *testing.B) {
			benchAttentionBatch(b, be, dt, 8, 160, 6, 48)
		})
	}
	for _, dt := range WeightDTypes {
		b.Run("Decode110M/"+dt.String(), func(b *testing.B) {
			benchDecode(b, be, dt)
		})
	}
	for _, nh := range []int{6, 8} {
		for _, dt := range []tensor.DType{tensor.F32, tensor.F16} {
			b.Run(fmt.Sprintf("FullAttention/1500x1500/%dx64/%v", nh, dt), func(b *testing.B) {
				benchFullAttention(b, be, dt, 1500, 1500, nh, 64)
			})
		}
	}
	for _, n := range []int{1, 5} { // a decoder's cross-attention: one row (greedy) or five (beams)
		b.Run(fmt.Sprintf("FullAttention/%dx1500/6x64/F16", n), func(b *testing.B) {
			benchFullAttention(b, be, tensor.F16, n, 1500, 6, 64)
		})
	}
	benchEncoderOps(b, be)
}

func benchMatMul(b *testing.B, be backend.Backend, dt tensor.DType, n, m, k int) {
	r := rng(fmt.Sprintf("bench matmul %v %d %d", dt, m, k))
	data, _ := quantRows(b, dt, m, k, randVec(r, m*k, 0.5))
	w := load(b, be, dt, m, k, data)
	if _, err := backend.Repack(be, w); err != nil { // as models use their matrices
		b.Fatal(err)
	}
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
	if dt != tensor.F32 {
		elem = 2
	}
	s := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(2*ctx*nh*hd*elem)/s/1e9, "GB/s")
}

// benchAttentionBatch measures one decode step's attention for seqs sequences, each one token
// over ctx cached positions in blocks of 16, nh heads of hd: GB/s of cache read.
func benchAttentionBatch(b *testing.B, be backend.Backend, dt tensor.DType, seqs, ctx, nh, hd int) {
	const bs = 16
	r := rng("bench attention batch")
	per := (ctx + bs - 1) / bs
	kv, err := be.NewKV(backend.KVConfig{Layers: 1, Slots: seqs * per * bs, Width: nh * hd, BlockSize: bs, DType: dt})
	must(b, err, "NewKV")
	defer kv.Close()
	fillKV(b, be, kv, r)
	bt := &backend.Batch{}
	for s := range seqs {
		blocks := make([]int32, per)
		for i := range blocks {
			blocks[i] = int32(s*per + i)
		}
		p := ctx - 1
		bt.Pos = append(bt.Pos, int32(p))
		bt.Slot = append(bt.Slot, blocks[p/bs]*bs+int32(p%bs))
		bt.Seqs = append(bt.Seqs, backend.Seq{Start: s, Count: 1, CtxLen: ctx, Blocks: blocks})
	}
	a := backend.Attn{NHead: nh, NKVHead: nh, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	q := alloc(b, be, seqs, nh*hd, randVec(r, seqs*nh*hd, 1))
	dst := alloc(b, be, seqs, nh*hd, nil)
	b.ReportAllocs()
	for b.Loop() {
		if err := be.Attention(dst, q, kv, 0, a, bt); err != nil {
			b.Fatal(err)
		}
	}
	elem := 4
	if dt != tensor.F32 {
		elem = 2
	}
	s := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(2*seqs*ctx*nh*hd*elem)/s/1e9, "GB/s")
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

func benchFullAttention(b *testing.B, be backend.Backend, dt tensor.DType, n, m, nh, hd int) {
	r := rng("bench full attention")
	w := nh * hd
	a := backend.Attn{NHead: nh, NKVHead: nh, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	q := alloc(b, be, n, w, randVec(r, n*w, 1))
	k := alloc(b, be, m, w, randVec(r, m*w, 1))
	v := alloc(b, be, m, w, randVec(r, m*w, 1))
	if dt == tensor.F16 {
		k = allocF16(b, be, m, w, randVec(r, m*w, 1))
		v = allocF16(b, be, m, w, randVec(r, m*w, 1))
	}
	dst := alloc(b, be, n, w, nil)
	row := make([]float32, w)
	must(b, be.FullAttention(dst, q, k, v, a), "FullAttention")
	b.ReportAllocs()
	for b.Loop() {
		if err := be.FullAttention(dst, q, k, v, a); err != nil {
			b.Fatal(err)
		}
	}
	must(b, be.Read(dst, 0, row), "Read") // waits for issued work
	s := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(4*float64(n)*float64(m)*float64(w)/s/1e9, "GFLOP/s")
}

// benchEncoderOps measures LayerNorm, GELU, Copy and Im2Col1D at Whisper tiny's shapes
// (1500 positions of 384, a feed-forward width of 1536, the second convolution's input).
func benchEncoderOps(b *testing.B, be backend.Backend) {
	r := rng("bench encoder ops")
	const n, d, ff = 1500, 384, 1536
	x := alloc(b, be, n, d, randVec(r, n*d, 1))
	xf := alloc(b, be, n, ff, randVec(r, n*ff, 1))
	w, bias := alloc(b, be, 1, d, randVec(r, d, 1)), alloc(b, be, 1, d, randVec(r, d, 1))
	dst, dstf := alloc(b, be, n, d, nil), alloc(b, be, n, ff, nil)
	h := allocF16(b, be, n, d, nil)
	sig := alloc(b, be, 2*n, d, randVec(r, 2*n*d, 1))
	cols := alloc(b, be, n, 3*d, nil)
	for _, c := range []struct {
		name  string
		bytes int // operand bytes read and written by one call
		run   func() error
	}{
		{"LayerNorm/1500x384", 8 * n * d, func() error { return be.LayerNorm(dst, x, w, bias, 1e-5) }},
		{"GELU/1500x1536", 8 * n * ff, func() error { return be.GELU(dstf, xf) }},
		{"Copy/F32toF16/1500x384", 6 * n * d, func() error { return be.Copy(h, x) }},
		{"Im2Col1D/3000x384k3s2", 4 * (2*n*d + n*3*d), func() error { return be.Im2Col1D(cols, sig, 3, 2, 1) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			must(b, c.run(), "%s", c.name)
			out := make([]float32, d)
			b.ReportAllocs()
			for b.Loop() {
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
			}
			must(b, be.Read(dst, 0, out), "Read") // waits for issued work
			s := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(float64(c.bytes)/s/1e9, "GB/s")
		})
	}
}
