/*
 * encoder.c: the row-wise and element-wise operations of encoder-decoder models: type
 * conversion (Copy), LayerNorm and the im2col layout of a 1-D convolution.
 *
 * Small operations run on the calling thread; larger ones hand out rows (or spans of elements)
 * to the pool.
 */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "simd.h"

/* Elements below which an operation runs on the calling thread alone. */
#define ENC_INLINE_ELEMS 16384
/* Elements a unit of the element-wise jobs. */
#define ENC_SPAN 16384

/* ================================================================ Convert */

#if PL_X86
PL_TARGET_AVX512 static void f32_to_f16_avx512(uint16_t *d, const float *s, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = plx_f32_to_f16(s[i]);
}

PL_TARGET_AVX2 static void f32_to_f16_avx2(uint16_t *d, const float *s, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = plx_f32_to_f16(s[i]);
}

PL_TARGET_AVX512 static void f16_to_f32_avx512(float *d, const uint16_t *s, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    for (; i < n; i++) d[i] = plx_f16_to_f32(s[i]);
}

PL_TARGET_AVX2 static void f16_to_f32_avx2(float *d, const uint16_t *s, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = plx_f16_to_f32(s[i]);
}
#endif

/* convert_span converts n elements of stype at src to dtype at dst (the types differ). */
static void convert_span(void *dst, int dtype, const void *src, int64_t n) {
    if (dtype == PL_F16) {
        uint16_t *d = (uint16_t *)dst;
        const float *s = (const float *)src;
#if PL_X86
        if (plx_isa >= PL_ISA_AVX512) {
            f32_to_f16_avx512(d, s, n);
            return;
        }
        if (plx_isa >= PL_ISA_AVX2) {
            f32_to_f16_avx2(d, s, n);
            return;
        }
#endif
        for (int64_t i = 0; i < n; i++) d[i] = plx_f32_to_f16(s[i]);
        return;
    }
    float *d = (float *)dst;
    const uint16_t *s = (const uint16_t *)src;
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        f16_to_f32_avx512(d, s, n);
        return;
    }
    if (plx_isa >= PL_ISA_AVX2) {
        f16_to_f32_avx2(d, s, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) d[i] = plx_f16_to_f32(s[i]);
}

typedef struct {
    pl_ctx *ctx;
    uint8_t *dst;
    const uint8_t *src;
    int dtype;
    int64_t n, dsz, ssz; /* elements; element sizes of dst and src */
} convert_job;

static void job_convert(void *p, int ith, int nth) {
    convert_job *j = (convert_job *)p;
    (void)ith;
    (void)nth;
    int64_t c, nc = (j->n + ENC_SPAN - 1) / ENC_SPAN;
    while ((c = plx_chunk_next(j->ctx)) < nc) {
        int64_t o = c * ENC_SPAN;
        convert_span(j->dst + o * j->dsz, j->dtype, j->src + o * j->ssz, PL_MIN(ENC_SPAN, j->n - o));
    }
}

int pl_convert(pl_ctx *ctx, void *dst, int dtype, const void *src, int stype, int64_t n) {
    if (ctx == NULL || n < 0) return PL_ERR_ARG;
    if ((dtype != PL_F32 && dtype != PL_F16) || (stype != PL_F32 && stype != PL_F16))
        return PL_ERR_UNSUPPORTED;
    if (n == 0) return PL_OK;
    if (dst == NULL || src == NULL) return PL_ERR_ARG;
    const int64_t dsz = dtype == PL_F32 ? 4 : 2, ssz = stype == PL_F32 ? 4 : 2;
    if (n > INT64_MAX / 4) return PL_ERR_ARG;
    if (dtype == stype) {
        memmove(dst, src, (size_t)(n * dsz));
        return PL_OK;
    }
    if (n <= ENC_INLINE_ELEMS) {
        convert_span(dst, dtype, src, n);
        return PL_OK;
    }
    convert_job j = {ctx, (uint8_t *)dst, (const uint8_t *)src, dtype, n, dsz, ssz};
    plx_chunk_reset(ctx);
    plx_run(ctx, job_convert, &j);
    return PL_OK;
}

/* ================================================================ LayerNorm
 *
 * Two passes in double: the mean, then the variance about the float mean mf (corrected by the
 * square of mean - mf, which the sum about mf adds); each output is
 * ((x - mf) - (mean - mf)) * rstd * w + b in float, the product with w and the bias in one FMA.
 */

static double sum_scalar(const float *x, int64_t d) {
    double s = 0.0;
    for (int64_t i = 0; i < d; i++) s += (double)x[i];
    return s;
}

