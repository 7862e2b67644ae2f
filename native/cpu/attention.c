/*
 * attention.c: the paged KV cache (StoreKV), attention over it, and full attention (no cache,
 * no mask: an encoder's self-attention, a decoder's cross-attention) with the same kernels.
 *
 * Attention works on items of (sequence, kv head, tile of consecutive tokens): the tile's query
 * heads that share the kv head form R query rows that walk the sequence's cache positions once,
 * CH keys at a time, with an online softmax: per row a running maximum m, a running sum l and an
 * unnormalised output O. Keys past a row's own position are masked (causal). A chunk gathers the
 * row pointers of its positions, so it may span several cache blocks; F16 and BF16 rows are
 * widened to F32 in registers.
 *
 * The kernels take the cache's element type kt (PL_F32, PL_F16 or PL_BF16) as a compile-time
 * constant: each is written once, inlined into one function per type (KV_CASES), and the type's
 * loads and roundings below fold to the instructions of that type.
 */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "simd.h"

#define CH 64      /* keys a chunk */
#define TILE_ROWS 16 /* query rows (tokens × grouped heads) an item aims at */

/* slot_of returns the cache slot of position p of a sequence with block table table, for
 * blocks of bs slots; bs = 2^shift when shift >= 0 (no division). */
static inline int64_t slot_of(const int32_t *table, int64_t bs, int shift, int64_t p) {
    if (shift >= 0) return ((int64_t)table[p >> shift] << shift) | (p & (bs - 1));
    return (int64_t)table[p / bs] * bs + p % bs;
}

/* KV_CASES(kt, CALL) runs CALL(PL_F16), CALL(PL_BF16) or CALL(PL_F32) as kt is F16, BF16 or
 * anything else: a kernel's cache type as the compile-time constant it is written for. */
#define KV_CASES(kt, CALL)                                                                       \
    switch (kt) {                                                                                \
    case PL_F16: CALL(PL_F16); break;                                                            \
    case PL_BF16: CALL(PL_BF16); break;                                                          \
    default: CALL(PL_F32); break;                                                                \
    }

/* kv_at: element d of a row of type kt, as float. to_half: x as an element of kt (F16 or BF16;
 * rounded to nearest even, NaN kept NaN). round_to: x rounded to kt, back as float (x itself
 * for F32). */
static inline float kv_at(const void *row, int d, const int kt) {
    if (kt == PL_F16) return plx_f16_to_f32(((const uint16_t *)row)[d]);
    if (kt == PL_BF16) return plx_bf16_to_f32(((const uint16_t *)row)[d]);
    return ((const float *)row)[d];
}

static inline uint16_t to_half(float x, const int kt) {
    return kt == PL_BF16 ? plx_f32_to_bf16(x) : plx_f32_to_f16(x);
}

static inline float round_to(float x, const int kt) {
    if (kt == PL_F16) return plx_f16_to_f32(plx_f32_to_f16(x));
    if (kt == PL_BF16) return plx_bf16_to_f32(plx_f32_to_bf16(x));
    return x;
}

#if PL_X86
/* bf16_bits256 is plx_f32_to_bf16 in lanes, the results in the high halves of the F32 bit
 * patterns (the low halves zero, so that they are the rounded values as floats). */
PL_TARGET_AVX2 static inline __m256i bf16_bits256(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    const __m256i qnan = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 b = _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(qnan), nan);
    return _mm256_and_si256(_mm256_castps_si256(b), _mm256_set1_epi32((int)0xffff0000u));
}

/* cvt8 widens eight elements of type kt (F16 or BF16) to F32; half8 rounds eight floats to kt. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline __m256 cvt8(__m128i h, const int kt) {
    if (kt == PL_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

__attribute__((always_inline)) PL_TARGET_AVX2 static inline __m128i half8(__m256 x, const int kt) {
    if (kt == PL_BF16) {
        const __m256i b = _mm256_srli_epi32(bf16_bits256(x), 16);
        return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    }
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
}

/* round8 is round_to in lanes. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline __m256 round8(__m256 x, const int kt) {
    if (kt == PL_F16) return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    if (kt == PL_BF16) return _mm256_castsi256_ps(bf16_bits256(x));
    return x;
}

/* y = x rounded to kt, as float, n elements. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
round_to_avx2_t(float *y, const float *x, int n, const int kt) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, round8(_mm256_loadu_ps(x + i), kt));
    for (; i < n; i++) y[i] = round_to(x[i], kt);
}

PL_TARGET_AVX2 static void round_to_avx2(float *y, const float *x, int n, int kt) {
#define ROUND_TO(KT) round_to_avx2_t(y, x, n, KT)
    KV_CASES(kt, ROUND_TO)
#undef ROUND_TO
}

/* cvt16 and round16: cvt8 and round8 for sixteen lanes. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline __m512 cvt16(__m256i h, const int kt) {
    if (kt == PL_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

__attribute__((always_inline)) PL_TARGET_AVX512 static inline __m512 round16(__m512 x, const int kt) {
    if (kt == PL_F16) return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    if (kt == PL_BF16) {
        const __m512i u = _mm512_castps_si512(x);
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
        r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), u, _mm512_set1_epi32(0x400000));
        return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
    }
    return x;
}
#endif

/* Scratch of the rows-in-lanes kernels (AVX-512). */
typedef struct {
    float *qt;      /* [hd][16] queries, transposed and scaled */
    float *st;      /* [sc][16] scores, then weights */
    float *o;       /* [16][hd] */
    float *kf, *vf; /* [CH][hd] widened F16 or BF16 rows */
} att_tile_buf;

/* ================================================================ StoreKV */

#if PL_X86
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
store_half_avx2_t(uint16_t *d, const float *s, int64_t n, const int kt) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(d + i), half8(_mm256_loadu_ps(s + i), kt));
    for (; i < n; i++) d[i] = to_half(s[i], kt);
}

PL_TARGET_AVX2 static void store_half_avx2(uint16_t *d, const float *s, int64_t n, int kt) {
    if (kt == PL_BF16) store_half_avx2_t(d, s, n, PL_BF16);
    else store_half_avx2_t(d, s, n, PL_F16);
}
#endif

static void store_row(void *cache, int kvt, int64_t slot, int64_t width, const float *src) {
    if (kvt == PL_F32) {
        memcpy((float *)cache + slot * width, src, (size_t)width * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)cache + slot * width;
#if PL_X86
    if (plx_isa >= PL_ISA_AVX2) {
        store_half_avx2(d, src, width, kvt);
        return;
    }
#endif
    for (int64_t i = 0; i < width; i++) d[i] = to_half(src[i], kvt);
}

typedef struct {
    pl_ctx *ctx;
    void *kc, *vc;
    int kvt;
    int64_t width;
    const float *k, *v;
    int64_t n;
    const int32_t *slot;
} kv_job;

static void job_store(void *p, int ith, int nth) {
    kv_job *j = (kv_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n) {
        store_row(j->kc, j->kvt, j->slot[i], j->width, j->k + i * j->width);
        store_row(j->vc, j->kvt, j->slot[i], j->width, j->v + i * j->width);
    }
}

int pl_store_kv(pl_ctx *ctx, void *kc, void *vc, int kvtype, int64_t slots, int64_t width,
                const float *k, const float *v, int64_t n, const int32_t *slot) {
    if (ctx == NULL || slots < 0 || width < 0 || n < 0) return PL_ERR_ARG;
    if (!pl_supports(PL_OP_KV, kvtype)) return PL_ERR_UNSUPPORTED;
    if (n == 0 || width == 0) return PL_OK;
    if (kc == NULL || vc == NULL || k == NULL || v == NULL || slot == NULL) return PL_ERR_ARG;
    for (int64_t i = 0; i < n; i++)
        if (slot[i] < 0 || slot[i] >= slots) return PL_ERR_ARG;
    if (n * width <= 16384) {
        for (int64_t i = 0; i < n; i++) {
            store_row(kc, kvtype, slot[i], width, k + i * width);
            store_row(vc, kvtype, slot[i], width, v + i * width);
        }
        return PL_OK;
    }
    kv_job j = {ctx, kc, vc, kvtype, width, k, v, n, slot};
    plx_chunk_reset(ctx);
    plx_run(ctx, job_store, &j);
    return PL_OK;
}

/* ================================================================ kernels
 *
 * Keys and values are addressed through per-position row pointers (the rows of one chunk may
 * lie in different cache blocks), of type kt, converted in registers.
 * scores: s[c] = scale * (q · K_c) for c < C.
 * pv:     o = alpha*o + sum_{c<nv} p[c] * V_c.
 * expsum: p[c] = exp(s[c] - mx) for c < nv; returns the sum.
 */

static void scores_scalar(const float *q, const void *const *k, int C, int hd, float scale,
                          float *s, int kt) {
    for (int c = 0; c < C; c++) {
        float a = 0.0f;
        for (int d = 0; d < hd; d++) a += q[d] * kv_at(k[c], d, kt);
        s[c] = a * scale;
    }
}

static void pv_scalar(float *o, float alpha, const float *p, int nv, const void *const *v, int hd,
                      int kt) {
    for (int d = 0; d < hd; d++) o[d] *= alpha;
    for (int c = 0; c < nv; c++) {
        float pc = p[c];
        for (int d = 0; d < hd; d++) o[d] += pc * kv_at(v[c], d, kt);
    }
}

static float expsum_scalar(float *s, int nv, float mx) {
    float sum = 0.0f;
    for (int c = 0; c < nv; c++) {
        s[c] = expf(s[c] - mx);
        sum += s[c];
    }
    return sum;
}

#if PL_X86
__attribute__((always_inline)) PL_TARGET_AVX2 static inline __m256 ld8(const void *row, int d,
                                                                        const int kt) {
    if (kt != PL_F32) return cvt8(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)), kt);
    return _mm256_loadu_ps((const float *)row + d);
}

