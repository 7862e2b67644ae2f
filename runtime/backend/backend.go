// Package backend defines the one small interface through which model code computes: tensors
// that live wherever a backend keeps them (host memory, or device memory for a GPU backend), and
// the dozen operations a transformer forward step needs. Models are written once against it; the
// pure-Go backend (backend/purego), the native CPU backend (backend/cpu, cgo and OpenBLAS) and a
// GPU backend implement it and all pass the same conformance suite (backend/backendtest).
//
// Execution may be asynchronous: an operation may return before its result exists, as long as
// operations on one backend take effect in the order they were issued. Read is the only call that
// waits for results. A backend that cannot do a case returns an error wrapping ErrUnsupported;
// nothing panics on bad arguments. Every backend resolves and checks its operands through one
// Operands, and states as data what it computes beyond what all do (Capabilities): docs/backends.md.
//
// Backends register themselves (Register) from an init function; New picks one by name, or the
// best available for "auto". The nocgo build registers only the pure-Go backend.
package backend

import (
	"errors"
	"fmt"
	"math"

	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/tensor"
)

// ErrUnsupported is wrapped by errors for cases a backend does not implement: tensor.ErrUnsupported,
// which the native bindings wrap too.
var ErrUnsupported = tensor.ErrUnsupported

// Tensor is a two-dimensional, row-major array owned by one backend: Rows() rows of Cols()
// elements of DType(). A row of a quantised type is DType().RowSize(Cols()) bytes. Vectors are
// one-row tensors; a batch of n token activations of width d is an [n, d] tensor.
type Tensor interface {
	DType() tensor.DType
	Rows() int
	Cols() int
	// Close releases the tensor's memory. Closing twice is a no-op.
	Close() error
}

// Func names an elementwise function of Unary and GLU (tensor.Func: tensor.ReLU, tensor.SiLU,
// tensor.GELU...), passed down to the native kernels as it is.
type Func = tensor.Func

// RoPEMode selects how rotary embedding pairs the elements of a head.
type RoPEMode int

const (
	// RoPENormal rotates adjacent pairs (x[2i], x[2i+1]), as LLaMA's original code does.
	RoPENormal RoPEMode = iota
	// RoPENeoX rotates pairs (x[i], x[i+Dims/2]), as GPT-NeoX and Qwen do.
	RoPENeoX
)

// RoPE describes rotary position embedding for heads of HeadDim elements, of which the first
// Dims are rotated (Dims == HeadDim for LLaMA; an even number from 2 to HeadDim). Pair i of a
// token at position p is rotated by the angle theta = FreqScale * (p * Base^(-2i/Dims) /
// Factors[i]) (with llama.cpp's YaRN extensions off), and its cosine and sine are multiplied by
// AttnFactor. Base and FreqScale are finite and above 0.
type RoPE struct {
	Mode      RoPEMode
	HeadDim   int
	Dims      int
	Base      float32
	FreqScale float32 // 1 for no scaling; 1/factor for linear scaling
	// Factors, nil or Dims/2 finite values above 0, divide each pair's angle: llama.cpp's
	// rope_freqs tensor, with which Llama 3.1 and later scale their low frequencies.
	Factors []float32
	// AttnFactor, 0 (meaning 1) or a finite value above 0, multiplies the rotated pairs:
	// LongRoPE's attention factor, which ggml's rope applies so.
	AttnFactor float32
	// YaRN, as ggml computes it, when ExtFactor (finite, 0 to 1) is not 0: pair i's angle is
	// theta*(1-r) + theta/FreqScale*r, r = ExtFactor*(1 - clamp((i-CorrDims[0]) /
	// max(0.001, CorrDims[1]-CorrDims[0]), 0, 1)), so that the fastest pairs keep their
	// unscaled angle, and the rotated pairs are multiplied by 1 + 0.1*ln(1/FreqScale) besides.
	ExtFactor float32
	CorrDims  [2]float32
}

