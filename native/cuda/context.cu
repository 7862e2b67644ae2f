// context.cu: devices, contexts, device memory, scratch and error reporting.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>

#include "attention.cuh"
#include "blas.cuh"
#include "copy.cuh"
#include "elementwise.cuh"
#include "getrows.cuh"
#include "gemm.cuh"
#include "kv.cuh"
#include "internal.cuh"

static void plc_msg(char *buf, size_t n, const char *fmt_what, const char *detail) {
    if (buf == NULL || n == 0) return;
    snprintf(buf, n, "%s: %s", fmt_what, detail);
}

int plc_fail_cuda(plc_ctx *ctx, const char *what, cudaError_t e) {
    if (ctx != NULL) {
        snprintf(ctx->err, sizeof ctx->err, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (e == cudaErrorMemoryAllocation) return PLC_ERR_NOMEM;
    return PLC_ERR_CUDA;
}

static const char *plc_blas_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
    }
}

int plc_fail_blas(plc_ctx *ctx, const char *what, cublasStatus_t s) {
    if (ctx != NULL) snprintf(ctx->err, sizeof ctx->err, "%s: %s (%d)", what, plc_blas_name(s), (int)s);
    if (s == CUBLAS_STATUS_ALLOC_FAILED) return PLC_ERR_NOMEM;
    return PLC_ERR_CUDA;
}

int plc_fail_arg(plc_ctx *ctx, const char *what) {
    if (ctx != NULL) snprintf(ctx->err, sizeof ctx->err, "%s", what);
    return PLC_ERR_ARG;
}

int plc_launched(plc_ctx *ctx, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return plc_fail_cuda(ctx, what, e);
    return PLC_OK;
}

int plc_enter(plc_ctx *ctx) {
    if (ctx == NULL) return PLC_ERR_ARG;
    cudaError_t e = cudaSetDevice(ctx->device);
    if (e != cudaSuccess) return plc_fail_cuda(ctx, "cudaSetDevice", e);
    return PLC_OK;
}

// plc_grow makes *buf at least n bytes, waiting for queued work before freeing the old buffer.
static int plc_grow(plc_ctx *ctx, void **buf, size_t *cap, size_t n, const char *what) {
    if (n <= *cap && *buf != NULL) return PLC_OK;
    size_t want = *cap ? *cap : 1 << 16;
    while (want < n) {
        if (want > ((size_t)1 << 62)) return plc_fail_arg(ctx, "scratch size overflows");
        want *= 2;
    }
    int st = plc_not_recording(ctx, what);
    if (st != PLC_OK) return st;
    if (*buf != NULL) {
        cudaError_t e = cudaStreamSynchronize(ctx->stream);
        if (e != cudaSuccess) return plc_fail_cuda(ctx, what, e);
        cudaFree(*buf);
        *buf = NULL;
        *cap = 0;
    }
    cudaError_t e = cudaMalloc(buf, want);
    if (e != cudaSuccess) {
        *buf = NULL;
        return plc_fail_cuda(ctx, what, e);
    }
    *cap = want;
    return PLC_OK;
}

void plc_idle(plc_ctx *ctx) {
    ctx->meta_used = 0;
    ctx->meta_tables.clear();
}

// plc_meta_free releases the meta arena and its host mirror (the stream must be idle).
static void plc_meta_free(plc_ctx *ctx) {
    if (ctx->meta) cudaFree(ctx->meta);
    if (ctx->meta_host) {
        if (ctx->meta_pinned) cudaFreeHost(ctx->meta_host);
        else free(ctx->meta_host);
    }
    ctx->meta = NULL;
    ctx->meta_host = NULL;
    ctx->meta_cap = 0;
    plc_idle(ctx);
}

