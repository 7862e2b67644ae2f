//go:build cuda && cgo && !nocgo

package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"

	bcuda "github.com/parleyhq/parley/bindings/cuda"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Priority is the backend's rank for backend.New("auto"): above the CPU backends.
const Priority = 20

// Environment variables read by the registered factory.
const (
	EnvDevice = "PARLEY_CUDA_DEVICE" // CUDA device ordinal (default 0)
	EnvTF32   = "PARLEY_CUDA_TF32"   // "0" computes F32 matrix products in full F32
	EnvGraphs = "PARLEY_CUDA_GRAPHS" // "1" records decode steps as CUDA graphs (Options.Graphs)
	EnvFlash  = "PARLEY_CUDA_FLASH"  // "mma" or "simt": the F16 flash-attention kernel (Options.FlashMMA)
	EnvMMQ    = "PARLEY_CUDA_MMQ"    // "0" multiplies batches by quantised weights as F16 products (Options.QuantF16)
)

func init() { backend.Register("cuda", Priority, factory) }

// Options configure a CUDA backend.
type Options struct {
	// Device is the CUDA device ordinal.
	Device int
	// ExactF32 turns TF32 off: F32 weights are then multiplied in full F32 (as the CPU backends
	// do), at a fraction of the tensor-core speed.
	ExactF32 bool
	// Graphs lets models record their steps as CUDA graphs (backend.Recorder): one launch a
	// step instead of one a kernel. Off by default until it has been measured on a GPU.
	Graphs bool
	// FlashMMA computes attention over F16 caches (prompts, Whisper's encoder) with the
	// tensor-core kernel (mma.sync; compute capability 8.0 and later) instead of the CUDA-core
	// one; unless ExactF32, attention over F32 caches and keys then also runs on tensor cores,
	// with TF32 inputs (queries, keys, weights and values rounded to 10-bit mantissas). Off by
	// default until it has been measured on a GPU.
	FlashMMA bool
	// QuantF16 multiplies more than eight activation rows (prompts, batched decoding of many
	// sequences) by quantised weights as F16 products on cuBLAS: each weight matrix expanded to
	// F16 in every product, the activations rounded to F16. By default such products run on
	// int8 tensor cores (mma.sync .s8) with the activations quantised as for fewer rows, as the
	// CPU backends and llama.cpp quantise them, so that a model's outputs do not depend on how
	// its prompt was batched; F16 products move them by more (the LLaMA parity test's Q4_0
	// model fails llama.cpp's bounds with them).
	QuantF16 bool
}

func factory(opts backend.Options) (backend.Backend, error) {
	o := Options{}
	if v := strings.TrimSpace(os.Getenv(EnvDevice)); v != "" {
		d, err := strconv.Atoi(v)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("cuda: %s=%q is not a device ordinal", EnvDevice, v)
		}
		o.Device = d
	}
	o.ExactF32 = strings.TrimSpace(os.Getenv(EnvTF32)) == "0"
	var err error
	if o.Graphs, err = envSwitch(EnvGraphs, false); err != nil {
		return nil, err
	}
	switch v := strings.TrimSpace(os.Getenv(EnvFlash)); v {
	case "", "simt":
	case "mma":
		o.FlashMMA = true
	default:
		return nil, fmt.Errorf("cuda: %s=%q: want mma or simt", EnvFlash, v)
	}
	mmq, err := envSwitch(EnvMMQ, true)
	if err != nil {
		return nil, err
	}
	o.QuantF16 = !mmq
	return New(o)
}

// envSwitch reads the environment variable name as "0" (off) or "1" (on); def when unset.
func envSwitch(name string, def bool) (bool, error) {
	switch v := strings.TrimSpace(os.Getenv(name)); v {
	case "":
		return def, nil
	case "0", "1":
		return v == "1", nil
	default:
		return false, fmt.Errorf("cuda: %s=%q: want 0 or 1", name, v)
	}
}

