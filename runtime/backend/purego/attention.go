package purego

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// KV holds keys and values of every layer: k32/v32 for F32 caches, k16/v16 (F16 or BF16
// bits) for F16 and BF16 ones, each [layer][slot*Width + e].
type KV struct {
	be       *Backend
	cfg      backend.KVConfig
	k32, v32 [][]float32
	k16, v16 [][]uint16
	res      backend.Residence
}

// Config returns the cache's configuration.
func (c *KV) Config() backend.KVConfig { return c.cfg }

// Close releases the cache. Closing twice is a no-op.
func (c *KV) Close() error {
	c.be.mu.Lock()
	defer c.be.mu.Unlock()
	c.res.Closed = true
	c.k32, c.v32, c.k16, c.v16 = nil, nil, nil, nil
	return nil
}

// NewKV makes a zeroed cache.
func (be *Backend) NewKV(cfg backend.KVConfig) (backend.KV, error) {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.ops.Closed() {
		return nil, errClosed
	}
	if err := be.ops.NewKV(cfg); err != nil {
		return nil, err
	}
	if cfg.Slots > maxElems/cfg.Width || cfg.Layers > maxElems/(cfg.Slots*cfg.Width) {
		return nil, fmt.Errorf("purego: new kv: config %+v is too large", cfg)
	}
	c := &KV{be: be, cfg: cfg, res: backend.Residence{Owner: be.ops.Owner}}
	n := cfg.Slots * cfg.Width
	for l := 0; l < cfg.Layers; l++ {
		if cfg.DType == tensor.F32 {
			c.k32 = append(c.k32, make([]float32, n))
			c.v32 = append(c.v32, make([]float32, n))
		} else {
			c.k16 = append(c.k16, make([]uint16, n))
			c.v16 = append(c.v16, make([]uint16, n))
		}
	}
	if cfg.DType == tensor.F16 {
		f16Once.Do(initF16Table)
	}
	return c, nil
}

// Residence is what the shared operand checks read of c (backend.Operands).
func (c *KV) Residence() *backend.Residence { return &c.res }

// StoreKV writes k and v [n, Width] into layer's cache at slots b.Slot.
func (be *Backend) StoreKV(kv backend.KV, layer int, k, v backend.Tensor, b *backend.Batch) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	c, kt, vt, err := be.ops.StoreKV(kv, layer, k, v, b)
	if err != nil {
		return err
	}
	w := c.cfg.Width
	for i, s := range b.Slot {
		kr, vr := kt.f32[i*w:(i+1)*w], vt.f32[i*w:(i+1)*w]
		o := int(s) * w
		if c.cfg.DType == tensor.F32 {
			copy(c.k32[layer][o:o+w], kr)
			copy(c.v32[layer][o:o+w], vr)
			continue
		}
		kd, vd := c.k16[layer][o:o+w], c.v16[layer][o:o+w]
		if c.cfg.DType == tensor.BF16 {
			for e := range kd {
				kd[e] = quant.F32ToBF16(kr[e])
				vd[e] = quant.F32ToBF16(vr[e])
			}
			continue
		}
		for e := range kd {
			kd[e] = quant.F32ToF16(kr[e])
			vd[e] = quant.F32ToF16(vr[e])
		}
	}
	return nil
}

// attnChunk is the number of cache positions scored together before the running softmax is
// rescaled.
const attnChunk = 32

// sStride is the stride of each head's scores in attnScratch.s: a chunk and three padding rows.
const sStride = attnChunk + 4

// attnScratch is one goroutine's working memory for attention. F32 caches use s, acc, m, l and
// off; F16 caches use s, qr and off, sized for the longest context seen so far.
type attnScratch struct {
	s    []float32 // F32: [group, sStride] scores, then weights; F16: [group, stride] likewise
	acc  []float32 // [group, HeadDim] weighted sums of values
	m, l []float32 // [group] running max and sum of weights
	off  []int     // F32: [attnChunk+3] cache offsets of a chunk's rows; F16: [stride]
	qr   []float32 // [group, HeadDim] the query heads rounded to F16
}