// plc_meta_room makes room for n more bytes in the meta arena: when they do not fit, it waits for
// the queued work (which may still read the tables), starts the arena over, and grows it if n
// alone does not fit.
static int plc_meta_room(plc_ctx *ctx, size_t n) {
    if (ctx->meta != NULL && ctx->meta_used + n <= ctx->meta_cap) return PLC_OK;
    int st = plc_not_recording(ctx, "making room for tables");
    if (st != PLC_OK) return st;
    cudaError_t e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) return plc_fail_cuda(ctx, "waiting for queued work before reusing table memory", e);
    plc_idle(ctx);
    if (ctx->meta != NULL && n <= ctx->meta_cap) return PLC_OK;
    size_t want = ctx->meta_cap ? ctx->meta_cap : (size_t)1 << 20;
    while (want < n) {
        if (want > ((size_t)1 << 40)) return plc_fail_arg(ctx, "table too large");
        want *= 2;
    }
    plc_meta_free(ctx);
    e = cudaMalloc(&ctx->meta, want);
    if (e != cudaSuccess) {
        ctx->meta = NULL;
        return plc_fail_cuda(ctx, "allocating table memory", e);
    }
    ctx->meta_pinned = cudaMallocHost((void **)&ctx->meta_host, want) == cudaSuccess;
    if (!ctx->meta_pinned) {
        cudaGetLastError();  // not sticky: fall back to pageable memory
        ctx->meta_host = (unsigned char *)malloc(want);
        if (ctx->meta_host == NULL) {
            cudaFree(ctx->meta);
            ctx->meta = NULL;
            snprintf(ctx->err, sizeof ctx->err, "allocating %zu bytes of host memory for tables", want);
            return PLC_ERR_NOMEM;
        }
    }
    ctx->meta_cap = want;
    return PLC_OK;
}

// plc_meta_find returns the device copy of the n bytes at h if the arena holds them, else NULL.
static void *plc_meta_find(plc_ctx *ctx, const void *h, size_t n) {
    for (const plc_meta_entry &t : ctx->meta_tables)
        if (t.size == n && memcmp(ctx->meta_host + t.off, h, n) == 0) return (char *)ctx->meta + t.off;
    return NULL;
}

int plc_meta(plc_ctx *ctx, int count, const void *const *host, const size_t *sizes, void **dev) {
    if (count < 0 || count > 16) return plc_fail_arg(ctx, "too many tables");
    size_t need = 0;  // bytes of the tables not in the arena yet
    for (int i = 0; i < count; i++) {
        if (sizes[i] > ((size_t)1 << 40)) return plc_fail_arg(ctx, "table too large");
        dev[i] = sizes[i] != 0 && ctx->meta != NULL ? plc_meta_find(ctx, host[i], sizes[i]) : NULL;
        if (sizes[i] != 0 && dev[i] == NULL) need += plc_round_up(sizes[i], 256);
    }
    if (ctx->meta == NULL || ctx->meta_used + need > ctx->meta_cap) {
        // The arena starts over (after the queued work) with room for all of them.
        size_t total = 0;
        for (int i = 0; i < count; i++) total += plc_round_up(sizes[i], 256);
        int st = plc_meta_room(ctx, total);
        if (st != PLC_OK) return st;
        for (int i = 0; i < count; i++) dev[i] = NULL;
    }
    for (int i = 0; i < count; i++) {
        if (sizes[i] == 0 || dev[i] != NULL) continue;
        if ((dev[i] = plc_meta_find(ctx, host[i], sizes[i])) != NULL) continue;  // an earlier one of this call
        if (ctx->recording && !ctx->meta_pinned) return plc_not_recording(ctx, "copying a table from memory that is not pinned");
        // The bytes are recorded as in use before their copy is queued: nothing rewrites them
        // until the stream is next idle.
        const size_t off = ctx->meta_used;
        try {
            ctx->meta_tables.push_back(plc_meta_entry{off, sizes[i]});
        } catch (...) {
            snprintf(ctx->err, sizeof ctx->err, "recording a table: out of host memory");
            return PLC_ERR_NOMEM;
        }
        ctx->meta_used += plc_round_up(sizes[i], 256);
        memcpy(ctx->meta_host + off, host[i], sizes[i]);
        cudaError_t e = cudaMemcpyAsync((char *)ctx->meta + off, ctx->meta_host + off, sizes[i], cudaMemcpyHostToDevice, ctx->stream);
        if (e != cudaSuccess) {  // not queued: a later call must not find these bytes
            ctx->meta_tables.pop_back();
            ctx->meta_used = off;
            return plc_fail_cuda(ctx, "copying a table to the device", e);
        }
        dev[i] = (char *)ctx->meta + off;
    }
    return PLC_OK;
}

int plc_work(plc_ctx *ctx, size_t n, void **out) {
    int st = plc_grow(ctx, &ctx->work, &ctx->work_cap, n ? n : 256, "allocating work scratch");
    if (st != PLC_OK) return st;
    *out = ctx->work;
    return PLC_OK;
}

