package cuda

import (
	"errors"

	"github.com/parleyhq/parley/runtime/tensor"
)

// ErrNotBuilt is returned by every operation of a binary built without the cuda tag.
var ErrNotBuilt = errors.New("cuda: this binary was built without CUDA (build with -tags cuda after scripts/cuda-build)")

// ErrNoDevice is wrapped by the errors that say why no GPU can be used: no NVIDIA driver, no
// GPU, or a driver too old for the CUDA runtime of this build.
var ErrNoDevice = errors.New("no usable NVIDIA GPU")

// Device describes one GPU.
type Device struct {
	Index           int    // CUDA device ordinal (as CUDA_VISIBLE_DEVICES numbers them)
	Name            string // "NVIDIA H100 80GB HBM3"
	UUID            string // NVML's "GPU-..." identifier
	PCIBusID        string // "0000:65:00.0"
	Major, Minor    int    // compute capability
	Multiprocessors int
	MemoryTotal     uint64 // bytes
	MemoryFree      uint64 // bytes, when discovered
}

// RoPE configures Rope: pairs (2i, 2i+1), or (i, i+Dims/2) when NeoX, of the first Dims of
// HeadDim elements of each head turn by (p*FreqScale)*Base^(-2i/Dims) at position p.
type RoPE struct {
	NeoX            bool
	HeadDim, Dims   int
	Base, FreqScale float32
	Factors         []float32 // nil, or Dims/2 values dividing each pair's angle
	AttnFactor      float32   // multiplies the rotated pairs (LongRoPE's attention factor); 0 means 1
	ExtFactor       float32   // YaRN's extrapolation (0 to 1; 0 for none), over the pairs CorrDims
	CorrDims        [2]float32
}

// Seq is one sequence of an attention batch, laid out as the C plc_seq (tensor.FlatSeq).
type Seq = tensor.FlatSeq

// Attn describes attention heads: NHead query heads, NKVHead key/value heads of HeadDim
// elements, scores scaled by Scale.
type Attn struct {
	NHead, NKVHead, HeadDim int
	Scale                   float32
}