// YaRNCorrDims are the pairs between which YaRN's ramp runs for dims rotated elements of base,
// a model trained on origCtx positions, and the rotation counts betaFast and betaSlow
// (ggml_rope_yarn_corr_dims). Where ggml's bounds are infinite (a base of 1), they are clamped
// to dims and -1, which give the same ramp.
func YaRNCorrDims(dims, origCtx int, base, betaFast, betaSlow float32) [2]float32 {
	corr := func(beta float32) float64 {
		return float64(dims) * math.Log(float64(origCtx)/(float64(beta)*2*math.Pi)) / (2 * math.Log(float64(base)))
	}
	lo := math.Min(float64(dims), math.Max(0, math.Floor(corr(betaFast))))
	hi := math.Max(-1, math.Min(float64(dims-1), math.Ceil(corr(betaSlow))))
	if lo != lo || hi != hi { // 0/0: no ramp
		lo, hi = 0, 0
	}
	return [2]float32{float32(lo), float32(hi)}
}

// Seq is one sequence's share of a Batch: tokens [Start, Start+Count) of the batch, which are at
// positions CtxLen-Count .. CtxLen-1 of the sequence, so that after the step the sequence's cache
// holds CtxLen positions. Blocks is the sequence's block table: cache position j lives in slot
// Blocks[j/BlockSize]*BlockSize + j%BlockSize.
type Seq struct {
	Start, Count int
	CtxLen       int
	Blocks       []int32
}

// Batch describes the tokens of one forward step: several sequences, each with its own tokens,
// positions and KV-cache blocks. Pos and Slot are per token (derivable from Seqs; they are
// precomputed once per step because every layer uses them).
type Batch struct {
	Pos  []int32 // [n] position of each token in its sequence
	Slot []int32 // [n] KV-cache slot each token's key and value are stored in
	Seqs []Seq
}

// KVConfig sizes a KV cache: Layers layers, each with Slots slots (at most MaxInt32) of Width =
// nKVHead*headDim elements for keys and as many for values, stored as DType (F32, F16 or BF16;
// a backend may refuse BF16 with ErrUnsupported), in blocks of BlockSize slots.
type KVConfig struct {
	Layers    int
	Slots     int
	Width     int
	BlockSize int
	DType     tensor.DType
}

// KV is a backend-owned key/value cache for all layers of one model, shared by every sequence:
// sequences own blocks of slots (see package kvcache), not whole caches.
type KV interface {
	Config() KVConfig
	Close() error
}

// Attn describes attention heads: NHead query heads and NKVHead key/value heads (grouped-query
// attention: query head h reads kv head h/(NHead/NKVHead)) of HeadDim elements, with scores
// scaled by Scale (normally 1/sqrt(HeadDim)).
type Attn struct {
	NHead, NKVHead, HeadDim int
	Scale                   float32
}