int plc_block_elems(int dt) {
    switch (dt) {
    case PLC_F32: case PLC_F16: case PLC_BF16: return 1;
    case PLC_Q4_0: case PLC_Q4_1: case PLC_Q5_0: case PLC_Q5_1: case PLC_Q8_0: case PLC_IQ4_NL: return 32;
    case PLC_Q2_K: case PLC_Q3_K: case PLC_Q4_K: case PLC_Q5_K: case PLC_Q6_K: case PLC_IQ4_XS: return 256;
    }
    return 0;
}

int64_t plc_row_bytes(int dt, int64_t n) {
    int64_t bs;
    switch (dt) {
    case PLC_F32: return n < 0 || n > (INT64_MAX / 4) ? -1 : n * 4;
    case PLC_F16: case PLC_BF16: return n < 0 || n > (INT64_MAX / 2) ? -1 : n * 2;
    case PLC_Q4_0: bs = 18; break;
    case PLC_Q4_1: bs = 20; break;
    case PLC_Q5_0: bs = 22; break;
    case PLC_Q5_1: bs = 24; break;
    case PLC_Q8_0: bs = 34; break;
    case PLC_IQ4_NL: bs = 18; break;
    case PLC_Q2_K: bs = 84; break;
    case PLC_Q3_K: bs = 110; break;
    case PLC_Q4_K: bs = 144; break;
    case PLC_Q5_K: bs = 176; break;
    case PLC_Q6_K: bs = 210; break;
    case PLC_IQ4_XS: bs = 136; break;
    default: return -1;
    }
    const int be = plc_block_elems(dt);
    if (n < 0 || n % be != 0) return -1;
    return n / be * bs;
}

extern "C" int plc_supports(int op, int dtype) {
    switch (op) {
    case PLC_OP_MATMUL: return plc_matmul_supports(dtype);
    case PLC_OP_GET_ROWS: return plc_get_rows_supports(dtype);
    case PLC_OP_KV: return plc_kv_supports(dtype);
    case PLC_OP_COPY: return plc_copy_supports(dtype);
    case PLC_OP_UNARY: return plc_unary_supports(dtype);
    }
    return 0;
}

extern "C" int plc_runtime_version(int32_t *version) {
    if (version == NULL) return PLC_ERR_ARG;
    *version = CUDART_VERSION;
    return PLC_OK;
}

extern "C" int plc_device_count(int32_t *count, char *err, size_t errlen) {
    if (count == NULL) return PLC_ERR_ARG;
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        plc_msg(err, errlen, "cudaGetDeviceCount", cudaGetErrorString(e));
        cudaGetLastError();  // clear the non-sticky error
        switch (e) {
        case cudaErrorNoDevice:
        case cudaErrorInsufficientDriver:
        case cudaErrorInitializationError:
        case cudaErrorCompatNotSupportedOnDevice:
        case cudaErrorSystemDriverMismatch:
            return PLC_ERR_NO_DEVICE;
        default:
            return PLC_ERR_CUDA;
        }
    }
    if (n == 0) {
        plc_msg(err, errlen, "cudaGetDeviceCount", "no CUDA device");
        return PLC_ERR_NO_DEVICE;
    }
    *count = n;
    return PLC_OK;
}

extern "C" int plc_device_info(int32_t dev, plc_device_props *out, char *err, size_t errlen) {
    if (out == NULL || dev < 0) return PLC_ERR_ARG;
    memset(out, 0, sizeof *out);
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, dev);
    if (e != cudaSuccess) {
        plc_msg(err, errlen, "cudaGetDeviceProperties", cudaGetErrorString(e));
        cudaGetLastError();
        return e == cudaErrorInvalidDevice ? PLC_ERR_ARG : PLC_ERR_CUDA;
    }
    snprintf(out->name, sizeof out->name, "%s", p.name);
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "%04x:%02x:%02x.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->total_mem = (int64_t)p.totalGlobalMem;
    return PLC_OK;
}

// A kernel that does nothing: asking for its attributes tells whether the library holds code for
// the device (the architectures it was built for, or PTX the driver can compile).
__global__ void plc_probe_k() {}

