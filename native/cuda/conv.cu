// conv.cu: plc_im2col_2d and plc_depthwise_conv_2d, the 2-D convolutions' operations over
// images [h*w, c] (channels last), one thread per output element.
#include "elementwise.cuh"
#include "internal.cuh"

static bool plc_conv_geom_ok(const plc_conv_geom *g) {
    const int64_t lim = (int64_t)1 << 24;
    if (g == NULL) return false;
    if (g->h < 1 || g->w < 1 || g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->ph < 0 || g->pw < 0) return false;
    if (g->h > lim || g->w > lim || g->kh > lim || g->kw > lim || g->sh > lim || g->sw > lim || g->ph > lim || g->pw > lim) return false;
    if (g->h * g->w > 0x7fffffff || g->kh * g->kw > (1 << 16)) return false;
    return g->h + 2 * g->ph >= g->kh && g->w + 2 * g->pw >= g->kw;
}

// plc_tap returns the input pixel of tap (i, j) of output pixel o, -1 in the padding.
__device__ __forceinline__ int64_t plc_tap(const plc_conv_geom g, int64_t wo, int64_t o, int64_t i, int64_t j) {
    const int64_t ih = (o / wo) * g.sh + i - g.ph, iw = (o % wo) * g.sw + j - g.pw;
    return (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) ? -1 : ih * g.w + iw;
}

__global__ void plc_im2col_2d_k(float *dst, const float *x, int64_t c, plc_conv_geom g, int64_t wo, int64_t total) {
    const int64_t taps = g.kh * g.kw, cols = c * taps;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = e / cols, col = e % cols, ch = col / taps, t = col % taps;
        const int64_t in = plc_tap(g, wo, o, t / g.kw, t % g.kw);
        dst[e] = in < 0 ? 0.f : x[in * c + ch];
    }
}

__global__ void plc_depthwise_conv_2d_k(float *dst, const float *x, const float *w, const float *b, int64_t c, plc_conv_geom g,
                                        int64_t wo, int64_t total) {
    const int64_t taps = g.kh * g.kw;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = e / c, ch = e % c;
        float s = b[ch];
        for (int64_t i = 0; i < g.kh; i++)
            for (int64_t j = 0; j < g.kw; j++) {
                const int64_t in = plc_tap(g, wo, o, i, j);
                if (in >= 0) s = fmaf(w[ch * taps + i * g.kw + j], x[in * c + ch], s);
            }
        dst[e] = s;
    }
}

extern "C" int plc_im2col_2d(plc_ctx *ctx, float *dst, const float *x, int64_t c, const plc_conv_geom *g) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (c < 0 || !plc_conv_geom_ok(g) || c > 0x7fffffff / (g->kh * g->kw)) return plc_fail_arg(ctx, "im2col 2d: bad geometry");
    const int64_t ho = (g->h + 2 * g->ph - g->kh) / g->sh + 1, wo = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    const int64_t total = ho * wo * c * g->kh * g->kw;
    if (total == 0) return PLC_OK;
    if (dst == NULL || x == NULL) return plc_fail_arg(ctx, "im2col 2d: null pointer");
    PLC_ENTER(ctx);
    plc_im2col_2d_k<<<plc_grid1d(ctx, total, 256), 256, 0, ctx->stream>>>(dst, x, c, *g, wo, total);
    return plc_launched(ctx, "im2col 2d");
}

extern "C" int plc_depthwise_conv_2d(plc_ctx *ctx, float *dst, const float *x, const float *w, const float *b, int64_t c,
                                     const plc_conv_geom *g) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (c < 0 || c > 0x7fffffff || !plc_conv_geom_ok(g)) return plc_fail_arg(ctx, "depthwise conv 2d: bad geometry");
    const int64_t ho = (g->h + 2 * g->ph - g->kh) / g->sh + 1, wo = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    const int64_t total = ho * wo * c;
    if (total == 0) return PLC_OK;
    if (dst == NULL || x == NULL || w == NULL || b == NULL) return plc_fail_arg(ctx, "depthwise conv 2d: null pointer");
    PLC_ENTER(ctx);
    plc_depthwise_conv_2d_k<<<plc_grid1d(ctx, total, 256), 256, 0, ctx->stream>>>(dst, x, w, b, c, *g, wo, total);
    return plc_launched(ctx, "depthwise conv 2d");
}