// Backend computes. All tensors passed to a backend's methods must have been made by it.
//
// Shapes in the comments are [rows, cols]; n is the number of tokens in a batch. An output and
// an input share no memory unless a comment allows it: "dst may be x" means dst is exactly x
// (the operation is in place) or shares no byte with it; a view overlapping part of an input is
// refused. Every backend checks its operands the same way, through Operands.
type Backend interface {
	// Name is the name the backend registered under ("purego", "cpu", "cuda").
	Name() string
	// Capabilities says which cases of the operations below the backend computes (weight and
	// cache types, the functions of Unary and GLU); the same value every time. Callers read it
	// through CapabilitiesOf, which adds the optional operations the backend has.
	Capabilities() Capabilities

	// Load makes a tensor of rows×cols elements of dt whose contents are data (row-major,
	// dt.RowSize(cols) bytes a row). Host backends may keep data itself without copying it, so
	// data must stay valid and unchanged for the life of the tensor (weights memory-mapped from a
	// model file do).
	Load(dt tensor.DType, rows, cols int, data []byte) (Tensor, error)
	// Alloc makes a zeroed F32 (or F16) tensor for activations.
	Alloc(dt tensor.DType, rows, cols int) (Tensor, error)
	// Write copies src into rows row0.. of an F32 tensor.
	Write(dst Tensor, row0 int, src []float32) error
	// Read waits for all issued work, then copies rows row0.. of an F32 tensor into dst.
	Read(src Tensor, row0 int, dst []float32) error
	// View returns a tensor sharing t's memory: rows row0 .. row0+rows-1 of t. Operations on the
	// view read and write t. Closing a view does not free t; t must outlive its views. Models
	// allocate scratch for the largest batch once and run smaller batches through views of it.
	View(t Tensor, row0, rows int) (Tensor, error)

	// GetRows: dst[i,:] = float32(table[ids[i],:]) for a table of any supported dtype.
	// dst [len(ids), cols] F32, sharing no memory with the table.
	GetRows(dst, table Tensor, ids []int32) error
	// MatMul: dst[i,j] = sum_k x[i,k]*w[j,k]. x [n, k] F32, w [m, k] any supported dtype,
	// dst [n, m] F32, sharing no memory with x or w. Quantised weights are multiplied as
	// llama.cpp does: each row of x is first converted to w's dot-product type (F16, Q8_0, Q8_1
	// or Q8_K). The CUDA backend departs from this where its tensor cores pay: by default it
	// multiplies F32 weights with TF32 inputs (10-bit mantissas; PARLEY_CUDA_TF32=0 keeps full
	// F32), and with PARLEY_CUDA_MMQ=0 it multiplies more than eight rows of x against quantised
	// weights as F16 products of x and the expanded weights (a row of x with values beyond F16's
	// range divided by a power of two for the product, then multiplied back).
	MatMul(dst, x, w Tensor) error
	// AddRows: dst[i,:] = a[i,:] + b[i,:], or b[0,:] when b has one row (a bias). dst may be a.
	AddRows(dst, a, b Tensor) error
	// RMSNorm: dst[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * w[0,:]. w [1, d] F32; eps finite
	// and above 0. dst may be x. A w of g columns, g dividing d, normalises each group of g
	// consecutive elements of a row on its own (x [n, h*g] as [n*h, g]: Qwen3's per-head norm of
	// queries and keys).
	RMSNorm(dst, x, w Tensor, eps float32) error
	// Unary: dst = f(x) elementwise, for a function f the backend computes (Capabilities.Funcs;
	// any other is refused with an error wrapping ErrUnsupported). F32; dst may be x.
	Unary(dst, x Tensor, f Func) error
	// GLU: dst = f(gate) * up elementwise, f as Unary's: the gated linear units (tensor.Sigmoid
	// the original GLU, tensor.SiLU SwiGLU, tensor.GELU GeGLU). F32; dst may be gate or up.
	GLU(dst, gate, up Tensor, f Func) error
	// SwiGLU: dst = silu(gate) * up elementwise, silu(g) = g/(1+exp(-g)): GLU with tensor.SiLU.
	// dst may be gate.
	SwiGLU(dst, gate, up Tensor) error
	// GeGLU: dst = gelu(gate) * up elementwise, gelu the tanh form as GELU's: GLU with
	// tensor.GELU. dst may be gate or up. (Gemma's feed-forward network.)
	GeGLU(dst, gate, up Tensor) error
	// Scale: dst = x * s elementwise, s finite. dst may be x. (Granite's embedding, residual and
	// logit multipliers.)
	Scale(dst, x Tensor, s float32) error
	// Rope rotates x [n, nHead*HeadDim] in place, token i at position b.Pos[i] (>= 0).
	Rope(x Tensor, nHead int, r RoPE, b *Batch) error

	// NewKV makes a zeroed KV cache.
	NewKV(cfg KVConfig) (KV, error)
	// StoreKV writes k and v [n, Width] (F32) into layer's cache at slots b.Slot.
	StoreKV(kv KV, layer int, k, v Tensor, b *Batch) error
	// Attention: for each sequence s of b and each of its tokens i (at position p), and each query
	// head h: dst[i, h] = softmax_j(Scale * q[i,h]·K[j,h']) · V[j,h'] over the cache positions
	// j = 0..p of s (causal), h' = h/(NHead/NKVHead). q, dst [n, NHead*HeadDim] F32. Every token of
	// b is in exactly one sequence. The keys and values of the batch's own tokens must have been
	// stored (StoreKV) first.
	//
	// With an F16 cache the products are F16 products, as llama.cpp computes them (ggml_mul_mat
	// converts its F32 operand to the F16 type of the cache): q is rounded to F16 before q·K, and
	// the normalised attention weights p_j = softmax(...)_j are rounded to F16 before p·V; both
	// sums accumulate in F32 or wider. With a BF16 cache the same holds with BF16 in place of
	// F16 (round to nearest even). With an F32 cache nothing is rounded.
	Attention(dst, q Tensor, kv KV, layer int, a Attn, b *Batch) error

	// Operations for encoder-decoder models (Whisper).

	// Copy converts src into dst elementwise: F32 to F16 (round to nearest even), F16 to F32, or
	// a plain copy between tensors of one float type. Same shape; dst may be src.
	Copy(dst, src Tensor) error
	// LayerNorm: dst[i,:] = (x[i,:] - mean(x[i,:])) / sqrt(var(x[i,:]) + eps) * w[0,:] + b[0,:]
	// (the biased variance). x, dst [n, d] F32; w, b [1, d] F32; eps finite and above 0. dst may
	// be x.
	LayerNorm(dst, x, w, b Tensor, eps float32) error
	// GELU: dst = 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))) elementwise, the tanh form
	// ggml and whisper.cpp compute: Unary with tensor.GELU. F32. dst may be x.
	GELU(dst, x Tensor) error
	// Im2Col1D lays out the receptive fields of a 1-D convolution as rows: for a signal x [T, C]
	// (row t = time step t, C channels), dst[t, c*K+k] = x[t*stride+k-pad, c], or 0 where that row
	// is outside 0..T-1, for t = 0..Tout-1, Tout = (T+2*pad-K)/stride+1. dst [Tout, C*K] F32.
	// The convolution with weights w [Cout, C*K] (PyTorch's and ggml's [Cout, C, K] flattened)
	// is then MatMul(out, dst, w).
	Im2Col1D(dst, x Tensor, kernel, stride, pad int) error
	// FullAttention is attention without a cache and without a mask: for each row i of q and
	// each query head h, dst[i,h] = softmax_j(Scale*q[i,h]·k[j,h']) · v[j,h'] over every row j of
	// k and v, h' = h/(NHead/NKVHead). q, dst [n, NHead*HeadDim] F32; k, v [m, NKVHead*HeadDim],
	// both F32 or both F16. With F16 keys and values the products are F16 products as in
	// Attention: q is rounded to F16 before q·k and the normalised weights before p·v.
	FullAttention(dst, q, k, v Tensor, a Attn) error

	// Close releases the backend's resources. Tensors made by it must not be used afterwards.
	Close() error
}

