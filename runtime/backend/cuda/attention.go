//go:build cuda && cgo && !nocgo

package cuda

import (
	"fmt"
	"math"

	bcuda "github.com/parleyhq/parley/bindings/cuda"
	"github.com/parleyhq/parley/runtime/backend"
)

// KV caches and attention over them, and attention without a cache (FullAttention).

// KV is a key/value cache in device memory: per layer, keys and values [Slots, Width].
type KV struct {
	b    *Backend
	cfg  backend.KVConfig
	k, v []*bcuda.Buffer
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

// NewKV makes a zeroed cache on the device.
func (b *Backend) NewKV(cfg backend.KVConfig) (backend.KV, error) {
	const op = "new kv"
	if b.ops.Closed() {
		return nil, fmt.Errorf("cuda: %s: backend closed", op)
	}
	if err := b.ops.NewKV(cfg); err != nil {
		return nil, err
	}
	n, _, err := b.ops.Size(op, cfg.DType, cfg.Slots, cfg.Width)
	if err != nil {
		return nil, err
	}
	if cfg.Layers > math.MaxInt32 || n > (math.MaxInt64/4)/(2*cfg.Layers) {
		return nil, fmt.Errorf("cuda: %s: %d layers of %d bytes is too large", op, cfg.Layers, 2*n)
	}
	if free, _, err := b.ctx.MemInfo(); err == nil && int64(n)*2*int64(cfg.Layers) > free {
		return nil, fmt.Errorf("cuda: %s: %d layers of %d bytes exceed the %d bytes free on the device", op, cfg.Layers, 2*n, free)
	}
	kv := &KV{b: b, cfg: cfg, k: make([]*bcuda.Buffer, 0, cfg.Layers), v: make([]*bcuda.Buffer, 0, cfg.Layers),
		res: backend.Residence{Owner: b.ops.Owner}}
	for l := 0; l < cfg.Layers; l++ {
		kb, err := b.alloc(op, n)
		if err != nil {
			kv.Close()
			return nil, err
		}
		kv.k = append(kv.k, kb)
		vb, err := b.alloc(op, n)
		if err != nil {
			b.free(kb)
			kv.k = kv.k[:l]
			kv.Close()
			return nil, err
		}
		kv.v = append(kv.v, vb)
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
	return b.ctx.StoreKV(bcuda.Ref{Buf: c.k[layer]}, bcuda.Ref{Buf: c.v[layer]}, c.cfg.DType, c.cfg.Slots, c.cfg.Width,
		kt.ref(), vt.ref(), len(bt.Slot), bt.Slot)
}

// Attention computes causal attention of q [n, NHead*HeadDim] over layer's cache for every
// sequence of bt into dst (same shape, not overlapping q).
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
	return b.ctx.Attention(d.ref(), qt.ref(), qt.rows, bcuda.Ref{Buf: c.k[layer]}, bcuda.Ref{Buf: c.v[layer]}, c.cfg.DType,
		c.cfg.Slots, c.cfg.Width, c.cfg.BlockSize, bcuda.Attn{NHead: a.NHead, NKVHead: a.NKVHead, HeadDim: a.HeadDim, Scale: a.Scale},
		b.seqs, b.blocks)
}

// FullAttention is unmasked attention of q over every row of k and v (both F32 or both F16).
func (b *Backend) FullAttention(dst, q, k, v backend.Tensor, a backend.Attn) error {
	d, qt, kt, vt, err := b.ops.FullAttention(dst, q, k, v, a)
	if err != nil {
		return err
	}
	if qt.rows == 0 { // no queries (and maybe no keys): nothing to do, as on the other backends
		return nil
	}
	return b.ctx.FullAttention(d.ref(), qt.ref(), qt.rows, kt.ref(), vt.ref(), kt.dt, kt.rows,
		bcuda.Attn{NHead: a.NHead, NKVHead: a.NKVHead, HeadDim: a.HeadDim, Scale: a.Scale})
}
