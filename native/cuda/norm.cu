// norm.cu: plc_rms_norm and plc_layer_norm, one thread block per row. Each row is read whole
// (the reductions end in a barrier) before any element is written, so dst may be x; the sums are
// in a fixed order, so results do not depend on the batch.
#include "elementwise.cuh"
#include "norm.cuh"

__global__ void __launch_bounds__(PLC_NORM_THREADS) plc_rms_norm_k(float *dst, const float *x, const float *w, int64_t d, float eps) {
    __shared__ float red[32];
    const float *xr = x + blockIdx.x * d;
    float *out = dst + blockIdx.x * d;
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
    ss = plc_block_sum(ss, red);
    const float s = 1.f / sqrtf(ss / (float)d + eps);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[j] = xr[j] * s * w[j];
}

__global__ void __launch_bounds__(PLC_NORM_THREADS) plc_layer_norm_k(float *dst, const float *x, const float *w, const float *b,
                                                                     int64_t d, float eps) {
    __shared__ float red[32];
    const float *xr = x + blockIdx.x * d;
    float *out = dst + blockIdx.x * d;
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += xr[j];
    const float mean = plc_block_sum(s, red) / (float)d;
    float v = 0.f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        const float c = xr[j] - mean;
        v += c * c;
    }
    const float var = plc_block_sum(v, red) / (float)d;
    const float r = 1.f / sqrtf(var + eps);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[j] = (xr[j] - mean) * r * w[j] + b[j];
}

// Rows are blocks of a one-dimensional grid (at most 2^31-1).
static int plc_norm_args(plc_ctx *ctx, const char *op, int64_t n, int64_t d) {
    if (n < 0 || d < 0 || n > 0x7fffffff) return plc_fail_arg(ctx, op);
    return PLC_OK;
}

extern "C" int plc_rms_norm(plc_ctx *ctx, float *dst, const float *x, const float *w, int64_t n, int64_t d, float eps) {
    if (ctx == NULL) return PLC_ERR_ARG;
    int st = plc_norm_args(ctx, "rms norm: bad shape", n, d);
    if (st != PLC_OK) return st;
    if (n == 0 || d == 0) return PLC_OK;
    if (dst == NULL || x == NULL || w == NULL) return plc_fail_arg(ctx, "rms norm: null pointer");
    PLC_ENTER(ctx);
    plc_rms_norm_k<<<(unsigned)n, PLC_NORM_THREADS, 0, ctx->stream>>>(dst, x, w, d, eps);
    return plc_launched(ctx, "rms norm");
}

extern "C" int plc_layer_norm(plc_ctx *ctx, float *dst, const float *x, const float *w, const float *b, int64_t n, int64_t d,
                              float eps) {
    if (ctx == NULL) return PLC_ERR_ARG;
    int st = plc_norm_args(ctx, "layer norm: bad shape", n, d);
    if (st != PLC_OK) return st;
    if (n == 0 || d == 0) return PLC_OK;
    if (dst == NULL || x == NULL || w == NULL || b == NULL) return plc_fail_arg(ctx, "layer norm: null pointer");
    PLC_ENTER(ctx);
    plc_layer_norm_k<<<(unsigned)n, PLC_NORM_THREADS, 0, ctx->stream>>>(dst, x, w, b, d, eps);
    return plc_launched(ctx, "layer norm");
}
