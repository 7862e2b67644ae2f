// Package cuda is the Go face of Parley's CUDA kernels (native/cuda, the C ABI of
// native/include/parley_cuda.h): GPU discovery, contexts, device buffers and the operations of
// the CUDA backend, each checking its arguments before it calls C and turning C status codes
// into Go errors. It is the only package that calls the CUDA library.
//
// The kernels exist only in builds with the cuda tag (go build -tags cuda), after
// scripts/cuda-build has built build/cuda/libparley_cuda.a. Other builds get a twin of this
// package in which Available reports false and everything that would need the GPU returns
// ErrNotBuilt.
//
// Linking. The archive is linked statically together with the static CUDA runtime
// (libcudart_static). The driver library libcuda.so.1 is not linked at all: the static runtime
// opens it with dlopen the first time a CUDA function runs, and reports "no driver" as an
// ordinary error when it is missing; loading it through our own dlopen would only duplicate
// that. cuBLAS (libcublas.so.11 for a CUDA 11 build) is opened with dlopen when the first
// context starts, for four entry points: linked statically it would add about 700 MB to every
// binary, and linked dynamically a binary would not start where it is missing. Discovery goes
// through NVML (github.com/NVIDIA/go-nvml), which likewise opens libnvidia-ml.so.1 at run time.
// A binary built with -tags cuda therefore starts, and runs on the CPU backends, on a machine
// with no NVIDIA driver and no CUDA libraries.
//
// Device memory is held in Buffers, which count themselves (LiveBuffers) so that tests can catch
// leaks. Operations address memory as Refs (a buffer and a byte offset) and check that every
// range they touch lies inside its buffer. Every call makes the context's device current on the
// calling thread before it does anything else, since goroutines move between threads.
package cuda