__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
scores_avx2_t(const float *q, const void *const *k, int C, int hd, float scale, float *s,
              const int kt) {
    const int hd8 = hd & ~7;
    for (int c0 = 0; c0 < C; c0 += 8) {
        const int nc = PL_MIN(8, C - c0);
        const void *kr[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) kr[c] = k[c0 + (c < nc ? c : 0)]; /* spare lanes repeat key 0 */
        __m256 acc[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
        for (int d = 0; d < hd8; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(qv, ld8(kr[c], d, kt), acc[c]);
        }
        float tmp[8];
        _mm256_storeu_ps(tmp, _mm256_mul_ps(plx_hsum8x256(acc), _mm256_set1_ps(scale)));
        for (int c = 0; c < nc; c++) {
            float t = 0.0f;
            for (int d = hd8; d < hd; d++) t += q[d] * kv_at(kr[c], d, kt);
            s[c0 + c] = tmp[c] + t * scale;
        }
    }
}

__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
pv_avx2_t(float *o, float alpha, const float *p, int nv, const void *const *v, int hd, const int kt) {
    const __m256 al = _mm256_set1_ps(alpha);
    int d0 = 0;
    for (; d0 + 32 <= hd; d0 += 32) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(o + d0), al);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(o + d0 + 8), al);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(o + d0 + 16), al);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(o + d0 + 24), al);
        for (int c = 0; c < nv; c++) {
            __m256 pc = _mm256_set1_ps(p[c]);
            a0 = _mm256_fmadd_ps(pc, ld8(v[c], d0, kt), a0);
            a1 = _mm256_fmadd_ps(pc, ld8(v[c], d0 + 8, kt), a1);
            a2 = _mm256_fmadd_ps(pc, ld8(v[c], d0 + 16, kt), a2);
            a3 = _mm256_fmadd_ps(pc, ld8(v[c], d0 + 24, kt), a3);
        }
        _mm256_storeu_ps(o + d0, a0);
        _mm256_storeu_ps(o + d0 + 8, a1);
        _mm256_storeu_ps(o + d0 + 16, a2);
        _mm256_storeu_ps(o + d0 + 24, a3);
    }
    for (; d0 + 8 <= hd; d0 += 8) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(o + d0), al);
        for (int c = 0; c < nv; c++) a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[c]), ld8(v[c], d0, kt), a0);
        _mm256_storeu_ps(o + d0, a0);
    }
    for (; d0 < hd; d0++) {
        float a = o[d0] * alpha;
        for (int c = 0; c < nv; c++) a += p[c] * kv_at(v[c], d0, kt);
        o[d0] = a;
    }
}

PL_TARGET_AVX2 static void scores_avx2(const float *q, const void *const *k, int C, int hd,
                                       float scale, float *s, int kt) {
#define SCORES(KT) scores_avx2_t(q, k, C, hd, scale, s, KT)
    KV_CASES(kt, SCORES)
#undef SCORES
}

PL_TARGET_AVX2 static void pv_avx2(float *o, float alpha, const float *p, int nv,
                                   const void *const *v, int hd, int kt) {
#define PV(KT) pv_avx2_t(o, alpha, p, nv, v, hd, KT)
    KV_CASES(kt, PV)
#undef PV
}

PL_TARGET_AVX2 static float expsum_avx2(float *s, int nv, float mx) {
    __m256 m = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    int c = 0;
    for (; c + 8 <= nv; c += 8) {
        __m256 e = plx_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + c), m));
        _mm256_storeu_ps(s + c, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (c < nv) { /* the last elements with the same exp, masked (as the AVX-512 form: the same values) */
        const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(nv - c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 e = plx_exp256(_mm256_sub_ps(_mm256_maskload_ps(s + c, mk), m));
        _mm256_maskstore_ps(s + c, mk, e);
        acc = _mm256_add_ps(acc, _mm256_and_ps(e, _mm256_castsi256_ps(mk)));
    }
    return plx_hsum256(acc);
}

__attribute__((always_inline)) PL_TARGET_AVX512 static inline __m512 ld16(const void *row, int d,
                                                                           __mmask16 m, const int kt) {
    if (kt != PL_F32) return cvt16(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + d), kt);
    return _mm512_maskz_loadu_ps(m, (const float *)row + d);
}

__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
scores_avx512_t(const float *q, const void *const *k, int C, int hd, float scale, float *s,
                const int kt) {
    for (int c0 = 0; c0 < C; c0 += 16) {
        const int nc = PL_MIN(16, C - c0);
        const void *kr[16];
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) kr[c] = k[c0 + (c < nc ? c : 0)]; /* spare lanes repeat key 0 */
        __m512 acc[16];
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) acc[c] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            __mmask16 mk = hd - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (hd - d)) - 1);
            __m512 qv = _mm512_maskz_loadu_ps(mk, q + d);
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) acc[c] = _mm512_fmadd_ps(qv, ld16(kr[c], d, mk, kt), acc[c]);
        }
        __m512 r = _mm512_mul_ps(plx_hsum16x512(acc), _mm512_set1_ps(scale));
        _mm512_mask_storeu_ps(s + c0, (__mmask16)((1u << nc) - 1), r);
    }
}

/* NB blocks of 16 floats of o held in registers; the last masked by ml. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
pv_blk_avx512(float *o, __m512 al, const float *p, int nv, const void *const *v, int d0,
              const int NB, __mmask16 ml, const int kt) {
    __m512 a[8];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
        a[b] = _mm512_mul_ps(_mm512_maskz_loadu_ps(b == NB - 1 ? ml : 0xFFFF, o + d0 + 16 * b), al);
    for (int c = 0; c < nv; c++) {
        __m512 pc = _mm512_set1_ps(p[c]);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++)
            a[b] = _mm512_fmadd_ps(pc, ld16(v[c], d0 + 16 * b, b == NB - 1 ? ml : 0xFFFF, kt), a[b]);
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) _mm512_mask_storeu_ps(o + d0 + 16 * b, b == NB - 1 ? ml : 0xFFFF, a[b]);
}

__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
pv_avx512_t(float *o, float alpha, const float *p, int nv, const void *const *v, int hd, const int kt) {
    const __m512 al = _mm512_set1_ps(alpha);
    for (int d0 = 0; d0 < hd; d0 += 128) {
        int rem = PL_MIN(128, hd - d0);
        int nb = (rem + 15) / 16;
        __mmask16 ml = rem % 16 ? (__mmask16)((1u << (rem % 16)) - 1) : (__mmask16)0xFFFF;
#define PV_BLK(NB) pv_blk_avx512(o, al, p, nv, v, d0, NB, ml, kt)
        PLX_CASES8(nb, PV_BLK)
#undef PV_BLK
    }
}

PL_TARGET_AVX512 static void scores_avx512(const float *q, const void *const *k, int C, int hd,
                                           float scale, float *s, int kt) {
#define SCORES(KT) scores_avx512_t(q, k, C, hd, scale, s, KT)
    KV_CASES(kt, SCORES)
#undef SCORES
}

PL_TARGET_AVX512 static void pv_avx512(float *o, float alpha, const float *p, int nv,
                                       const void *const *v, int hd, int kt) {
#define PV(KT) pv_avx512_t(o, alpha, p, nv, v, hd, KT)
    KV_CASES(kt, PV)
#undef PV
}

PL_TARGET_AVX512 static float expsum_avx512(float *s, int nv, float mx) {
    __m512 m = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    for (int c = 0; c < nv; c += 16) {
        __mmask16 mk = nv - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nv - c)) - 1);
        __m512 e = plx_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + c), m));
        _mm512_mask_storeu_ps(s + c, mk, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(mk, e));
    }
    return _mm512_reduce_add_ps(acc);
}
#endif

#if PL_X86
/* tile_scores4 computes the scores of four keys k[0..3] (hd floats each) for the 16 query lanes
 * of qt ([hd][16]), summed as ggml_vec_dot_f32/f16 do on AVX-512 (whole 64-element steps in F32,
 * the remaining elements' products in double), then scaled by scl. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
tile_scores4(const float *qt, const float *const k[4], int hd, __m512 scl, __m512 av[4]) {
    const int hd64 = hd & ~63;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < hd64; d++) {
        __m512 qv = _mm512_load_ps(qt + d * 16);
        a0 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k[0][d]), a0);
        a1 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k[1][d]), a1);
        a2 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k[2][d]), a2);
        a3 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k[3][d]), a3);
    }
    av[0] = a0, av[1] = a1, av[2] = a2, av[3] = a3;
    if (hd64 < hd) {
        for (int i = 0; i < 4; i++) {
            __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(av[i]));
            __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(av[i]), 1)));
            for (int d = hd64; d < hd; d++) {
                __m512 pr = _mm512_mul_ps(_mm512_load_ps(qt + d * 16), _mm512_set1_ps(k[i][d]));
                lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(pr)));
                hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(pr), 1))));
            }
            av[i] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);
        }
    }
    for (int i = 0; i < 4; i++) av[i] = _mm512_mul_ps(av[i], scl);
}

/* ---------------------------------------------------------------- AVX-512, rows in lanes
 *
 * For items of at least 8 query rows: the item's R <= 16 query rows are lanes of one vector.
 * Q is transposed once per item (Qt [hd][16]; the scale is applied to the sums), so the scores of one key for all rows
 * are hd broadcast-FMAs, the online softmax runs lane-wise, and P·V accumulates 4 rows × 64
 * elements of O in registers per pass over the chunk's values. F16 and BF16 rows are widened
 * once per chunk into Kf/Vf. */

/* widen_rows512 widens rows[c] (hd elements of type kt, F16 or BF16) into dst [C][hd]. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
widen_rows512_t(float *dst, const void *const *rows, int C, int hd, const int kt) {
    const int hd16 = hd & ~15;
    for (int c = 0; c < C; c++) {
        const uint16_t *h = (const uint16_t *)rows[c];
        float *o = dst + (size_t)c * hd;
        int d = 0;
        for (; d < hd16; d += 16) _mm512_storeu_ps(o + d, cvt16(_mm256_loadu_si256((const __m256i *)(h + d)), kt));
        if (d < hd) { /* masked only for the tail */
            const __mmask16 mk = (__mmask16)((1u << (hd - d)) - 1);
            _mm512_mask_storeu_ps(o + d, mk, cvt16(_mm256_maskz_loadu_epi16(mk, h + d), kt));
        }
    }
}

PL_TARGET_AVX512 static void widen_rows512(float *dst, const void *const *rows, int C, int hd, int kt) {
    if (kt == PL_BF16) widen_rows512_t(dst, rows, C, hd, PL_BF16);
    else widen_rows512_t(dst, rows, C, hd, PL_F16);
}

/* O[r][d0..d0+16*NB) += sum_c P[c][r] * V_c[d0..], rows r0..r0+3 (P rows past R are zero). */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
tile_pv(float *o, int hd, const float *st, int C, const float *const *v, int r0, int d0,
        const int NB, __mmask16 ml) {
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++)
            a[i][b] = _mm512_maskz_loadu_ps(b == NB - 1 ? ml : 0xFFFF, o + (size_t)(r0 + i) * hd + d0 + 16 * b);
    for (int c = 0; c < C; c++) {
        __m512 vv[4];
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) vv[b] = _mm512_maskz_loadu_ps(b == NB - 1 ? ml : 0xFFFF, v[c] + d0 + 16 * b);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512 pc = _mm512_set1_ps(st[c * 16 + r0 + i]);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) a[i][b] = _mm512_fmadd_ps(pc, vv[b], a[i][b]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++)
            _mm512_mask_storeu_ps(o + (size_t)(r0 + i) * hd + d0 + 16 * b, b == NB - 1 ? ml : 0xFFFF, a[i][b]);
}

/* att_tile512 runs one item whose rows are lanes: q[r] the query of row r < R (scaled by
 * scale), pos[r] its position; writes dst[r] rows. kp, vp: CH row pointers of scratch. An F16 or
 * BF16 cache (kt) is widened as it is, with nothing rounded (att_tile512_half rounds). */
