// lstm.cu: plc_lstm_cell, one step of LSTM cells after their gates' products, one thread per
// cell.
#include "elementwise.cuh"
#include "internal.cuh"

__device__ __forceinline__ float plc_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void plc_lstm_cell_k(float *h, float *c, const float *gates, int64_t p, int64_t total) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / p, k = e % p;
        const float *g = gates + r * 4 * p;
        const float i = plc_sigmoid(g[k]), f = plc_sigmoid(g[p + k]), o = plc_sigmoid(g[2 * p + k]);
        const float cn = f * c[e] + i * tanhf(g[3 * p + k]);
        c[e] = cn;
        h[e] = o * tanhf(cn);
    }
}

extern "C" int plc_lstm_cell(plc_ctx *ctx, float *h, float *c, const float *gates, int64_t n, int64_t p) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (n < 0 || p < 0 || (p > 0 && n > INT64_MAX / 8 / p)) return plc_fail_arg(ctx, "lstm cell: bad shape");
    if (n == 0 || p == 0) return PLC_OK;
    if (h == NULL || c == NULL || gates == NULL) return plc_fail_arg(ctx, "lstm cell: null pointer");
    PLC_ENTER(ctx);
    plc_lstm_cell_k<<<plc_grid1d(ctx, n * p, 256), 256, 0, ctx->stream>>>(h, c, gates, p, n * p);
    return plc_launched(ctx, "lstm cell");
}
