/*
 * ops.c: row-wise and element-wise operations: RMSNorm, AddRows, Scale, RoPE.
 *
 * Small operations (a decode step's single row) run on the calling thread: waking the pool would
 * cost more than the work.
 */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "simd.h"

/* Elements below which an operation runs on the calling thread alone. */
#define PLX_INLINE_ELEMS 16384

/* ================================================================ RMSNorm */

static double sumsq_scalar(const float *x, int64_t d) {
    double s = 0.0;
    for (int64_t i = 0; i < d; i++) s += (double)(x[i] * x[i]);
    return s;
}

#if PL_X86
PL_TARGET_AVX2 static double sumsq_avx2(const float *x, int64_t d) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0;
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        v = _mm256_mul_ps(v, v);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    a0 = _mm256_add_pd(a0, a1);
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a0), _mm256_extractf128_pd(a0, 1));
    double r = _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
    for (; i < d; i++) r += (double)(x[i] * x[i]);
    return r;
}

PL_TARGET_AVX2 static void scale_mul_avx2(float *y, const float *x, const float *w, float sc,
                                          int64_t d) {
    __m256 s = _mm256_set1_ps(sc);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), s),
                                              _mm256_loadu_ps(w + i)));
    for (; i < d; i++) y[i] = x[i] * sc * w[i];
}

PL_TARGET_AVX512 static double sumsq_avx512(const float *x, int64_t d) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        v = _mm512_mul_ps(v, v);
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
    }
    double r = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; i < d; i++) r += (double)(x[i] * x[i]);
    return r;
}

PL_TARGET_AVX512 static void scale_mul_avx512(float *y, const float *x, const float *w, float sc,
                                              int64_t d) {
    __m512 s = _mm512_set1_ps(sc);
    int64_t i = 0;
    for (; i + 16 <= d; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), s),
                                              _mm512_loadu_ps(w + i)));
    for (; i < d; i++) y[i] = x[i] * sc * w[i];
}
#endif

static void rms_row(float *y, const float *x, const float *w, int64_t d, float eps) {
    double ss;
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512)
        ss = sumsq_avx512(x, d);
    else if (plx_isa >= PL_ISA_AVX2)
        ss = sumsq_avx2(x, d);
    else
#endif
        ss = sumsq_scalar(x, d);
    const float mean = (float)(ss / (double)d);
    const float sc = 1.0f / sqrtf(mean + eps);
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        scale_mul_avx512(y, x, w, sc, d);
        return;
    }
    if (plx_isa >= PL_ISA_AVX2) {
        scale_mul_avx2(y, x, w, sc, d);
        return;
    }
#endif
    for (int64_t i = 0; i < d; i++) y[i] = x[i] * sc * w[i];
}

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *x, *w;
    int64_t n, d;
    float eps;
} rms_job;

static void job_rms(void *p, int ith, int nth) {
    rms_job *j = (rms_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n)
        rms_row(j->dst + i * j->d, j->x + i * j->d, j->w, j->d, j->eps);
}

int pl_rms_norm(pl_ctx *ctx, float *dst, const float *x, const float *w, int64_t n, int64_t d,
                float eps) {
    if (ctx == NULL || n < 0 || d < 0 || !(eps >= 0.0f)) return PL_ERR_ARG;
    if (n == 0 || d == 0) return PL_OK;
    if (dst == NULL || x == NULL || w == NULL) return PL_ERR_ARG;
    if (n * d <= PLX_INLINE_ELEMS) {
        for (int64_t i = 0; i < n; i++) rms_row(dst + i * d, x + i * d, w, d, eps);
        return PL_OK;
    }
    rms_job j = {ctx, dst, x, w, n, d, eps};
    plx_chunk_reset(ctx);
    plx_run(ctx, job_rms, &j);
    return PL_OK;
}

/* ================================================================ AddRows */

static void add_span(float *y, const float *a, const float *b, int64_t len) {
    /* plain loop: vectorised by the compiler for the baseline ISA */
    for (int64_t i = 0; i < len; i++) y[i] = a[i] + b[i];
}

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *a, *b;
    int64_t n, d, brows;
} add_job;

static void job_add(void *p, int ith, int nth) {
    add_job *j = (add_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n)
        add_span(j->dst + i * j->d, j->a + i * j->d, j->b + (j->brows == 1 ? 0 : i * j->d), j->d);
}

