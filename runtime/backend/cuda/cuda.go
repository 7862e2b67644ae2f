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
	"sync/atomic"

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

func init() {
	backend.Register("cuda", Priority, factory)
	backend.RegisterInfo("cuda", describeDevices)
}

// describeDevices lists the GPUs this process sees, or says why it sees none.
func describeDevices() string {
	devs, err := bcuda.Devices()
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for i, d := range devs {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "GPU %d: %s (compute capability %d.%d, %.1f GiB)", d.Index, d.Name, d.Major, d.Minor, float64(d.MemoryTotal)/(1<<30))
	}
	return b.String()
}

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

	mu     sync.Mutex // guards owned and the attention tables below
	owned  map[*bcuda.Buffer]struct{}
	closed atomic.Bool
	seqs   []bcuda.Seq
	blocks []int32
	tok    []int32 // scratch of backend.CheckAttention
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
	return &Backend{ctx: ctx, dev: *dev, owned: map[*bcuda.Buffer]struct{}{}, graphs: o.Graphs}, nil
}

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
	if b.closed.Load() {
		return nil
	}
	b.closed.Store(true)
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
	if b.closed.Load() {
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
	closed     bool
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
	if t.closed {
		return nil
	}
	t.closed = true
	if t.root == t && t.buf != nil {
		t.b.free(t.buf)
	}
	return nil
}

func (t *Tensor) ref() bcuda.Ref { return bcuda.Ref{Buf: t.buf, Off: t.off} }

// size returns rows*dt.RowSize(cols) in bytes and the row size.
func size(op string, dt tensor.DType, rows, cols int) (n, rowBytes int, err error) {
	if rows < 0 || cols < 0 {
		return 0, 0, fmt.Errorf("cuda: %s: negative shape %dx%d", op, rows, cols)
	}
	rs, err := dt.RowSize(int64(cols))
	if err != nil {
		return 0, 0, fmt.Errorf("cuda: %s: %w", op, err)
	}
	if rs != 0 && int64(rows) > (math.MaxInt64/4)/rs {
		return 0, 0, fmt.Errorf("cuda: %s: %dx%d %v is too large", op, rows, cols, dt)
	}
	return int(int64(rows) * rs), int(rs), nil
}

