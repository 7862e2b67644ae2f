// elementwise.cu: plc_add_rows, plc_scale, and the elementwise functions of parley_fn.h alone
// (plc_unary) and as gates (plc_glu). All F32, all in-place safe (each element is read before it
// is written, by the same thread).
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

// The elementwise functions, one instance of the kernels each. Adding a function: its case in
// plc_fn and its entry in PLC_FNS.
template <int F>
__device__ __forceinline__ float plc_fn(float x) {
    if constexpr (F == PL_FN_RELU) {
        return x > 0.f ? x : 0.f;
    } else if constexpr (F == PL_FN_SILU) {
        // x/(1+exp(-x)): for x < -88, exp(-x) is +inf and the quotient -0, never NaN.
        return x / (1.f + expf(-x));
    } else if constexpr (F == PL_FN_SIGMOID) {
        return 1.f / (1.f + expf(-x));
    } else if constexpr (F == PL_FN_TANH) {
        return tanhf(x);
    } else if constexpr (F == PL_FN_GELU) {
        // The tanh form, as ggml and whisper.cpp compute it. tanhf saturates to ±1 for large
        // arguments, so x^3 overflowing to ±inf gives 0 or x, not NaN.
        const float c = 0.7978845608028654f;  // sqrt(2/pi)
        return 0.5f * x * (1.f + tanhf(c * (x + 0.044715f * x * x * x)));
    } else if constexpr (F == PL_FN_GELU_ERF) {
        // erfc, not 1 + erf, keeps the relative precision of the small values of negative x.
        return 0.5f * x * erfcf(-x * 0.70710678118654752f);
    } else if constexpr (F == PL_FN_ELU) {
        return x > 0.f ? x : expm1f(x);
    } else {
        static_assert(F == PL_FN_EXP, "a function of parley_fn.h without a case");
        return expf(x);
    }
}

#define PLC_FNS(X) X(PL_FN_RELU) X(PL_FN_SILU) X(PL_FN_SIGMOID) X(PL_FN_TANH) X(PL_FN_GELU) X(PL_FN_GELU_ERF) X(PL_FN_ELU) X(PL_FN_EXP)

// dst = f(x), or f(x)*u where u is not NULL.
template <int F>
__global__ void plc_fn_k(float *dst, const float *x, const float *u, int64_t len) {
    PLC_GRID_STRIDE(i, len) {
        const float v = plc_fn<F>(x[i]);
        dst[i] = u != NULL ? v * u[i] : v;
    }
}

int plc_unary_supports(int fn) {
    switch (fn) {
#define PLC_FN_KNOWN(F) case F:
        PLC_FNS(PLC_FN_KNOWN)
        return 1;
#undef PLC_FN_KNOWN
    }
    return 0;
}

// plc_fn_launch queues f over len elements; PLC_ERR_UNSUPPORTED for an unknown fn.
static int plc_fn_launch(plc_ctx *ctx, const char *op, int fn, float *dst, const float *x, const float *u, int64_t len) {
    const int grid = plc_grid1d(ctx, len, 256);
    switch (fn) {
#define PLC_FN_LAUNCH(F) \
    case F: plc_fn_k<F><<<grid, 256, 0, ctx->stream>>>(dst, x, u, len); break;
        PLC_FNS(PLC_FN_LAUNCH)
#undef PLC_FN_LAUNCH
    default:
        return PLC_ERR_UNSUPPORTED;
    }
    return plc_launched(ctx, op);
}

extern "C" int plc_unary(plc_ctx *ctx, int fn, float *dst, const float *x, int64_t len) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (len < 0) return plc_fail_arg(ctx, "unary: negative length");
    if (!plc_unary_supports(fn)) return PLC_ERR_UNSUPPORTED;
    if (len == 0) return PLC_OK;
    if (dst == NULL || x == NULL) return plc_fail_arg(ctx, "unary: null pointer");
    PLC_ENTER(ctx);
    return plc_fn_launch(ctx, "unary", fn, dst, x, NULL, len);
}

extern "C" int plc_glu(plc_ctx *ctx, int fn, float *dst, const float *gate, const float *up, int64_t len) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (len < 0) return plc_fail_arg(ctx, "glu: negative length");
    if (!plc_unary_supports(fn)) return PLC_ERR_UNSUPPORTED;
    if (len == 0) return PLC_OK;
    if (dst == NULL || gate == NULL || up == NULL) return plc_fail_arg(ctx, "glu: null pointer");
    PLC_ENTER(ctx);
    return plc_fn_launch(ctx, "glu", fn, dst, gate, up, len);
}