// Backend is the CUDA backend.
type Backend struct {
	ctx *bcuda.Context
	dev bcuda.Device
	ops backend.Operands[*Tensor, *KV] // also says whether the backend is closed (set under mu)

	mu     sync.Mutex // guards owned and the attention tables below
	owned  map[*bcuda.Buffer]struct{}
	seqs   []bcuda.Seq
	blocks []int32
	tok    []int32 // scratch of the attention checks: each token's sequence
	graphs bool    // Options.Graphs
}

// New starts a backend on GPU o.Device. Without a usable GPU it returns an error saying why.
func New(o Options) (*Backend, error) {
	devs, err := bcuda.Devices()
	if err != nil {
		return nil, err
	}
	var dev *bcuda.Device
	for i := range devs {
		if devs[i].Index == o.Device {
			dev = &devs[i]
		}
	}
	if dev == nil {
		return nil, fmt.Errorf("cuda: no device %d (this machine has %d)", o.Device, len(devs))
	}
	ctx, err := bcuda.NewContext(dev.Index)
	if err != nil {
		return nil, fmt.Errorf("cuda: %s (compute capability %d.%d): %w", dev.Name, dev.Major, dev.Minor, err)
	}
	if err := ctx.SetTF32(!o.ExactF32); err != nil {
		ctx.Close()
		return nil, err
	}
	if o.FlashMMA {
		if err := ctx.SetFlashMMA(true); err != nil {
			ctx.Close()
			return nil, fmt.Errorf("cuda: %s (compute capability %d.%d): tensor-core attention: %w", dev.Name, dev.Major, dev.Minor, err)
		}
	}
	if o.QuantF16 {
		if err := ctx.SetMMQ(false); err != nil {
			ctx.Close()
			return nil, err
		}
	}
	caps := backend.Capabilities{
		Weights: backend.DTypes(func(dt tensor.DType) bool { return bcuda.Supports(bcuda.OpMatMul, dt) }),
		KV:      backend.DTypes(func(dt tensor.DType) bool { return bcuda.Supports(bcuda.OpKV, dt) }),
	}
	return &Backend{ctx: ctx, dev: *dev, ops: backend.NewOperands[*Tensor, *KV]("cuda", caps), owned: map[*bcuda.Buffer]struct{}{},
		graphs: o.Graphs}, nil
}

// Capabilities says what the backend computes: the weight and cache types of its kernels.
func (b *Backend) Capabilities() backend.Capabilities { return b.ops.Capabilities() }

// Record starts recording operations as a CUDA graph (backend.Recorder); ErrNotRecording unless
// Options.Graphs.
func (b *Backend) Record() error {
	if !b.graphs {
		return backend.ErrNotRecording
	}
	return b.ctx.GraphBegin()
}

// Replay runs the recorded operations as one graph.
func (b *Backend) Replay() error { return b.ctx.GraphEnd() }

// Discard drops the recorded operations.
func (b *Backend) Discard() { b.ctx.GraphAbort() }

// GraphStats returns the backend's graph counters.
func (b *Backend) GraphStats() (bcuda.GraphStats, error) { return b.ctx.GraphStats() }

// FreeMemory returns the device's free memory in bytes (backend.MemoryReporter).
func (b *Backend) FreeMemory() (int64, error) {
	free, _, err := b.ctx.MemInfo()
	return free, err
}

// Name returns "cuda".
func (b *Backend) Name() string { return "cuda" }

// Device describes the GPU the backend computes on.
func (b *Backend) Device() bcuda.Device { return b.dev }

// Close frees every tensor and cache still open, then the context.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.ops.Close() {
		return nil
	}
	var errs []error
	for buf := range b.owned {
		errs = append(errs, buf.Close())
	}
	b.owned = nil
	errs = append(errs, b.ctx.Close())
	return errors.Join(errs...)
}

// alloc returns n zeroed bytes of device memory owned by the backend.
func (b *Backend) alloc(op string, n int) (*bcuda.Buffer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ops.Closed() {
		return nil, fmt.Errorf("cuda: %s: backend closed", op)
	}
	buf, err := b.ctx.Alloc(n)
	if err != nil {
		return nil, err
	}
	b.owned[buf] = struct{}{}
	return buf, nil
}

