/*
 * conv.c: the 2-D convolutions' operations over images [h*w, c] (pixel by pixel, channels
 * last): the im2col layout of receptive fields and the depthwise convolution, each handing out
 * rows of the output image to the pool.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

/* Elements below which an operation runs on the calling thread alone. */
#define CONV_INLINE_ELEMS 16384

static int conv_geom_ok(const pl_conv_geom *g) {
    const int64_t lim = (int64_t)1 << 24;
    if (g == NULL) return 0;
    if (g->h < 1 || g->w < 1 || g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->ph < 0 || g->pw < 0) return 0;
    if (g->h > lim || g->w > lim || g->kh > lim || g->kw > lim || g->sh > lim || g->sw > lim || g->ph > lim || g->pw > lim) return 0;
    if (g->h * g->w > INT32_MAX || g->kh * g->kw > (1 << 16)) return 0;
    return g->h + 2 * g->ph >= g->kh && g->w + 2 * g->pw >= g->kw;
}

static inline int64_t conv_ho(const pl_conv_geom *g) { return (g->h + 2 * g->ph - g->kh) / g->sh + 1; }
static inline int64_t conv_wo(const pl_conv_geom *g) { return (g->w + 2 * g->pw - g->kw) / g->sw + 1; }

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *x;
    const float *wt; /* depthwise: [taps, c], tap-major */
    const float *b;
    int64_t c, ho, wo;
    pl_conv_geom g;
} conv_job;

/* tap_row returns the input pixel of tap (i, j) of output pixel (oh, ow), NULL in the padding. */
static inline const float *tap_row(const conv_job *j, int64_t oh, int64_t ow, int64_t i, int64_t jj) {
    const int64_t ih = oh * j->g.sh + i - j->g.ph, iw = ow * j->g.sw + jj - j->g.pw;
    if (ih < 0 || ih >= j->g.h || iw < 0 || iw >= j->g.w) return NULL;
    return j->x + (ih * j->g.w + iw) * j->c;
}

/* ================================================================ Im2Col2D */

static void im2col_2d_row(const conv_job *j, int64_t oh) {
    const int64_t C = j->c, taps = j->g.kh * j->g.kw, cols = C * taps;
    for (int64_t ow = 0; ow < j->wo; ow++) {
        float *out = j->dst + (oh * j->wo + ow) * cols;
        for (int64_t i = 0; i < j->g.kh; i++) {
            for (int64_t jj = 0; jj < j->g.kw; jj++) {
                const int64_t t = i * j->g.kw + jj;
                const float *src = tap_row(j, oh, ow, i, jj);
                if (src == NULL) {
                    for (int64_t ch = 0; ch < C; ch++) out[ch * taps + t] = 0.0f;
                } else if (C == 1) {
                    out[t] = src[0];
                } else {
                    for (int64_t ch = 0; ch < C; ch++) out[ch * taps + t] = src[ch];
                }
            }
        }
    }
}

static void job_im2col_2d(void *p, int ith, int nth) {
    conv_job *j = (conv_job *)p;
    (void)ith;
    (void)nth;
    int64_t oh;
    while ((oh = plx_chunk_next(j->ctx)) < j->ho) im2col_2d_row(j, oh);
}

int pl_im2col_2d(pl_ctx *ctx, float *dst, const float *x, int64_t c, const pl_conv_geom *g) {
    if (ctx == NULL || c < 0 || !conv_geom_ok(g)) return PL_ERR_ARG;
    const int64_t taps = g->kh * g->kw;
    if (c > INT32_MAX / taps) return PL_ERR_ARG;
    conv_job j = {ctx, dst, x, NULL, NULL, c, conv_ho(g), conv_wo(g), *g};
    if (c == 0) return PL_OK;
    if (dst == NULL || x == NULL) return PL_ERR_ARG;
    if (j.ho * j.wo * c * taps <= CONV_INLINE_ELEMS) {
        for (int64_t oh = 0; oh < j.ho; oh++) im2col_2d_row(&j, oh);
        return PL_OK;
    }
    plx_chunk_reset(ctx);
    plx_run(ctx, job_im2col_2d, &j);
    return PL_OK;
}