static double sqdev_scalar(const float *x, float mf, int64_t d) {
    double s = 0.0;
    for (int64_t i = 0; i < d; i++) {
        float t = x[i] - mf;
        s += (double)(t * t);
    }
    return s;
}

static void ln_out_scalar(float *y, const float *x, const float *w, const float *b, float mf,
                          float dm, float rstd, int64_t d) {
    for (int64_t i = 0; i < d; i++) y[i] = fmaf(((x[i] - mf) - dm) * rstd, w[i], b[i]);
}

#if PL_X86

PL_TARGET_AVX2 static double sqdev_avx2(const float *x, float mf, int64_t d) {
    const __m256 m = _mm256_set1_ps(mf);
    __m256d a0 = _mm256_setzero_pd(), a1 = a0;
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 t = _mm256_sub_ps(_mm256_loadu_ps(x + i), m);
        t = _mm256_mul_ps(t, t);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(t)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(t, 1)));
    }
    a0 = _mm256_add_pd(a0, a1);
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a0), _mm256_extractf128_pd(a0, 1));
    double r = _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
    for (; i < d; i++) {
        float t = x[i] - mf;
        r += (double)(t * t);
    }
    return r;
}

PL_TARGET_AVX2 static void ln_out_avx2(float *y, const float *x, const float *w, const float *b,
                                       float mf, float dm, float rstd, int64_t d) {
    const __m256 m = _mm256_set1_ps(mf), c = _mm256_set1_ps(dm), r = _mm256_set1_ps(rstd);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 z = _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m), c), r);
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(z, _mm256_loadu_ps(w + i), _mm256_loadu_ps(b + i)));
    }
    for (; i < d; i++) y[i] = fmaf(((x[i] - mf) - dm) * rstd, w[i], b[i]);
}

PL_TARGET_AVX512 static double sum_avx512(const float *x, int64_t d) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
    }
    double r = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; i < d; i++) r += (double)x[i];
    return r;
}

PL_TARGET_AVX512 static double sqdev_avx512(const float *x, float mf, int64_t d) {
    const __m512 m = _mm512_set1_ps(mf);
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m512 t = _mm512_sub_ps(_mm512_loadu_ps(x + i), m);
        t = _mm512_mul_ps(t, t);
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(t)));
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(t, 1)));
    }
    double r = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; i < d; i++) {
        float t = x[i] - mf;
        r += (double)(t * t);
    }
    return r;
}

PL_TARGET_AVX512 static void ln_out_avx512(float *y, const float *x, const float *w, const float *b,
                                           float mf, float dm, float rstd, int64_t d) {
    const __m512 m = _mm512_set1_ps(mf), c = _mm512_set1_ps(dm), r = _mm512_set1_ps(rstd);
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m512 z = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), m), c), r);
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(z, _mm512_loadu_ps(w + i), _mm512_loadu_ps(b + i)));
    }
    for (; i < d; i++) y[i] = fmaf(((x[i] - mf) - dm) * rstd, w[i], b[i]);
}
#endif

static void ln_row(float *y, const float *x, const float *w, const float *b, int64_t d, float eps) {
    double s, ss;
    float mf;
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        s = sum_avx512(x, d);
        mf = (float)(s / (double)d);
        ss = sqdev_avx512(x, mf, d);
    } else if (plx_isa >= PL_ISA_AVX2) {
        s = plx_sum_f64_avx2(x, d);
        mf = (float)(s / (double)d);
        ss = sqdev_avx2(x, mf, d);
    } else
#endif
    {
        s = sum_scalar(x, d);
        mf = (float)(s / (double)d);
        ss = sqdev_scalar(x, mf, d);
    }
    const double mean = s / (double)d, dmd = mean - (double)mf;
    double var = ss / (double)d - dmd * dmd;
    if (var < 0.0) var = 0.0;
    const float rstd = (float)(1.0 / sqrt(var + (double)eps));
    const float dm = (float)dmd;
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        ln_out_avx512(y, x, w, b, mf, dm, rstd, d);
        return;
    }
    if (plx_isa >= PL_ISA_AVX2) {
        ln_out_avx2(y, x, w, b, mf, dm, rstd, d);
        return;
    }
#endif
    ln_out_scalar(y, x, w, b, mf, dm, rstd, d);
}

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *x, *w, *b;
    int64_t n, d;
    float eps;
} ln_job;

static void job_ln(void *p, int ith, int nth) {
    ln_job *j = (ln_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n) ln_row(j->dst + i * j->d, j->x + i * j->d, j->w, j->b, j->d, j->eps);
}

