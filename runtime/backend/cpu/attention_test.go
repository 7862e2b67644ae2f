package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestAttentionBlocks covers what the shared suite's small caches do not reach: cache blocks
// longer than the kernel's 64-position chunks, blocks of one and of an odd number of slots (a
// chunk spans several), head sizes that are not a multiple of the vector width, and long
// prefills split over several tiles of query rows, at every instruction set. The reference is
// float64 over the values as the cache stores them, with F16 caches' roundings of the query and
// of the weights (backend.Backend.Attention).
func TestAttentionBlocks(t *testing.T) {
	if !cpu.Available() {
		t.Skip(cpu.ErrNotBuilt)
	}
	best := cpu.BestISA()
	defer cpu.SetISA(best)
	cases := []struct {
		bs, nh, nkv, hd int
		dt              tensor.DType
	}{
		{256, 4, 1, 64, tensor.F32},
		{128, 2, 2, 72, tensor.F16},
		{1, 3, 3, 24, tensor.F32},
		{7, 8, 2, 40, tensor.F16},
	}
	for isa := cpu.ISAScalar; isa <= best; isa++ {
		if err := cpu.SetISA(isa); err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			name := fmt.Sprintf("%v/bs%d/h%d-%d/hd%d/%v", isa, c.bs, c.nh, c.nkv, c.hd, c.dt)
			t.Run(name, func(t *testing.T) {
				attentionBlocks(t, c.bs, c.nh, c.nkv, c.hd, c.dt)
			})
		}
	}
}

func attentionBlocks(t *testing.T, bs, nh, nkv, hd int, dt tensor.DType) {
	be, err := New(backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	r := rand.New(rand.NewPCG(uint64(bs), uint64(hd)))
	const total = 300 // positions of the one sequence
	nblk := (total + bs - 1) / bs
	slots := (nblk + 3) * bs
	width := nkv * hd
	cfg := backend.KVConfig{Layers: 1, Slots: slots, Width: width, BlockSize: bs, DType: dt}
	kv, err := be.NewKV(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// blocks in reverse order, after three unused ones
	blocks := make([]int32, nblk)
	for i := range blocks {
		blocks[i] = int32(nblk + 2 - i)
	}
	kc, vc := make([]float64, slots*width), make([]float64, slots*width) // as stored
	store := func(v float32) float64 {
		if dt == tensor.F16 {
			return float64(quant.F16ToF32(quant.F32ToF16(v)))
		}
		return float64(v)
	}
	a := backend.Attn{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	ctx := 0
	for _, count := range []int{1, 150, 1, 97, 1, 50} {
		bt := &backend.Batch{Seqs: []backend.Seq{{Start: 0, Count: count, CtxLen: ctx + count, Blocks: blocks}}}
		for i := 0; i < count; i++ {
			p := ctx + i
			bt.Pos = append(bt.Pos, int32(p))
			bt.Slot = append(bt.Slot, blocks[p/bs]*int32(bs)+int32(p%bs))
		}
		kv32, vv32, qv := make([]float32, count*width), make([]float32, count*width), make([]float32, count*nh*hd)
		for i := range kv32 {
			kv32[i], vv32[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
		}
		for i := range qv {
			qv[i] = float32(r.NormFloat64() * 2)
		}
		for i, s := range bt.Slot {
			for e := 0; e < width; e++ {
				kc[int(s)*width+e] = store(kv32[i*width+e])
				vc[int(s)*width+e] = store(vv32[i*width+e])
			}
		}
		kt, _ := be.Alloc(tensor.F32, count, width)
		vt, _ := be.Alloc(tensor.F32, count, width)
		q, _ := be.Alloc(tensor.F32, count, nh*hd)
		dst, _ := be.Alloc(tensor.F32, count, nh*hd)
		must(t, be.Write(kt, 0, kv32), be.Write(vt, 0, vv32), be.Write(q, 0, qv),
			be.StoreKV(kv, 0, kt, vt, bt), be.Attention(dst, q, kv, 0, a, bt))
		got := make([]float32, count*nh*hd)
		must(t, be.Read(dst, 0, got))
		for i := 0; i < count; i++ {
			p := ctx + i
			for h := 0; h < nh; h++ {
				off := h / (nh / nkv) * hd
				// the contract for F16 caches: q rounded to F16 before q·K, the normalised
				// weights rounded to F16 before p·V
				qh := make([]float64, hd)
				for d, x := range qv[(i*nh+h)*hd : (i*nh+h+1)*hd] {
					qh[d] = store(x)
				}
				sc := make([]float64, p+1)
				mx := math.Inf(-1)
				for j := range sc {
					slot := int(blocks[j/bs])*bs + j%bs
					for d, x := range qh {
						sc[j] += x * kc[slot*width+off+d]
					}
					sc[j] *= float64(a.Scale)
					mx = math.Max(mx, sc[j])
				}
				sum := 0.0
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					sum += sc[j]
				}
				ulp := make([]float64, len(sc)) // how far a weight may round the other way
				for j := range sc {
					sc[j] /= sum
					if dt == tensor.F16 {
						w := sc[j]
						sc[j] = store(float32(w))
						ulp[j] = store(float32(w*(1+1e-5))) - store(float32(w*(1-1e-5)))
					}
				}
				for d := 0; d < hd; d++ {
					want, slack := 0.0, 0.0
					for j, e := range sc {
						slot := int(blocks[j/bs])*bs + j%bs
						v := vc[slot*width+off+d]
						want += e * v
						slack += ulp[j] * math.Abs(v)
					}
					// float32 rounding of hd-term scores of magnitude about 2*sqrt(hd)/sqrt(hd)
					// and of the weighted sum: a few 1e-6; outputs are convex combinations of
					// values below about 5, so 1e-5 is far above rounding and far below any
					// indexing or masking error. F16 weights near a rounding boundary may round
					// the other way: slack.
					g := got[(i*nh+h)*hd+d]
					if math.Abs(float64(g)-want) > 1e-5+slack || g != g {
						t.Fatalf("token %d (position %d) head %d element %d: %v, want %v ± %.3g", i, p, h, d, g, want, 1e-5+slack)
					}
				}
			}
		}
		for _, x := range []backend.Tensor{kt, vt, q, dst} {
			x.Close()
		}
		ctx += count
	}
	kv.Close()
}

func must(t testing.TB, errs ...error) {
	t.Helper()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