/* ================================================================ DepthwiseConv2D */

/* dw_tap adds w[ch]*x[ch] to out[ch] for every channel. */
static void dw_tap_scalar(float *out, const float *w, const float *x, int64_t c) {
    for (int64_t ch = 0; ch < c; ch++) out[ch] = fmaf(w[ch], x[ch], out[ch]);
}

#if PL_X86
PL_TARGET_AVX2 static void dw_tap_avx2(float *out, const float *w, const float *x, int64_t c) {
    int64_t ch = 0;
    for (; ch + 8 <= c; ch += 8)
        _mm256_storeu_ps(out + ch, _mm256_fmadd_ps(_mm256_loadu_ps(w + ch), _mm256_loadu_ps(x + ch), _mm256_loadu_ps(out + ch)));
    for (; ch < c; ch++) out[ch] = fmaf(w[ch], x[ch], out[ch]);
}

PL_TARGET_AVX512 static void dw_tap_avx512(float *out, const float *w, const float *x, int64_t c) {
    int64_t ch = 0;
    for (; ch + 16 <= c; ch += 16)
        _mm512_storeu_ps(out + ch, _mm512_fmadd_ps(_mm512_loadu_ps(w + ch), _mm512_loadu_ps(x + ch), _mm512_loadu_ps(out + ch)));
    if (ch < c) {
        const __mmask16 m = (__mmask16)((1u << (c - ch)) - 1);
        _mm512_mask_storeu_ps(out + ch, m, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + ch), _mm512_maskz_loadu_ps(m, x + ch),
                                                           _mm512_maskz_loadu_ps(m, out + ch)));
    }
}
#endif

static void dw_row(const conv_job *j, int64_t oh) {
    const int64_t C = j->c;
    void (*tap)(float *, const float *, const float *, int64_t) = dw_tap_scalar;
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512)
        tap = dw_tap_avx512;
    else if (plx_isa >= PL_ISA_AVX2)
        tap = dw_tap_avx2;
#endif
    for (int64_t ow = 0; ow < j->wo; ow++) {
        float *out = j->dst + (oh * j->wo + ow) * C;
        memcpy(out, j->b, (size_t)C * sizeof(float));
        for (int64_t i = 0; i < j->g.kh; i++)
            for (int64_t jj = 0; jj < j->g.kw; jj++) {
                const float *src = tap_row(j, oh, ow, i, jj);
                if (src != NULL) tap(out, j->wt + (i * j->g.kw + jj) * C, src, C);
            }
    }
}

static void job_dw(void *p, int ith, int nth) {
    conv_job *j = (conv_job *)p;
    (void)ith;
    (void)nth;
    int64_t oh;
    while ((oh = plx_chunk_next(j->ctx)) < j->ho) dw_row(j, oh);
}

int pl_depthwise_conv_2d(pl_ctx *ctx, float *dst, const float *x, const float *w, const float *b,
                         int64_t c, const pl_conv_geom *g) {
    if (ctx == NULL || c < 0 || c > INT32_MAX || !conv_geom_ok(g)) return PL_ERR_ARG;
    if (c == 0) return PL_OK;
    if (dst == NULL || x == NULL || w == NULL || b == NULL) return PL_ERR_ARG;
    const int64_t taps = g->kh * g->kw;
    /* the kernels tap-major, so that one tap's weights of every channel are contiguous */
    float *wt = (float *)plx_scratch(ctx, (size_t)(taps * c) * sizeof(float));
    if (wt == NULL) return PL_ERR_NOMEM;
    for (int64_t ch = 0; ch < c; ch++)
        for (int64_t t = 0; t < taps; t++) wt[t * c + ch] = w[ch * taps + t];
    conv_job j = {ctx, dst, x, wt, b, c, conv_ho(g), conv_wo(g), *g};
    if (j.ho * j.wo * c * taps <= CONV_INLINE_ELEMS) {
        for (int64_t oh = 0; oh < j.ho; oh++) dw_row(&j, oh);
        return PL_OK;
    }
    plx_chunk_reset(ctx);
    plx_run(ctx, job_dw, &j);
    return PL_OK;
}