// attnJob computes attention by units of (token, kv head): each unit serves the group of query
// heads that share the kv head, so each key and value row is read once for all of them.
type attnJob struct {
	c       *KV
	layer   int
	a       backend.Attn
	b       *backend.Batch
	tok     []int32       // [n] index into b.Seqs
	q, dst  []float32     // [n, NHead*HeadDim]
	stride  int           // F16 and BF16 caches: the longest context of the batch, plus three
	scratch []attnScratch // [worker]
	half    halfKernels   // F16 and BF16 caches: the kernels of the cache's type
}

// halfKernels are the attention kernels for a cache of 16-bit floats.
type halfKernels struct {
	dot4       func(q []float32, k0, k1, k2, k3 []uint16) (s0, s1, s2, s3 float32)
	axpy4      func(y []float32, a, b, c, d float32, x0, x1, x2, x3 []uint16)
	scaleRound func(dst, src []float32, f float32)
}

func (j *attnJob) unit(w, u int) {
	if j.half.dot4 != nil {
		j.attendF16(&j.scratch[w], u/j.a.NKVHead, u%j.a.NKVHead)
		return
	}
	j.attend(&j.scratch[w], u/j.a.NKVHead, u%j.a.NKVHead)
}

// attendF16 attends token i's query heads of kv head kh over its sequence's F16 (or BF16) cache
// as llama.cpp multiplies with F16 (BF16) operands: each query head is rounded to the cache's
// type before its scores are computed, and each normalised weight is rounded to it before it
// multiplies its value row. Normalised weights need the final maximum and sum, so it makes two
// passes: scores of every position, then the weighted sum of values.
func (j *attnJob) attendF16(sc *attnScratch, i, kh int) {
	a, cfg := j.a, j.c.cfg
	hd, w, bs := a.HeadDim, cfg.Width, cfg.BlockSize
	group := a.NHead / a.NKVHead
	s := &j.b.Seqs[j.tok[i]]
	ctx := s.CtxLen - s.Count + (i - s.Start) + 1 // the token sees positions 0..ctx-1
	qw := a.NHead * hd
	k16, v16 := j.c.k16[j.layer], j.c.v16[j.layer]
	stride := j.stride
	hk := &j.half

	qr := sc.qr[:group*hd]
	hk.scaleRound(qr, j.q[i*qw+kh*group*hd:i*qw+(kh+1)*group*hd], 1)

	// Offsets of the positions' rows; three more repeat the last, so that rows can be taken four
	// at a time.
	o := sc.off[:ctx+3]
	off := kh * hd
	for b0 := 0; b0 < ctx; b0 += bs {
		row := int(s.Blocks[b0/bs])*bs*w + off
		for pos := b0; pos < min(b0+bs, ctx); pos++ {
			o[pos] = row
			row += w
		}
	}
	o[ctx], o[ctx+1], o[ctx+2] = o[ctx-1], o[ctx-1], o[ctx-1]

	// Pass 1: scores of every position for every head of the group, four keys at a time.
	for jj := 0; jj < ctx; jj += 4 {
		k0, k1, k2, k3 := k16[o[jj]:o[jj]+hd], k16[o[jj+1]:o[jj+1]+hd], k16[o[jj+2]:o[jj+2]+hd], k16[o[jj+3]:o[jj+3]+hd]
		for g := 0; g < group; g++ {
			s0, s1, s2, s3 := hk.dot4(qr[g*hd:(g+1)*hd], k0, k1, k2, k3)
			ss := sc.s[g*stride+jj : g*stride+jj+4]
			ss[0], ss[1], ss[2], ss[3] = a.Scale*s0, a.Scale*s1, a.Scale*s2, a.Scale*s3
		}
	}
	// Softmax: exp(s - max), summed in float64, times 1/sum, rounded to the cache's type. Weights
	// past the context are zero.
	for g := 0; g < group; g++ {
		ss := sc.s[g*stride : g*stride+ctx+3]
		m := ss[0]
		for _, v := range ss[1:ctx] {
			if v > m {
				m = v
			}
		}
		sum := vec.ExpSum(ss[:ctx], m)
		hk.scaleRound(ss[:ctx], ss[:ctx], float32(1/sum))
		ss[ctx], ss[ctx+1], ss[ctx+2] = 0, 0, 0
	}
	// Pass 2: weighted values, four rows at a time.
	out := j.dst[i*qw+kh*group*hd : i*qw+(kh+1)*group*hd]
	clear(out)
	for jj := 0; jj < ctx; jj += 4 {
		v0, v1, v2, v3 := v16[o[jj]:o[jj]+hd], v16[o[jj+1]:o[jj+1]+hd], v16[o[jj+2]:o[jj+2]+hd], v16[o[jj+3]:o[jj+3]+hd]
		for g := 0; g < group; g++ {
			ss := sc.s[g*stride+jj : g*stride+jj+4]
			hk.axpy4(out[g*hd:(g+1)*hd], ss[0], ss[1], ss[2], ss[3], v0, v1, v2, v3)
		}
	}
}

