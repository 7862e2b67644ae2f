// copy.cu: plc_copy (F32 <-> F16, or a plain copy).
#include "copy.cuh"
#include "elementwise.cuh"

int plc_copy_supports(int dt) { return dt == PLC_F32 || dt == PLC_F16 || dt == PLC_BF16; }

__global__ void plc_f32_f16_k(__half *dst, const float *src, int64_t len) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < len; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

__global__ void plc_f16_f32_k(float *dst, const __half *src, int64_t len) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < len; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __half2float(src[i]);
}

extern "C" int plc_copy(plc_ctx *ctx, void *dst, int32_t dst_type, const void *src, int32_t src_type, int64_t len) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (!plc_copy_supports(dst_type) || !plc_copy_supports(src_type)) return PLC_ERR_UNSUPPORTED;
    if (src_type != dst_type && !((src_type == PLC_F32 && dst_type == PLC_F16) || (src_type == PLC_F16 && dst_type == PLC_F32)))
        return PLC_ERR_UNSUPPORTED;
    if (len < 0 || len > INT64_MAX / 4) return plc_fail_arg(ctx, "copy: bad length");
    if (len == 0) return PLC_OK;
    if (dst == NULL || src == NULL) return plc_fail_arg(ctx, "copy: null pointer");
    PLC_ENTER(ctx);
    if (src_type == dst_type) {
        const size_t bytes = (size_t)plc_row_bytes(src_type, len);
        cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream);
        return e == cudaSuccess ? PLC_OK : plc_fail_cuda(ctx, "copy: cudaMemcpyAsync", e);
    }
    const int grid = plc_grid1d(ctx, len, 256);
    if (src_type == PLC_F32)
        plc_f32_f16_k<<<grid, 256, 0, ctx->stream>>>((__half *)dst, (const float *)src, len);
    else
        plc_f16_f32_k<<<grid, 256, 0, ctx->stream>>>((float *)dst, (const __half *)src, len);
    return plc_launched(ctx, "copy");
}