int pl_add_rows(pl_ctx *ctx, float *dst, const float *a, const float *b, int64_t n, int64_t d,
                int64_t b_rows) {
    if (ctx == NULL || n < 0 || d < 0) return PL_ERR_ARG;
    if (b_rows != 1 && b_rows != n) return PL_ERR_ARG;
    if (n == 0 || d == 0) return PL_OK;
    if (dst == NULL || a == NULL || b == NULL) return PL_ERR_ARG;
    if (n * d <= PLX_INLINE_ELEMS) {
        for (int64_t i = 0; i < n; i++) add_span(dst + i * d, a + i * d, b + (b_rows == 1 ? 0 : i * d), d);
        return PL_OK;
    }
    add_job j = {ctx, dst, a, b, n, d, b_rows};
    plx_chunk_reset(ctx);
    plx_run(ctx, job_add, &j);
    return PL_OK;
}

/* ================================================================ Scale */

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *x;
    float s;
    int64_t len;
} scale_job;

#define SCALE_CHUNK 4096

static void job_scale(void *p, int ith, int nth) {
    scale_job *j = (scale_job *)p;
    (void)ith;
    (void)nth;
    int64_t c;
    while ((c = plx_chunk_next(j->ctx)) * SCALE_CHUNK < j->len) {
        const int64_t e = PL_MIN(j->len, (c + 1) * SCALE_CHUNK);
        for (int64_t i = c * SCALE_CHUNK; i < e; i++) j->dst[i] = j->x[i] * j->s;
    }
}

int pl_scale(pl_ctx *ctx, float *dst, const float *x, float s, int64_t len) {
    if (ctx == NULL || len < 0 || !isfinite(s)) return PL_ERR_ARG;
    if (len == 0) return PL_OK;
    if (dst == NULL || x == NULL) return PL_ERR_ARG;
    if (len <= PLX_INLINE_ELEMS) {
        for (int64_t i = 0; i < len; i++) dst[i] = x[i] * s;
        return PL_OK;
    }
    scale_job j = {ctx, dst, x, s, len};
    plx_chunk_reset(ctx);
    plx_run(ctx, job_scale, &j);
    return PL_OK;
}

/* ================================================================ RoPE */

typedef struct {
    pl_ctx *ctx;
    float *x;
    int64_t n, n_head;
    pl_rope_cfg r;
    float theta_scale;
    const int32_t *pos;
    float *tab; /* [n][dims] */
} rope_job;

/* rope_angles fills cs [dims] with cos, sin of each pair's angle at position p, as ggml does:
 * theta = p * theta_scale^i by repeated multiplication, divided by the pair's frequency factor,
 * turned by freq_scale. */
static void rope_angles(const rope_job *j, int32_t p, float *cs) {
    float theta = (float)p;
    const float *ff = j->r.freq_factors;
    const float ext = j->r.ext_factor;
    float m = j->r.mscale == 0.0f ? 1.0f : j->r.mscale;
    if (ext != 0.0f) m *= 1.0f + 0.1f * logf(1.0f / j->r.freq_scale);
    for (int i = 0; i < j->r.dims / 2; i++) {
        const float extrap = ff != NULL ? theta / ff[i] : theta;
        float t = j->r.freq_scale * extrap;
        if (ext != 0.0f) {
            const float y = ((float)i - j->r.corr_dims[0]) / PL_MAX(0.001f, j->r.corr_dims[1] - j->r.corr_dims[0]);
            const float mix = (1.0f - PL_MIN(1.0f, PL_MAX(0.0f, y))) * ext;
            t = t * (1.0f - mix) + extrap * mix;
        }
        cs[2 * i] = cosf(t) * m;
        cs[2 * i + 1] = sinf(t) * m;
        theta *= j->theta_scale;
    }
}

/* rope_token rotates the n_head heads of one token with the angles cs. */
static void rope_token(const rope_job *j, float *x, const float *cs) {
    const int dims = j->r.dims, hd = j->r.head_dim;
    for (int64_t h = 0; h < j->n_head; h++) {
        float *v = x + h * hd;
        if (j->r.mode == PL_ROPE_NEOX) {
            const int half = dims / 2;
            for (int i = 0; i < half; i++) {
                float c = cs[2 * i], s = cs[2 * i + 1];
                float x0 = v[i], x1 = v[i + half];
                v[i] = x0 * c - x1 * s;
                v[i + half] = x0 * s + x1 * c;
            }
        } else {
            for (int i = 0; i < dims; i += 2) {
                float c = cs[i], s = cs[i + 1];
                float x0 = v[i], x1 = v[i + 1];
                v[i] = x0 * c - x1 * s;
                v[i + 1] = x0 * s + x1 * c;
            }
        }
    }
}

static void job_rope_tab(void *p, int ith, int nth) {
    rope_job *j = (rope_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n) rope_angles(j, j->pos[i], j->tab + i * j->r.dims);
}

static void job_rope(void *p, int ith, int nth) {
    rope_job *j = (rope_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n)
        rope_token(j, j->x + i * j->n_head * j->r.head_dim, j->tab + i * j->r.dims);
}

