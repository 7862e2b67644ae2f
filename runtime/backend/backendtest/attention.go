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
// caches hold values rounded to F16).
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
			if m.cfg.DType == tensor.F16 {
				kv, vv = f16Round(k[i*w+e]), f16Round(v[i*w+e])
			}
			m.k[layer][int(s)*w+e] = kv
			m.v[layer][int(s)*w+e] = vv
		}
	}
}

// attend computes the reference attention of batch b's tokens for one layer, and the bound on
// each output element. Scores are Scale·q·k over at most HeadDim float32 products and sums
// ((HeadDim+2)·2^-24 relative to Scale·Σ|q·k|), and for an F16 cache a backend may round q to
// F16 too, as llama.cpp does (2^-11 more); a score error e changes the softmax weights by a
// factor within exp(±2e), which moves the output by at most expm1(2e)·max|v|. The weighted sum of
// values adds float32 rounding of the normalisation and of ctx terms (2·(ctx+HeadDim+8)·2^-24
// of max|v|) and of a float32 exp approximation (2^-18 of max|v|).
func (m *kvModel) attend(layer int, q []float32, a backend.Attn, b *backend.Batch) (want, tol []float64) {
	qw, w, hd := a.NHead*a.HeadDim, m.cfg.Width, a.HeadDim
	n := len(b.Pos)
	want = make([]float64, n*qw)
	tol = make([]float64, n*qw)
	relQ := float64(hd+2) * u
	if m.cfg.DType == tensor.F16 {
		relQ += 0x1p-11
	}
	group := a.NHead / a.NKVHead
	bs := m.cfg.BlockSize
	for _, s := range b.Seqs {
		for c := 0; c < s.Count; c++ {
			i := s.Start + c
			p := s.CtxLen - s.Count + c
			for h := 0; h < a.NHead; h++ {
				off := (h / group) * hd
				qh := q[i*qw+h*hd : i*qw+(h+1)*hd]
				scores := make([]float64, p+1)
				smax, es, vmax := math.Inf(-1), 0.0, 0.0
				for j := 0; j <= p; j++ {
					slot := int(s.Blocks[j/bs])*bs + j%bs
					kj := m.k[layer][slot*w+off : slot*w+off+hd]
					dot, abs := 0.0, 0.0
					for d, qv := range qh {
						dot += float64(qv) * kj[d]
						abs += math.Abs(float64(qv) * kj[d])
					}
					scores[j] = float64(a.Scale) * dot
					smax = math.Max(smax, scores[j])
					es = math.Max(es, float64(a.Scale)*abs*relQ)
					for _, v := range m.v[layer][slot*w+off : slot*w+off+hd] {
						vmax = math.Max(vmax, math.Abs(v))
					}
				}
				sum := 0.0
				for j := range scores {
					scores[j] = math.Exp(scores[j] - smax)
					sum += scores[j]
				}
				out := want[i*qw+h*hd : i*qw+(h+1)*hd]
				for j, e := range scores {
					slot := int(s.Blocks[j/bs])*bs + j%bs
					vj := m.v[layer][slot*w+off : slot*w+off+hd]
					for d := range out {
						out[d] += e / sum * vj[d]
					}
				}
				bound := (math.Expm1(2*es) + 2*float64(p+hd+8)*u + 0x1p-18) * vmax
				for d := 0; d < hd; d++ {
					tol[i*qw+h*hd+d] = bound
				}
			}
		}
	}
	return want, tol
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
			want, tol := model.attend(layer, qv, a, bt)
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
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16} {
		for _, c := range []struct {
			nHead, nKV, hd int
		}{{4, 4, 32}, {4, 2, 64}, {8, 2, 16}} {
			name := fmt.Sprintf("%v/GQA%d/HeadDim%d", dt, c.nHead/c.nKV, c.hd)
			t.Run(name, func(t *testing.T) {
				a := backend.Attn{NHead: c.nHead, NKVHead: c.nKV, HeadDim: c.hd, Scale: float32(1.5 / math.Sqrt(float64(c.hd)))}
				cfg := backend.KVConfig{Layers: 2, Slots: 4 * 16, Width: c.nKV * c.hd, BlockSize: 4, DType: dt}
				attnScenario(t, b, name, cfg, a, 4, short)
			})
		}
		name := fmt.Sprintf("%v/Long", dt)
		t.Run(name, func(t *testing.T) {
			a := backend.Attn{NHead: 8, NKVHead: 2, HeadDim: 64, Scale: 0.125}
			cfg := backend.KVConfig{Layers: 1, Slots: 16 * 16, Width: 2 * 64, BlockSize: 16, DType: dt}
			attnScenario(t, b, name, cfg, a, 2, long)
		})
	}
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