PL_TARGET_AVX512 static void att_tile512(const float *const *q, float *const *dst, const int32_t *pos,
                                         int R, int hd, float scale, int kt, int32_t pmax,
                                         const uint8_t *kc, const uint8_t *vc, int64_t rowb,
                                         int64_t headb, const int32_t *table, int64_t bs, int shift,
                                         const void **kp, const void **vp, att_tile_buf *tb) {
    (void)shift; /* positions advance block by block here */
    int32_t pl[16];
    for (int r = 0; r < 16; r++) pl[r] = r < R ? pos[r] : pos[0];
    const __m512i P = _mm512_loadu_si512((const void *)pl);
    for (int d = 0; d < hd; d++)
        for (int r = 0; r < 16; r++) tb->qt[d * 16 + r] = r < R ? q[r][d] : 0.0f;
    const __m512 scl = _mm512_set1_ps(scale);
    memset(tb->o, 0, (size_t)16 * hd * sizeof(float));
    __m512 m = _mm512_set1_ps(-INFINITY), l = _mm512_setzero_ps();
    __mmask16 valid[CH];
    int64_t blk = 0, off = 0;
    for (int32_t j0 = 0; j0 <= pmax;) {
        int C = (int)PL_MIN((int64_t)CH, (int64_t)(pmax + 1 - j0));
        for (int c = 0; c < C; c++) {
            int64_t slot = (int64_t)table[blk] * bs + off;
            kp[c] = kc + slot * rowb + headb;
            vp[c] = vc + slot * rowb + headb;
            if (++off == bs) {
                off = 0;
                blk++;
            }
        }
        const float *const *K = (const float *const *)kp, *const *V = (const float *const *)vp;
        const float *kr[CH], *vr[CH];
        if (kt != PL_F32) {
            widen_rows512(tb->kf, kp, C, hd, kt);
            widen_rows512(tb->vf, vp, C, hd, kt);
            for (int c = 0; c < C; c++) {
                kr[c] = tb->kf + (size_t)c * hd;
                vr[c] = tb->vf + (size_t)c * hd;
            }
            K = kr;
            V = vr;
        }
        /* scores, four keys at a time; masked entries -inf */
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int c0 = 0; c0 < C; c0 += 4) {
            const float *k0 = K[c0], *k1 = K[PL_MIN(c0 + 1, C - 1)], *k2 = K[PL_MIN(c0 + 2, C - 1)],
                        *k3 = K[PL_MIN(c0 + 3, C - 1)];
            __m512 av[4];
            const float *k4[4] = {k0, k1, k2, k3};
            tile_scores4(tb->qt, k4, hd, scl, av);
            for (int i = 0; i < 4 && c0 + i < C; i++) {
                __mmask16 vm = _mm512_cmp_epi32_mask(_mm512_set1_epi32(j0 + c0 + i), P, _MM_CMPINT_LE);
                valid[c0 + i] = vm;
                __m512 sv = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vm, av[i]);
                _mm512_store_ps(tb->st + (c0 + i) * 16, sv);
                mx = _mm512_max_ps(mx, sv);
            }
        }
        __m512 mnew = _mm512_max_ps(m, mx);
        /* rows with no key yet keep m = -inf: their alpha is irrelevant (O and l are zero) */
        __mmask16 seen = _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        __m512 alpha = _mm512_maskz_mov_ps(seen, plx_exp512(_mm512_sub_ps(m, mnew)));
        __m512 sum = _mm512_setzero_ps();
        for (int c = 0; c < C; c++) {
            __m512 e = _mm512_maskz_mov_ps(valid[c], plx_exp512(_mm512_sub_ps(_mm512_load_ps(tb->st + c * 16), mnew)));
            _mm512_store_ps(tb->st + c * 16, e);
            sum = _mm512_add_ps(sum, e);
        }
        l = _mm512_fmadd_ps(l, alpha, sum);
        m = mnew;
        float al[16];
        _mm512_storeu_ps(al, alpha);
        for (int r = 0; r < R; r++) {
            __m512 ar = _mm512_set1_ps(al[r]);
            float *orow = tb->o + (size_t)r * hd;
            for (int d = 0; d < hd; d += 16) {
                __mmask16 mk = hd - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (hd - d)) - 1);
                _mm512_mask_storeu_ps(orow + d, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, orow + d), ar));
            }
        }
        for (int d0 = 0; d0 < hd; d0 += 64) {
            int rem = PL_MIN(64, hd - d0), nb = (rem + 15) / 16;
            __mmask16 ml = rem % 16 ? (__mmask16)((1u << (rem % 16)) - 1) : (__mmask16)0xFFFF;
            for (int r0 = 0; r0 < R; r0 += 4) {
                switch (nb) {
                case 1: tile_pv(tb->o, hd, tb->st, C, V, r0, d0, 1, ml); break;
                case 2: tile_pv(tb->o, hd, tb->st, C, V, r0, d0, 2, ml); break;
                case 3: tile_pv(tb->o, hd, tb->st, C, V, r0, d0, 3, ml); break;
                default: tile_pv(tb->o, hd, tb->st, C, V, r0, d0, 4, ml); break;
                }
            }
        }
        j0 += C;
    }
    float li[16];
    _mm512_storeu_ps(li, l);
    for (int r = 0; r < R; r++) {
        float inv = 1.0f / li[r];
        for (int d = 0; d < hd; d++) dst[r][d] = tb->o[(size_t)r * hd + d] * inv;
    }
}

/* att_tile512_half is att_tile512 for an F16 or BF16 cache (kt), in two passes as llama.cpp's
 * F16 products compute it: the queries rounded to kt; every score of the item stored
 * (st [ctx][16]); the exact softmax of each row, its weights rounded to kt; then p·V. */
PL_TARGET_AVX512 static void att_tile512_half(const float *const *q, float *const *dst,
                                              const int32_t *pos, int R, int hd, float scale, int kt,
                                              int32_t pmax, const uint8_t *kc, const uint8_t *vc,
                                              int64_t rowb, int64_t headb, const int32_t *table,
                                              int64_t bs, int shift, const void **kp, const void **vp,
                                              att_tile_buf *tb) {
    int32_t pl[16];
    for (int r = 0; r < 16; r++) pl[r] = r < R ? pos[r] : pos[0];
    const __m512i P = _mm512_loadu_si512((const void *)pl);
    for (int r = 0; r < R; r++) round_to_avx2(tb->o + (size_t)r * hd, q[r], hd, kt); /* o: free until pass 2 */
    for (int d = 0; d < hd; d++)
        for (int r = 0; r < 16; r++) tb->qt[d * 16 + r] = r < R ? tb->o[(size_t)r * hd + d] : 0.0f;
    const float *kr[CH], *vr[CH];
    const __m512 scl = _mm512_set1_ps(scale);
    /* pass 1: scores of every position, masked ones -inf */
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int32_t j0 = 0; j0 <= pmax; j0 += CH) {
        int C = (int)PL_MIN((int64_t)CH, (int64_t)(pmax + 1 - j0));
        for (int c = 0; c < C; c++) kp[c] = kc + slot_of(table, bs, shift, j0 + c) * rowb + headb;
        widen_rows512(tb->kf, kp, C, hd, kt);
        for (int c = 0; c < C; c++) kr[c] = tb->kf + (size_t)c * hd;
        for (int c0 = 0; c0 < C; c0 += 4) {
            const float *k0 = kr[c0], *k1 = kr[PL_MIN(c0 + 1, C - 1)], *k2 = kr[PL_MIN(c0 + 2, C - 1)],
                        *k3 = kr[PL_MIN(c0 + 3, C - 1)];
            __m512 av[4];
            const float *k4[4] = {k0, k1, k2, k3};
            tile_scores4(tb->qt, k4, hd, scl, av);
            for (int i = 0; i < 4 && c0 + i < C; i++) {
                __mmask16 vm = _mm512_cmp_epi32_mask(_mm512_set1_epi32(j0 + c0 + i), P, _MM_CMPINT_LE);
                __m512 sv = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vm, av[i]);
                _mm512_store_ps(tb->st + (size_t)(j0 + c0 + i) * 16, sv);
                mx = _mm512_max_ps(mx, sv);
            }
        }
    }
    /* the softmax of each row (lane), weights rounded to kt */
    /* as ggml_soft_max: exp in F32, the sum in double, then a multiply by (float)(1/sum) */
    __m512d sumlo = _mm512_setzero_pd(), sumhi = sumlo;
    for (int32_t jj = 0; jj <= pmax; jj++) {
        __mmask16 vm = _mm512_cmp_epi32_mask(_mm512_set1_epi32(jj), P, _MM_CMPINT_LE);
        __m512 e = _mm512_maskz_mov_ps(vm, plx_exp512(_mm512_sub_ps(_mm512_load_ps(tb->st + (size_t)jj * 16), mx)));
        _mm512_store_ps(tb->st + (size_t)jj * 16, e);
        sumlo = _mm512_add_pd(sumlo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        sumhi = _mm512_add_pd(sumhi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    const __m512d one = _mm512_set1_pd(1.0);
    const __m512 inv = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(_mm512_div_pd(one, sumlo))),
                                          _mm512_cvtpd_ps(_mm512_div_pd(one, sumhi)), 1);
    for (int32_t jj = 0; jj <= pmax; jj++)
        _mm512_store_ps(tb->st + (size_t)jj * 16, round16(_mm512_mul_ps(_mm512_load_ps(tb->st + (size_t)jj * 16), inv), kt));
    /* pass 2: p·V */
    memset(tb->o, 0, (size_t)16 * hd * sizeof(float));
    for (int32_t j0 = 0; j0 <= pmax; j0 += CH) {
        int C = (int)PL_MIN((int64_t)CH, (int64_t)(pmax + 1 - j0));
        for (int c = 0; c < C; c++) vp[c] = vc + slot_of(table, bs, shift, j0 + c) * rowb + headb;
        widen_rows512(tb->vf, vp, C, hd, kt);
        for (int c = 0; c < C; c++) vr[c] = tb->vf + (size_t)c * hd;
        const float *st = tb->st + (size_t)j0 * 16;
        for (int d0 = 0; d0 < hd; d0 += 64) {
            int rem = PL_MIN(64, hd - d0), nb = (rem + 15) / 16;
            __mmask16 ml = rem % 16 ? (__mmask16)((1u << (rem % 16)) - 1) : (__mmask16)0xFFFF;
            for (int r0 = 0; r0 < R; r0 += 4) {
                switch (nb) {
                case 1: tile_pv(tb->o, hd, st, C, vr, r0, d0, 1, ml); break;
                case 2: tile_pv(tb->o, hd, st, C, vr, r0, d0, 2, ml); break;
                case 3: tile_pv(tb->o, hd, st, C, vr, r0, d0, 3, ml); break;
                default: tile_pv(tb->o, hd, st, C, vr, r0, d0, 4, ml); break;
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int d = 0; d < hd; d++) dst[r][d] = tb->o[(size_t)r * hd + d];
}
#endif

static void scores(const float *q, const void *const *k, int C, int hd, float scale, float *s,
                   int kt) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        scores_avx512(q, k, C, hd, scale, s, kt);
        return;
    }
    if (plx_isa >= PL_ISA_AVX2) {
        scores_avx2(q, k, C, hd, scale, s, kt);
        return;
    }
#endif
    scores_scalar(q, k, C, hd, scale, s, kt);
}

/* dot_tail_f16 is sum_d double(q[d] * k[d]) over n elements (F32 products, a double sum in
 * order): the tail of scores_f16_ggml below AVX2. */
static double dot_tail_f16(const float *q, const uint16_t *k, int n) {
    double s = 0.0;
    for (int d = 0; d < n; d++) s += (double)(q[d] * plx_f16_to_f32(k[d]));
    return s;
}

#if PL_X86
/* reduce8_pd returns the vector whose lane i is the sum of the lanes of a[i], added as GCC's
 * _mm512_reduce_add_pd adds one vector (lanes j and j+4, then j and j+2, then the two left). */
PL_TARGET_AVX512 static inline __m512d reduce8_pd(const __m512d a[8]) {
    __m512d h[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* keys 2i, 2i+1: [a_{j+4} + a_j, j < 4] each */
        h[i] = _mm512_add_pd(_mm512_shuffle_f64x2(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)),
                             _mm512_shuffle_f64x2(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)));
    /* keys 4i..4i+3: [h_{j+2} + h_j, j < 2] each */
    const __m512d g0 = _mm512_add_pd(_mm512_shuffle_f64x2(h[0], h[1], _MM_SHUFFLE(3, 1, 3, 1)),
                                     _mm512_shuffle_f64x2(h[0], h[1], _MM_SHUFFLE(2, 0, 2, 0)));
    const __m512d g1 = _mm512_add_pd(_mm512_shuffle_f64x2(h[2], h[3], _MM_SHUFFLE(3, 1, 3, 1)),
                                     _mm512_shuffle_f64x2(h[2], h[3], _MM_SHUFFLE(2, 0, 2, 0)));
    const __m512i ev = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), od = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
    return _mm512_add_pd(_mm512_permutex2var_pd(g0, ev, g1), _mm512_permutex2var_pd(g0, od, g1));
}