/* rope_same reports whether the angle table of ctx's last call serves r. */
static int rope_same(const pl_ctx *ctx, const pl_rope_cfg *r) {
    const pl_rope_cfg *a = &ctx->rope_cfg;
    if (a->dims != r->dims || a->base != r->base || a->freq_scale != r->freq_scale || a->mscale != r->mscale ||
        a->ext_factor != r->ext_factor || a->corr_dims[0] != r->corr_dims[0] || a->corr_dims[1] != r->corr_dims[1])
        return 0;
    if ((a->freq_factors == NULL) != (r->freq_factors == NULL)) return 0;
    return r->freq_factors == NULL ||
           (ctx->rope_ff_n == r->dims / 2 && memcmp(ctx->rope_ff, r->freq_factors, (size_t)(r->dims / 2) * sizeof(float)) == 0);
}

int pl_rope(pl_ctx *ctx, float *x, int64_t n, int64_t n_head, const pl_rope_cfg *r,
            const int32_t *pos) {
    if (ctx == NULL || r == NULL || n < 0 || n_head < 0) return PL_ERR_ARG;
    if (r->mode != PL_ROPE_NORMAL && r->mode != PL_ROPE_NEOX) return PL_ERR_UNSUPPORTED;
    if (r->head_dim <= 0 || r->dims <= 0 || r->dims > r->head_dim || r->dims % 2 != 0)
        return PL_ERR_ARG;
    if (!(r->base > 0.0f) || !isfinite(r->freq_scale)) return PL_ERR_ARG;
    if (!(r->mscale >= 0.0f) || isinf(r->mscale)) return PL_ERR_ARG;
    if (!(r->ext_factor >= 0.0f && r->ext_factor <= 1.0f) || !isfinite(r->corr_dims[0]) || !isfinite(r->corr_dims[1]))
        return PL_ERR_ARG;
    if (r->freq_factors != NULL)
        for (int i = 0; i < r->dims / 2; i++)
            if (!(r->freq_factors[i] > 0.0f) || isinf(r->freq_factors[i])) return PL_ERR_ARG;
    if (n == 0 || n_head == 0) return PL_OK;
    if (x == NULL || pos == NULL) return PL_ERR_ARG;
    for (int64_t i = 0; i < n; i++)
        if (pos[i] < 0) return PL_ERR_ARG;
    rope_job j = {ctx, x, n, n_head, *r, powf(r->base, -2.0f / (float)r->dims), pos, NULL};
    const int big = n * n_head * r->head_dim > PLX_INLINE_ELEMS;
    /* the angle table: reused while positions and parameters repeat (every layer of a step) */
    if (!(ctx->rope_tab != NULL && ctx->rope_n == n && rope_same(ctx, r) &&
          memcmp(ctx->rope_pos, pos, (size_t)n * sizeof(int32_t)) == 0)) {
        if (n * r->dims > ctx->rope_cap || n > ctx->rope_cap) {
            int64_t cap = PL_MAX(n * r->dims, n);
            float *tab = (float *)malloc((size_t)cap * sizeof(float));
            int32_t *ps = (int32_t *)malloc((size_t)cap * sizeof(int32_t));
            if (tab == NULL || ps == NULL) {
                free(tab);
                free(ps);
                return PL_ERR_NOMEM;
            }
            free(ctx->rope_tab);
            free(ctx->rope_pos);
            ctx->rope_tab = tab;
            ctx->rope_pos = ps;
            ctx->rope_cap = cap;
        }
        ctx->rope_n = 0; /* invalid while being filled */
        if (r->freq_factors != NULL) {
            if (ctx->rope_ff_n < r->dims / 2) {
                float *ff = (float *)realloc(ctx->rope_ff, (size_t)(r->dims / 2) * sizeof(float));
                if (ff == NULL) return PL_ERR_NOMEM;
                ctx->rope_ff = ff;
            }
            memcpy(ctx->rope_ff, r->freq_factors, (size_t)(r->dims / 2) * sizeof(float));
            ctx->rope_ff_n = r->dims / 2;
        }
        j.tab = ctx->rope_tab;
        if (big) {
            plx_chunk_reset(ctx);
            plx_run(ctx, job_rope_tab, &j);
        } else {
            for (int64_t i = 0; i < n; i++) rope_angles(&j, pos[i], j.tab + i * r->dims);
        }
        memcpy(ctx->rope_pos, pos, (size_t)n * sizeof(int32_t));
        ctx->rope_cfg = *r;
        ctx->rope_n = n;
    }
    j.tab = ctx->rope_tab;
    if (!big) {
        for (int64_t i = 0; i < n; i++) rope_token(&j, x + i * n_head * r->head_dim, j.tab + i * r->dims);
        return PL_OK;
    }
    plx_chunk_reset(ctx);
    plx_run(ctx, job_rope, &j);
    return PL_OK;
}
