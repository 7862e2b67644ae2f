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
// float64 over the values as the cache stores them, with F16 and BF16 caches' roundings of the
// query and of the weights (backend.Backend.Attention).
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
		{128, 2, 2, 72, tensor.BF16},
		{7, 8, 2, 40, tensor.BF16},
		{5, 6, 3, 36, tensor.BF16}, // head size not a multiple of 8: the vector kernels' tails
	}
	for isa := shortISA(cpu.ISAScalar, best); isa <= best; isa++ {
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
		switch dt {
		case tensor.F16:
			return float64(quant.F16ToF32(quant.F32ToF16(v)))
		case tensor.BF16:
			return float64(quant.BF16ToF32(quant.F32ToBF16(v)))
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
				// the contract for F16 (BF16) caches: q rounded to F16 (BF16) before q·K, the
				// normalised weights rounded to F16 (BF16) before p·V
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
					if dt != tensor.F32 {
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
					// indexing or masking error. F16 and BF16 weights near a rounding boundary
					// may round the other way: slack.
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

// TestAttentionF16TailsAVX2 checks that attention over F16 caches whose head size has elements
// past the whole 64-element steps (48, 80, 96) gives the same outputs, bit for bit, with the
// kernels lowered to AVX2 as at AVX-512: the AVX2 score and p·V tails sum in the order of the
// AVX-512 ones. Both levels take the row-at-a-time path here (items of fewer than 8 query rows:
// decode and short prefills, plain and grouped heads; full attention of one query row). For head
// sizes above 64 the first 64 elements of queries and keys are multiples of 1/2 in [-1, 1], so
// that the F32 part of the scores, which the two levels sum in different orders, is exact.
func TestAttentionF16TailsAVX2(t *testing.T) {
	if !cpu.Available() {
		t.Skip(cpu.ErrNotBuilt)
	}
	best := cpu.BestISA()
	if best < cpu.ISAAVX512 {
		t.Skip("no AVX-512 on this processor: nothing to compare the AVX2 tails with")
	}
	if testing.Short() {
		t.Skip("-short: two instruction sets' C kernels compared, which the race detector does not see; the full run checks them")
	}
	defer cpu.SetISA(best)
	same := func(t *testing.T, what string, a, b []float32) {
		t.Helper()
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("%s: element %d: AVX2 %v (%#08x), AVX-512 %v (%#08x)", what, i, b[i],
					math.Float32bits(b[i]), a[i], math.Float32bits(a[i]))
			}
		}
	}
	for _, hd := range []int{48, 80, 96, 40, 72} {
		for _, h := range []struct{ nh, nkv int }{{6, 6}, {4, 2}, {8, 2}} {
			t.Run(fmt.Sprintf("cache/hd%d/h%d-%d", hd, h.nh, h.nkv), func(t *testing.T) {
				var out [2][]tailStep
				for i, isa := range []cpu.ISA{cpu.ISAAVX512, cpu.ISAAVX2} {
					must(t, cpu.SetISA(isa))
					out[i] = tailCacheOutputs(t, hd, h.nh, h.nkv)
				}
				for s := range out[0] {
					same(t, out[0][s].what, out[0][s].out, out[1][s].out)
				}
			})
		}
		for _, m := range []int{1, 33, 64, 100, 161, 250} {
			t.Run(fmt.Sprintf("full/hd%d/m%d", hd, m), func(t *testing.T) {
				var out [2][]float32
				for i, isa := range []cpu.ISA{cpu.ISAAVX512, cpu.ISAAVX2} {
					must(t, cpu.SetISA(isa))
					out[i] = tailFullOutputs(t, hd, m)
				}
				same(t, "full attention", out[0], out[1])
			})
		}
	}
}

type tailStep struct {
	what string
	out  []float32
}

// tailValue returns element d of a query (query true) or key row of head size hd. Elements of
// the whole 64-element steps are multiples of 1/2 in [-1, 1] (exact F32 sums). Past them, the
// elements are normal but for two in different double lanes whose products are 2^30 and -2^30
// in every row: they cancel, but the normal products added to them are rounded at 2^-22, so
// that the score of any other order of the double sums differs in its last bits.
func tailValue(r *rand.Rand, hd, d int, query bool) float32 {
	hd64 := hd &^ 63
	switch {
	case d < hd64:
		return float32(r.IntN(5)-2) / 2
	case d == hd64+1:
		return 1 << 15
	case d == hd64+6 && query:
		return -(1 << 15)
	case d == hd64+6:
		return 1 << 15
	}
	return float32(r.NormFloat64())
}

// tailCacheOutputs runs two sequences of up to 200 positions through an F16 cache, one growing
// a token at a time after a short prefill, the other by prefills of varying lengths (at most 7
// query rows an item), and returns the outputs of every step.
func tailCacheOutputs(t *testing.T, hd, nh, nkv int) []tailStep {
	be, err := New(backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	r := rand.New(rand.NewPCG(uint64(hd), uint64(nh*16+nkv)))
	const bs, total = 16, 200
	nblk := (total + bs - 1) / bs
	width := nkv * hd
	kv, err := be.NewKV(backend.KVConfig{Layers: 1, Slots: 2 * nblk * bs, Width: width, BlockSize: bs, DType: tensor.F16})
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	blocks := [2][]int32{make([]int32, nblk), make([]int32, nblk)}
	for i := 0; i < nblk; i++ {
		blocks[0][i], blocks[1][i] = int32(2*i), int32(2*nblk-1-2*i)
	}
	a := backend.Attn{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	maxc := max(1, 7/(nh/nkv)) // tokens an item of fewer than 8 rows holds
	counts := [2][]int{{maxc, 1}, {maxc, 1, 2, maxc - 1, 3}}
	var ctx [2]int
	var steps []tailStep
	for step := 0; ctx[0] < total || ctx[1] < total; step++ {
		bt := &backend.Batch{}
		for s := range 2 {
			cs := counts[s]
			n := cs[min(step, len(cs)-1)]
			if s == 1 {
				n = cs[step%len(cs)]
			}
			n = min(max(1, min(n, maxc)), total-ctx[s])
			if n <= 0 {
				continue
			}
			bt.Seqs = append(bt.Seqs, backend.Seq{Start: len(bt.Pos), Count: n, CtxLen: ctx[s] + n, Blocks: blocks[s]})
			for i := 0; i < n; i++ {
				p := ctx[s] + i
				bt.Pos = append(bt.Pos, int32(p))
				bt.Slot = append(bt.Slot, blocks[s][p/bs]*bs+int32(p%bs))
			}
			ctx[s] += n
		}
		nt := len(bt.Pos)
		kv32, vv32, qv := make([]float32, nt*width), make([]float32, nt*width), make([]float32, nt*nh*hd)
		for i := range kv32 {
			kv32[i], vv32[i] = tailValue(r, hd, i%hd, false), float32(r.NormFloat64())
		}
		for i := range qv {
			qv[i] = tailValue(r, hd, i%hd, true)
		}
		kt, _ := be.Alloc(tensor.F32, nt, width)
		vt, _ := be.Alloc(tensor.F32, nt, width)
		q, _ := be.Alloc(tensor.F32, nt, nh*hd)
		dst, _ := be.Alloc(tensor.F32, nt, nh*hd)
		must(t, be.Write(kt, 0, kv32), be.Write(vt, 0, vv32), be.Write(q, 0, qv),
			be.StoreKV(kv, 0, kt, vt, bt), be.Attention(dst, q, kv, 0, a, bt))
		got := make([]float32, nt*nh*hd)
		must(t, be.Read(dst, 0, got))
		what := fmt.Sprintf("step %d (contexts %d, %d)", step, ctx[0], ctx[1])
		steps = append(steps, tailStep{what, got})
		for _, x := range []backend.Tensor{kt, vt, q, dst} {
			x.Close()
		}
	}
	return steps
}

// tailFullOutputs returns full attention of one query row over m F16 keys and values, four heads.
func tailFullOutputs(t *testing.T, hd, m int) []float32 {
	be, err := New(backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	r := rand.New(rand.NewPCG(uint64(hd), uint64(m)))
	const nh = 4
	w := nh * hd
	a := backend.Attn{NHead: nh, NKVHead: nh, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	qv, kv32, vv32 := make([]float32, w), make([]float32, m*w), make([]float32, m*w)
	for i := range qv {
		qv[i] = tailValue(r, hd, i%hd, true)
	}
	for i := range kv32 {
		kv32[i], vv32[i] = tailValue(r, hd, i%hd, false), float32(r.NormFloat64())
	}
	q, _ := be.Alloc(tensor.F32, 1, w)
	dst, _ := be.Alloc(tensor.F32, 1, w)
	k32, _ := be.Alloc(tensor.F32, m, w)
	v32, _ := be.Alloc(tensor.F32, m, w)
	k, _ := be.Alloc(tensor.F16, m, w)
	v, _ := be.Alloc(tensor.F16, m, w)
	defer func() {
		for _, x := range []backend.Tensor{q, dst, k32, v32, k, v} {
			x.Close()
		}
	}()
	must(t, be.Write(q, 0, qv), be.Write(k32, 0, kv32), be.Write(v32, 0, vv32), be.Copy(k, k32),
		be.Copy(v, v32), be.FullAttention(dst, q, k, v, a))
	got := make([]float32, w)
	must(t, be.Read(dst, 0, got))
	return got
}