/* transpose8_ps transposes the 8x8 matrix of rows r[0..7] in place. */
PL_TARGET_AVX512 static inline void transpose8_ps(__m256 r[8]) {
    __m256 t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

/* scores_tail_f16_avx512 is the part of scores_f16_ggml past the whole 64-element steps on
 * AVX-512, for hd with such a part: s[c] = (float)(s64_c + t_c) * scale, where s64_c is s[c] as
 * the 64-element steps left it (0.0 for hd < 64) and t_c the double sum of the remaining
 * elements' F32 products as ggml's AVX-512 tail sums it: eight double lanes over whole
 * 16-element steps, those lanes added as _mm512_reduce_add_pd adds them, then the last elements
 * one by one. Eight keys at a time: each its own accumulator over the 16-element steps, then the
 * keys in lanes for the reduction and the last elements.
 *
 * exact: the queries' elements are finite F16 values (the rounded queries always are). The
 * product of two F16 values has at most 22 significant bits and lies between 2^-48 and 2^32, so
 * its F32 rounding is exact: converted to double it is the double product, and adding it is a
 * double FMA of the elements widened to double. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
scores_tail_f16_avx512_t(const float *q, const void *const *k, int C, int hd, float scale, float *s,
                         const int exact) {
    const int hd64 = hd & ~63, n = hd - hd64, n16 = n & ~15;
    const float *qt = q + hd64;
    double qd[48]; /* exact: qt[0..n16) widened */
    if (exact)
        for (int d = 0; d < n16; d += 8) _mm512_storeu_pd(qd + d, _mm512_cvtps_pd(_mm256_loadu_ps(qt + d)));
    const __m256 scl = _mm256_set1_ps(scale);
    for (int c0 = 0; c0 < C; c0 += 8) {
        const int nc = PL_MIN(8, C - c0);
        const uint16_t *kr[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) kr[c] = (const uint16_t *)k[c0 + (c < nc ? c : 0)] + hd64; /* spare lanes repeat key 0 */
        __m512d acc[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) acc[c] = _mm512_setzero_pd();
        for (int d = 0; d < n16; d += 16) {
            if (exact) {
                const __m512d q0 = _mm512_loadu_pd(qd + d), q1 = _mm512_loadu_pd(qd + d + 8);
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) {
                    const __m512d k0 = _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr[c] + d))));
                    const __m512d k1 = _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr[c] + d + 8))));
                    acc[c] = _mm512_fmadd_pd(q0, k0, acc[c]);
                    acc[c] = _mm512_fmadd_pd(q1, k1, acc[c]);
                }
            } else {
                const __m512 qv = _mm512_loadu_ps(qt + d);
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) {
                    const __m512 p = _mm512_mul_ps(qv, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr[c] + d))));
                    acc[c] = _mm512_add_pd(acc[c], _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
                    acc[c] = _mm512_add_pd(acc[c], _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1))));
                }
            }
        }
        __m512d t = reduce8_pd(acc);
        for (int e0 = n16; e0 < n; e0 += 8) {
            const int ne = PL_MIN(8, n - e0);
            const __mmask8 me = (__mmask8)((1u << ne) - 1);
            const __m256 qv = _mm256_maskz_loadu_ps(me, qt + e0);
            __m256 pr[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) pr[c] = _mm256_mul_ps(qv, _mm256_cvtph_ps(_mm_maskz_loadu_epi16(me, kr[c] + e0)));
            transpose8_ps(pr); /* pr[e]: element e0+e of the eight keys */
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++)
                if (e < ne) t = _mm512_add_pd(t, _mm512_cvtps_pd(pr[e]));
        }
        const __mmask8 mc = (__mmask8)((1u << nc) - 1);
        const __m512d a = hd64 > 0 ? _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mc, s + c0)) : _mm512_setzero_pd();
        _mm256_mask_storeu_ps(s + c0, mc, _mm256_mul_ps(_mm512_cvtpd_ps(_mm512_add_pd(a, t)), scl));
    }
}

/* f16_exact512 reports whether x[0..n) are all finite F16 values. */
PL_TARGET_AVX512 static int f16_exact512(const float *x, int n) {
    for (int d = 0; d < n; d += 16) {
        const __mmask16 m = n - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - d)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + d);
        const __m512 r = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __mmask16 ok = _mm512_cmp_ps_mask(v, r, _CMP_EQ_OQ) &
                             _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(65504.0f), _CMP_LE_OQ);
        if ((__mmask16)(ok & m) != m) return 0;
    }
    return 1;
}

PL_TARGET_AVX512 static void scores_tail_f16_avx512(const float *q, const void *const *k, int C, int hd,
                                                    float scale, float *s) {
    const int hd64 = hd & ~63;
    if (f16_exact512(q + hd64, (hd - hd64) & ~15)) scores_tail_f16_avx512_t(q, k, C, hd, scale, s, 1);
    else scores_tail_f16_avx512_t(q, k, C, hd, scale, s, 0);
}

/* f16_exact256 is f16_exact512 on AVX2. */
PL_TARGET_AVX2 static int f16_exact256(const float *x, int n) {
    const __m256 lim = _mm256_set1_ps(65504.0f), mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int d = 0; d < n; d += 8) {
        /* lanes past n load 0, which is exact */
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - d), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 v = _mm256_maskload_ps(x + d, m);
        const __m256 r = _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(v, r, _CMP_EQ_OQ),
                                        _mm256_cmp_ps(_mm256_and_ps(v, mag), lim, _CMP_LE_OQ));
        if (_mm256_movemask_ps(ok) != 0xFF) return 0;
    }
    return 1;
}

/* reduce4x8_pd returns the vector whose lane i is the sum of the eight double lanes of key i,
 * held as lo[i] (lanes 0-3) and hi[i] (lanes 4-7), added in reduce8_pd's order: lanes j and j+4,
 * then j and j+2, then the two left. */
PL_TARGET_AVX2 static inline __m256d reduce4x8_pd(const __m256d lo[4], const __m256d hi[4]) {
    __m256d h[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) h[i] = _mm256_add_pd(lo[i], hi[i]); /* [a_j + a_{j+4}, j < 4] */
    /* keys 0, 2 and 1, 3: [h_j + h_{j+2}, j < 2] each */
    const __m256d g02 = _mm256_add_pd(_mm256_permute2f128_pd(h[0], h[2], 0x20), _mm256_permute2f128_pd(h[0], h[2], 0x31));
    const __m256d g13 = _mm256_add_pd(_mm256_permute2f128_pd(h[1], h[3], 0x20), _mm256_permute2f128_pd(h[1], h[3], 0x31));
    return _mm256_add_pd(_mm256_unpacklo_pd(g02, g13), _mm256_unpackhi_pd(g02, g13));
}

/* scores_tail_f16_avx2 is scores_tail_f16_avx512 on AVX2, bit for bit: each key's eight double
 * lanes are two vectors of four (lanes 0-3 and 4-7), added in the same order over the 16-element
 * steps, reduced as reduce8_pd reduces them, then the last elements one by one. Four keys at a
 * time (their accumulators fill half the registers); exact as there. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
scores_tail_f16_avx2_t(const float *q, const void *const *k, int C, int hd, float scale, float *s,
                       const int exact) {
    const int hd64 = hd & ~63, n = hd - hd64, n16 = n & ~15;
    const float *qt = q + hd64;
    double qd[48]; /* exact: qt[0..n16) widened */
    if (exact)
        for (int d = 0; d < n16; d += 4) _mm256_storeu_pd(qd + d, _mm256_cvtps_pd(_mm_loadu_ps(qt + d)));
    const __m128 scl = _mm_set1_ps(scale);
    for (int c0 = 0; c0 < C; c0 += 4) {
        const int nc = PL_MIN(4, C - c0);
        const uint16_t *kr[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) kr[c] = (const uint16_t *)k[c0 + (c < nc ? c : 0)] + hd64; /* spare lanes repeat key 0 */
        __m256d lo[4], hi[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) lo[c] = hi[c] = _mm256_setzero_pd();
        for (int d = 0; d < n16; d += 8) { /* elements d..d+7 into lanes 0..7 */
            if (exact) {
                const __m256d q0 = _mm256_loadu_pd(qd + d), q1 = _mm256_loadu_pd(qd + d + 4);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr[c] + d)));
                    lo[c] = _mm256_fmadd_pd(q0, _mm256_cvtps_pd(_mm256_castps256_ps128(x)), lo[c]);
                    hi[c] = _mm256_fmadd_pd(q1, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), hi[c]);
                }
            } else {
                const __m256 qv = _mm256_loadu_ps(qt + d);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    const __m256 p = _mm256_mul_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr[c] + d))));
                    lo[c] = _mm256_add_pd(lo[c], _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
                    hi[c] = _mm256_add_pd(hi[c], _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
                }
            }
        }
        __m256d t = reduce4x8_pd(lo, hi);
        for (int e = n16; e < n; e++) {
            const __m128 kv = _mm_cvtph_ps(_mm_setr_epi16((short)kr[0][e], (short)kr[1][e], (short)kr[2][e], (short)kr[3][e], 0, 0, 0, 0));
            t = _mm256_add_pd(t, _mm256_cvtps_pd(_mm_mul_ps(_mm_set1_ps(qt[e]), kv)));
        }
        float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (hd64 > 0)
            for (int c = 0; c < nc; c++) a[c] = s[c0 + c];
        float r[4];
        _mm_storeu_ps(r, _mm_mul_ps(_mm256_cvtpd_ps(_mm256_add_pd(_mm256_cvtps_pd(_mm_loadu_ps(a)), t)), scl));
        for (int c = 0; c < nc; c++) s[c0 + c] = r[c];
    }
}

