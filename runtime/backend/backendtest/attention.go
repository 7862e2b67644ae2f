package backendtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// kvModel is the suite's own copy of a KV cache: what StoreKV must have written, as stored (F16
// and BF16 caches hold values rounded to their type).
type kvModel struct {
	cfg  backend.KVConfig
	k, v [][]float64 // [layer][slot*Width+e]
}

func newKVModel(cfg backend.KVConfig) *kvModel {
	m := &kvModel{cfg: cfg}
	for l := 0; l < cfg.Layers; l++ {
		m.k = append(m.k, make([]float64, cfg.Slots*cfg.Width))
		m.v = append(m.v, make([]float64, cfg.Slots*cfg.Width))
	}
	return m
}

func (m *kvModel) store(layer int, k, v []float32, slots []int32) {
	w := m.cfg.Width
	for i, s := range slots {
		for e := 0; e < w; e++ {
			kv, vv := float64(k[i*w+e]), float64(v[i*w+e])
			switch m.cfg.DType {
			case tensor.F16:
				kv, vv = f16Round(k[i*w+e]), f16Round(v[i*w+e])
			case tensor.BF16:
				kv, vv = bf16Round(k[i*w+e]), bf16Round(v[i*w+e])
			}
			m.k[layer][int(s)*w+e] = kv
			m.v[layer][int(s)*w+e] = vv
		}
	}
}

// rounding says which roundings to F16 (or, with bf16, to BF16) a reference applies: of each
// query element before q·K, and of each normalised attention weight before p·V. The contract
// (backend.Backend.Attention) is both for an F16 or BF16 cache and neither for an F32 one; the
// others are what a backend that skips one of them computes.
type rounding struct{ q, p, bf16 bool }

// to rounds v to the half type of rd.
func (rd rounding) to(v float32) float64 {
	if rd.bf16 {
		return bf16Round(v)
	}
	return f16Round(v)
}

// contract returns the rounding backend.Backend.Attention requires for m's cache.
func (m *kvModel) contract() rounding {
	half := m.cfg.DType == tensor.F16 || m.cfg.DType == tensor.BF16
	return rounding{q: half, p: half, bf16: m.cfg.DType == tensor.BF16}
}

// expRel bounds the relative error of a float32 exp approximation.
const expRel = 0x1p-18

