/*
 * relpos.c: self-attention with Transformer-XL's relative positions (Parakeet's FastConformer),
 * several clips at once, attention within each.
 *
 * A work item is a tile of rows of one clip and one head. For each row it takes the scores of
 * the keys the row attends to (content and position terms in one pass of fused multiply-adds),
 * their exact softmax, and the weighted sum of the values: one row's scores at a time, never a
 * clip's matrix, nor rel_shift's [t, 2t-1] one.
 */
#include <math.h>

#include "internal.h"
#include "simd.h"

/* Rows of one clip and head a work item computes. */
#define RP_TILE 8

typedef struct {
    int32_t row0, clip, head, pad;
} rp_item;

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *q, *k, *v, *p, *u, *bv;
    const int32_t *clip_start; /* [n_clips+1] */
    const rp_item *items;
    int64_t n_items, half, span;
    pl_relpos_cfg a;
} rp_job;

/* rp_dot returns qu.k + qv.p over hd elements. */
static float rp_dot_scalar(const float *qu, const float *k, const float *qv, const float *p, int64_t hd) {
    float s = 0.0f;
    for (int64_t d = 0; d < hd; d++) s += qu[d] * k[d] + qv[d] * p[d];
    return s;
}

/* rp_axpy adds a*v to acc. */
static void rp_axpy_scalar(float *acc, float a, const float *v, int64_t hd) {
    for (int64_t d = 0; d < hd; d++) acc[d] += a * v[d];
}

/* rp_exp sets s[x] = exp(s[x] - mx) and returns their sum. */
static float rp_exp_scalar(float *s, int64_t m, float mx) {
    float sum = 0.0f;
    for (int64_t x = 0; x < m; x++) {
        s[x] = expf(s[x] - mx);
        sum += s[x];
    }
    return sum;
}

#if PL_X86
PL_TARGET_AVX2 static float rp_dot_avx2(const float *qu, const float *k, const float *qv, const float *p, int64_t hd) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t d = 0;
    for (; d + 8 <= hd; d += 8) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qu + d), _mm256_loadu_ps(k + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d), _mm256_loadu_ps(p + d), a1);
    }
    float s = plx_hsum256(_mm256_add_ps(a0, a1));
    for (; d < hd; d++) s += qu[d] * k[d] + qv[d] * p[d];
    return s;
}

PL_TARGET_AVX2 static void rp_axpy_avx2(float *acc, float a, const float *v, int64_t hd) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t d = 0;
    for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(av, _mm256_loadu_ps(v + d), _mm256_loadu_ps(acc + d)));
    for (; d < hd; d++) acc[d] += a * v[d];
}

PL_TARGET_AVX2 static float rp_exp_avx2(float *s, int64_t m, float mx) {
    const __m256 mv = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    int64_t x = 0;
    for (; x + 8 <= m; x += 8) {
        __m256 e = plx_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + x), mv));
        _mm256_storeu_ps(s + x, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = plx_hsum256(acc);
    for (; x < m; x++) {
        s[x] = expf(s[x] - mx);
        sum += s[x];
    }
    return sum;
}

PL_TARGET_AVX512 static float rp_dot_avx512(const float *qu, const float *k, const float *qv, const float *p, int64_t hd) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    int64_t d = 0;
    for (; d + 16 <= hd; d += 16) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qu + d), _mm512_loadu_ps(k + d), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(qv + d), _mm512_loadu_ps(p + d), a1);
    }
    if (d < hd) {
        const __mmask16 mk = (__mmask16)((1u << (hd - d)) - 1);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, qu + d), _mm512_maskz_loadu_ps(mk, k + d), a0);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, qv + d), _mm512_maskz_loadu_ps(mk, p + d), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