extern "C" int plc_ctx_new(int32_t dev, plc_ctx **out, char *err, size_t errlen) {
    if (out == NULL || dev < 0) return PLC_ERR_ARG;
    *out = NULL;
    plc_ctx *ctx = new (std::nothrow) plc_ctx();
    if (ctx == NULL) return PLC_ERR_NOMEM;
    ctx->device = dev;
    ctx->tf32 = 1;
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&ctx->sm_count, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&ctx->cc_major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) {
        cudaFuncAttributes fa;
        e = cudaFuncGetAttributes(&fa, plc_probe_k);
        if (e != cudaSuccess) {
            plc_msg(err, errlen, "this build of the kernels cannot run on the device (rebuild with its compute capability in CMAKE_CUDA_ARCHITECTURES)", cudaGetErrorString(e));
            cudaGetLastError();
            delete ctx;
            return PLC_ERR_UNSUPPORTED;
        }
        ctx->mmq = ctx->cc_major >= 8 && plc_mmq_built();
    }
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        plc_msg(err, errlen, "starting CUDA on the device", cudaGetErrorString(e));
        cudaGetLastError();
        delete ctx;
        return e == cudaErrorMemoryAllocation ? PLC_ERR_NOMEM : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? PLC_ERR_NO_DEVICE : PLC_ERR_CUDA);
    }
    const char *why = "";
    const plc_blas_api *blas = plc_blas(&why);
    if (blas == NULL) {
        plc_msg(err, errlen, "cuBLAS", why);
        cudaStreamDestroy(ctx->stream);
        delete ctx;
        return PLC_ERR_UNSUPPORTED;
    }
    cublasStatus_t s = blas->create(&ctx->blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = blas->set_stream(ctx->blas, ctx->stream);
    // A workspace of its own for the handle, set after the stream (setting the stream resets it):
    // 32 MiB, what cuBLAS asks for on Hopper.
    const size_t ws = (size_t)32 << 20;
    if (s == CUBLAS_STATUS_SUCCESS && blas->set_workspace != NULL) {
        if (cudaMalloc(&ctx->blas_ws, ws) != cudaSuccess) {
            cudaGetLastError();
            ctx->blas_ws = NULL;
            s = CUBLAS_STATUS_ALLOC_FAILED;
        } else {
            s = blas->set_workspace(ctx->blas, ctx->blas_ws, ws);
        }
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        plc_msg(err, errlen, "creating a cuBLAS handle", plc_blas_name(s));
        if (ctx->blas) blas->destroy(ctx->blas);
        if (ctx->blas_ws) cudaFree(ctx->blas_ws);
        cudaStreamDestroy(ctx->stream);
        delete ctx;
        return s == CUBLAS_STATUS_ALLOC_FAILED ? PLC_ERR_NOMEM : PLC_ERR_CUDA;
    }
    *out = ctx;
    return PLC_OK;
}

extern "C" void plc_ctx_free(plc_ctx *ctx) {
    if (ctx == NULL) return;
    cudaSetDevice(ctx->device);
    plc_graph_abort(ctx);
    cudaStreamSynchronize(ctx->stream);
    plc_graph_free(ctx);
    plc_meta_free(ctx);
    if (ctx->work) cudaFree(ctx->work);
    plc_blas(NULL)->destroy(ctx->blas);
    if (ctx->blas_ws) cudaFree(ctx->blas_ws);
    cudaStreamDestroy(ctx->stream);
    delete ctx;
}

extern "C" const char *plc_ctx_error(const plc_ctx *ctx) { return ctx == NULL ? "" : ctx->err; }

extern "C" int plc_ctx_set_tf32(plc_ctx *ctx, int32_t on) {
    if (ctx == NULL) return PLC_ERR_ARG;
    ctx->tf32 = on != 0;
    return PLC_OK;
}

extern "C" int plc_ctx_set_flash(plc_ctx *ctx, int32_t mma) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (mma != 0) {
        PLC_ENTER(ctx);
        if (ctx->cc_major < 8 || !plc_flash_mma_built()) return PLC_ERR_UNSUPPORTED;
    }
    ctx->flash_mma = mma != 0;
    return PLC_OK;
}

extern "C" int plc_ctx_set_mmq(plc_ctx *ctx, int32_t on) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (on != 0) {
        PLC_ENTER(ctx);
        if (ctx->cc_major < 8 || !plc_mmq_built()) return PLC_ERR_UNSUPPORTED;
    }
    ctx->mmq = on != 0;
    return PLC_OK;
}