func (b *Backend) free(buf *bcuda.Buffer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.owned[buf]; ok {
		delete(b.owned, buf)
		buf.Close()
	}
}

// Tensor is a tensor in device memory.
type Tensor struct {
	b          *Backend
	dt         tensor.DType
	rows, cols int
	rowBytes   int
	buf        *bcuda.Buffer // the root's memory
	off        int           // byte offset of row 0 in buf
	root       *Tensor       // the tensor that owns buf (itself unless a View)
	readOnly   bool          // loaded weights
	res        backend.Residence
}

// DType is the tensor's element type.
func (t *Tensor) DType() tensor.DType { return t.dt }

// Rows is the number of rows.
func (t *Tensor) Rows() int { return t.rows }

// Cols is the number of elements a row.
func (t *Tensor) Cols() int { return t.cols }

// Close frees the tensor's device memory (a View's memory is its parent's). Closing twice is a
// no-op.
func (t *Tensor) Close() error {
	if t.res.Closed {
		return nil
	}
	t.res.Closed = true
	if t.root == t && t.buf != nil {
		t.b.free(t.buf)
	}
	return nil
}

func (t *Tensor) ref() bcuda.Ref { return bcuda.Ref{Buf: t.buf, Off: t.off} }

// Residence is what the shared operand checks read of t (backend.Operands).
func (t *Tensor) Residence() *backend.Residence { return &t.res }

// reside records t's device memory for the operand checks.
func (t *Tensor) reside() {
	t.res = backend.Residence{Owner: t.b.ops.Owner, DType: t.dt, ReadOnly: t.readOnly,
		Addr: t.buf.Addr() + uintptr(t.off), Bytes: t.rows * t.rowBytes}
	if t.root != t {
		t.res.View = &t.root.res
	}
}

// Load copies data (rows×cols elements of dt) to the device. data may be reused once Load
// returns.
func (b *Backend) Load(dt tensor.DType, rows, cols int, data []byte) (backend.Tensor, error) {
	const op = "load"
	n, rb, err := b.ops.Load(dt, rows, cols, data)
	if err != nil {
		return nil, err
	}
	buf, err := b.alloc(op, n)
	if err != nil {
		return nil, err
	}
	if err := b.ctx.Upload(bcuda.Ref{Buf: buf}, data); err != nil {
		b.free(buf)
		return nil, err
	}
	t := &Tensor{b: b, dt: dt, rows: rows, cols: cols, rowBytes: rb, buf: buf, readOnly: true}
	t.root = t
	t.reside()
	return t, nil
}

// Alloc makes a zeroed F32 or F16 tensor.
func (b *Backend) Alloc(dt tensor.DType, rows, cols int) (backend.Tensor, error) {
	n, rb, err := b.ops.Alloc(dt, rows, cols)
	if err != nil {
		return nil, err
	}
	buf, err := b.alloc("alloc", n)
	if err != nil {
		return nil, err
	}
	t := &Tensor{b: b, dt: dt, rows: rows, cols: cols, rowBytes: rb, buf: buf}
	t.root = t
	t.reside()
	return t, nil
}

// View returns rows row0 .. row0+rows-1 of t, sharing its memory.
func (b *Backend) View(t backend.Tensor, row0, rows int) (backend.Tensor, error) {
	p, err := b.ops.View(t, row0, rows)
	if err != nil {
		return nil, err
	}
	v := &Tensor{b: b, dt: p.dt, rows: rows, cols: p.cols, rowBytes: p.rowBytes, buf: p.buf,
		off: p.off + row0*p.rowBytes, root: p.root, readOnly: p.readOnly}
	v.reside()
	return v, nil
}

// Write copies src into rows row0.. of an F32 tensor (in stream order).
func (b *Backend) Write(dst backend.Tensor, row0 int, src []float32) error {
	t, err := b.ops.Span("write", "dst", dst, row0, len(src), true)
	if err != nil {
		return err
	}
	return b.ctx.UploadF32(bcuda.Ref{Buf: t.buf, Off: t.off + row0*t.rowBytes}, src)
}

