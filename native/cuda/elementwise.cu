// elementwise.cu: plc_add_rows, plc_swiglu, plc_gelu. All F32, all in-place safe (each element
// is read before it is written, by the same thread).
#include "elementwise.cuh"

int plc_grid1d(plc_ctx *ctx, int64_t len, int threads) {
    int64_t b = (len + threads - 1) / threads;
    const int64_t cap = (int64_t)ctx->sm_count * 32;
    if (b > cap) b = cap;
    return b < 1 ? 1 : (int)b;
}

#define PLC_GRID_STRIDE(i, len) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (len); i += (int64_t)gridDim.x * blockDim.x)

__global__ void plc_add_rows_k(float *dst, const float *a, const float *b, int64_t len, int64_t d, int bcast) {
    PLC_GRID_STRIDE(i, len) dst[i] = a[i] + (bcast ? b[i % d] : b[i]);
}

// silu(g)*u = g/(1+exp(-g))*u: for g < -88, exp(-g) is +inf and the quotient -0, never NaN.
__global__ void plc_swiglu_k(float *dst, const float *g, const float *u, int64_t len) {
    PLC_GRID_STRIDE(i, len) {
        const float gv = g[i];
        dst[i] = gv / (1.f + expf(-gv)) * u[i];
    }
}

// The tanh form of GELU, as ggml and whisper.cpp compute it. tanhf saturates to ±1 for large
// arguments, so x^3 overflowing to ±inf gives 0 or x, not NaN.
__global__ void plc_gelu_k(float *dst, const float *x, int64_t len) {
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    PLC_GRID_STRIDE(i, len) {
        const float v = x[i];
        dst[i] = 0.5f * v * (1.f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

__global__ void plc_geglu_k(float *dst, const float *g, const float *u, int64_t len) {
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    PLC_GRID_STRIDE(i, len) {
        const float v = g[i];
        dst[i] = 0.5f * v * (1.f + tanhf(c * (v + 0.044715f * v * v * v))) * u[i];
    }
}

extern "C" int plc_geglu(plc_ctx *ctx, float *dst, const float *gate, const float *up, int64_t len) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (len < 0) return plc_fail_arg(ctx, "geglu: negative length");
    if (len == 0) return PLC_OK;
    if (dst == NULL || gate == NULL || up == NULL) return plc_fail_arg(ctx, "geglu: null pointer");
    PLC_ENTER(ctx);
    plc_geglu_k<<<plc_grid1d(ctx, len, 256), 256, 0, ctx->stream>>>(dst, gate, up, len);
    return plc_launched(ctx, "geglu");
}

extern "C" int plc_add_rows(plc_ctx *ctx, float *dst, const float *a, const float *b, int64_t n, int64_t d, int64_t b_rows) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (n < 0 || d < 0 || (b_rows != 1 && b_rows != n) || (d > 0 && n > INT64_MAX / d)) return plc_fail_arg(ctx, "add rows: bad shape");
    if (n == 0 || d == 0) return PLC_OK;
    if (dst == NULL || a == NULL || b == NULL) return plc_fail_arg(ctx, "add rows: null pointer");
    PLC_ENTER(ctx);
    plc_add_rows_k<<<plc_grid1d(ctx, n * d, 256), 256, 0, ctx->stream>>>(dst, a, b, n * d, d, b_rows == 1 && n != 1);
    return plc_launched(ctx, "add rows");
}

__global__ void plc_scale_k(float *dst, const float *x, float s, int64_t len) {
    PLC_GRID_STRIDE(i, len) dst[i] = x[i] * s;
}

extern "C" int plc_scale(plc_ctx *ctx, float *dst, const float *x, float s, int64_t len) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (len < 0 || !isfinite(s)) return plc_fail_arg(ctx, "scale: negative length or factor not finite");
    if (len == 0) return PLC_OK;
    if (dst == NULL || x == NULL) return plc_fail_arg(ctx, "scale: null pointer");
    PLC_ENTER(ctx);
    plc_scale_k<<<plc_grid1d(ctx, len, 256), 256, 0, ctx->stream>>>(dst, x, s, len);
    return plc_launched(ctx, "scale");
}

extern "C" int plc_swiglu(plc_ctx *ctx, float *dst, const float *gate, const float *up, int64_t len) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (len < 0) return plc_fail_arg(ctx, "swiglu: negative length");
    if (len == 0) return PLC_OK;
    if (dst == NULL || gate == NULL || up == NULL) return plc_fail_arg(ctx, "swiglu: null pointer");
    PLC_ENTER(ctx);
    plc_swiglu_k<<<plc_grid1d(ctx, len, 256), 256, 0, ctx->stream>>>(dst, gate, up, len);
    return plc_launched(ctx, "swiglu");
}

extern "C" int plc_gelu(plc_ctx *ctx, float *dst, const float *x, int64_t len) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (len < 0) return plc_fail_arg(ctx, "gelu: negative length");
    if (len == 0) return PLC_OK;
    if (dst == NULL || x == NULL) return plc_fail_arg(ctx, "gelu: null pointer");
    PLC_ENTER(ctx);
    plc_gelu_k<<<plc_grid1d(ctx, len, 256), 256, 0, ctx->stream>>>(dst, x, len);
    return plc_launched(ctx, "gelu");
}