PL_TARGET_AVX512 static void rp_axpy_avx512(float *acc, float a, const float *v, int64_t hd) {
    const __m512 av = _mm512_set1_ps(a);
    int64_t d = 0;
    for (; d + 16 <= hd; d += 16) _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(av, _mm512_loadu_ps(v + d), _mm512_loadu_ps(acc + d)));
    if (d < hd) {
        const __mmask16 mk = (__mmask16)((1u << (hd - d)) - 1);
        _mm512_mask_storeu_ps(acc + d, mk, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk, v + d), _mm512_maskz_loadu_ps(mk, acc + d)));
    }
}

PL_TARGET_AVX512 static float rp_exp_avx512(float *s, int64_t m, float mx) {
    const __m512 mv = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    int64_t x = 0;
    for (; x + 16 <= m; x += 16) {
        __m512 e = plx_exp512(_mm512_sub_ps(_mm512_loadu_ps(s + x), mv));
        _mm512_storeu_ps(s + x, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (x < m) {
        const __mmask16 mk = (__mmask16)((1u << (m - x)) - 1);
        __m512 e = plx_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + x), mv));
        _mm512_mask_storeu_ps(s + x, mk, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(mk, e));
    }
    return _mm512_reduce_add_ps(acc);
}
#endif

typedef struct {
    float (*dot)(const float *, const float *, const float *, const float *, int64_t);
    void (*axpy)(float *, float, const float *, int64_t);
    float (*exp)(float *, int64_t, float);
} rp_fns;

static rp_fns rp_pick(void) {
    rp_fns f = {rp_dot_scalar, rp_axpy_scalar, rp_exp_scalar};
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        f.axpy = rp_axpy_avx512;
        f.exp = rp_exp_avx512;
        f.dot = rp_dot_avx512;
    } else if (plx_isa >= PL_ISA_AVX2) {
        f.dot = rp_dot_avx2;
        f.axpy = rp_axpy_avx2;
        f.exp = rp_exp_avx2;
    }
#endif
    return f;
}

/* rp_row computes head h of row i of the clip of n rows starting at row s0. buf holds span
 * scores then 3*hd floats. */
static void rp_row(const rp_job *j, const rp_fns *f, float *buf, int64_t s0, int64_t n, int64_t i, int64_t h) {
    const int64_t hd = j->a.head_dim, width = (int64_t)j->a.n_head * hd, off = h * hd;
    float *s = buf, *qu = buf + j->span, *qv = qu + hd, *acc = qv + hd;
    const float *q = j->q + (s0 + i) * width + off;
    for (int64_t d = 0; d < hd; d++) {
        qu[d] = q[d] + j->u[off + d];
        qv[d] = q[d] + j->bv[off + d];
        acc[d] = 0.0f;
    }
    int64_t lo = 0, hi = n - 1;
    if (j->a.window > 0) {
        lo = i - j->a.window > 0 ? i - j->a.window : 0;
        hi = i + j->a.window < n - 1 ? i + j->a.window : n - 1;
    }
    const int64_t m = hi - lo + 1;
    /* key lo+x is row s0+lo+x of k; its position row half-i+lo+x of p */
    const float *k = j->k + (s0 + lo) * width + off, *p = j->p + (j->half - i + lo) * width + off;
    float mx = -INFINITY;
    for (int64_t x = 0; x < m; x++) {
        s[x] = f->dot(qu, k + x * width, qv, p + x * width, hd) * j->a.scale;
        if (s[x] > mx) mx = s[x];
    }
    const float sum = f->exp(s, m, mx);
    const float *v = j->v + (s0 + lo) * width + off;
    for (int64_t x = 0; x < m; x++) f->axpy(acc, s[x], v + x * width, hd);
    float *out = j->dst + (s0 + i) * width + off;
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < hd; d++) out[d] = acc[d] * inv;
}

static void rp_item_run(const rp_job *j, const rp_fns *f, const rp_item *it, float *buf) {
    const int64_t s0 = j->clip_start[it->clip], n = j->clip_start[it->clip + 1] - s0;
    const int64_t r1 = it->row0 + RP_TILE < s0 + n ? it->row0 + RP_TILE : s0 + n;
    for (int64_t r = it->row0; r < r1; r++) rp_row(j, f, buf, s0, n, r - s0, it->head);
}