// Read waits for all queued work, then copies rows row0.. of an F32 tensor into dst.
func (b *Backend) Read(src backend.Tensor, row0 int, dst []float32) error {
	t, err := b.ops.Span("read", "src", src, row0, len(dst), false)
	if err != nil {
		return err
	}
	return b.ctx.DownloadF32(dst, bcuda.Ref{Buf: t.buf, Off: t.off + row0*t.rowBytes})
}

// GetRows: dst[i,:] = float32(table[ids[i],:]); dst [len(ids), cols] F32.
func (b *Backend) GetRows(dst, table backend.Tensor, ids []int32) error {
	d, tb, err := b.ops.GetRows(dst, table, ids)
	if err != nil {
		return err
	}
	return b.ctx.GetRows(d.ref(), tb.ref(), tb.dt, tb.rows, tb.cols, ids)
}

// MatMul: dst[i,j] = sum_k x[i,k]*w[j,k]; x [n, k] F32, w [m, k], dst [n, m] F32.
func (b *Backend) MatMul(dst, x, w backend.Tensor) error {
	d, xt, wt, err := b.ops.MatMul(dst, x, w)
	if err != nil {
		return err
	}
	return b.ctx.MatMul(d.ref(), xt.ref(), xt.rows, xt.cols, wt.ref(), wt.dt, wt.rows)
}

var _ backend.MultiMatMuler = (*Backend)(nil)

// MatMuls computes dst[i] = x · w[i]ᵀ for every i (backend.MultiMatMuler), each bit for bit as
// MatMul does: one launch for a layer's query, key and value products (or gate and up) against
// a decode-sized x, where the matrices share a type.
func (b *Backend) MatMuls(dst []backend.Tensor, x backend.Tensor, w []backend.Tensor) error {
	n := len(w)
	if n == 0 || n > 4 || len(dst) != n {
		if len(dst) != n {
			return fmt.Errorf("cuda: matmuls: %d destinations for %d matrices", len(dst), n)
		}
		for i := range w {
			if err := b.MatMul(dst[i], x, w[i]); err != nil {
				return err
			}
		}
		return nil
	}
	// Every product is checked before any runs.
	var ds, ws [4]*Tensor
	xt, err := b.ops.MatMuls(dst, x, w, ds[:n], ws[:n])
	if err != nil {
		return err
	}
	same := true
	for i := range n {
		same = same && ws[i].dt == ws[0].dt
	}
	if !same {
		for i := range n {
			if err := b.ctx.MatMul(ds[i].ref(), xt.ref(), xt.rows, xt.cols, ws[i].ref(), ws[i].dt, ws[i].rows); err != nil {
				return err
			}
		}
		return nil
	}
	var dr, wr [4]bcuda.Ref
	var m [4]int
	for i := range n {
		dr[i], wr[i], m[i] = ds[i].ref(), ws[i].ref(), ws[i].rows
	}
	return b.ctx.MatMuls(dr[:n], xt.ref(), xt.rows, xt.cols, wr[:n], ws[0].dt, m[:n])
}

// AddRows: dst[i,:] = a[i,:] + bias[i or 0,:]. dst may be a.
func (b *Backend) AddRows(dst, a, bias backend.Tensor) error {
	d, at, bt, err := b.ops.AddRows(dst, a, bias)
	if err != nil {
		return err
	}
	return b.ctx.AddRows(d.ref(), at.ref(), bt.ref(), at.rows, at.cols, bt.rows)
}

// RMSNorm: dst[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * w[0,:]; a w narrower than x
// normalises groups of its width apart (see backend.Backend). dst may be x.
func (b *Backend) RMSNorm(dst, x, w backend.Tensor, eps float32) error {
	d, xt, wt, err := b.ops.RMSNorm(dst, x, w, eps)
	if err != nil {
		return err
	}
	if xt.cols == 0 {
		return nil
	}
	// rows of x in groups of w's width: [n, h*g] as [n*h, g]
	return b.ctx.RMSNorm(d.ref(), xt.ref(), wt.ref(), xt.rows*(xt.cols/wt.cols), wt.cols, eps)
}

