package cpu

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
)

// KV caches and attention over them, and attention without a cache (FullAttention).

// KV is a key/value cache in native memory: per layer, keys and values [Slots, Width] of the
// configuration's type (F32, F16 or BF16).
type KV struct {
	b    *Backend
	cfg  backend.KVConfig
	k, v []*cpu.Buffer
	res  backend.Residence
}

// Config returns the cache's configuration.
func (kv *KV) Config() backend.KVConfig { return kv.cfg }

// Close frees the cache. Closing twice is a no-op.
func (kv *KV) Close() error {
	if kv.res.Closed {
		return nil
	}
	kv.res.Closed = true
	for i := range kv.k {
		kv.b.free(kv.k[i])
		kv.b.free(kv.v[i])
	}
	kv.k, kv.v = nil, nil
	return nil
}

// NewKV makes a zeroed cache of F32, F16 or BF16 elements.
func (b *Backend) NewKV(cfg backend.KVConfig) (backend.KV, error) {
	const op = "new kv"
	if b.ops.Closed() {
		return nil, fmt.Errorf("cpu: %s: backend closed", op)
	}
	if err := b.ops.NewKV(cfg); err != nil {
		return nil, err
	}
	n, _, err := b.ops.Size(op, cfg.DType, cfg.Slots, cfg.Width)
	if err != nil {
		return nil, err
	}
	if cfg.Layers > math.MaxInt32 || n > (math.MaxInt/4)/(2*cfg.Layers) {
		return nil, fmt.Errorf("cpu: %s: %d layers of %d bytes is too large", op, cfg.Layers, 2*n)
	}
	kv := &KV{b: b, cfg: cfg, k: make([]*cpu.Buffer, cfg.Layers), v: make([]*cpu.Buffer, cfg.Layers),
		res: backend.Residence{Owner: b.ops.Owner}}
	for l := 0; l < cfg.Layers; l++ {
		if kv.k[l], err = b.alloc(op, n); err == nil {
			kv.v[l], err = b.alloc(op, n)
		}
		if err != nil {
			for i := 0; i <= l; i++ {
				b.free(kv.k[i])
				b.free(kv.v[i])
			}
			return nil, err
		}
	}
	return kv, nil
}

// Residence is what the shared operand checks read of kv (backend.Operands).
func (kv *KV) Residence() *backend.Residence { return &kv.res }

// StoreKV writes k and v [n, Width] (F32) into layer's cache at slots bt.Slot.
func (b *Backend) StoreKV(kv backend.KV, layer int, k, v backend.Tensor, bt *backend.Batch) error {
	c, kt, vt, err := b.ops.StoreKV(kv, layer, k, v, bt)
	if err != nil {
		return err
	}
	return b.ctx.StoreKV(c.k[layer].Bytes(), c.v[layer].Bytes(), c.cfg.DType, c.cfg.Slots, c.cfg.Width, kt.f32, vt.f32, len(bt.Slot), bt.Slot)
}

// Attention computes causal attention of q [n, NHead*HeadDim] over layer's cache for every
// sequence of bt into dst (same shape, not q).
func (b *Backend) Attention(dst, q backend.Tensor, kv backend.KV, layer int, a backend.Attn, bt *backend.Batch) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, d, qt, err := b.ops.Attention(dst, q, kv, layer, a, bt, &b.tok)
	if err != nil {
		return err
	}
	if err := b.ops.Flatten(bt, &b.seqs, &b.blocks); err != nil {
		return err
	}
	return b.ctx.Attention(d.f32, qt.f32, qt.rows, c.k[layer].Bytes(), c.v[layer].Bytes(), c.cfg.DType,
		c.cfg.Slots, c.cfg.Width, c.cfg.BlockSize, cpu.Attn{NHead: a.NHead, NKVHead: a.NKVHead, HeadDim: a.HeadDim, Scale: a.Scale},
		b.seqs, b.blocks)
}

// FullAttention computes attention of q [n, NHead*HeadDim] over every row of k and v
// ([m, NKVHead*HeadDim], both F32 or both F16) into dst (same shape as q, overlapping none of
// them).
func (b *Backend) FullAttention(dst, q, k, v backend.Tensor, a backend.Attn) error {
	d, qt, kt, vt, err := b.ops.FullAttention(dst, q, k, v, a)
	if err != nil {
		return err
	}
	return b.ctx.FullAttention(d.f32, qt.f32, qt.rows, kt.data, vt.data, kt.dt, kt.rows,
		cpu.Attn{NHead: a.NHead, NKVHead: a.NKVHead, HeadDim: a.HeadDim, Scale: a.Scale})
}
