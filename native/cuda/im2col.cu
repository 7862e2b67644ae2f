// im2col.cu: plc_im2col_1d, the receptive fields of a 1-D convolution laid out as rows.
#include "elementwise.cuh"
#include "im2col.cuh"

// dst [t_out, c*kernel]: one thread per destination element.
__global__ void plc_im2col_1d_k(float *dst, const float *x, int64_t t_in, int64_t c, int kernel, int stride, int pad, int64_t t_out) {
    const int64_t cols = c * kernel;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < t_out * cols; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / cols, col = i % cols;
        const int64_t ci = col / kernel, kk = col % kernel;
        const int64_t src = t * stride + kk - pad;
        dst[i] = (src >= 0 && src < t_in) ? x[src * c + ci] : 0.f;
    }
}

extern "C" int plc_im2col_1d(plc_ctx *ctx, float *dst, const float *x, int64_t t_in, int64_t c, int32_t kernel, int32_t stride,
                             int32_t pad, int64_t t_out) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (t_in < 0 || c < 0 || kernel <= 0 || stride <= 0 || pad < 0 || t_out < 0) return plc_fail_arg(ctx, "im2col: bad shape");
    if (t_in + 2 * (int64_t)pad < kernel || (t_in + 2 * (int64_t)pad - kernel) / stride + 1 != t_out)
        return plc_fail_arg(ctx, "im2col: t_out does not match the input, kernel, stride and padding");
    if (c > 0 && (int64_t)kernel > INT64_MAX / c / (t_out > 0 ? t_out : 1)) return plc_fail_arg(ctx, "im2col: size overflows");
    if (t_out == 0 || c == 0) return PLC_OK;
    if (dst == NULL || x == NULL) return plc_fail_arg(ctx, "im2col: null pointer");
    PLC_ENTER(ctx);
    plc_im2col_1d_k<<<plc_grid1d(ctx, t_out * c * kernel, 256), 256, 0, ctx->stream>>>(dst, x, t_in, c, kernel, stride, pad, t_out);
    return plc_launched(ctx, "im2col");
}