extern "C" int plc_sync(plc_ctx *ctx) {
    PLC_ENTER(ctx);
    int st = plc_not_recording(ctx, "waiting for queued work");
    if (st != PLC_OK) return st;
    cudaError_t e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) return plc_fail_cuda(ctx, "waiting for queued work", e);
    plc_idle(ctx);
    return PLC_OK;
}

extern "C" int plc_mem_info(plc_ctx *ctx, int64_t *free_bytes, int64_t *total_bytes) {
    if (free_bytes == NULL || total_bytes == NULL) return PLC_ERR_ARG;
    PLC_ENTER(ctx);
    size_t f = 0, t = 0;
    cudaError_t e = cudaMemGetInfo(&f, &t);
    if (e != cudaSuccess) return plc_fail_cuda(ctx, "cudaMemGetInfo", e);
    *free_bytes = (int64_t)f;
    *total_bytes = (int64_t)t;
    return PLC_OK;
}

extern "C" int plc_alloc(plc_ctx *ctx, size_t n, void **out) {
    if (out == NULL || n == 0) return plc_fail_arg(ctx, "alloc: zero size or null result");
    *out = NULL;
    PLC_ENTER(ctx);
    int st = plc_not_recording(ctx, "alloc");
    if (st != PLC_OK) return st;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) return plc_fail_cuda(ctx, "cudaMalloc", e);
    e = cudaMemsetAsync(p, 0, n, ctx->stream);
    if (e != cudaSuccess) {
        cudaFree(p);
        return plc_fail_cuda(ctx, "cudaMemsetAsync", e);
    }
    *out = p;
    return PLC_OK;
}

extern "C" int plc_free(plc_ctx *ctx, void *p) {
    if (p == NULL) return PLC_OK;
    PLC_ENTER(ctx);
    int st = plc_not_recording(ctx, "free (it waits for queued work)");
    if (st != PLC_OK) return st;
    // Work queued on the (non-blocking) stream may still use p: wait for it first.
    cudaError_t e = cudaStreamSynchronize(ctx->stream);
    cudaError_t e2 = cudaFree(p);
    if (e != cudaSuccess) return plc_fail_cuda(ctx, "waiting before cudaFree", e);
    if (e2 != cudaSuccess) return plc_fail_cuda(ctx, "cudaFree", e2);
    plc_idle(ctx);
    return PLC_OK;
}

extern "C" int plc_upload(plc_ctx *ctx, void *dst, const void *src, size_t n) {
    if (n == 0) return PLC_OK;
    if (dst == NULL || src == NULL) return plc_fail_arg(ctx, "upload: null pointer");
    PLC_ENTER(ctx);
    int st = plc_not_recording(ctx, "upload (from memory that is not pinned)");
    if (st != PLC_OK) return st;
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, ctx->stream);
    if (e != cudaSuccess) return plc_fail_cuda(ctx, "copying to the device", e);
    return PLC_OK;
}

extern "C" int plc_download(plc_ctx *ctx, void *dst, const void *src, size_t n) {
    if (n > 0 && (dst == NULL || src == NULL)) return plc_fail_arg(ctx, "download: null pointer");
    PLC_ENTER(ctx);
    int st = plc_not_recording(ctx, "download (it waits for queued work)");
    if (st != PLC_OK) return st;
    if (n > 0) {
        cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, ctx->stream);
        if (e != cudaSuccess) return plc_fail_cuda(ctx, "copying from the device", e);
        ctx->downloads++;
    }
    cudaError_t e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) return plc_fail_cuda(ctx, "waiting for queued work", e);
    plc_idle(ctx);
    return PLC_OK;
}

extern "C" int plc_memset0(plc_ctx *ctx, void *dst, size_t n) {
    if (n == 0) return PLC_OK;
    if (dst == NULL) return plc_fail_arg(ctx, "memset: null pointer");
    PLC_ENTER(ctx);
    cudaError_t e = cudaMemsetAsync(dst, 0, n, ctx->stream);
    if (e != cudaSuccess) return plc_fail_cuda(ctx, "cudaMemsetAsync", e);
    return PLC_OK;
}

extern "C" int plc_ctx_downloads(plc_ctx *ctx, int64_t *n) {
    if (ctx == NULL || n == NULL) return PLC_ERR_ARG;
    *n = ctx->downloads;
    return PLC_OK;
}