// attend computes the reference attention of batch b's tokens for one layer with the roundings
// rd, in float64 (softmax included), and the bound on each output element.
//
// Without rounding (F32 cache): scores are Scale·q·k over at most HeadDim float32 products and
// sums ((HeadDim+2)·2^-24 relative to Scale·Σ|q·k|); a score error e changes the softmax weights
// by a factor within exp(±2e), which moves the output by at most expm1(2e)·max|v|. The weighted
// sum of values adds float32 rounding of the normalisation and of ctx terms
// (2·(ctx+HeadDim+8)·2^-24 of max|v|) and of a float32 exp approximation (2^-18 of max|v|).
//
// With both roundings (F16 cache, the contract; BF16 alike, with BF16 in place of F16): q is a float32 input, which the backend and
// the reference round to the same F16 values, so the backend's score s'_j differs from the
// reference's s_j only by float32 dot-product error, |s'_j - s_j| <= e_j =
// (HeadDim+2)·2^-24·Scale·Σ|q·k_j|. Its weight p'_j (float32 exp, sum and normalisation) is
// then within a factor exp(±d_j) of the exact p_j, where d_j = g_j + Σ_k p_k·expm1(g_k) +
// 2·2^-18 (exp) + (ctx+4)·2^-24 (sum and normalisation) and g_j = e_j + 2^-24·(smax-s_j) adds
// the float32 subtraction of the maximum. That error can move p'_j across an F16 rounding
// boundary that p_j does not cross. Rounding to F16 is monotone, so the backend's rounded weight
// lies between the roundings of p_j·(1-d) and p_j·(1+d), d = expm1(d_j): for most j both are
// the same F16 value, which the backend's rounded weight then equals exactly; a weight that
// close to a boundary may round the other way, by at most w_j, the distance between the two
// roundings (one F16 ulp of p_j). The output then differs from the reference by at most
// Σ_j w_j·|v_j| plus float32 accumulation of ctx products (exact: F16 times F16 fits float32)
// and the final rounding, (ctx+2)·2^-24·Σ_j (r_j+w_j)·|v_j| for rounded weights r_j (BF16 times
// BF16 fits float32 too): float32
// summation error, plus one F16 ulp of each weight that lies near a boundary times its value.
// (e_j is a worst-case bound, far above typical dot-product error, so some weights of every
// long context count as near a boundary.)
//
// Other roundings are only used to tell the contract's result from another's; their bound is
// the F32 one.
func (m *kvModel) attend(layer int, q []float32, a backend.Attn, b *backend.Batch, rd rounding) (want, tol []float64) {
	qw, w, hd := a.NHead*a.HeadDim, m.cfg.Width, a.HeadDim
	n := len(b.Pos)
	want = make([]float64, n*qw)
	tol = make([]float64, n*qw)
	group := a.NHead / a.NKVHead
	bs := m.cfg.BlockSize
	for _, s := range b.Seqs {
		for c := 0; c < s.Count; c++ {
			i := s.Start + c
			ctx := s.CtxLen - s.Count + c + 1
			rows := make([]int, ctx) // offset of position j's kv row, before the head's
			for j := range rows {
				rows[j] = (int(s.Blocks[j/bs])*bs + j%bs) * w
			}
			for h := 0; h < a.NHead; h++ {
				off := (h / group) * hd
				attendHead(q[i*qw+h*hd:i*qw+(h+1)*hd], ctx,
					func(j int) []float64 { return m.k[layer][rows[j]+off : rows[j]+off+hd] },
					func(j int) []float64 { return m.v[layer][rows[j]+off : rows[j]+off+hd] },
					float64(a.Scale), rd, want[i*qw+h*hd:i*qw+(h+1)*hd], tol[i*qw+h*hd:i*qw+(h+1)*hd])
			}
		}
	}
	return want, tol
}

// attendHead computes the reference output of one query head q [HeadDim] over ctx keys and
// values, key(j) and val(j) returning position j's rows of the head as stored, with the
// roundings rd, into out and the bound on each of its elements (derived at kvModel.attend) into
// bound.
func attendHead(q []float32, ctx int, key, val func(j int) []float64, scale float64, rd rounding, out, bound []float64) {
	hd := len(q)
	both := rd.q && rd.p
	relQ := float64(hd+2) * u
	qh := make([]float64, hd)
	for d, v := range q {
		qh[d] = float64(v)
		if rd.q {
			qh[d] = rd.to(v)
		}
	}
	scores := make([]float64, ctx) // scores, then weights
	errs := make([]float64, ctx)   // e_j
	smax, emax, vmax := math.Inf(-1), 0.0, 0.0
	for j := range scores {
		kj := key(j)
		dot, abs := 0.0, 0.0
		for d, qv := range qh {
			dot += qv * kj[d]
			abs += math.Abs(qv * kj[d])
		}
		scores[j] = scale * dot
		errs[j] = scale * abs * relQ
		smax = math.Max(smax, scores[j])
		emax = math.Max(emax, errs[j])
		for _, v := range val(j) {
			vmax = math.Max(vmax, math.Abs(v))
		}
	}
	sum := 0.0
	for j := range scores {
		sum += math.Exp(scores[j] - smax)
	}
	ebar := 0.0
	for j := range scores {
		ebar += math.Exp(scores[j]-smax) / sum * math.Expm1(errs[j]+(smax-scores[j])*u)
	}
	for j := range scores {
		pj := math.Exp(scores[j]-smax) / sum
		wj := 0.0
		if rd.p {
			d := math.Expm1(errs[j] + (smax-scores[j])*u + ebar + 2*expRel + float64(ctx+4)*u)
			wj = rd.to(float32(pj*(1+d))) - rd.to(float32(pj*(1-d)))
			pj = rd.to(float32(pj))
		}
		vj := val(j)
		for d := range out {
			out[d] += pj * vj[d]
			if both {
				bound[d] += wj*math.Abs(vj[d]) + float64(ctx+2)*u*(pj+wj)*math.Abs(vj[d])
			}
		}
	}
	if !both {
		f32 := (math.Expm1(2*emax) + 2*float64(ctx-1+hd+8)*u + expRel) * vmax
		for d := range bound {
			bound[d] = f32
		}
	}
}

