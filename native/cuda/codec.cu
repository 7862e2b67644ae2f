// codec.cu: the operations of streaming codecs and flow-matching heads: plc_mul, the elementwise
// product of rows (F32, in-place safe: each element is read before it is written, by the same
// thread).
#include "codec.cuh"
#include "elementwise.cuh"

__global__ void plc_mul_k(float *dst, const float *a, const float *b, int64_t len, int64_t d, int bcast) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < len; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = a[i] * (bcast ? b[i % d] : b[i]);
}

extern "C" int plc_mul(plc_ctx *ctx, float *dst, const float *a, const float *b, int64_t n, int64_t d, int64_t b_rows) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (n < 0 || d < 0 || (b_rows != 1 && b_rows != n) || (d > 0 && n > INT64_MAX / d)) return plc_fail_arg(ctx, "mul: bad shape");
    if (n == 0 || d == 0) return PLC_OK;
    if (dst == NULL || a == NULL || b == NULL) return plc_fail_arg(ctx, "mul: null pointer");
    PLC_ENTER(ctx);
    plc_mul_k<<<plc_grid1d(ctx, n * d, 256), 256, 0, ctx->stream>>>(dst, a, b, n * d, d, b_rows == 1 && n != 1);
    return plc_launched(ctx, "mul");
}