int pl_layer_norm(pl_ctx *ctx, float *dst, const float *x, const float *w, const float *b,
                  int64_t n, int64_t d, float eps) {
    if (ctx == NULL || n < 0 || d < 0 || !(eps >= 0.0f) || isinf(eps)) return PL_ERR_ARG;
    if (n == 0 || d == 0) return PL_OK;
    if (dst == NULL || x == NULL || w == NULL || b == NULL) return PL_ERR_ARG;
    if (n * d <= ENC_INLINE_ELEMS) {
        for (int64_t i = 0; i < n; i++) ln_row(dst + i * d, x + i * d, w, b, d, eps);
        return PL_OK;
    }
    ln_job j = {ctx, dst, x, w, b, n, d, eps};
    plx_chunk_reset(ctx);
    plx_run(ctx, job_ln, &j);
    return PL_OK;
}

/* ================================================================ Im2Col1D */

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *x;
    int64_t t, c, k, stride, pad, t_out;
} im2col_job;

/* Kernels up to this size are laid out reading their rows side by side. */
#define IM2COL_KMAX 16

/* im2col_row writes output row o: for each channel, its k taps in a row, reading the k input
 * rows it spans (a missing row reads as zeros). */
static void im2col_row(const im2col_job *j, int64_t o) {
    const int64_t C = j->c, K = j->k;
    float *out = j->dst + o * C * K;
    const int64_t r0 = o * j->stride - j->pad;
    if (K == 1) {
        if (r0 < 0 || r0 >= j->t)
            memset(out, 0, (size_t)C * sizeof(float));
        else
            memcpy(out, j->x + r0 * C, (size_t)C * sizeof(float));
        return;
    }
    if (K <= IM2COL_KMAX) {
        /* written in order, reading the K rows side by side (a missing row from zeros) */
        const float *src[IM2COL_KMAX];
        int missing = 0;
        for (int64_t kk = 0; kk < K; kk++) {
            const int64_t r = r0 + kk;
            src[kk] = r < 0 || r >= j->t ? NULL : j->x + r * C;
            missing |= src[kk] == NULL;
        }
        if (!missing && K == 3) {
            const float *a = src[0], *b = src[1], *c = src[2];
            for (int64_t ch = 0; ch < C; ch++) {
                out[3 * ch] = a[ch];
                out[3 * ch + 1] = b[ch];
                out[3 * ch + 2] = c[ch];
            }
            return;
        }
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t kk = 0; kk < K; kk++) out[ch * K + kk] = src[kk] != NULL ? src[kk][ch] : 0.0f;
        return;
    }
    for (int64_t kk = 0; kk < K; kk++) {
        const int64_t r = r0 + kk;
        if (r < 0 || r >= j->t) {
            for (int64_t ch = 0; ch < C; ch++) out[ch * K + kk] = 0.0f;
            continue;
        }
        const float *src = j->x + r * C;
        for (int64_t ch = 0; ch < C; ch++) out[ch * K + kk] = src[ch];
    }
}

/* Output rows a unit of the job. */
#define IM2COL_ROWS 16

static void job_im2col(void *p, int ith, int nth) {
    im2col_job *j = (im2col_job *)p;
    (void)ith;
    (void)nth;
    int64_t c, nc = (j->t_out + IM2COL_ROWS - 1) / IM2COL_ROWS;
    while ((c = plx_chunk_next(j->ctx)) < nc)
        for (int64_t o = c * IM2COL_ROWS; o < PL_MIN(j->t_out, (c + 1) * IM2COL_ROWS); o++) im2col_row(j, o);
}

int pl_im2col_1d(pl_ctx *ctx, float *dst, const float *x, int64_t t, int64_t c, int64_t k,
                 int64_t stride, int64_t pad) {
    if (ctx == NULL || t < 0 || c < 0 || k <= 0 || stride <= 0 || pad < 0) return PL_ERR_ARG;
    if (pad > INT64_MAX / 8 || t > INT64_MAX / 8 || t + 2 * pad < k) return PL_ERR_ARG;
    const int64_t t_out = (t + 2 * pad - k) / stride + 1;
    if (c > 0 && k > INT64_MAX / 8 / c) return PL_ERR_ARG;
    if (c > 0 && t_out > INT64_MAX / 8 / (c * k)) return PL_ERR_ARG;
    if (c == 0) return PL_OK;
    if (dst == NULL || (t > 0 && x == NULL)) return PL_ERR_ARG;
    im2col_job j = {ctx, dst, x, t, c, k, stride, pad, t_out};
    if (t_out * c * k <= ENC_INLINE_ELEMS) {
        for (int64_t o = 0; o < t_out; o++) im2col_row(&j, o);
        return PL_OK;
    }
    plx_chunk_reset(ctx);
    plx_run(ctx, job_im2col, &j);
    return PL_OK;
}
