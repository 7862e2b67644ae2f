package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// modelShape sizes a LLaMA-style decoder.
type modelShape struct {
	dim, hidden, layers, heads, kvHeads, vocab int
	ctx, blockSize                             int // positions cached when decoding; KV block size
}

// llama110M is the shape of the 110M-parameter TinyStories LLaMA.
var llama110M = modelShape{dim: 768, hidden: 2048, layers: 12, heads: 12, kvHeads: 12, vocab: 32000, ctx: 128, blockSize: 16}

type modelLayer struct {
	attnNorm, wq, wk, wv, wo, ffnNorm, w1, w3, w2 backend.Tensor
}

// model is a decoder with random weights that decodes one token at a time at a fixed position,
// issuing the operations a real forward step issues.
type model struct {
	b                          backend.Backend
	s                          modelShape
	embd, outNorm, out         backend.Tensor
	layers                     []modelLayer
	kv                         backend.KV
	x, xn, q, k, v, att, o     backend.Tensor // [1, ...] activations
	gate, up, logits           backend.Tensor
	batch                      *backend.Batch
	rope                       backend.RoPE
	attn                       backend.Attn
	ids                        []int32
	host                       []float32
	closers                    []backend.Tensor
	weightBytes, flopsPerToken float64
}

// newModel builds s with weights of dt, the output matrix of outDT and an F16 cache. Each weight
// matrix has its own memory (copies of one quantised random matrix per shape), so a step streams
// as many bytes as a real model of that size.
func newModel(t testing.TB, b backend.Backend, s modelShape, dt, outDT tensor.DType) *model {
	t.Helper()
	m := &model{b: b, s: s}
	r := rng(fmt.Sprintf("model %+v %v", s, dt))
	shapes := map[[3]int][]byte{}
	weight := func(dt tensor.DType, rows, cols int) backend.Tensor {
		key := [3]int{int(dt), rows, cols}
		src, ok := shapes[key]
		if !ok {
			src, _ = quantRows(t, dt, rows, cols, randVec(r, rows*cols, 0.02))
			shapes[key] = src
		}
		data := append([]byte(nil), src...)
		w := load(t, b, dt, rows, cols, data)
		m.closers = append(m.closers, w)
		m.weightBytes += float64(len(data))
		return w
	}
	norm := func() backend.Tensor {
		w := alloc(t, b, 1, s.dim, randVec(r, s.dim, 1))
		m.closers = append(m.closers, w)
		return w
	}
	act := func(cols int) backend.Tensor {
		x := alloc(t, b, 1, cols, nil)
		m.closers = append(m.closers, x)
		return x
	}
	hd := s.dim / s.heads
	kvw := s.kvHeads * hd
	m.embd = weight(dt, s.vocab, s.dim)
	m.weightBytes -= float64(len(shapes[[3]int{int(dt), s.vocab, s.dim}])) // one row is read
	for l := 0; l < s.layers; l++ {
		m.layers = append(m.layers, modelLayer{
			attnNorm: norm(),
			wq:       weight(dt, s.dim, s.dim),
			wk:       weight(dt, kvw, s.dim),
			wv:       weight(dt, kvw, s.dim),
			wo:       weight(dt, s.dim, s.dim),
			ffnNorm:  norm(),
			w1:       weight(dt, s.hidden, s.dim),
			w3:       weight(dt, s.hidden, s.dim),
			w2:       weight(dt, s.dim, s.hidden),
		})
	}
	m.outNorm = norm()
	m.out = weight(outDT, s.vocab, s.dim)
	m.flopsPerToken = 2 * float64(s.layers*(2*s.dim*s.dim+2*kvw*s.dim+3*s.hidden*s.dim)+s.vocab*s.dim)

	m.x, m.xn, m.q, m.att, m.o = act(s.dim), act(s.dim), act(s.dim), act(s.dim), act(s.dim)
	m.k, m.v = act(kvw), act(kvw)
	m.gate, m.up = act(s.hidden), act(s.hidden)
	m.logits = act(s.vocab)
	m.host = make([]float32, s.vocab)
	m.ids = []int32{int32(s.vocab / 3)}

	slots := (s.ctx + s.blockSize - 1) / s.blockSize * s.blockSize
	kv, err := b.NewKV(backend.KVConfig{Layers: s.layers, Slots: slots, Width: kvw, BlockSize: s.blockSize, DType: tensor.F16})
	must(t, err, "NewKV")
	m.kv = kv
	fillKV(t, b, kv, r)
	m.batch = decodeBatch(s.ctx, s.blockSize)
	m.rope = backend.RoPE{Mode: backend.RoPENormal, HeadDim: hd, Dims: hd, Base: 10000, FreqScale: 1}
	m.attn = backend.Attn{NHead: s.heads, NKVHead: s.kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	return m
}

// step decodes one token and reads back its logits.
func (m *model) step() error {
	b := m.b
	if err := b.GetRows(m.x, m.embd, m.ids); err != nil {
		return err
	}
	for l := range m.layers {
		ly := &m.layers[l]
		for _, err := range []error{
			b.RMSNorm(m.xn, m.x, ly.attnNorm, 1e-5),
			b.MatMul(m.q, m.xn, ly.wq),
			b.MatMul(m.k, m.xn, ly.wk),
			b.MatMul(m.v, m.xn, ly.wv),
			b.Rope(m.q, m.s.heads, m.rope, m.batch),
			b.Rope(m.k, m.s.kvHeads, m.rope, m.batch),
			b.StoreKV(m.kv, l, m.k, m.v, m.batch),
			b.Attention(m.att, m.q, m.kv, l, m.attn, m.batch),
			b.MatMul(m.o, m.att, ly.wo),
			b.AddRows(m.x, m.x, m.o),
			b.RMSNorm(m.xn, m.x, ly.ffnNorm, 1e-5),
			b.MatMul(m.gate, m.xn, ly.w1),
			b.MatMul(m.up, m.xn, ly.w3),
			b.SwiGLU(m.gate, m.gate, m.up),
			b.MatMul(m.o, m.gate, ly.w2),
			b.AddRows(m.x, m.x, m.o),
		} {
			if err != nil {
				return err
			}
		}
	}
	if err := b.RMSNorm(m.xn, m.x, m.outNorm, 1e-5); err != nil {
		return err
	}
	if err := b.MatMul(m.logits, m.xn, m.out); err != nil {
		return err
	}
	return b.Read(m.logits, 0, m.host)
}

func (m *model) close() {
	for _, x := range m.closers {
		x.Close()
	}
	m.kv.Close()
}

// testZeroAllocs checks that steady-state decoding allocates nothing: MatMul of one token for
// several weight types, Attention of one token, the encoder's operations, and a whole decode
// step of a small model.
func testZeroAllocs(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	const k, m = 512, 96
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.Q8_0, tensor.Q4_0, tensor.Q4_1, tensor.Q4_K, tensor.Q6_K} {
		t.Run("MatMul/"+dt.String(), func(t *testing.T) {
			r := rng("allocs " + dt.String())
			data, _ := quantRows(t, dt, m, k, randVec(r, m*k, 1))
			w := load(t, b, dt, m, k, data)
			x := alloc(t, b, 1, k, randVec(r, k, 1))
			dst := alloc(t, b, 1, m, nil)
			out := make([]float32, m)
			var err error
			run := func() {
				if e := b.MatMul(dst, x, w); e != nil && err == nil {
					err = e
				}
				if e := b.Read(dst, 0, out); e != nil && err == nil {
					err = e
				}
			}
			run()
			must(t, err, "MatMul")
			if n := testing.AllocsPerRun(20, run); n != 0 {
				t.Errorf("MatMul %v of one token: %v allocations per call, want 0", dt, n)
			}
		})
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16} {
		t.Run("Attention/"+dt.String(), func(t *testing.T) {
			const nh, nkv, hd, ctx, bs = 8, 2, 64, 300, 16
			r := rng("allocs attention " + dt.String())
			kv, err := b.NewKV(backend.KVConfig{Layers: 1, Slots: 320, Width: nkv * hd, BlockSize: bs, DType: dt})
			must(t, err, "NewKV")
			defer kv.Close()
			fillKV(t, b, kv, r)
			bt := decodeBatch(ctx, bs)
			a := backend.Attn{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: 0.125}
			kt := alloc(t, b, 1, nkv*hd, randVec(r, nkv*hd, 1))
			vt := alloc(t, b, 1, nkv*hd, randVec(r, nkv*hd, 1))
			q := alloc(t, b, 1, nh*hd, randVec(r, nh*hd, 1))
			dst := alloc(t, b, 1, nh*hd, nil)
			out := make([]float32, nh*hd)
			run := func() {
				for _, e := range []error{b.StoreKV(kv, 0, kt, vt, bt), b.Attention(dst, q, kv, 0, a, bt), b.Read(dst, 0, out)} {
					if e != nil && err == nil {
						err = e
					}
				}
			}
			run()
			must(t, err, "StoreKV, Attention")
			if n := testing.AllocsPerRun(20, run); n != 0 {
				t.Errorf("StoreKV and Attention of one token: %v allocations per call, want 0", n)
			}
		})
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16} {
		t.Run("EncoderOps/"+dt.String(), func(t *testing.T) {
			// A Whisper encoder layer's operations other than MatMul, at small sizes: the
			// keys and values converted to dt, full attention, norms, GELU, a convolution's
			// input layout.
			const n, nh, hd, ff = 40, 4, 16, 256
			d := nh * hd
			r := rng("allocs encoder " + dt.String())
			x := alloc(t, b, n, d, randVec(r, n*d, 1))
			w, bias := alloc(t, b, 1, d, randVec(r, d, 1)), alloc(t, b, 1, d, randVec(r, d, 1))
			xn, q, att := alloc(t, b, n, d, nil), alloc(t, b, n, d, randVec(r, n*d, 1)), alloc(t, b, n, d, nil)
			h := alloc(t, b, n, ff, randVec(r, n*ff, 1))
			cols := alloc(t, b, (n+2-3)/2+1, 3*d, nil)
			k, v := alloc(t, b, n, d, nil), alloc(t, b, n, d, nil)
			if dt == tensor.F16 {
				k, v = allocF16(t, b, n, d, nil), allocF16(t, b, n, d, nil)
			}
			a := backend.Attn{NHead: nh, NKVHead: nh, HeadDim: hd, Scale: 0.25}
			out := make([]float32, n*d)
			var err error
			run := func() {
				for _, e := range []error{
					b.LayerNorm(xn, x, w, bias, 1e-5),
					b.Copy(k, xn),
					b.Copy(v, x),
					b.FullAttention(att, q, k, v, a),
					b.GELU(h, h),
					b.Im2Col1D(cols, x, 3, 2, 1),
					b.Read(att, 0, out),
				} {
					if e != nil && err == nil {
						err = e
					}
				}
			}
			run()
			must(t, err, "encoder operations")
			if n := testing.AllocsPerRun(20, run); n != 0 {
				t.Errorf("encoder operations: %v allocations per run, want 0", n)
			}
		})
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.Q8_0, tensor.Q4_K} {
		t.Run("DecodeStep/"+dt.String(), func(t *testing.T) {
			s := modelShape{dim: 256, hidden: 512, layers: 2, heads: 4, kvHeads: 2, vocab: 97, ctx: 40, blockSize: 16}
			md := newModel(t, b, s, dt, dt)
			defer md.close()
			var err error
			run := func() {
				if e := md.step(); e != nil && err == nil {
					err = e
				}
			}
			run()
			must(t, err, "decode step")
			if n := testing.AllocsPerRun(10, run); n != 0 {
				t.Errorf("decode step: %v allocations per token, want 0", n)
			}
		})
	}
}