// attnSeq is a sequence of an attention scenario: its block table and how many positions its
// cache holds.
type attnSeq struct {
	blocks []int32
	ctx    int
}

// attnStep names how many tokens of which sequence one batch carries, in batch order.
type attnStep []struct{ seq, count int }

// attnScenario runs steps against a fresh cache: for every step and layer it stores random keys
// and values for the batch's tokens, runs Attention, and compares with the reference.
func attnScenario(t *testing.T, b backend.Backend, name string, cfg backend.KVConfig, a backend.Attn, nseq int, steps []attnStep) {
	r := rng("attention " + name)
	kv, err := b.NewKV(cfg)
	must(t, err, "NewKV(%+v)", cfg)
	defer kv.Close()
	if got := kv.Config(); got != cfg {
		t.Fatalf("KV.Config() = %+v, want %+v", got, cfg)
	}
	model := newKVModel(cfg)

	// Every sequence gets enough blocks for all its steps, drawn from a shuffled list of all
	// blocks, so tables are neither contiguous nor ordered.
	need := make([]int, nseq)
	for _, st := range steps {
		for _, e := range st {
			need[e.seq] += e.count
		}
	}
	perm := r.Perm(cfg.Slots / cfg.BlockSize)
	seqs := make([]*attnSeq, nseq)
	for s := range seqs {
		nb := (need[s] + cfg.BlockSize - 1) / cfg.BlockSize
		if nb > len(perm) {
			t.Fatalf("scenario %s needs more blocks than the cache has", name)
		}
		seqs[s] = &attnSeq{}
		for _, blk := range perm[:nb] {
			seqs[s].blocks = append(seqs[s].blocks, int32(blk))
		}
		perm = perm[nb:]
	}

	for si, st := range steps {
		bt := &backend.Batch{}
		for _, e := range st {
			s := seqs[e.seq]
			bt.Seqs = append(bt.Seqs, backend.Seq{Start: len(bt.Pos), Count: e.count, CtxLen: s.ctx + e.count, Blocks: s.blocks})
			for c := 0; c < e.count; c++ {
				p := s.ctx + c
				bt.Pos = append(bt.Pos, int32(p))
				bt.Slot = append(bt.Slot, s.blocks[p/cfg.BlockSize]*int32(cfg.BlockSize)+int32(p%cfg.BlockSize))
			}
		}
		n := len(bt.Pos)
		qw := a.NHead * a.HeadDim
		for layer := 0; layer < cfg.Layers; layer++ {
			what := fmt.Sprintf("%s step %d layer %d", name, si, layer)
			kvals, vvals := randVec(r, n*cfg.Width, 1), randVec(r, n*cfg.Width, 1)
			kt, vt := alloc(t, b, n, cfg.Width, kvals), alloc(t, b, n, cfg.Width, vvals)
			must(t, b.StoreKV(kv, layer, kt, vt, bt), "StoreKV %s", what)
			model.store(layer, kvals, vvals, bt.Slot)
			qv := randVec(r, n*qw, 2)
			q := alloc(t, b, n, qw, qv)
			if layer%2 == 1 {
				q = allocView(t, b, n, qw, qv)
			}
			dst, g := output(t, b, n, qw)
			must(t, b.Attention(dst, q, kv, layer, a, bt), "Attention %s", what)
			want, tol := model.attend(layer, qv, a, bt, model.contract())
			compare(t, "Attention "+what, qw, read(t, b, dst), want, func(i int) float64 { return tol[i] })
			g.check(t)
			for _, x := range []backend.Tensor{kt, vt, q, dst} {
				x.Close()
			}
		}
		for _, e := range st {
			seqs[e.seq].ctx += e.count
		}
	}
}