PL_TARGET_AVX2 static void scores_tail_f16_avx2(const float *q, const void *const *k, int C, int hd,
                                                float scale, float *s) {
    const int hd64 = hd & ~63;
    if (f16_exact256(q + hd64, (hd - hd64) & ~15)) scores_tail_f16_avx2_t(q, k, C, hd, scale, s, 1);
    else scores_tail_f16_avx2_t(q, k, C, hd, scale, s, 0);
}
#endif

/* scores_f16_ggml is scores() for an F16 cache summed as ggml_vec_dot_f16 does (AVX-512 build):
 * whole 64-element steps in F32, the remaining elements' F32 products in double; then scaled. */
static void scores_f16_ggml(const float *q, const void *const *k, int C, int hd, float scale, float *s) {
    const int hd64 = hd & ~63;
    if (hd64 == hd) {
        scores(q, k, C, hd, scale, s, PL_F16);
        return;
    }
    if (hd64 > 0) scores(q, k, C, hd64, 1.0f, s, PL_F16);
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        scores_tail_f16_avx512(q, k, C, hd, scale, s);
        return;
    }
    if (plx_isa >= PL_ISA_AVX2) {
        scores_tail_f16_avx2(q, k, C, hd, scale, s);
        return;
    }
#endif
    for (int c = 0; c < C; c++) {
        double a = hd64 > 0 ? (double)s[c] : 0.0;
        a += dot_tail_f16(q + hd64, (const uint16_t *)k[c] + hd64, hd - hd64);
        s[c] = (float)a * scale;
    }
}

static void pv(float *o, float alpha, const float *p, int nv, const void *const *v, int hd, int kt) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        pv_avx512(o, alpha, p, nv, v, hd, kt);
        return;
    }
    if (plx_isa >= PL_ISA_AVX2) {
        pv_avx2(o, alpha, p, nv, v, hd, kt);
        return;
    }
#endif
    pv_scalar(o, alpha, p, nv, v, hd, kt);
}

static float expsum(float *s, int nv, float mx) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) return expsum_avx512(s, nv, mx);
    if (plx_isa >= PL_ISA_AVX2) return expsum_avx2(s, nv, mx);
#endif
    return expsum_scalar(s, nv, mx);
}

/* round_weights: s[c] = s[c] * inv rounded to kt, for c < n, the value back as float. */
#if PL_X86
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
round_weights_avx2_t(float *s, int64_t n, float inv, const int kt) {
    const __m256 iv = _mm256_set1_ps(inv);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) _mm256_storeu_ps(s + c, round8(_mm256_mul_ps(_mm256_loadu_ps(s + c), iv), kt));
    for (; c < n; c++) s[c] = round_to(s[c] * inv, kt);
}

PL_TARGET_AVX2 static void round_weights_avx2(float *s, int64_t n, float inv, int kt) {
#define ROUND_WEIGHTS(KT) round_weights_avx2_t(s, n, inv, KT)
    KV_CASES(kt, ROUND_WEIGHTS)
#undef ROUND_WEIGHTS
}
#endif

/* row_max returns the largest of s[0..n), n >= 1; row_sum_f64 the sum of s[0..n) in double. */
#if PL_X86
PL_TARGET_AVX2 static float row_max_avx2(const float *s, int64_t n) {
    int64_t c = 0;
    float mx = s[0];
    if (n >= 8) {
        __m256 a = _mm256_loadu_ps(s);
        for (c = 8; c + 8 <= n; c += 8) a = _mm256_max_ps(a, _mm256_loadu_ps(s + c));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        mx = _mm_cvtss_f32(h);
    }
    for (; c < n; c++) mx = s[c] > mx ? s[c] : mx;
    return mx;
}

#endif

static float row_max(const float *s, int64_t n) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX2) return row_max_avx2(s, n);
#endif
    float mx = s[0];
    for (int64_t c = 1; c < n; c++) mx = s[c] > mx ? s[c] : mx;
    return mx;
}

static double row_sum_f64(const float *s, int64_t n) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX2) return plx_sum_f64_avx2(s, n);
#endif
    double r = 0.0;
    for (int64_t c = 0; c < n; c++) r += (double)s[c];
    return r;
}

/* round_row: y = x rounded to kt, as float, n elements. */
static void round_row(float *y, const float *x, int n, int kt) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX2) {
        round_to_avx2(y, x, n, kt);
        return;
    }
#endif
    for (int i = 0; i < n; i++) y[i] = round_to(x[i], kt);
}

static void round_weights(float *s, int64_t n, float inv, int kt) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX2) {
        round_weights_avx2(s, n, inv, kt);
        return;
    }
#endif
    for (int64_t c = 0; c < n; c++) s[c] = round_to(s[c] * inv, kt);
}

/* ================================================================ attention */

typedef struct {
    int32_t seq, g, t0, t1; /* tokens [t0, t1) of the batch, kv head g */
} att_item;

/* Positions ahead of the current chunk whose key and value rows are prefetched. Decoding streams
 * the weights through the last-level cache, so the cache's rows come from memory each token, and
 * consecutive positions are a whole cache row apart (all heads of a slot): too far apart for the
 * hardware prefetchers, so without this attention waits on memory latency. PF_KEYS: the keys
 * ahead in the first of two passes (F16 and BF16 caches, few rows), whose values are prefetched
 * as that pass reaches them; more in flight at once only queue (a cache in memory took longer at
 * 128). */
#define PF_AHEAD 128
#define PF_KEYS 32

/* The rows of one kv head in a cache: position p's row is at base + slot(p)*rowb, bytes long. */
typedef struct {
    const uint8_t *base; /* the cache plus the head's offset */
    int64_t rowb, bytes, bs;
    int shift; /* bs = 2^shift, or -1 */
    const int32_t *table;
} att_rows;

/* rows_at sets rows[c] to the row of position j0+c for c < C, block by block. */
static inline void rows_at(const att_rows *a, int32_t j0, int C, const void **rows) {
    int64_t blk = a->shift >= 0 ? j0 >> a->shift : j0 / a->bs, off = j0 - blk * a->bs;
    for (int c = 0; c < C;) {
        const int n = (int)PL_MIN((int64_t)(C - c), a->bs - off);
        const uint8_t *r = a->base + ((int64_t)a->table[blk] * a->bs + off) * a->rowb;
        for (int i = 0; i < n; i++, r += a->rowb) rows[c + i] = r;
        c += n;
        blk++;
        off = 0;
    }
}

/* prefetch_line asks for the cache line at p in the core's L2. On Zen 4, prefetches into L1
 * (prefetcht0) keep fewer misses in flight: attention over a cache in memory ran about 1.5 times
 * as long with them. An asm statement, as GCC drops __builtin_prefetch from some loop nests. */
static inline void prefetch_line(const void *p) {
#if PL_X86
    __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 0, 2);
#endif
}

/* prefetch_span prefetches the rows of positions p0 .. p1-1. */
static inline void prefetch_span(const att_rows *a, int64_t p0, int64_t p1) {
    if (p0 >= p1) return;
    int64_t blk = a->shift >= 0 ? p0 >> a->shift : p0 / a->bs, off = p0 - blk * a->bs;
    for (int64_t p = p0; p < p1;) {
        const int64_t n = PL_MIN(p1 - p, a->bs - off);
        const uint8_t *r = a->base + ((int64_t)a->table[blk] * a->bs + off) * a->rowb;
        for (int64_t i = 0; i < n; i++, r += a->rowb) /* every line the row touches */
            for (const uint8_t *l = r - ((uintptr_t)r & 63); l < r + a->bytes; l += 64) prefetch_line(l);
        p += n;
        blk++;
        off = 0;
    }
}

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *q;
    const uint8_t *kc, *vc;
    int kvt;
    int64_t width, bs;
    pl_attn_cfg a;
    int G;
    const pl_seq *seqs;
    const int32_t *blocks;
    const att_item *items;
    int64_t nitems;
    int rmax;
    int64_t sc; /* score columns a row of scratch */
    int shift;  /* bs = 2^shift, or -1 */
    int full;   /* full attention: every token sees all m positions (no mask) */
    int64_t m;
} att_job;

/* Per-thread scratch of an attention job: rmax query rows of hd, sc score columns a row (CH for
 * F32 caches, whose softmax is online; every position of the longest sequence, rounded up to
 * CH, for F16 and BF16 caches, whose weights are normalised before p·V; all m positions, rounded
 * up, for full attention). */
typedef struct {
    float *o, *m, *l, *s, *qr; /* [rmax][hd], [rmax], [rmax], [rmax][sc], [rmax][hd] */
    const void **kp, **vp;     /* [CH] row pointers */
    att_tile_buf tb;           /* rows in lanes (AVX-512) */
    double *tail;              /* [rmax][hd] double-summed part of p·V (F16 caches) */
} att_scratch;

static size_t att_scratch_floats(int rmax, int hd, int64_t sc) {
    return (size_t)rmax * hd * 2 + 2 * (size_t)rmax + (size_t)rmax * sc + /* o, qr, m, l, s */
           2 * CH * (sizeof(void *) / sizeof(float)) +                    /* kp, vp */
           (size_t)hd * 16 + (size_t)sc * 16 + (size_t)16 * hd + 2 * (size_t)CH * hd + /* tb */
           2 * (size_t)rmax * hd + 8 + /* tail: [rmax][hd] doubles */
           64;
}

static att_scratch att_layout(float *buf, int rmax, int hd, int64_t sc) {
    att_scratch a;
    a.o = buf;
    a.qr = a.o + (size_t)rmax * hd;
    a.m = a.qr + (size_t)rmax * hd;
    a.l = a.m + rmax;
    a.s = a.l + rmax;
    a.kp = (const void **)(void *)(a.s + (size_t)rmax * sc);
    a.vp = a.kp + CH;
    float *f = (float *)(((uintptr_t)(a.vp + CH) + 63) & ~(uintptr_t)63);
    a.tb.qt = f;
    a.tb.st = a.tb.qt + (size_t)hd * 16;
    a.tb.o = a.tb.st + (size_t)sc * 16;
    a.tb.kf = a.tb.o + (size_t)16 * hd;
    a.tb.vf = a.tb.kf + (size_t)CH * hd;
    a.tail = (double *)(((uintptr_t)(a.tb.vf + (size_t)CH * hd) + 7) & ~(uintptr_t)7);
    return a;
}

/* prefetch_start prefetches the keys and values of the first PF_AHEAD positions (up to pmax),
 * chunk by chunk. */
static void prefetch_start(const att_rows *K, const att_rows *V, int32_t pmax) {
    const int64_t n = PL_MIN((int64_t)PF_AHEAD, (int64_t)pmax + 1);
    for (int64_t p = 0; p < n; p += CH) {
        prefetch_span(K, p, PL_MIN(p + CH, n));
        prefetch_span(V, p, PL_MIN(p + CH, n));
    }
}

