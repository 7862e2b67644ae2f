//go:build cuda && cgo && !nocgo

package cuda

import (
	"errors"
	"fmt"
	"os"
	"slices"
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
		Funcs:   backend.SetOf(slices.DeleteFunc(tensor.Funcs(), func(f tensor.Func) bool { return !bcuda.SupportsFunc(f) })...),
	}
	return &Backend{ctx: ctx, dev: *dev, ops: backend.NewOperands[*Tensor, *KV]("cuda", caps), owned: map[*bcuda.Buffer]struct{}{},
		graphs: o.Graphs}, nil
}

// Capabilities says what the backend computes: the weight and cache types and the elementwise
// functions of its kernels.
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

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Tensor  = (*Tensor)(nil)
	_ backend.KV      = (*KV)(nil)
)