func testAttention(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	// Sequence 3 is stored first and read again only at the end: its keys and values catch
	// writes to slots of other sequences' blocks.
	short := []attnStep{
		{{0, 5}, {3, 7}, {1, 3}},         // prefill of three sequences of different lengths
		{{2, 6}, {0, 4}, {1, 1}},         // a new sequence, a prefill chunk continuing a cache, a decode
		{{0, 1}, {1, 1}, {2, 1}},         // decode
		{{3, 1}, {0, 1}},                 // decode
		{{1, 9}},                         // a long chunk alone
		{{2, 1}, {3, 1}, {0, 1}, {1, 1}}, // decode of every sequence
	}
	long := []attnStep{
		{{0, 100}, {1, 37}},
		{{1, 1}, {0, 1}},
		{{1, 20}, {0, 1}},
		{{0, 1}, {1, 1}},
		{{0, 200}},       // a long prompt chunk continuing a cache
		{{0, 1}, {1, 1}}, // decode over 300 positions (backends may split the keys)
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.BF16} {
		for _, c := range []struct {
			nHead, nKV, hd int
		}{{4, 4, 32}, {4, 2, 64}, {8, 2, 16}, {12, 1, 16}} {
			name := fmt.Sprintf("%v/GQA%d/HeadDim%d", dt, c.nHead/c.nKV, c.hd)
			t.Run(name, func(t *testing.T) {
				a := backend.Attn{NHead: c.nHead, NKVHead: c.nKV, HeadDim: c.hd, Scale: float32(1.5 / math.Sqrt(float64(c.hd)))}
				cfg := backend.KVConfig{Layers: 2, Slots: 4 * 16, Width: c.nKV * c.hd, BlockSize: 4, DType: dt}
				attnScenario(t, b, name, cfg, a, 4, short)
			})
		}
		if dt != tensor.F32 {
			t.Run(fmt.Sprintf("%v/Rounding", dt), func(t *testing.T) { testAttentionRounding(t, b, dt) })
		}
		name := fmt.Sprintf("%v/Long", dt)
		t.Run(name, func(t *testing.T) {
			a := backend.Attn{NHead: 8, NKVHead: 2, HeadDim: 64, Scale: 0.125}
			cfg := backend.KVConfig{Layers: 1, Slots: 28 * 16, Width: 2 * 64, BlockSize: 16, DType: dt}
			attnScenario(t, b, name, cfg, a, 2, long)
		})
	}
}