/* gather fills kp, vp with the key and value rows of positions j0 .. j0+C-1 and prefetches rows
 * ahead (up to pmax): for one pass (kp and vp) both rows of the positions PF_AHEAD on; for the
 * keys' pass of two (vp NULL) the keys PF_KEYS on and the values of j0 .., which the second pass
 * reads; for the values' pass (kp NULL) none. */
static void gather(const att_rows *K, const att_rows *V, int32_t j0, int C, int32_t pmax,
                   const void **kp, const void **vp) {
    if (kp != NULL) rows_at(K, j0, C, kp);
    if (vp != NULL) rows_at(V, j0, C, vp);
    if (kp == NULL) return;
    const int64_t p0 = (int64_t)j0 + (vp != NULL ? PF_AHEAD : PF_KEYS), p1 = PL_MIN(p0 + C, (int64_t)pmax + 1);
    prefetch_span(K, p0, p1);
    if (vp != NULL) prefetch_span(V, p0, p1);
    else prefetch_span(V, j0, PL_MIN((int64_t)j0 + C, (int64_t)pmax + 1));
}

#if PL_X86
/* ---------------------------------------------------------------- AVX2, full attention
 *
 * Items of full attention below AVX-512 take their rows two at a time: the scores of two rows
 * against four keys in eight accumulators (six loads for eight FMAs), and 32 elements of two
 * rows' outputs in registers across a chunk of values. Every row sees every key, so the softmax
 * is exact (two passes) for every cache type.
 */

/* scores2_avx2_t: s0[c] = scale*(q0 . k_c) and s1[c] = scale*(q1 . k_c) for c < C. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
scores2_avx2_t(const float *q0, const float *q1, const void *const *k, int C, int hd, float scale,
               float *s0, float *s1, const int kt) {
    const int hd8 = hd & ~7;
    for (int c0 = 0; c0 < C; c0 += 4) {
        const int nc = PL_MIN(4, C - c0);
        const void *kr[4];
        for (int c = 0; c < 4; c++) kr[c] = k[c0 + (c < nc ? c : nc - 1)]; /* spare keys repeat the last */
        __m256 a[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        for (int d = 0; d < hd8; d += 8) {
            const __m256 x0 = _mm256_loadu_ps(q0 + d), x1 = _mm256_loadu_ps(q1 + d);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m256 kv = ld8(kr[c], d, kt);
                __asm__("" : "+x"(kv)); /* one load for both rows, not one folded into each FMA */
                a[c] = _mm256_fmadd_ps(x0, kv, a[c]);
                a[4 + c] = _mm256_fmadd_ps(x1, kv, a[4 + c]);
            }
        }
        float t[8];
        _mm256_storeu_ps(t, plx_hsum8x256(a));
        for (int c = 0; c < nc; c++) {
            float u0 = t[c], u1 = t[4 + c];
            for (int d = hd8; d < hd; d++) {
                const float kv = kv_at(kr[c], d, kt);
                u0 += q0[d] * kv;
                u1 += q1[d] * kv;
            }
            s0[c0 + c] = u0 * scale;
            s1[c0 + c] = u1 * scale;
        }
    }
}

/* pv2_avx2_t: o0[d0..d0+32) += sum_{c<C} p0[c] * v_c[d0..d0+32), o1 likewise with p1. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
pv2_avx2_t(float *o0, float *o1, const float *p0, const float *p1, int C, const void *const *v,
           int d0, const int kt) {
    __m256 a[4], b[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        a[i] = _mm256_loadu_ps(o0 + d0 + 8 * i);
        b[i] = _mm256_loadu_ps(o1 + d0 + 8 * i);
    }
    for (int c = 0; c < C; c++) {
        const __m256 w0 = _mm256_set1_ps(p0[c]), w1 = _mm256_set1_ps(p1[c]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m256 x = ld8(v[c], d0 + 8 * i, kt);
            __asm__("" : "+x"(x)); /* one load for both rows */
            a[i] = _mm256_fmadd_ps(w0, x, a[i]);
            b[i] = _mm256_fmadd_ps(w1, x, b[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(o0 + d0 + 8 * i, a[i]);
        _mm256_storeu_ps(o1 + d0 + 8 * i, b[i]);
    }
}

PL_TARGET_AVX2 static void scores2_avx2(const float *q0, const float *q1, const void *const *k, int C,
                                        int hd, float scale, float *s0, float *s1, int kt) {
#define SCORES2(KT) scores2_avx2_t(q0, q1, k, C, hd, scale, s0, s1, KT)
    KV_CASES(kt, SCORES2)
#undef SCORES2
}

PL_TARGET_AVX2 static void pv2_avx2(float *o0, float *o1, const float *p0, const float *p1, int C,
                                    const void *const *v, int d0, int kt) {
#define PV2(KT) pv2_avx2_t(o0, o1, p0, p1, C, v, d0, KT)
    KV_CASES(kt, PV2)
#undef PV2
}

/* full_qrow returns query row r of an item: its rounding to the keys' type in the scratch for
 * F16 or BF16 keys. */
static inline const float *full_qrow(const att_job *j, const att_item *it, const att_scratch *sc, int r, int half) {
    const int hd = j->a.head_dim, G = j->G;
    if (half) return sc->qr + (size_t)r * hd;
    return j->q + ((int64_t)(it->t0 + r / G) * j->a.n_head + it->g * G + r % G) * hd;
}

/* att_full_rows_avx2 runs an item of full attention (R >= 2 rows, each seeing all m keys) with
 * the kernels above: the scores of every key, the softmax of each row (F16 and BF16: the
 * weights normalised and rounded to that type), then p.V. */
static void att_full_rows_avx2(const att_job *j, const att_item *it, att_scratch *sc, int R) {
    const int hd = j->a.head_dim, G = j->G, nh = j->a.n_head, kt = j->kvt, half = kt != PL_F32;
    const int64_t esz = half ? 2 : 4;
    const int64_t rowb = j->width * esz, headb = (int64_t)it->g * hd * esz;
    const int32_t m = (int32_t)j->m;
    float *S = sc->s, *O = sc->o;
    if (half) {
        for (int r = 0; r < R; r++) {
            const int t = it->t0 + r / G, h = it->g * G + r % G;
            round_row(sc->qr + (size_t)r * hd, j->q + ((int64_t)t * nh + h) * hd, hd, kt);
        }
    }
    for (int32_t j0 = 0; j0 < m; j0 += CH) {
        const int C = (int)PL_MIN((int64_t)CH, (int64_t)(m - j0));
        for (int c = 0; c < C; c++) sc->kp[c] = j->kc + (int64_t)(j0 + c) * rowb + headb;
        for (int r = 0; r < R; r += 2) {
            const int r1 = PL_MIN(r + 1, R - 1);
            scores2_avx2(full_qrow(j, it, sc, r, half), full_qrow(j, it, sc, r1, half), sc->kp, C, hd,
                         j->a.scale, S + (size_t)r * j->sc + j0, S + (size_t)r1 * j->sc + j0, kt);
        }
    }
    for (int r = 0; r < R; r++) {
        float *sr = S + (size_t)r * j->sc;
        const float mx = row_max(sr, m);
        /* F32 exponentials, a double sum */
        for (int32_t c0 = 0; c0 < m; c0 += CH) expsum(sr + c0, (int)PL_MIN((int64_t)CH, (int64_t)(m - c0)), mx);
        const double sum = row_sum_f64(sr, m);
        if (half) round_weights(sr, m, (float)(1.0 / sum), kt);
        else sc->l[r] = (float)(1.0 / sum);
    }
    memset(O, 0, (size_t)R * hd * sizeof(float));
    const int hd32 = hd & ~31;
    for (int32_t j0 = 0; j0 < m; j0 += CH) {
        const int C = (int)PL_MIN((int64_t)CH, (int64_t)(m - j0));
        for (int c = 0; c < C; c++) sc->vp[c] = j->vc + (int64_t)(j0 + c) * rowb + headb;
        for (int r = 0; r < R; r += 2) {
            const int r1 = PL_MIN(r + 1, R - 1);
            const float *p0 = S + (size_t)r * j->sc + j0, *p1 = S + (size_t)r1 * j->sc + j0;
            float *o0 = O + (size_t)r * hd, *o1 = O + (size_t)r1 * hd;
            for (int d0 = 0; d0 < hd32; d0 += 32) pv2_avx2(o0, o1, p0, p1, C, sc->vp, d0, kt);
            for (int d = hd32; d < hd; d++) {
                float a0 = o0[d], a1 = o1[d];
                for (int c = 0; c < C; c++) {
                    const float x = kv_at(sc->vp[c], d, kt);
                    a0 += p0[c] * x;
                    a1 += p1[c] * x;
                }
                o0[d] = a0;
                o1[d] = a1;
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const int t = it->t0 + r / G, h = it->g * G + r % G;
        float *d = j->dst + ((int64_t)t * nh + h) * hd;
        const float f = half ? 1.0f : sc->l[r];
        for (int e = 0; e < hd; e++) d[e] = O[(size_t)r * hd + e] * f;
    }
}
#endif

/* pv_tail_f16 adds to tr[d] (double) the F32 products p[c]·v_c[d] for positions nf <= c < nv of
 * an F16 cache, in position order for every d: the part of ggml's p·V dot product past its whole
 * 64-element steps. The vector form rounds exactly as the scalar one. */
#if PL_X86
/* NB blocks of 16 elements of tr from d0 (the last masked to ml) held in registers, as two
 * vectors of doubles each, across all the positions. exact: the weights p[nf..nv) are finite F16
 * values (the rounded weights always are), so each F32 product is exact and adding it is a
 * double FMA (as in scores_tail_f16_avx512_t). */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
pv_tail_blk_avx512(double *tr, const float *p, int nf, int nv, const void *const *v, int d0,
                   const int NB, __mmask16 ml, const int exact) {
    __m512d lo[8], hi[8];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        const __mmask16 mb = b == NB - 1 ? ml : (__mmask16)0xFFFF;
        lo[b] = _mm512_maskz_loadu_pd((__mmask8)mb, tr + d0 + 16 * b);
        hi[b] = _mm512_maskz_loadu_pd((__mmask8)(mb >> 8), tr + d0 + 16 * b + 8);
    }
    for (int c = nf; c < nv; c++) {
        const uint16_t *vr = (const uint16_t *)v[c] + d0;
        if (exact) {
            const __m512d pc = _mm512_set1_pd((double)p[c]);
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++) {
                const __mmask16 mb = b == NB - 1 ? ml : (__mmask16)0xFFFF;
                const __m512d x0 = _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_maskz_loadu_epi16((__mmask8)mb, vr + 16 * b)));
                const __m512d x1 = _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_maskz_loadu_epi16((__mmask8)(mb >> 8), vr + 16 * b + 8)));
                lo[b] = _mm512_fmadd_pd(pc, x0, lo[b]);
                hi[b] = _mm512_fmadd_pd(pc, x1, hi[b]);
            }
        } else {
            const __m512 pc = _mm512_set1_ps(p[c]);
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++) {
                const __mmask16 mb = b == NB - 1 ? ml : (__mmask16)0xFFFF;
                const __m512 prod = _mm512_mul_ps(pc, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mb, vr + 16 * b)));
                lo[b] = _mm512_add_pd(lo[b], _mm512_cvtps_pd(_mm512_castps512_ps256(prod)));
                hi[b] = _mm512_add_pd(hi[b], _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(prod), 1))));
            }
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        const __mmask16 mb = b == NB - 1 ? ml : (__mmask16)0xFFFF;
        _mm512_mask_storeu_pd(tr + d0 + 16 * b, (__mmask8)mb, lo[b]);
        _mm512_mask_storeu_pd(tr + d0 + 16 * b + 8, (__mmask8)(mb >> 8), hi[b]);
    }
}