// Load copies data (rows×cols elements of dt) to the device. data may be reused once Load
// returns.
func (b *Backend) Load(dt tensor.DType, rows, cols int, data []byte) (backend.Tensor, error) {
	const op = "load"
	if !bcuda.Supports(bcuda.OpMatMul, dt) {
		return nil, fmt.Errorf("cuda: %s: dtype %v: %w", op, dt, backend.ErrUnsupported)
	}
	n, rb, err := size(op, dt, rows, cols)
	if err != nil {
		return nil, err
	}
	if len(data) != n {
		return nil, fmt.Errorf("cuda: %s: %dx%d %v needs %d bytes, got %d", op, rows, cols, dt, n, len(data))
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
	return t, nil
}

// Alloc makes a zeroed F32 or F16 tensor.
func (b *Backend) Alloc(dt tensor.DType, rows, cols int) (backend.Tensor, error) {
	const op = "alloc"
	if dt != tensor.F32 && dt != tensor.F16 {
		return nil, fmt.Errorf("cuda: %s: dtype %v (want F32 or F16): %w", op, dt, backend.ErrUnsupported)
	}
	n, rb, err := size(op, dt, rows, cols)
	if err != nil {
		return nil, err
	}
	buf, err := b.alloc(op, n)
	if err != nil {
		return nil, err
	}
	t := &Tensor{b: b, dt: dt, rows: rows, cols: cols, rowBytes: rb, buf: buf}
	t.root = t
	return t, nil
}

var errForeign = errors.New("tensor was not made by this backend")

// tensorOf returns t as a live tensor of b.
func (b *Backend) tensorOf(op, what string, t backend.Tensor) (*Tensor, error) {
	ct, ok := t.(*Tensor)
	if !ok || ct == nil || ct.b != b {
		return nil, fmt.Errorf("cuda: %s: %s: %w", op, what, errForeign)
	}
	if ct.closed || ct.root.closed || b.closed.Load() {
		return nil, fmt.Errorf("cuda: %s: %s is closed", op, what)
	}
	return ct, nil
}

// f32Of returns t as a live F32 tensor of b, writable if write.
func (b *Backend) f32Of(op, what string, t backend.Tensor, write bool) (*Tensor, error) {
	ct, err := b.tensorOf(op, what, t)
	if err != nil {
		return nil, err
	}
	if ct.dt != tensor.F32 {
		return nil, fmt.Errorf("cuda: %s: %s is %v, want F32", op, what, ct.dt)
	}
	if write && ct.readOnly {
		return nil, fmt.Errorf("cuda: %s: %s is a loaded weight tensor (read-only)", op, what)
	}
	return ct, nil
}

// f32Of3 checks the writable F32 destination and two F32 operands of an elementwise op.
func (b *Backend) f32Of3(op string, dst backend.Tensor, n1 string, t1 backend.Tensor, n2 string, t2 backend.Tensor) (d, a, c *Tensor, err error) {
	if d, err = b.f32Of(op, "dst", dst, true); err != nil {
		return nil, nil, nil, err
	}
	if a, err = b.f32Of(op, n1, t1, false); err != nil {
		return nil, nil, nil, err
	}
	if c, err = b.f32Of(op, n2, t2, false); err != nil {
		return nil, nil, nil, err
	}
	return d, a, c, nil
}

// overlaps reports whether two tensors share any byte of device memory.
func overlaps(a, c *Tensor) bool {
	if a.buf != c.buf {
		return false
	}
	aEnd, cEnd := a.off+a.rows*a.rowBytes, c.off+c.rows*c.rowBytes
	return a.off < cEnd && c.off < aEnd
}

// same reports whether two tensors are exactly the same memory (an allowed in-place operand).
func same(a, c *Tensor) bool {
	return a.buf == c.buf && a.off == c.off && a.rows == c.rows && a.rowBytes == c.rowBytes
}

// View returns rows row0 .. row0+rows-1 of t, sharing its memory.
func (b *Backend) View(t backend.Tensor, row0, rows int) (backend.Tensor, error) {
	const op = "view"
	p, err := b.tensorOf(op, "t", t)
	if err != nil {
		return nil, err
	}
	if err := backend.CheckView(p, row0, rows); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	return &Tensor{b: b, dt: p.dt, rows: rows, cols: p.cols, rowBytes: p.rowBytes, buf: p.buf,
		off: p.off + row0*p.rowBytes, root: p.root, readOnly: p.readOnly}, nil
}

// Write copies src into rows row0.. of an F32 tensor (in stream order).
func (b *Backend) Write(dst backend.Tensor, row0 int, src []float32) error {
	const op = "write"
	t, err := b.f32Of(op, "dst", dst, true)
	if err != nil {
		return err
	}
	if err := backend.CheckSpan(op, t, row0, len(src)); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	return b.ctx.UploadF32(bcuda.Ref{Buf: t.buf, Off: t.off + row0*t.rowBytes}, src)
}

// Read waits for all queued work, then copies rows row0.. of an F32 tensor into dst.
func (b *Backend) Read(src backend.Tensor, row0 int, dst []float32) error {
	const op = "read"
	t, err := b.f32Of(op, "src", src, false)
	if err != nil {
		return err
	}
	if err := backend.CheckSpan(op, t, row0, len(dst)); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	return b.ctx.DownloadF32(dst, bcuda.Ref{Buf: t.buf, Off: t.off + row0*t.rowBytes})
}

// GetRows: dst[i,:] = float32(table[ids[i],:]); dst [len(ids), cols] F32.
func (b *Backend) GetRows(dst, table backend.Tensor, ids []int32) error {
	const op = "get rows"
	d, err := b.f32Of(op, "dst", dst, true)
	if err != nil {
		return err
	}
	tb, err := b.tensorOf(op, "table", table)
	if err != nil {
		return err
	}
	if err := backend.CheckGetRows(d, tb, ids); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if overlaps(d, tb) {
		return fmt.Errorf("cuda: %s: dst overlaps the table", op)
	}
	return b.ctx.GetRows(d.ref(), tb.ref(), tb.dt, tb.rows, tb.cols, ids)
}

// MatMul: dst[i,j] = sum_k x[i,k]*w[j,k]; x [n, k] F32, w [m, k], dst [n, m] F32.
func (b *Backend) MatMul(dst, x, w backend.Tensor) error {
	const op = "matmul"
	d, err := b.f32Of(op, "dst", dst, true)
	if err != nil {
		return err
	}
	xt, err := b.f32Of(op, "x", x, false)
	if err != nil {
		return err
	}
	wt, err := b.tensorOf(op, "w", w)
	if err != nil {
		return err
	}
	if err := backend.CheckMatMul(d, xt, wt); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if overlaps(d, xt) || overlaps(d, wt) {
		return fmt.Errorf("cuda: %s: dst must not overlap an operand", op)
	}
	return b.ctx.MatMul(d.ref(), xt.ref(), xt.rows, xt.cols, wt.ref(), wt.dt, wt.rows)
}

var _ backend.MultiMatMuler = (*Backend)(nil)

// MatMuls computes dst[i] = x · w[i]ᵀ for every i (backend.MultiMatMuler), each bit for bit as
// MatMul does: one launch for a layer's query, key and value products (or gate and up) against
// a decode-sized x, where the matrices share a type.
func (b *Backend) MatMuls(dst []backend.Tensor, x backend.Tensor, w []backend.Tensor) error {
	const op = "matmuls"
	if len(dst) != len(w) {
		return fmt.Errorf("cuda: %s: %d destinations for %d matrices", op, len(dst), len(w))
	}
	if len(w) == 0 || len(w) > 4 {
		for i := range w {
			if err := b.MatMul(dst[i], x, w[i]); err != nil {
				return err
			}
		}
		return nil
	}
	xt, err := b.f32Of(op, "x", x, false)
	if err != nil {
		return err
	}
	// Every product is checked before any runs.
	var ds, ws [4]*Tensor
	same := true
	for i := range w {
		if ds[i], err = b.f32Of(op, "dst", dst[i], true); err != nil {
			return err
		}
		if ws[i], err = b.tensorOf(op, "w", w[i]); err != nil {
			return err
		}
		if err := backend.CheckMatMul(ds[i], xt, ws[i]); err != nil {
			return fmt.Errorf("cuda: %w", err)
		}
		if overlaps(ds[i], xt) || overlaps(ds[i], ws[i]) {
			return fmt.Errorf("cuda: %s: dst must not overlap an operand", op)
		}
		for j := range i {
			if overlaps(ds[i], ds[j]) || overlaps(ds[i], ws[j]) || overlaps(ds[j], ws[i]) {
				return fmt.Errorf("cuda: %s: a destination overlaps another product's", op)
			}
		}
		same = same && ws[i].dt == ws[0].dt
	}
	n := len(w)
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
	const op = "add rows"
	d, at, bt, err := b.f32Of3(op, dst, "a", a, "b", bias)
	if err != nil {
		return err
	}
	if err := backend.CheckAddRows(d, at, bt); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if (overlaps(d, at) && !same(d, at)) || (overlaps(d, bt) && !(same(d, bt) && bt.rows == at.rows)) {
		return fmt.Errorf("cuda: %s: dst partly overlaps an operand", op)
	}
	return b.ctx.AddRows(d.ref(), at.ref(), bt.ref(), at.rows, at.cols, bt.rows)
}

// RMSNorm: dst[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * w[0,:]; a w narrower than x
// normalises groups of its width apart (see backend.Backend). dst may be x.
func (b *Backend) RMSNorm(dst, x, w backend.Tensor, eps float32) error {
	const op = "rms norm"
	d, xt, wt, err := b.f32Of3(op, dst, "x", x, "w", w)
	if err != nil {
		return err
	}
	if err := backend.CheckRMSNorm(d, xt, wt, eps); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if overlaps(d, wt) || (overlaps(d, xt) && !same(d, xt)) {
		return fmt.Errorf("cuda: %s: dst overlaps the weight or part of x", op)
	}
	if xt.cols == 0 {
		return nil
	}
	// rows of x in groups of w's width: [n, h*g] as [n*h, g]
	return b.ctx.RMSNorm(d.ref(), xt.ref(), wt.ref(), xt.rows*(xt.cols/wt.cols), wt.cols, eps)
}

// GeGLU: dst = gelu(gate) * up elementwise. dst may be gate or up.
func (b *Backend) GeGLU(dst, gate, up backend.Tensor) error {
	const op = "geglu"
	d, g, u, err := b.f32Of3(op, dst, "gate", gate, "up", up)
	if err != nil {
		return err
	}
	if err := backend.CheckGeGLU(d, g, u); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if (overlaps(d, g) && !same(d, g)) || (overlaps(d, u) && !same(d, u)) {
		return fmt.Errorf("cuda: %s: dst partly overlaps an operand", op)
	}
	return b.ctx.GeGLU(d.ref(), g.ref(), u.ref(), g.rows*g.cols)
}

// Scale: dst = x * s elementwise. dst may be x.
func (b *Backend) Scale(dst, x backend.Tensor, s float32) error {
	const op = "scale"
	d, xt, _, err := b.f32Of3(op, dst, "x", x, "x", x)
	if err != nil {
		return err
	}
	if err := backend.CheckScale(d, xt, s); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if overlaps(d, xt) && !same(d, xt) {
		return fmt.Errorf("cuda: %s: dst partly overlaps x", op)
	}
	return b.ctx.Scale(d.ref(), xt.ref(), s, xt.rows*xt.cols)
}

// SwiGLU: dst = silu(gate) * up elementwise. dst may be gate (or up).
func (b *Backend) SwiGLU(dst, gate, up backend.Tensor) error {
	const op = "swiglu"
	d, g, u, err := b.f32Of3(op, dst, "gate", gate, "up", up)
	if err != nil {
		return err
	}
	if err := backend.CheckSwiGLU(d, g, u); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if (overlaps(d, g) && !same(d, g)) || (overlaps(d, u) && !same(d, u)) {
		return fmt.Errorf("cuda: %s: dst partly overlaps an operand", op)
	}
	return b.ctx.SwiGLU(d.ref(), g.ref(), u.ref(), g.rows*g.cols)
}

// Rope rotates x [n, nHead*HeadDim] in place, token i at position bt.Pos[i].
func (b *Backend) Rope(x backend.Tensor, nHead int, r backend.RoPE, bt *backend.Batch) error {
	const op = "rope"
	xt, err := b.f32Of(op, "x", x, true)
	if err != nil {
		return err
	}
	if err := backend.CheckRope(xt, nHead, r, bt); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	return b.ctx.Rope(xt.ref(), xt.rows, nHead, bcuda.RoPE{NeoX: r.Mode == backend.RoPENeoX, HeadDim: r.HeadDim, Dims: r.Dims,
		Base: r.Base, FreqScale: r.FreqScale, Factors: r.Factors, AttnFactor: r.AttnFactor,
		ExtFactor: r.ExtFactor, CorrDims: r.CorrDims}, bt.Pos)
}

// KV is a key/value cache in device memory: per layer, keys and values [Slots, Width].
type KV struct {
	b      *Backend
	cfg    backend.KVConfig
	k, v   []*bcuda.Buffer
	closed bool
}

// Config returns the cache's configuration.
func (kv *KV) Config() backend.KVConfig { return kv.cfg }

// Close frees the cache. Closing twice is a no-op.
func (kv *KV) Close() error {
	if kv.closed {
		return nil
	}
	kv.closed = true
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
	if b.closed.Load() {
		return nil, fmt.Errorf("cuda: %s: backend closed", op)
	}
	if err := backend.CheckKVConfig(cfg); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	n, _, err := size(op, cfg.DType, cfg.Slots, cfg.Width)
	if err != nil {
		return nil, err
	}
	if cfg.Layers > math.MaxInt32 || n > (math.MaxInt64/4)/(2*cfg.Layers) {
		return nil, fmt.Errorf("cuda: %s: %d layers of %d bytes is too large", op, cfg.Layers, 2*n)
	}
	if free, _, err := b.ctx.MemInfo(); err == nil && int64(n)*2*int64(cfg.Layers) > free {
		return nil, fmt.Errorf("cuda: %s: %d layers of %d bytes exceed the %d bytes free on the device", op, cfg.Layers, 2*n, free)
	}
	kv := &KV{b: b, cfg: cfg, k: make([]*bcuda.Buffer, 0, cfg.Layers), v: make([]*bcuda.Buffer, 0, cfg.Layers)}
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

func (b *Backend) kvOf(op string, kv backend.KV, layer int) (*KV, error) {
	c, ok := kv.(*KV)
	if !ok || c == nil || c.b != b {
		return nil, fmt.Errorf("cuda: %s: kv cache: %w", op, errForeign)
	}
	if c.closed || b.closed.Load() {
		return nil, fmt.Errorf("cuda: %s: kv cache is closed", op)
	}
	if err := backend.CheckLayer(op, c.cfg, layer); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	return c, nil
}

// StoreKV writes k and v [n, Width] (F32) into layer's cache at slots bt.Slot.
func (b *Backend) StoreKV(kv backend.KV, layer int, k, v backend.Tensor, bt *backend.Batch) error {
	const op = "store kv"
	c, err := b.kvOf(op, kv, layer)
	if err != nil {
		return err
	}
	kt, err := b.f32Of(op, "k", k, false)
	if err != nil {
		return err
	}
	vt, err := b.f32Of(op, "v", v, false)
	if err != nil {
		return err
	}
	if err := backend.CheckStoreKV(c.cfg, kt, vt, bt); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	return b.ctx.StoreKV(bcuda.Ref{Buf: c.k[layer]}, bcuda.Ref{Buf: c.v[layer]}, c.cfg.DType, c.cfg.Slots, c.cfg.Width,
		kt.ref(), vt.ref(), len(bt.Slot), bt.Slot)
}

// Attention computes causal attention of q [n, NHead*HeadDim] over layer's cache for every
// sequence of bt into dst (same shape, not overlapping q).
func (b *Backend) Attention(dst, q backend.Tensor, kv backend.KV, layer int, a backend.Attn, bt *backend.Batch) error {
	const op = "attention"
	c, err := b.kvOf(op, kv, layer)
	if err != nil {
		return err
	}
	d, err := b.f32Of(op, "dst", dst, true)
	if err != nil {
		return err
	}
	qt, err := b.f32Of(op, "q", q, false)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tok, err = backend.CheckAttention(d, qt, c.cfg, a, bt, b.tok); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if overlaps(d, qt) {
		return fmt.Errorf("cuda: %s: dst must not overlap q", op)
	}
	// The C batch holds int32s. The check leaves Start, Count and CtxLen non-negative and CtxLen
	// at most the cache's slots (an int32).
	b.seqs, b.blocks = b.seqs[:0], b.blocks[:0]
	for i, s := range bt.Seqs {
		if s.Start > math.MaxInt32 || s.Count > math.MaxInt32 || len(s.Blocks) > math.MaxInt32-len(b.blocks) {
			return fmt.Errorf("cuda: %s: sequence %d: bad range start=%d count=%d context=%d", op, i, s.Start, s.Count, s.CtxLen)
		}
		b.seqs = append(b.seqs, bcuda.Seq{Start: int32(s.Start), Count: int32(s.Count), CtxLen: int32(s.CtxLen),
			BlocksOff: int32(len(b.blocks)), NBlocks: int32(len(s.Blocks))})
		b.blocks = append(b.blocks, s.Blocks...)
	}
	return b.ctx.Attention(d.ref(), qt.ref(), qt.rows, bcuda.Ref{Buf: c.k[layer]}, bcuda.Ref{Buf: c.v[layer]}, c.cfg.DType,
		c.cfg.Slots, c.cfg.Width, c.cfg.BlockSize, bcuda.Attn{NHead: a.NHead, NKVHead: a.NKVHead, HeadDim: a.HeadDim, Scale: a.Scale},
		b.seqs, b.blocks)
}

// Copy converts src into dst elementwise: F32 to F16, F16 to F32, or a copy of one float type.
func (b *Backend) Copy(dst, src backend.Tensor) error {
	const op = "copy"
	d, err := b.tensorOf(op, "dst", dst)
	if err != nil {
		return err
	}
	s, err := b.tensorOf(op, "src", src)
	if err != nil {
		return err
	}
	if d.readOnly {
		return fmt.Errorf("cuda: %s: dst is a loaded weight tensor (read-only)", op)
	}
	if err := backend.CheckCopy(d, s); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if overlaps(d, s) {
		return fmt.Errorf("cuda: %s: dst overlaps src", op)
	}
	return b.ctx.Copy(d.ref(), d.dt, s.ref(), s.dt, s.rows*s.cols)
}

// LayerNorm: dst[i,:] = (x[i,:]-mean)/sqrt(var+eps)*w[0,:] + bias[0,:]. dst may be x.
func (b *Backend) LayerNorm(dst, x, w, bias backend.Tensor, eps float32) error {
	const op = "layer norm"
	d, xt, wt, err := b.f32Of3(op, dst, "x", x, "w", w)
	if err != nil {
		return err
	}
	bt, err := b.f32Of(op, "b", bias, false)
	if err != nil {
		return err
	}
	if err := backend.CheckLayerNorm(d, xt, wt, bt, eps); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if overlaps(d, wt) || overlaps(d, bt) || (overlaps(d, xt) && !same(d, xt)) {
		return fmt.Errorf("cuda: %s: dst overlaps a parameter or part of x", op)
	}
	return b.ctx.LayerNorm(d.ref(), xt.ref(), wt.ref(), bt.ref(), xt.rows, xt.cols, eps)
}

// GELU (tanh form) elementwise. dst may be x.
func (b *Backend) GELU(dst, x backend.Tensor) error {
	const op = "gelu"
	d, err := b.f32Of(op, "dst", dst, true)
	if err != nil {
		return err
	}
	xt, err := b.f32Of(op, "x", x, false)
	if err != nil {
		return err
	}
	if err := backend.CheckSameShape(op, d, xt); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if overlaps(d, xt) && !same(d, xt) {
		return fmt.Errorf("cuda: %s: dst partly overlaps x", op)
	}
	return b.ctx.GELU(d.ref(), xt.ref(), xt.rows*xt.cols)
}

// Im2Col1D lays out the receptive fields of a 1-D convolution of x [T, C] as rows of dst
// [Tout, C*kernel].
func (b *Backend) Im2Col1D(dst, x backend.Tensor, kernel, stride, pad int) error {
	const op = "im2col"
	d, err := b.f32Of(op, "dst", dst, true)
	if err != nil {
		return err
	}
	xt, err := b.f32Of(op, "x", x, false)
	if err != nil {
		return err
	}
	tout, err := backend.CheckIm2Col1D(d, xt, kernel, stride, pad)
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if overlaps(d, xt) {
		return fmt.Errorf("cuda: %s: dst overlaps x", op)
	}
	return b.ctx.Im2Col1D(d.ref(), xt.ref(), xt.rows, xt.cols, kernel, stride, pad, tout)
}

// FullAttention is unmasked attention of q over every row of k and v (both F32 or both F16).
func (b *Backend) FullAttention(dst, q, k, v backend.Tensor, a backend.Attn) error {
	const op = "full attention"
	d, err := b.f32Of(op, "dst", dst, true)
	if err != nil {
		return err
	}
	qt, err := b.f32Of(op, "q", q, false)
	if err != nil {
		return err
	}
	kt, err := b.tensorOf(op, "k", k)
	if err != nil {
		return err
	}
	vt, err := b.tensorOf(op, "v", v)
	if err != nil {
		return err
	}
	if err := backend.CheckFullAttention(qt, kt, vt, a); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := backend.CheckSameShape(op, d, qt); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if overlaps(d, qt) || overlaps(d, kt) || overlaps(d, vt) {
		return fmt.Errorf("cuda: %s: dst must not overlap an operand", op)
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
