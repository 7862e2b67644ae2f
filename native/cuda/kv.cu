// kv.cu: plc_store_kv: rows of k and v scattered to cache slots, F16 and BF16 rounded to nearest
// even.
#include "elementwise.cuh"
#include "kv.cuh"

int plc_kv_supports(int dt) { return dt == PLC_F32 || dt == PLC_F16 || dt == PLC_BF16; }

__device__ __forceinline__ void plc_put(float *p, float v) { *p = v; }
__device__ __forceinline__ void plc_put(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void plc_put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T>
__global__ void plc_store_kv_k(T *kc, T *vc, int64_t width, const float *k, const float *v, int64_t n, const int32_t *slot) {
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n * width; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t / width, e = t % width;
        const int64_t o = (int64_t)slot[i] * width + e;
        plc_put(kc + o, k[t]);
        plc_put(vc + o, v[t]);
    }
}

extern "C" int plc_store_kv(plc_ctx *ctx, void *kc, void *vc, int32_t kvtype, int64_t slots, int64_t width, const float *k,
                            const float *v, int64_t n, const int32_t *slot) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (!plc_kv_supports(kvtype)) return PLC_ERR_UNSUPPORTED;
    if (slots < 0 || width < 0 || n < 0 || (width > 0 && n > INT64_MAX / width)) return plc_fail_arg(ctx, "store kv: bad shape");
    if (n == 0 || width == 0) return PLC_OK;
    if (kc == NULL || vc == NULL || k == NULL || v == NULL || slot == NULL) return plc_fail_arg(ctx, "store kv: null pointer");
    for (int64_t i = 0; i < n; i++)
        if (slot[i] < 0 || slot[i] >= slots) return plc_fail_arg(ctx, "store kv: slot out of range");
    PLC_ENTER(ctx);
    const void *host[1] = {slot};
    const size_t sizes[1] = {(size_t)n * sizeof(int32_t)};
    void *dev[1];
    int st = plc_meta(ctx, 1, host, sizes, dev);
    if (st != PLC_OK) return st;
    const int grid = plc_grid1d(ctx, n * width, 256);
    if (kvtype == PLC_F32)
        plc_store_kv_k<float><<<grid, 256, 0, ctx->stream>>>((float *)kc, (float *)vc, width, k, v, n, (const int32_t *)dev[0]);
    else if (kvtype == PLC_F16)
        plc_store_kv_k<__half><<<grid, 256, 0, ctx->stream>>>((__half *)kc, (__half *)vc, width, k, v, n, (const int32_t *)dev[0]);
    else
        plc_store_kv_k<__nv_bfloat16><<<grid, 256, 0, ctx->stream>>>((__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc, width, k, v, n, (const int32_t *)dev[0]);
    return plc_launched(ctx, "store kv");
}