static void job_rp(void *p, int ith, int nth) {
    rp_job *j = (rp_job *)p;
    (void)nth;
    const rp_fns f = rp_pick();
    float *buf = (float *)plx_tscratch(j->ctx, ith);
    int64_t c;
    while ((c = plx_chunk_next(j->ctx)) < j->n_items) rp_item_run(j, &f, &j->items[c], buf);
}

int pl_relpos_attention(pl_ctx *ctx, float *dst, const float *q, const float *k, const float *v,
                        const float *p, int64_t p_rows, const float *u, const float *bv,
                        const int32_t *clips, int64_t n_clips, const pl_relpos_cfg *a) {
    if (ctx == NULL || a == NULL || a->n_head <= 0 || a->head_dim <= 0 || a->window < 0 || n_clips < 0 || p_rows < 1 || p_rows % 2 != 1)
        return PL_ERR_ARG;
    if ((int64_t)a->n_head * a->head_dim > INT32_MAX || isnan(a->scale) || isinf(a->scale)) return PL_ERR_ARG;
    if (n_clips == 0) return PL_OK;
    if (dst == NULL || q == NULL || k == NULL || v == NULL || p == NULL || u == NULL || bv == NULL || clips == NULL) return PL_ERR_ARG;
    const int64_t half = (p_rows - 1) / 2;
    int64_t n = 0, longest = 0, n_items = 0;
    for (int64_t c = 0; c < n_clips; c++) {
        if (clips[c] < 1 || n > INT32_MAX - clips[c]) return PL_ERR_ARG;
        n += clips[c];
        if (clips[c] > longest) longest = clips[c];
        n_items += (clips[c] + RP_TILE - 1) / RP_TILE;
    }
    int64_t reach = longest - 1, span = longest;
    if (a->window > 0 && a->window < reach) reach = a->window;
    if (a->window > 0 && 2 * (int64_t)a->window + 1 < span) span = 2 * (int64_t)a->window + 1;
    if (half < reach) return PL_ERR_ARG;
    n_items *= a->n_head;
    /* shared scratch: the clips' first rows, then the items */
    const size_t starts = ((size_t)(n_clips + 1) * sizeof(int32_t) + 63) & ~(size_t)63;
    uint8_t *sc = plx_scratch(ctx, starts + (size_t)n_items * sizeof(rp_item));
    if (sc == NULL) return PL_ERR_NOMEM;
    int32_t *clip_start = (int32_t *)sc;
    rp_item *items = (rp_item *)(sc + starts);
    int64_t row = 0, it = 0;
    for (int64_t c = 0; c < n_clips; c++) {
        clip_start[c] = (int32_t)row;
        for (int64_t r = row; r < row + clips[c]; r += RP_TILE)
            for (int32_t h = 0; h < a->n_head; h++) items[it++] = (rp_item){(int32_t)r, (int32_t)c, h, 0};
        row += clips[c];
    }
    clip_start[n_clips] = (int32_t)row;
    const int64_t spanp = (span + 15) & ~(int64_t)15;
    if (plx_tscratch_reserve(ctx, (size_t)(spanp + 3 * (int64_t)a->head_dim) * sizeof(float)) != PL_OK) return PL_ERR_NOMEM;
    rp_job j = {ctx, dst, q, k, v, p, u, bv, clip_start, items, n_items, half, spanp, *a};
    if (n_items == 1 || (int64_t)n * longest * (int64_t)a->n_head * a->head_dim <= 65536) {
        const rp_fns f = rp_pick();
        float *buf = (float *)plx_tscratch(ctx, 0);
        for (int64_t i = 0; i < n_items; i++) rp_item_run(&j, &f, &items[i], buf);
        return PL_OK;
    }
    plx_chunk_reset(ctx);
    plx_run(ctx, job_rp, &j);
    return PL_OK;
}