// GeGLU: dst = gelu(gate) * up elementwise. dst may be gate or up.
func (b *Backend) GeGLU(dst, gate, up backend.Tensor) error {
	d, g, u, err := b.ops.GLU("geglu", dst, gate, up)
	if err != nil {
		return err
	}
	return b.ctx.GeGLU(d.ref(), g.ref(), u.ref(), g.rows*g.cols)
}

// Scale: dst = x * s elementwise. dst may be x.
func (b *Backend) Scale(dst, x backend.Tensor, s float32) error {
	d, xt, err := b.ops.Scale(dst, x, s)
	if err != nil {
		return err
	}
	return b.ctx.Scale(d.ref(), xt.ref(), s, xt.rows*xt.cols)
}

// SwiGLU: dst = silu(gate) * up elementwise. dst may be gate (or up).
func (b *Backend) SwiGLU(dst, gate, up backend.Tensor) error {
	d, g, u, err := b.ops.GLU("swiglu", dst, gate, up)
	if err != nil {
		return err
	}
	return b.ctx.SwiGLU(d.ref(), g.ref(), u.ref(), g.rows*g.cols)
}

// Rope rotates x [n, nHead*HeadDim] in place, token i at position bt.Pos[i].
func (b *Backend) Rope(x backend.Tensor, nHead int, r backend.RoPE, bt *backend.Batch) error {
	xt, err := b.ops.Rope(x, nHead, r, bt)
	if err != nil {
		return err
	}
	return b.ctx.Rope(xt.ref(), xt.rows, nHead, bcuda.RoPE{NeoX: r.Mode == backend.RoPENeoX, HeadDim: r.HeadDim, Dims: r.Dims,
		Base: r.Base, FreqScale: r.FreqScale, Factors: r.Factors, AttnFactor: r.AttnFactor,
		ExtFactor: r.ExtFactor, CorrDims: r.CorrDims}, bt.Pos)
}

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

// Copy converts src into dst elementwise: F32 to F16, F16 to F32, or a copy of one float type.
func (b *Backend) Copy(dst, src backend.Tensor) error {
	d, s, err := b.ops.Copy(dst, src)
	if err != nil {
		return err
	}
	if d.buf == s.buf && d.off == s.off { // dst is src
		return nil
	}
	return b.ctx.Copy(d.ref(), d.dt, s.ref(), s.dt, s.rows*s.cols)
}

// LayerNorm: dst[i,:] = (x[i,:]-mean)/sqrt(var+eps)*w[0,:] + bias[0,:]. dst may be x.
func (b *Backend) LayerNorm(dst, x, w, bias backend.Tensor, eps float32) error {
	d, xt, wt, bt, err := b.ops.LayerNorm(dst, x, w, bias, eps)
	if err != nil {
		return err
	}
	return b.ctx.LayerNorm(d.ref(), xt.ref(), wt.ref(), bt.ref(), xt.rows, xt.cols, eps)
}

// GELU (tanh form) elementwise. dst may be x.
func (b *Backend) GELU(dst, x backend.Tensor) error {
	d, xt, err := b.ops.Elementwise("gelu", dst, x)
	if err != nil {
		return err
	}
	return b.ctx.GELU(d.ref(), xt.ref(), xt.rows*xt.cols)
}

// Im2Col1D lays out the receptive fields of a 1-D convolution of x [T, C] as rows of dst
// [Tout, C*kernel].
func (b *Backend) Im2Col1D(dst, x backend.Tensor, kernel, stride, pad int) error {
	d, xt, tout, err := b.ops.Im2Col1D(dst, x, kernel, stride, pad)
	if err != nil {
		return err
	}
	return b.ctx.Im2Col1D(d.ref(), xt.ref(), xt.rows, xt.cols, kernel, stride, pad, tout)
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

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Tensor  = (*Tensor)(nil)
	_ backend.KV      = (*KV)(nil)
)