// attend attends token i's query heads of kv head kh over its sequence's F32 cache, with a
// softmax that keeps a running maximum and rescales the partial sums when it grows.
func (j *attnJob) attend(sc *attnScratch, i, kh int) {
	a, cfg := j.a, j.c.cfg
	hd, w, bs := a.HeadDim, cfg.Width, cfg.BlockSize
	group := a.NHead / a.NKVHead
	s := &j.b.Seqs[j.tok[i]]
	p := s.CtxLen - s.Count + (i - s.Start) // the token's position: it sees 0..p
	qw := a.NHead * hd
	q := j.q[i*qw+kh*group*hd : i*qw+(kh+1)*group*hd]
	acc := sc.acc[:group*hd]
	clear(acc)
	mx, l := sc.m[:group], sc.l[:group]
	for g := range mx {
		mx[g] = float32(math.Inf(-1))
		l[g] = 0
	}
	off := kh * hd
	k32, v32 := j.c.k32[j.layer], j.c.v32[j.layer]
	o := sc.off[:attnChunk+3]
	for j0 := 0; j0 <= p; j0 += attnChunk {
		cn := min(attnChunk, p+1-j0)
		// Offsets of the chunk's rows; up to three more repeat the last, so that rows can be
		// taken four at a time.
		for jj := 0; jj < cn; jj++ {
			pos := j0 + jj
			o[jj] = int(s.Blocks[pos/bs])*bs*w + (pos%bs)*w + off
		}
		for jj := cn; jj < cn+3; jj++ {
			o[jj] = o[cn-1]
		}
		// Scores of the chunk's positions for every head of the group, four keys at a time.
		for g := 0; g < group; g++ {
			qg := q[g*hd : (g+1)*hd]
			ss := sc.s[g*sStride : g*sStride+attnChunk+3]
			for jj := 0; jj < cn; jj += 4 {
				s0, s1, s2, s3 := dot4(qg, k32[o[jj]:o[jj]+hd], k32[o[jj+1]:o[jj+1]+hd], k32[o[jj+2]:o[jj+2]+hd], k32[o[jj+3]:o[jj+3]+hd])
				ss[jj], ss[jj+1], ss[jj+2], ss[jj+3] = a.Scale*s0, a.Scale*s1, a.Scale*s2, a.Scale*s3
			}
		}
		// Softmax weights relative to each head's running maximum.
		for g := 0; g < group; g++ {
			ss := sc.s[g*sStride : g*sStride+cn]
			m := mx[g]
			for _, v := range ss {
				m = max(m, v)
			}
			if m > mx[g] {
				if l[g] != 0 {
					f := vec.Expf(mx[g] - m)
					l[g] *= f
					scale32(acc[g*hd:(g+1)*hd], f)
				}
				mx[g] = m
			}
			sum := float32(0)
			for jj, v := range ss {
				e := vec.Expf(v - m)
				ss[jj] = e
				sum += e
			}
			l[g] += sum
		}
		// Weighted values, four rows at a time; weights past the chunk's end are zero.
		for g := 0; g < group; g++ {
			ss := sc.s[g*sStride : g*sStride+attnChunk+3]
			for jj := cn; jj < cn+3; jj++ {
				ss[jj] = 0
			}
			ag := acc[g*hd : (g+1)*hd]
			for jj := 0; jj < cn; jj += 4 {
				axpy4(ag, ss[jj], ss[jj+1], ss[jj+2], ss[jj+3], v32[o[jj]:o[jj]+hd], v32[o[jj+1]:o[jj+1]+hd], v32[o[jj+2]:o[jj+2]+hd], v32[o[jj+3]:o[jj+3]+hd])
			}
		}
	}
	out := j.dst[i*qw+kh*group*hd : i*qw+(kh+1)*group*hd]
	for g := 0; g < group; g++ {
		inv := 1 / l[g]
		for d, v := range acc[g*hd : (g+1)*hd] {
			out[g*hd+d] = v * inv
		}
	}
}

