// internal.cuh: the context, scratch memory, error reporting and device helpers shared by the
// kernels of libparley_cuda. Not part of the C ABI.
#ifndef PLC_INTERNAL_CUH
#define PLC_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <vector>

#include "parley_cuda.h"

// A table in the meta arena: its bytes are meta_host[off, off+size), its copy meta+off.
struct plc_meta_entry {
    size_t off, size;
};

// An executable graph kept for steps whose recordings have its signature (graph.cu).
struct plc_graph_exec {
    cudaGraphExec_t exec;
    uint64_t sig, used;
};

struct plc_ctx {
    int device;
    int sm_count;
    cudaStream_t stream;
    cublasHandle_t blas;
    // cuBLAS's workspace, set once (cublasSetWorkspace): without it cuBLAS may allocate one in
    // every recorded graph (graph.cu), which records every step afresh.
    void *blas_ws;
    int tf32;
    int cc_major;   // the device's compute capability (major)
    int flash_mma;  // F16 flash attention on tensor cores (plc_ctx_set_flash)
    int mmq;        // quantised products of more than eight rows on int8 tensor cores (plc_ctx_set_mmq; on from 8.0)
    // Small per-call tables copied from the host (ids, positions, slots, block tables, attention
    // tiles) go to the meta arena and stay there until the stream is next idle: a table equal
    // to one already uploaded since then (every layer of a step passes the same positions,
    // slots and block table) is not copied again. meta_host mirrors the arena in pinned host
    // memory (pageable if pinning failed), so that a copy never makes the host wait.
    void *meta;
    unsigned char *meta_host;
    int meta_pinned;
    size_t meta_cap, meta_used;
    std::vector<plc_meta_entry> meta_tables;
    // Device scratch reused by every operation (stream order makes reuse safe): intermediate
    // arrays (F16 copies, partial attention results).
    void *work;
    size_t work_cap;
    // Host staging for tables the library builds (attention tiles), kept between calls.
    std::vector<unsigned char> host;
    // Graphs (graph.cu): recording is set between plc_graph_begin and its end or abort, with the
    // meta arena's state at the start (tables added while recording are dropped on abort: their
    // copies never ran). execs are the graphs kept from earlier recordings, a few at most.
    int recording;
    size_t rec_meta_used, rec_meta_tables;
    std::vector<plc_graph_exec> execs;  // kept graphs, by the signature of their kernels
    std::vector<cudaGraphNode_t> nodes; // scratch of plc_graph_sig
    uint64_t graph_clock;
    int64_t graph_runs, graph_updates, graph_inits;
    int64_t downloads;  // device-to-host copies (plc_download)
    char err[512];
};

// plc_not_recording fails with PLC_ERR_ARG if the context is recording a graph: what (a call
// that waits for the device, or must grow memory) cannot be recorded.
int plc_not_recording(plc_ctx *ctx, const char *what);
// plc_graph_free drops the kept graph (plc_ctx_free).
void plc_graph_free(plc_ctx *ctx);

// Every entry point that takes a context starts with PLC_ENTER: it checks the context and makes
// its device current on this thread.
int plc_enter(plc_ctx *ctx);
#define PLC_ENTER(ctx)                       \
    do {                                     \
        int st_ = plc_enter(ctx);            \
        if (st_ != PLC_OK) return st_;       \
    } while (0)

// plc_fail_cuda records what failed and returns PLC_ERR_CUDA (PLC_ERR_NOMEM for out-of-memory).
int plc_fail_cuda(plc_ctx *ctx, const char *what, cudaError_t e);
int plc_fail_blas(plc_ctx *ctx, const char *what, cublasStatus_t s);
// plc_fail_arg records a message and returns PLC_ERR_ARG.
int plc_fail_arg(plc_ctx *ctx, const char *what);
// plc_launched checks that the kernel just launched was accepted.
int plc_launched(plc_ctx *ctx, const char *what);

// plc_meta gives the device addresses of count host arrays (sizes in bytes), each 256-byte
// aligned, copying those not already in the meta arena. Arrays of size 0 get a null address. The
// device copies must not be written; they stay valid until the stream is next idle (plc_idle).
int plc_meta(plc_ctx *ctx, int count, const void *const *host, const size_t *sizes, void **dev);
// plc_idle tells the context that its stream has no queued work left (after a wait): the meta
// arena starts over.
void plc_idle(plc_ctx *ctx);
// plc_work returns at least n bytes of device scratch, valid until the next plc_work call. One
// operation asks once and divides the space itself.
int plc_work(plc_ctx *ctx, size_t n, void **out);

// plc_round_up rounds n up to a multiple of a.
static inline size_t plc_round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Row size in bytes of n elements of dt, or -1 if dt is not a supported type or n is not a
// multiple of its block size.
int64_t plc_row_bytes(int dt, int64_t n);
// Elements per block of dt (1 for float types), 0 if unsupported.
int plc_block_elems(int dt);


// ---- device helpers ----

#define PLC_WARP 32

__device__ __forceinline__ float plc_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float plc_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// plc_block_sum returns the sum of v over the block (blockDim.x a multiple of 32, at most 1024)
// to every thread. red: shared scratch of 32 floats. Contains __syncthreads.
__device__ __forceinline__ float plc_block_sum(float v, float *red) {
    const int lane = threadIdx.x % PLC_WARP, warp = threadIdx.x / PLC_WARP;
    const int nw = blockDim.x / PLC_WARP;
    v = plc_warp_sum(v);
    __syncthreads();  // red may still be read by a previous reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < nw; w++) s += red[w];  // same order in every thread: same result
    return s;
}

// plc_block_max: as plc_block_sum, for the maximum (-inf for a block of -inf).
__device__ __forceinline__ float plc_block_max(float v, float *red) {
    const int lane = threadIdx.x % PLC_WARP, warp = threadIdx.x / PLC_WARP;
    const int nw = blockDim.x / PLC_WARP;
    v = plc_warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < nw; w++) m = fmaxf(m, red[w]);
    return m;
}

// Half-precision loads from byte addresses that are 2-byte aligned (block layouts).
__device__ __forceinline__ float plc_f16_at(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ float plc_f16_round(float v) { return __half2float(__float2half_rn(v)); }

__device__ __forceinline__ float plc_to_f32(float v) { return v; }
__device__ __forceinline__ float plc_to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float plc_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

// plc_round_as<T>(v) is v rounded to T (to nearest even) and back: v itself for float.
template <typename T> __device__ __forceinline__ float plc_round_as(float v);
template <> __device__ __forceinline__ float plc_round_as<float>(float v) { return v; }
template <> __device__ __forceinline__ float plc_round_as<__half>(float v) { return plc_f16_round(v); }
template <> __device__ __forceinline__ float plc_round_as<__nv_bfloat16>(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

#endif