__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
pv_tail_f16_avx512_t(double *tr, const float *p, int nf, int nv, const void *const *v, int hd,
                     const int exact) {
    for (int d0 = 0; d0 < hd; d0 += 128) {
        const int rem = PL_MIN(128, hd - d0), nb = (rem + 15) / 16;
        const __mmask16 ml = rem % 16 ? (__mmask16)((1u << (rem % 16)) - 1) : (__mmask16)0xFFFF;
#define PV_TAIL_BLK(NB) pv_tail_blk_avx512(tr, p, nf, nv, v, d0, NB, ml, exact)
        PLX_CASES8(nb, PV_TAIL_BLK)
#undef PV_TAIL_BLK
    }
}

PL_TARGET_AVX512 static void pv_tail_f16_avx512(double *tr, const float *p, int nf, int nv,
                                                const void *const *v, int hd) {
    if (f16_exact512(p + nf, nv - nf)) pv_tail_f16_avx512_t(tr, p, nf, nv, v, hd, 1);
    else pv_tail_f16_avx512_t(tr, p, nf, nv, v, hd, 0);
}

/* pv_tail_blk_avx2 is pv_tail_blk_avx512 on AVX2: NB blocks of 8 elements of tr from d0, as two
 * vectors of four doubles each, in registers across the positions; exact as there. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
pv_tail_blk_avx2(double *tr, const float *p, int nf, int nv, const void *const *v, int d0,
                 const int NB, const int exact) {
    __m256d lo[4], hi[4];
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) {
        lo[b] = _mm256_loadu_pd(tr + d0 + 8 * b);
        hi[b] = _mm256_loadu_pd(tr + d0 + 8 * b + 4);
    }
    for (int c = nf; c < nv; c++) {
        const uint16_t *vr = (const uint16_t *)v[c] + d0;
        if (exact) {
            const __m256d pc = _mm256_set1_pd((double)p[c]);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) {
                const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + 8 * b)));
                lo[b] = _mm256_fmadd_pd(pc, _mm256_cvtps_pd(_mm256_castps256_ps128(x)), lo[b]);
                hi[b] = _mm256_fmadd_pd(pc, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), hi[b]);
            }
        } else {
            const __m256 pc = _mm256_set1_ps(p[c]);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) {
                const __m256 prod = _mm256_mul_ps(pc, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + 8 * b))));
                lo[b] = _mm256_add_pd(lo[b], _mm256_cvtps_pd(_mm256_castps256_ps128(prod)));
                hi[b] = _mm256_add_pd(hi[b], _mm256_cvtps_pd(_mm256_extractf128_ps(prod, 1)));
            }
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) {
        _mm256_storeu_pd(tr + d0 + 8 * b, lo[b]);
        _mm256_storeu_pd(tr + d0 + 8 * b + 4, hi[b]);
    }
}

/* Whole 8-element blocks 32 elements a pass, the last hd % 8 elements one by one. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
pv_tail_f16_avx2_t(double *tr, const float *p, int nf, int nv, const void *const *v, int hd,
                   const int exact) {
    const int hd8 = hd & ~7;
    for (int d0 = 0; d0 < hd8; d0 += 32) {
        switch (PL_MIN(32, hd8 - d0) / 8) {
        case 1: pv_tail_blk_avx2(tr, p, nf, nv, v, d0, 1, exact); break;
        case 2: pv_tail_blk_avx2(tr, p, nf, nv, v, d0, 2, exact); break;
        case 3: pv_tail_blk_avx2(tr, p, nf, nv, v, d0, 3, exact); break;
        default: pv_tail_blk_avx2(tr, p, nf, nv, v, d0, 4, exact); break;
        }
    }
    for (int d = hd8; d < hd; d++) {
        double a = tr[d];
        for (int c = nf; c < nv; c++) a += (double)(p[c] * kv_at(v[c], d, PL_F16));
        tr[d] = a;
    }
}

PL_TARGET_AVX2 static void pv_tail_f16_avx2(double *tr, const float *p, int nf, int nv,
                                            const void *const *v, int hd) {
    if (f16_exact256(p + nf, nv - nf)) pv_tail_f16_avx2_t(tr, p, nf, nv, v, hd, 1);
    else pv_tail_f16_avx2_t(tr, p, nf, nv, v, hd, 0);
}
#endif

static void pv_tail_f16(double *tr, const float *p, int nf, int nv, const void *const *v, int hd) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        pv_tail_f16_avx512(tr, p, nf, nv, v, hd);
        return;
    }
    if (plx_isa >= PL_ISA_AVX2) {
        pv_tail_f16_avx2(tr, p, nf, nv, v, hd);
        return;
    }
#endif
    for (int c = nf; c < nv; c++)
        for (int d = 0; d < hd; d++) tr[d] += (double)(p[c] * kv_at(v[c], d, PL_F16));
}

static void att_item_run(const att_job *j, const att_item *it, float *buf) {
    const int hd = j->a.head_dim, G = j->G, nh = j->a.n_head, kt = j->kvt;
    const pl_seq *s = &j->seqs[it->seq];
    const int R = (it->t1 - it->t0) * G;
    att_scratch sc = att_layout(buf, j->rmax, hd, j->sc);
    const int64_t esz = kt == PL_F32 ? 4 : 2;
    const int64_t rowb = j->width * esz, headb = (int64_t)it->g * hd * esz, rowbytes = hd * esz;
    const int32_t *table = j->blocks + s->blocks_off;
    /* position of batch token t: pos0 + step*t (full attention: m-1 for every token) */
    const int32_t pos0 = j->full ? (int32_t)(j->m - 1) : s->ctx_len - s->count - s->start;
    const int32_t step = j->full ? 0 : 1;
    const int32_t pmax = pos0 + step * (it->t1 - 1);

    const att_rows K = {j->kc + headb, rowb, rowbytes, j->bs, j->shift, table};
    const att_rows V = {j->vc + headb, rowb, rowbytes, j->bs, j->shift, table};
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512 && R >= 8 && R <= 16) {
        prefetch_start(&K, &V, pmax);
        const float *qs[16];
        float *ds[16];
        int32_t ps[16];
        for (int r = 0; r < R; r++) {
            int t = it->t0 + r / G, h = it->g * G + r % G;
            qs[r] = j->q + ((int64_t)t * nh + h) * hd;
            ds[r] = j->dst + ((int64_t)t * nh + h) * hd;
            ps[r] = pos0 + step * t;
        }
        if (kt != PL_F32)
            att_tile512_half(qs, ds, ps, R, hd, j->a.scale, kt, pmax, j->kc, j->vc, rowb, headb,
                             table, j->bs, j->shift, sc.kp, sc.vp, &sc.tb);
        else
            att_tile512(qs, ds, ps, R, hd, j->a.scale, PL_F32, pmax, j->kc, j->vc, rowb, headb, table,
                        j->bs, j->shift, sc.kp, sc.vp, &sc.tb);
        return;
    }
    if (j->full && plx_isa == PL_ISA_AVX2 && R >= 2) {
        prefetch_start(&K, &V, pmax);
        att_full_rows_avx2(j, it, &sc, R);
        return;
    }
#endif
    float *O = sc.o, *M = sc.m, *L = sc.l, *S = sc.s;
    memset(O, 0, (size_t)R * hd * sizeof(float));
    if (kt != PL_F32) {
        /* Two passes, as llama.cpp's F16 products compute it: queries rounded to the cache's
         * type, every score stored, the exact softmax of each row, its weights rounded to that
         * type, then p·V. The keys are prefetched first (see gather). F16 sums its products in
         * ggml's order (scores_f16_ggml, pv_tail_f16); BF16, which llama.cpp's CPU backend does
         * not hold, in the kernels' own F32 order. */
        const int f16 = kt == PL_F16;
        prefetch_span(&K, 0, PL_MIN((int64_t)PF_KEYS, (int64_t)pmax + 1));
        for (int r = 0; r < R; r++) {
            int t = it->t0 + r / G, h = it->g * G + r % G;
            const float *qr = j->q + ((int64_t)t * nh + h) * hd;
            round_row(sc.qr + (size_t)r * hd, qr, hd, kt);
        }
        for (int32_t j0 = 0; j0 <= pmax; j0 += CH) {
            int C = (int)PL_MIN((int64_t)CH, (int64_t)(pmax + 1 - j0));
            gather(&K, &V, j0, C, pmax, sc.kp, NULL);
            for (int r = 0; r < R; r++) {
                int32_t p = pos0 + step * (it->t0 + r / G);
                int nv = (int)PL_MIN((int64_t)C, (int64_t)p - j0 + 1);
                if (nv <= 0) continue;
                const float *qr = sc.qr + (size_t)r * hd;
                float *sr = S + (size_t)r * j->sc + j0;
                if (f16) scores_f16_ggml(qr, sc.kp, nv, hd, j->a.scale, sr);
                else scores(qr, sc.kp, nv, hd, j->a.scale, sr, kt);
            }
        }
        for (int r = 0; r < R; r++) {
            int32_t n = pos0 + step * (it->t0 + r / G) + 1; /* positions 0..p */
            float *sr = S + (size_t)r * j->sc;
            const float mx = row_max(sr, n);
            /* as ggml_soft_max: F32 exponentials, a double sum */
            for (int32_t c0 = 0; c0 < n; c0 += CH) expsum(sr + c0, (int)PL_MIN((int64_t)CH, (int64_t)(n - c0)), mx);
            const double sum = row_sum_f64(sr, n);
            round_weights(sr, n, (float)(1.0 / sum), kt);
        }
        /* ggml's p·V is a dot product over the cache's n_kv cells (the context rounded up to 32;
         * full attention: the m positions): whole 64-element steps in F32, the rest of the
         * positions' F32 products in double. BF16: every position in F32. */
        const int32_t nkv = j->full ? (int32_t)j->m : (int32_t)(((int64_t)s->ctx_len + 31) & ~(int64_t)31);
        const int32_t np = f16 ? nkv & ~63 : INT32_MAX;
        double *tail = sc.tail;
        memset(tail, 0, (size_t)R * hd * sizeof(double));
        for (int32_t j0 = 0; j0 <= pmax; j0 += CH) {
            int C = (int)PL_MIN((int64_t)CH, (int64_t)(pmax + 1 - j0));
            gather(&K, &V, j0, C, -1, NULL, sc.vp);
            for (int r = 0; r < R; r++) {
                int32_t p = pos0 + step * (it->t0 + r / G);
                int nv = (int)PL_MIN((int64_t)C, (int64_t)p - j0 + 1);
                if (nv <= 0) continue;
                const float *pr = S + (size_t)r * j->sc + j0;
                int nf = (int)PL_MAX(0, PL_MIN((int64_t)nv, (int64_t)np - j0)); /* F32 part */
                if (nf > 0) pv(O + (size_t)r * hd, 1.0f, pr, nf, sc.vp, hd, kt);
                if (nf < nv) pv_tail_f16(tail + (size_t)r * hd, pr, nf, nv, sc.vp, hd);
            }
        }
        for (int r = 0; r < R; r++) {
            int t = it->t0 + r / G, h = it->g * G + r % G;
            float *d = j->dst + ((int64_t)t * nh + h) * hd;
            for (int e = 0; e < hd; e++) d[e] = (float)((double)O[(size_t)r * hd + e] + tail[(size_t)r * hd + e]);
        }
        return;
    }
    /* F32: one pass, online softmax */
    prefetch_start(&K, &V, pmax);
    for (int r = 0; r < R; r++) {
        M[r] = -INFINITY;
        L[r] = 0.0f;
    }
    for (int32_t j0 = 0; j0 <= pmax; j0 += CH) {
        int C = (int)PL_MIN((int64_t)CH, (int64_t)(pmax + 1 - j0));
        gather(&K, &V, j0, C, pmax, sc.kp, sc.vp);
        for (int r = 0; r < R; r++) {
            int t = it->t0 + r / G, h = it->g * G + r % G;
            int32_t p = pos0 + step * t;
            int nv = (int)PL_MIN((int64_t)C, (int64_t)p - j0 + 1);
            if (nv <= 0) continue;
            const float *qr = j->q + ((int64_t)t * nh + h) * hd;
            float *sr = S + (size_t)r * CH;
            scores(qr, sc.kp, nv, hd, j->a.scale, sr, PL_F32);
            float mx = sr[0];
            for (int c = 1; c < nv; c++) mx = sr[c] > mx ? sr[c] : mx;
            float mnew = mx > M[r] ? mx : M[r];
            float alpha = M[r] == -INFINITY ? 0.0f : expf(M[r] - mnew);
            float sum = expsum(sr, nv, mnew);
            L[r] = L[r] * alpha + sum;
            M[r] = mnew;
            pv(O + (size_t)r * hd, alpha, sr, nv, sc.vp, hd, PL_F32);
        }
    }
    for (int r = 0; r < R; r++) {
        int t = it->t0 + r / G, h = it->g * G + r % G;
        float *d = j->dst + ((int64_t)t * nh + h) * hd;
        float inv = 1.0f / L[r];
        for (int e = 0; e < hd; e++) d[e] = O[(size_t)r * hd + e] * inv;
    }
}

