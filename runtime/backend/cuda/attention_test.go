//go:build cuda && cgo && !nocgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestTF32Attention checks attention over F32 keys and values on tensor cores (Options.FlashMMA
// with TF32 on) against a float64 reference, within TF32's bound, and that it is the TF32
// kernel that ran: its outputs must differ from those of a backend computing in full F32 by
// more than F32 rounding could.
//
// The bound: queries and keys rounded to TF32 (2^-11 relative each, to nearest) move a score
// s_j by at most e_j = Scale·Σ|q·k_j|·(2^-10 + 2^-22 + (HeadDim+2)·2^-24) (the last term the F32
// sum); that changes the softmax weights by a factor within exp(±2e), which moves the output by
// at most expm1(2·max e)·max|v|. The weights and values rounded to TF32 add 2^-10 + 2^-22 of
// Σ p_j·|v_j| <= max|v|, and the F32 softmax, its sums over ctx keys and the normalisation
// 2·(ctx+HeadDim+8)·2^-24 + 2^-18 (exp) of max|v|. The kernel takes prompts (two or more
// tokens) whose head dimension is 64, 80 or 128; decode steps stay on the CUDA cores.
func TestTF32Attention(t *testing.T) {
	gpu(t)
	tc, err := New(Options{FlashMMA: true})
	if err != nil {
		t.Skipf("tensor-core attention: %v", err)
	}
	defer tc.Close()
	exact, err := New(Options{FlashMMA: true, ExactF32: true})
	if err != nil {
		t.Fatal(err)
	}
	defer exact.Close()
	for _, hd := range []int{64, 80, 128} {
		t.Run(fmt.Sprintf("HeadDim%d", hd), func(t *testing.T) {
			const nh, nkv, bs = 4, 2, 16
			a := backend.Attn{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: float32(1.5 / math.Sqrt(float64(hd)))}
			r := rand.New(rand.NewPCG(uint64(hd), 7))
			// Sequence 0: a prompt of 70 tokens (a full tile of 64 queries and a part of one);
			// sequence 1: 33 tokens, then 40 more that continue its cache; blocks interleaved.
			steps := [][]struct{ seq, count int }{{{0, 70}, {1, 33}}, {{1, 40}}}
			tables := [2][]int32{}
			for i := 0; i < 10; i++ {
				tables[i%2] = append(tables[i%2], int32(9-i))
			}
			cfg := backend.KVConfig{Layers: 1, Slots: 10 * bs, Width: nkv * hd, BlockSize: bs, DType: tensor.F32}
			var kvs []backend.KV
			for _, be := range []*Backend{tc, exact} {
				kv, err := be.NewKV(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer kv.Close()
				kvs = append(kvs, kv)
			}
			keys, vals := make([]float32, cfg.Slots*cfg.Width), make([]float32, cfg.Slots*cfg.Width)
			ctx := [2]int{}
			for si, st := range steps {
				bt := &backend.Batch{}
				for _, e := range st {
					bt.Seqs = append(bt.Seqs, backend.Seq{Start: len(bt.Pos), Count: e.count, CtxLen: ctx[e.seq] + e.count, Blocks: tables[e.seq]})
					for c := 0; c < e.count; c++ {
						p := ctx[e.seq] + c
						bt.Pos = append(bt.Pos, int32(p))
						bt.Slot = append(bt.Slot, tables[e.seq][p/bs]*bs+int32(p%bs))
					}
				}
				n := len(bt.Pos)
				k, v, q := randFloats(r, n*cfg.Width, 1), randFloats(r, n*cfg.Width, 1), randFloats(r, n*nh*hd, 1)
				for i, s := range bt.Slot {
					copy(keys[int(s)*cfg.Width:], k[i*cfg.Width:(i+1)*cfg.Width])
					copy(vals[int(s)*cfg.Width:], v[i*cfg.Width:(i+1)*cfg.Width])
				}
				var outs [2][]float32
				for i, be := range []*Backend{tc, exact} {
					kt, vt, qt := onDevice(t, be, n, cfg.Width, k), onDevice(t, be, n, cfg.Width, v), onDevice(t, be, n, nh*hd, q)
					dst := onDevice(t, be, n, nh*hd, nil)
					if err := be.StoreKV(kvs[i], 0, kt, vt, bt); err != nil {
						t.Fatal(err)
					}
					if err := be.Attention(dst, qt, kvs[i], 0, a, bt); err != nil {
						t.Fatal(err)
					}
					outs[i] = make([]float32, n*nh*hd)
					if err := be.Read(dst, 0, outs[i]); err != nil {
						t.Fatal(err)
					}
				}
				apart := 0.0
				for _, s := range bt.Seqs {
					for c := 0; c < s.Count; c++ {
						i, ctxLen := s.Start+c, s.CtxLen-s.Count+c+1
						for h := 0; h < nh; h++ {
							off := (h / (nh / nkv)) * hd
							row := func(m []float32, j int) []float32 {
								at := (int(s.Blocks[j/bs])*bs+j%bs)*cfg.Width + off
								return m[at : at+hd]
							}
							want, bound := tf32Reference(q[(i*nh+h)*hd:(i*nh+h+1)*hd], ctxLen, func(j int) []float32 { return row(keys, j) },
								func(j int) []float32 { return row(vals, j) }, float64(a.Scale))
							for d := range want {
								got := float64(outs[0][(i*nh+h)*hd+d])
								if diff := math.Abs(got - want[d]); !(diff <= bound) {
									t.Fatalf("step %d token %d head %d [%d] = %v, want %v (TF32 bound %.3g)", si, i, h, d, got, want[d], bound)
								}
								apart = math.Max(apart, math.Abs(got-float64(outs[1][(i*nh+h)*hd+d])))
							}
						}
					}
				}
				// Outputs are of order 0.1-1; full F32 arithmetic keeps them within about 1e-6 of
				// the reference, TF32 inputs move them by about 1e-4.
				if apart < 1e-5 {
					t.Fatalf("step %d: the outputs are within %.3g of full F32's: the TF32 kernel did not run", si, apart)
				}
				t.Logf("step %d: largest difference from full F32 %.3g", si, apart)
				for _, e := range st {
					ctx[e.seq] += e.count
				}
			}

			// Unmasked attention (Whisper's encoder and cross-attention) over dense keys and values.
			const n, m = 70, 45
			k, v, q := randFloats(r, m*cfg.Width, 1), randFloats(r, m*cfg.Width, 1), randFloats(r, n*nh*hd, 1)
			var outs [2][]float32
			for i, be := range []*Backend{tc, exact} {
				dst := onDevice(t, be, n, nh*hd, nil)
				if err := be.FullAttention(dst, onDevice(t, be, n, nh*hd, q), onDevice(t, be, m, cfg.Width, k), onDevice(t, be, m, cfg.Width, v), a); err != nil {
					t.Fatal(err)
				}
				outs[i] = make([]float32, n*nh*hd)
				if err := be.Read(dst, 0, outs[i]); err != nil {
					t.Fatal(err)
				}
			}
			apart := 0.0
			for i := 0; i < n; i++ {
				for h := 0; h < nh; h++ {
					off := (h / (nh / nkv)) * hd
					row := func(x []float32, j int) []float32 { return x[j*cfg.Width+off : j*cfg.Width+off+hd] }
					want, bound := tf32Reference(q[(i*nh+h)*hd:(i*nh+h+1)*hd], m, func(j int) []float32 { return row(k, j) },
						func(j int) []float32 { return row(v, j) }, float64(a.Scale))
					for d := range want {
						got := float64(outs[0][(i*nh+h)*hd+d])
						if diff := math.Abs(got - want[d]); !(diff <= bound) {
							t.Fatalf("full attention: token %d head %d [%d] = %v, want %v (TF32 bound %.3g)", i, h, d, got, want[d], bound)
						}
						apart = math.Max(apart, math.Abs(got-float64(outs[1][(i*nh+h)*hd+d])))
					}
				}
			}
			if apart < 1e-5 {
				t.Fatalf("full attention: the outputs are within %.3g of full F32's: the TF32 kernel did not run", apart)
			}
		})
	}
}

// tf32Reference returns the float64 attention of one query head over ctx keys and values, and
// the bound of TestTF32Attention on each of its elements.
func tf32Reference(q []float32, ctx int, key, val func(j int) []float32, scale float64) ([]float64, float64) {
	hd := len(q)
	rel := 0x1p-10 + 0x1p-22 + float64(hd+2)*0x1p-24
	s := make([]float64, ctx)
	smax, emax, vmax := math.Inf(-1), 0.0, 0.0
	for j := range s {
		dot, abs := 0.0, 0.0
		for d, kv := range key(j) {
			dot += float64(q[d]) * float64(kv)
			abs += math.Abs(float64(q[d]) * float64(kv))
		}
		s[j] = scale * dot
		smax = math.Max(smax, s[j])
		emax = math.Max(emax, scale*abs*rel)
		for _, v := range val(j) {
			vmax = math.Max(vmax, math.Abs(float64(v)))
		}
	}
	sum := 0.0
	for j := range s {
		s[j] = math.Exp(s[j] - smax)
		sum += s[j]
	}
	out := make([]float64, hd)
	for j := range s {
		for d, v := range val(j) {
			out[d] += s[j] / sum * float64(v)
		}
	}
	bound := (math.Expm1(2*emax) + 0x1p-10 + 0x1p-22 + 2*float64(ctx+hd+8)*0x1p-24 + 0x1p-18) * vmax
	return out, bound
}

// onDevice is upload with NaN for a nil v, so that elements left unwritten show.
func onDevice(t *testing.T, be *Backend, rows, cols int, v []float32) backend.Tensor {
	t.Helper()
	if v == nil {
		v = make([]float32, rows*cols)
		for i := range v {
			v[i] = float32(math.NaN())
		}
	}
	return upload(t, be, rows, cols, v)
}