// MultiMatMuler is implemented by backends that multiply one x by several matrices in one call
// faster than by one MatMul each (the CPU backend converts x once and wakes its threads once for
// a layer's query, key and value products). MatMuls computes dst[i] = x · w[i]ᵀ for every i,
// each bit for bit what MatMul(dst[i], x, w[i]) gives it.
type MultiMatMuler interface {
	MatMuls(dst []Tensor, x Tensor, w []Tensor) error
}

// MatMuls computes dst[i] = x · w[i]ᵀ for every i, as MatMul computes each: in one call where be
// is a MultiMatMuler, else one MatMul at a time. No dst may be x, a w or another dst.
func MatMuls(be Backend, dst []Tensor, x Tensor, w []Tensor) error {
	if len(dst) != len(w) {
		return fmt.Errorf("matmuls: %d destinations for %d matrices", len(dst), len(w))
	}
	for i, d := range dst {
		for _, e := range dst[:i] {
			if d == e {
				return fmt.Errorf("matmuls: destination %d repeats another", i)
			}
		}
	}
	if mm, ok := be.(MultiMatMuler); ok {
		return mm.MatMuls(dst, x, w)
	}
	for i := range w {
		if err := be.MatMul(dst[i], x, w[i]); err != nil {
			return err
		}
	}
	return nil
}