// testAttentionRounding checks that attention over an F16 (or BF16) cache rounds both the query
// and the normalised weights to F16 (BF16), as backend.Backend.Attention requires. The scenarios' bounds widen
// by one F16 ulp of every weight near a rounding boundary, which can hide a missing rounding in
// places; here the backend's output must be far nearer the reference with both roundings than
// that reference is to the ones that skip the query's rounding, the weights' or both. One
// sequence of 48 tokens attends in one batch, so contexts run from 1 to 48, with scores of a few
// units so that no weight is near 0 or 1 for long: each rounding then moves an output by about
// 2^-12 of its size, against about 2^-24·(ctx+HeadDim) for float32 arithmetic and one F16 ulp of
// the rare weight that lies within float32 error of a boundary. A backend that rounds as
// required lands within 1/10 of the smallest of those distances (summed over all outputs); one
// that skips a rounding lands at about that distance.
func testAttentionRounding(t *testing.T, b backend.Backend, dt tensor.DType) {
	const n, bs, nh, nkv, hd = 48, 8, 4, 2, 64
	r := rng("attention rounding " + dt.String())
	cfg := backend.KVConfig{Layers: 1, Slots: n, Width: nkv * hd, BlockSize: bs, DType: dt}
	a := backend.Attn{NHead: nh, NKVHead: nkv, HeadDim: hd, Scale: float32(1.5 / math.Sqrt(hd))}
	kv, err := b.NewKV(cfg)
	must(t, err, "NewKV(%+v)", cfg)
	defer kv.Close()
	bt := &backend.Batch{Seqs: []backend.Seq{{Start: 0, Count: n, CtxLen: n, Blocks: []int32{3, 0, 5, 1, 4, 2}}}}
	for p := 0; p < n; p++ {
		bt.Pos = append(bt.Pos, int32(p))
		bt.Slot = append(bt.Slot, bt.Seqs[0].Blocks[p/bs]*bs+int32(p%bs))
	}
	model := newKVModel(cfg)
	kvals, vvals := randVec(r, n*cfg.Width, 1), randVec(r, n*cfg.Width, 1)
	must(t, b.StoreKV(kv, 0, alloc(t, b, n, cfg.Width, kvals), alloc(t, b, n, cfg.Width, vvals), bt), "StoreKV")
	model.store(0, kvals, vvals, bt.Slot)
	qv := randVec(r, n*nh*hd, 2)
	dst, g := output(t, b, n, nh*hd)
	must(t, b.Attention(dst, alloc(t, b, n, nh*hd, qv), kv, 0, a, bt), "Attention")
	got := read(t, b, dst)
	g.check(t)

	bf := dt == tensor.BF16
	want, tol := model.attend(0, qv, a, bt, rounding{q: true, p: true, bf16: bf})
	dist := func(x []float64) float64 {
		s := 0.0
		for i, v := range x {
			s += math.Abs(v - want[i])
		}
		return s
	}
	got64 := make([]float64, len(got))
	for i, v := range got {
		got64[i] = float64(v)
	}
	dGot := dist(got64)
	for _, alt := range []struct {
		rd        rounding
		ref, diag string
	}{
		{rounding{q: false, p: true, bf16: bf}, "rounds only the weights", "does not round the query to " + dt.String() + " before q·K"},
		{rounding{q: true, p: false, bf16: bf}, "rounds only the query", "does not round the attention weights to " + dt.String() + " before p·V"},
		{rounding{bf16: bf}, "rounds neither", "rounds neither the query nor the attention weights to " + dt.String()},
	} {
		other, _ := model.attend(0, qv, a, bt, alt.rd)
		dAlt := dist(other)
		t.Logf("summed distances from the reference with both roundings: the reference that %s %.3g, the backend %.3g", alt.ref, dAlt, dGot)
		if !(dGot <= dAlt/10) {
			t.Errorf("the backend's output is %.3g (summed) from the reference with both roundings, and the reference that %s is %.3g from it: the backend %s",
				dGot, alt.ref, dAlt, alt.diag)
		}
	}
	compare(t, "Attention with an "+dt.String()+" cache", nh*hd, got, want, func(i int) float64 { return tol[i] })
}

// decodeBatch returns a one-token batch for a sequence whose cache holds ctx positions after
// the step, in consecutive blocks of bs slots starting at block 0.
func decodeBatch(ctx, bs int) *backend.Batch {
	blocks := make([]int32, (ctx+bs-1)/bs)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	p := ctx - 1
	return &backend.Batch{
		Pos:  []int32{int32(p)},
		Slot: []int32{blocks[p/bs]*int32(bs) + int32(p%bs)},
		Seqs: []backend.Seq{{Start: 0, Count: 1, CtxLen: ctx, Blocks: blocks}},
	}
}

// fillKV stores random keys and values in every slot of every layer of kv.
func fillKV(t testing.TB, b backend.Backend, kv backend.KV, r *rand.Rand) {
	cfg := kv.Config()
	const chunk = 64
	for layer := 0; layer < cfg.Layers; layer++ {
		for s0 := 0; s0 < cfg.Slots; s0 += chunk {
			n := min(chunk, cfg.Slots-s0)
			bt := &backend.Batch{Pos: make([]int32, n), Slot: make([]int32, n)}
			for i := range bt.Slot {
				bt.Slot[i] = int32(s0 + i)
				bt.Pos[i] = int32(s0 + i)
			}
			k := alloc(t, b, n, cfg.Width, randVec(r, n*cfg.Width, 1))
			v := alloc(t, b, n, cfg.Width, randVec(r, n*cfg.Width, 1))
			must(t, b.StoreKV(kv, layer, k, v, bt), "StoreKV")
			k.Close()
			v.Close()
		}
	}
}