// Attention: dst[i, h] = softmax_j(Scale·q[i,h]·K[j,h']) · V[j,h'] over positions 0..p of token
// i's sequence. With an F16 (BF16) cache, q and the normalised weights are rounded to F16 (BF16)
// before their products (backend.Backend.Attention).
func (be *Backend) Attention(dst, q backend.Tensor, kv backend.KV, layer int, a backend.Attn, b *backend.Batch) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	// The check also finds the sequence of every token (be.tok): each is in exactly one, whose
	// blocks hold its positions.
	c, d, qt, err := be.ops.Attention(dst, q, kv, layer, a, b, &be.tok)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	n := len(b.Pos)
	maxCtx := 0
	for _, s := range b.Seqs {
		if s.Count > 0 {
			maxCtx = max(maxCtx, s.CtxLen)
		}
	}

	j := &be.at
	group := a.NHead / a.NKVHead
	threads := be.pool.threads
	if len(j.scratch) < threads {
		j.scratch = make([]attnScratch, threads)
	}
	// Scratch grows to the largest shapes seen, and only then.
	j.stride = maxCtx + 3
	for t := range j.scratch[:threads] {
		sc := &j.scratch[t]
		if c.cfg.DType != tensor.F32 {
			sc.s = grow(sc.s, group*j.stride)
			sc.off = grow(sc.off, j.stride)
			sc.qr = grow(sc.qr, group*a.HeadDim)
			continue
		}
		sc.s = grow(sc.s, group*sStride)
		sc.acc = grow(sc.acc, group*a.HeadDim)
		sc.m = grow(sc.m, group)
		sc.l = grow(sc.l, group)
		sc.off = grow(sc.off, attnChunk+3)
	}
	j.c, j.layer, j.a, j.b, j.tok, j.q, j.dst = c, layer, a, b, be.tok, qt.f32, d.f32
	switch c.cfg.DType { // the F16 kernels are variables that assembly may replace at init
	case tensor.F16:
		j.half = halfKernels{dot4: dot4F16, axpy4: axpy4F16, scaleRound: scaleRoundF16}
	case tensor.BF16:
		j.half = halfKernels{dot4: dot4BF16, axpy4: axpy4BF16, scaleRound: scaleRoundBF16}
	}
	be.pool.do(j, n*a.NKVHead)
	j.c, j.b, j.tok, j.q, j.dst, j.half = nil, nil, nil, nil, nil, halfKernels{}
	return nil
}