// Argmaxer is implemented by backends that find the largest logit of rows where the logits are,
// so that only token ids leave the backend (on a GPU, the logits stay on the device). Argmax
// waits for the logits, then writes into ids[i] the index of the largest value of row row0+i of
// logits (F32), the lowest index among equal values, or -1 where that row holds a NaN or +Inf
// or no value above -Inf (the rows a sampler refuses). Its answers are ArgmaxRows'.
type Argmaxer interface {
	Argmax(logits Tensor, row0 int, ids []int32) error
}

// ErrNoArgmax is what a caller reports for a row whose argmax is -1: logits with a NaN or +Inf,
// or none above -Inf.
var ErrNoArgmax = errors.New("the logits hold a NaN or +Inf, or no value above -Inf")

// ArgmaxRows is Argmaxer's rule over len(ids) rows of cols values in x, on the host: ids[i] is
// the lowest index of the largest value of x[i*cols:(i+1)*cols], or -1 where that row holds a
// NaN or +Inf or no value above -Inf.
func ArgmaxRows(x []float32, cols int, ids []int32) error {
	if cols <= 0 || len(x) != len(ids)*cols {
		return fmt.Errorf("argmax: %d values for %d rows of %d", len(x), len(ids), cols)
	}
	for i := range ids {
		row := x[i*cols : (i+1)*cols]
		mx, nan := vec.Max(row)
		if nan || math.IsInf(float64(mx), 0) {
			ids[i] = -1
			continue
		}
		ids[i] = int32(vec.Index(row, mx))
	}
	return nil
}

// Recorder is implemented by backends that can record a sequence of operations and then run it
// as one unit, which costs less to start than the operations one by one (the CUDA backend
// records CUDA graphs). After Record, the operations called are recorded, not run, until Replay
// runs them or Discard drops them. While recording, a call that needs the results (Read,
// Argmax) or that the backend cannot record fails; the caller then Discards and calls the
// operations again without recording. If Replay fails, nothing recorded has run and the
// backend is no longer recording. Only the goroutine that called Record may use the backend
// until Replay or Discard: models stepped by goroutines of their own (a server's models) each
// need a backend of their own. Record returns ErrNotRecording when the backend records nothing
// (turned off), and the caller should not ask again.
type Recorder interface {
	Record() error
	Replay() error
	Discard()
}

// ErrNotRecording is Record's answer from a backend whose recording is turned off.
var ErrNotRecording = errors.New("backend: recording is turned off")

// Repacker is implemented by backends that multiply some weight types faster in a layout of
// their own (the CPU backend interleaves the rows of quantised matrices for its AVX-512 VNNI kernels). Repack
// rearranges a weight tensor made by Load into that layout, in memory the tensor owns, and
// reports whether it did; MatMul then reads the new layout, and the data given to Load is read
// again only by GetRows and views. Models repack the matrices they multiply once, after loading.
// A repacked tensor's products may differ from the unpacked ones by float rounding (the order in
// which block sums are added), never by more than a dtype's tolerance in the conformance suite.
type Repacker interface {
	Repack(t Tensor) (bool, error)
}

// Repack repacks t when be is a Repacker, and reports whether it did.
func Repack(be Backend, t Tensor) (bool, error) {
	if r, ok := be.(Repacker); ok {
		return r.Repack(t)
	}
	return false, nil
}

// Options configure a backend.
type Options struct {
	// Threads is the number of CPU threads to compute with; 0 means one per core.
	Threads int
}

// MemoryReporter is a Backend whose buffers live in memory of its own (a GPU's) and that can say
// how much of it is free now, in bytes. Backends that compute in host memory are not one.
type MemoryReporter interface {
	FreeMemory() (int64, error)
}
