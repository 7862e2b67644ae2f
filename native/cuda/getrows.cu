// getrows.cu: plc_get_rows, the embedding lookup: rows of a table of any supported type,
// expanded to F32.
#include "getrows.cuh"
#include "internal.cuh"
#include "quant.cuh"

int plc_get_rows_supports(int dt) { return plc_block_elems(dt) != 0; }

// Float tables: grid (row chunks, n); dst [n, cols].
template <typename T>
__global__ void plc_get_rows_float(float *dst, const T *table, int64_t cols, const int32_t *ids) {
    const int64_t i = blockIdx.y;
    const T *src = table + (int64_t)ids[i] * cols;
    float *out = dst + i * cols;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x)
        out[j] = plc_to_f32(src[j]);
}

// Quantised tables: one thread per 32-element chunk; grid (chunk groups, n).
template <int DT>
__global__ void plc_get_rows_q(float *dst, const uint8_t *table, int64_t rowbytes, int64_t cols, const int32_t *ids) {
    const int64_t i = blockIdx.y;
    const uint8_t *src = table + (int64_t)ids[i] * rowbytes;
    float *out = dst + i * cols;
    float v[32];
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols / 32; c += (int64_t)gridDim.x * blockDim.x) {
        plc_deq32<DT>(src, c, v);
#pragma unroll
        for (int j = 0; j < 32; j++) out[c * 32 + j] = v[j];
    }
}

static int plc_get_rows_launch(plc_ctx *ctx, float *dst, const void *table, int dtype, int64_t rowbytes, int64_t cols,
                               const int32_t *dids, dim3 grid, int threads);

extern "C" int plc_get_rows(plc_ctx *ctx, float *dst, const void *table, int32_t dtype, int64_t rows, int64_t cols,
                            const int32_t *ids, int64_t n) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (!plc_get_rows_supports(dtype)) return PLC_ERR_UNSUPPORTED;
    const int64_t rowbytes = plc_row_bytes(dtype, cols);
    if (rows < 0 || n < 0 || rowbytes < 0) return plc_fail_arg(ctx, "get rows: bad shape");
    if (n == 0 || cols == 0) return PLC_OK;
    if (dst == NULL || table == NULL || ids == NULL) return plc_fail_arg(ctx, "get rows: null pointer");
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= rows) return plc_fail_arg(ctx, "get rows: id out of range");
    PLC_ENTER(ctx);
    const void *host[1] = {ids};
    const size_t sizes[1] = {(size_t)n * sizeof(int32_t)};
    void *dev[1];
    int st = plc_meta(ctx, 1, host, sizes, dev);
    if (st != PLC_OK) return st;
    const int32_t *dids = (const int32_t *)dev[0];
    const int threads = 128;
    const int64_t per = plc_block_elems(dtype) == 1 ? cols : cols / 32;
    int64_t gx = (per + threads - 1) / threads;
    if (gx > 64) gx = 64;
    // gridDim.y is at most 65535: larger gathers take several launches.
    for (int64_t i0 = 0; i0 < n; i0 += 65535) {
        const int64_t cnt = n - i0 < 65535 ? n - i0 : 65535;
        st = plc_get_rows_launch(ctx, dst + i0 * cols, table, dtype, rowbytes, cols, dids + i0, dim3((unsigned)gx, (unsigned)cnt), threads);
        if (st != PLC_OK) return st;
    }
    return PLC_OK;
}

static int plc_get_rows_launch(plc_ctx *ctx, float *dst, const void *table, int dtype, int64_t rowbytes, int64_t cols,
                               const int32_t *dids, dim3 grid, int threads) {
    switch (dtype) {
    case PLC_F32: plc_get_rows_float<float><<<grid, threads, 0, ctx->stream>>>(dst, (const float *)table, cols, dids); break;
    case PLC_F16: plc_get_rows_float<__half><<<grid, threads, 0, ctx->stream>>>(dst, (const __half *)table, cols, dids); break;
    case PLC_BF16: plc_get_rows_float<__nv_bfloat16><<<grid, threads, 0, ctx->stream>>>(dst, (const __nv_bfloat16 *)table, cols, dids); break;
#define PLC_CASE(DT) \
    case DT: plc_get_rows_q<DT><<<grid, threads, 0, ctx->stream>>>(dst, (const uint8_t *)table, rowbytes, cols, dids); break;
    PLC_FOR_QTYPES(PLC_CASE)
#undef PLC_CASE
    default: return PLC_ERR_UNSUPPORTED;
    }
    return plc_launched(ctx, "get rows");
}