static void job_att(void *p, int ith, int nth) {
    att_job *j = (att_job *)p;
    (void)nth;
    float *buf = (float *)plx_tscratch(j->ctx, ith);
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->nitems) att_item_run(j, &j->items[i], buf);
}

/* att_launch runs a prepared job: scratch for every thread, then its items (one inline, several
 * on the pool). */
static int att_launch(pl_ctx *ctx, att_job *j) {
    if (plx_tscratch_reserve(ctx, att_scratch_floats(j->rmax, j->a.head_dim, j->sc) * sizeof(float)) != PL_OK)
        return PL_ERR_NOMEM;
    plx_chunk_reset(ctx);
    if (j->nitems == 1) {
        att_item_run(j, &j->items[0], (float *)plx_tscratch(ctx, 0));
        return PL_OK;
    }
    plx_run(ctx, job_att, j);
    return PL_OK;
}

int pl_attention(pl_ctx *ctx, float *dst, const float *q, int64_t n, const void *kc,
                 const void *vc, int kvtype, int64_t slots, int64_t width, int64_t block_size,
                 const pl_attn_cfg *a, const pl_seq *seqs, int64_t n_seqs, const int32_t *blocks,
                 int64_t n_blocks_total) {
    if (ctx == NULL || a == NULL || n < 0 || slots < 0 || width < 0 || block_size <= 0 ||
        n_seqs < 0 || n_blocks_total < 0)
        return PL_ERR_ARG;
    if (!pl_supports(PL_OP_KV, kvtype)) return PL_ERR_UNSUPPORTED;
    if (a->n_head <= 0 || a->n_kv_head <= 0 || a->head_dim <= 0 || a->n_head % a->n_kv_head != 0)
        return PL_ERR_ARG;
    if ((int64_t)a->n_kv_head * a->head_dim != width || !isfinite(a->scale)) return PL_ERR_ARG;
    if (n_seqs == 0 || n == 0) return PL_OK;
    if (dst == NULL || q == NULL || kc == NULL || vc == NULL || seqs == NULL) return PL_ERR_ARG;
    if (n > INT32_MAX / 2) return PL_ERR_ARG;
    const int64_t nblk = slots / block_size;
    int64_t nitems = 0;
    const int G = a->n_head / a->n_kv_head;
    const int T = PL_MAX(1, TILE_ROWS / G);
    for (int64_t i = 0; i < n_seqs; i++) {
        const pl_seq *s = &seqs[i];
        if (s->start < 0 || s->count < 0 || (int64_t)s->start + s->count > n || s->count > s->ctx_len)
            return PL_ERR_ARG;
        if (s->count == 0) continue;
        int64_t need = ((int64_t)s->ctx_len + block_size - 1) / block_size;
        if (s->n_blocks < need || s->blocks_off < 0 || (int64_t)s->blocks_off + need > n_blocks_total)
            return PL_ERR_ARG;
        if (blocks == NULL) return PL_ERR_ARG;
        for (int64_t b = 0; b < need; b++) {
            int32_t id = blocks[s->blocks_off + b];
            if (id < 0 || id >= nblk) return PL_ERR_ARG;
        }
        nitems += (int64_t)((s->count + T - 1) / T) * a->n_kv_head;
    }
    if (nitems == 0) return PL_OK;
    att_item *items = (att_item *)plx_scratch(ctx, (size_t)nitems * sizeof(att_item));
    if (items == NULL) return PL_ERR_NOMEM;
    /* later tiles (more keys) first, so that the dynamic schedule ends on short items */
    int64_t ni = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        const pl_seq *s = &seqs[i];
        int ntile = (s->count + T - 1) / T;
        for (int tl = ntile - 1; tl >= 0; tl--) {
            for (int g = 0; g < a->n_kv_head; g++) {
                items[ni].seq = (int32_t)i;
                items[ni].g = g;
                items[ni].t0 = s->start + tl * T;
                items[ni].t1 = s->start + PL_MIN(s->count, (tl + 1) * T);
                ni++;
            }
        }
    }
    att_job j;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.dst = dst;
    j.q = q;
    j.kc = (const uint8_t *)kc;
    j.vc = (const uint8_t *)vc;
    j.kvt = kvtype;
    j.width = width;
    j.bs = block_size;
    j.a = *a;
    j.G = G;
    j.seqs = seqs;
    j.blocks = blocks;
    j.items = items;
    j.nitems = nitems;
    j.rmax = T * G;
    j.shift = (block_size & (block_size - 1)) == 0 ? __builtin_ctzll((unsigned long long)block_size) : -1;
    j.sc = CH;
    if (kvtype != PL_F32) {
        int64_t maxctx = 0;
        for (int64_t i = 0; i < n_seqs; i++)
            if (seqs[i].count > 0) maxctx = PL_MAX(maxctx, (int64_t)seqs[i].ctx_len);
        j.sc = (maxctx + CH - 1) / CH * CH;
    }
    return att_launch(ctx, &j);
}

/* ================================================================ full attention
 *
 * Attention without a cache or a mask runs the same items and kernels: keys and values are one
 * block of m rows (block table {0}, block size m rounded up to a power of two, so that a
 * position's slot is itself) and every token's position is m-1, so each sees every row. Items
 * are (kv head, tile of tokens), head-major so that the threads work on one head's keys and
 * values at a time while they fit in the cores' caches.
 */

int pl_full_attention(pl_ctx *ctx, float *dst, const float *q, int64_t n, const void *k,
                      const void *v, int kvtype, int64_t m, const pl_attn_cfg *a) {
    if (ctx == NULL || a == NULL || n < 0 || m < 0) return PL_ERR_ARG;
    if (kvtype != PL_F32 && kvtype != PL_F16) return PL_ERR_UNSUPPORTED;
    if (a->n_head <= 0 || a->n_kv_head <= 0 || a->head_dim <= 0 || a->n_head % a->n_kv_head != 0 ||
        !isfinite(a->scale))
        return PL_ERR_ARG;
    if (n == 0) return PL_OK;
    if (m == 0 || dst == NULL || q == NULL || k == NULL || v == NULL) return PL_ERR_ARG;
    if (n > INT32_MAX / 2 || m > INT32_MAX / 2) return PL_ERR_ARG;
    const int G = a->n_head / a->n_kv_head;
    const int T = PL_MAX(1, TILE_ROWS / G);
    const int64_t ntile = (n + T - 1) / T;
    const int64_t nitems = ntile * a->n_kv_head;
    att_item *items = (att_item *)plx_scratch(ctx, (size_t)nitems * sizeof(att_item));
    if (items == NULL) return PL_ERR_NOMEM;
    int64_t ni = 0;
    for (int g = 0; g < a->n_kv_head; g++) {
        for (int64_t tl = 0; tl < ntile; tl++) {
            items[ni].seq = 0;
            items[ni].g = g;
            items[ni].t0 = (int32_t)(tl * T);
            items[ni].t1 = (int32_t)PL_MIN(n, (tl + 1) * T);
            ni++;
        }
    }
    static const int32_t one_block = 0;
    pl_seq seq = {0, (int32_t)n, (int32_t)m, 0, 1};
    att_job j;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.dst = dst;
    j.q = q;
    j.kc = (const uint8_t *)k;
    j.vc = (const uint8_t *)v;
    j.kvt = kvtype;
    j.width = (int64_t)a->n_kv_head * a->head_dim;
    /* One block holding all m positions, its size rounded up to a power of two: slot_of is then
     * a shift and a mask (position p is slot p) instead of two divisions by m for every key
     * each tile of queries reads (which cost as much as the tile's arithmetic for m = 1500). */
    j.bs = 1;
    while (j.bs < m) j.bs <<= 1;
    j.a = *a;
    j.G = G;
    j.seqs = &seq;
    j.blocks = &one_block;
    j.items = items;
    j.nitems = nitems;
    j.rmax = T * G;
    j.shift = __builtin_ctzll((unsigned long long)j.bs);
    j.sc = (m + CH - 1) / CH * CH; /* whole rows of scores (two-pass softmax) */
    j.full = 1;
    j.m = m;
    return att_launch(ctx, &j);
}
