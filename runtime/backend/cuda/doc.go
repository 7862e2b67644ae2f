// Package cuda is the GPU backend, registered as "cuda" in builds with the cuda tag: a
// backend.Backend whose tensors and KV caches live in the memory of one NVIDIA GPU and whose
// operations are the CUDA kernels of bindings/cuda, queued on one stream (Read waits for them).
// Weights are uploaded once by Load; F32 weights are multiplied with TF32 tensor cores unless
// Options.ExactF32 (or PARLEY_CUDA_TF32=0) asks for full F32. Besides the interface it decodes on
// the device (Argmax, Draw, BeamStep), returning only token ids; as a backend.Argmaxer and
// backend.Drawer it gives the scheduler the tokens of greedy and sampling sequences without their
// logits leaving the GPU. As a
// backend.Recorder it records a model's decode step (LLaMA's, Whisper's decoder's) as a CUDA
// graph and runs it with one launch (Options.Graphs, or PARLEY_CUDA_GRAPHS=1; off by default
// until measured on a GPU): each step is recorded afresh and the graph kept from the step before
// is updated in place, a new one instantiated only when the step's kernels differ. Options.FlashMMA (PARLEY_CUDA_FLASH=mma)
// computes attention over F16 caches with a tensor-core kernel (mma.sync, 64 queries a block),
// and, with TF32 on, attention over F32 ones with TF32 inputs (mma.sync m16n8k8 .tf32); the
// default is the CUDA-core kernel, until the others have been measured on a GPU. More than eight
// activation rows against quantised weights run on int8 tensor cores (mma.sync .s8), with the
// activations quantised as for decode and as the CPU backends quantise them; Options.QuantF16
// (PARLEY_CUDA_MMQ=0) expands the weights to F16 for cuBLAS instead.
//
// The factory it registers fails with a precise error when no GPU is usable (no driver, no GPU,
// a driver too old, or kernels not built for the GPU's architecture), so that backend.New("auto")
// goes on to the CPU backends. In builds without the cuda tag the package is empty and registers
// nothing.
package cuda
