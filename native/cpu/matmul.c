/*
 * matmul.c: dst = x · wᵀ for every weight type, and GetRows.
 *
 * Quantised weights: each row of x is converted once to the weights' dot type and packed
 * (quant.c); weight rows are unpacked a group at a time into per-thread panels and multiplied by
 * register-tiled integer kernels (RM weight rows × RN activation rows per tile). One activation
 * row (decode) uses the same kernels with RN = 1 and panels of RM rows, which stay in L1.
 * F32 weights: own matrix-vector kernel for one row, OpenBLAS sgemm (one OpenBLAS thread per
 * worker, each on its own block of weight rows) for several.
 * F16/BF16 weights: x rounded to the weight type, then either a converting matrix-vector kernel
 * (few rows) or weight panels widened to F32 and sgemm. With AVX-512, 2 to 16 rows of x go
 * through a register-tiled kernel (4 weight rows × 4 rows of x, weights widened once and
 * prefetched ahead) and more through the packed GEMM below.
 */
#include <cblas.h>
#include <stdlib.h>

#include "internal.h"
#include "qunits.h"

void plx_blas_threads(int n) { openblas_set_num_threads(n); }

/* ================================================================ integer kernels
 *
 * A kernel multiplies RM unpacked weight rows (w, stride ws bytes) by RN packed activation rows
 * (a, stride as bytes), kp elements each, and writes out[j*RM + i] = row i · act j.
 */
typedef void (*plx_qk_fn)(int64_t kp, const uint8_t *w, int64_t ws, const uint8_t *a, int64_t as,
                          float *out);

/* ---------------------------------------------------------------- scalar */

static inline void qk_scalar_body(int64_t kp, const uint8_t *w, const uint8_t *a, float *out,
                                  int has_min, int signed_u) {
    const float *dw = (const float *)(w + kp), *mn = (const float *)(w + 2 * kp);
    const int8_t *q = (const int8_t *)a;
    const float *dx = (const float *)(a + kp), *aux = (const float *)(a + 2 * kp);
    const int32_t *bias = (const int32_t *)(a + 2 * kp);
    float acc = 0.0f, accm = 0.0f;
    for (int64_t l = 0; l < kp / 4; l++) {
        int s = has_min ? 0 : bias[l];
        for (int t = 0; t < 4; t++) {
            int uv = signed_u ? (int)(int8_t)w[4 * l + t] : (int)w[4 * l + t];
            s += uv * q[4 * l + t];
        }
        acc += (float)s * (dw[l] * dx[l]);
        if (has_min) accm += mn[l] * aux[l];
    }
    *out = acc + accm;
}

static void qk_scalar_off(int64_t kp, const uint8_t *w, int64_t ws, const uint8_t *a, int64_t as,
                          float *out) {
    (void)ws;
    (void)as;
    qk_scalar_body(kp, w, a, out, 0, 0);
}
static void qk_scalar_min(int64_t kp, const uint8_t *w, int64_t ws, const uint8_t *a, int64_t as,
                          float *out) {
    (void)ws;
    (void)as;
    qk_scalar_body(kp, w, a, out, 1, 0);
}
static void qk_scalar_signed(int64_t kp, const uint8_t *w, int64_t ws, const uint8_t *a,
                             int64_t as, float *out) {
    (void)ws;
    (void)as;
    qk_scalar_body(kp, w, a, out, 0, 1);
}

#if PL_X86
/* ---------------------------------------------------------------- AVX2 */

PL_TARGET_AVX2 static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
qk_avx2_body(int64_t kp, const uint8_t *w, int64_t ws, const uint8_t *a, int64_t as, float *out,
             const int RM, const int RN, const int has_min, const int signed_u) {
    __m256 acc[4][4];
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int i = 0; i < RM; i++)
#pragma GCC unroll 4
        for (int j = 0; j < RN; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t o = 0; o < kp; o += 32) {
#pragma GCC unroll 4
        for (int i = 0; i < RM; i++) {
            const uint8_t *wi = w + i * ws;
            __m256i wv = _mm256_load_si256((const __m256i *)(wi + o));
            __m256 dwv = _mm256_load_ps((const float *)(wi + kp + o));
            __m256i wa = signed_u ? _mm256_sign_epi8(wv, wv) : wv;
#pragma GCC unroll 4
            for (int j = 0; j < RN; j++) {
                const uint8_t *aj = a + j * as;
                __m256i xv = _mm256_load_si256((const __m256i *)(aj + o));
                if (signed_u) xv = _mm256_sign_epi8(xv, wv);
                __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xv), ones);
                if (!has_min && !signed_u)
                    d = _mm256_add_epi32(d, _mm256_load_si256((const __m256i *)(aj + 2 * kp + o)));
                __m256 sc = _mm256_mul_ps(dwv, _mm256_load_ps((const float *)(aj + kp + o)));
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, acc[i][j]);
                if (has_min)
                    acc[i][j] = _mm256_fmadd_ps(_mm256_load_ps((const float *)(wi + 2 * kp + o)),
                                                _mm256_load_ps((const float *)(aj + 2 * kp + o)),
                                                acc[i][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < RN; j++)
#pragma GCC unroll 4
        for (int i = 0; i < RM; i++) out[j * RM + i] = hsum256(acc[i][j]);
}

#define QK_AVX2(NAME, RM, RN, MIN, SGN)                                                          \
    PL_TARGET_AVX2 static void NAME(int64_t kp, const uint8_t *w, int64_t ws, const uint8_t *a,  \
                                    int64_t as, float *out) {                                   \
        qk_avx2_body(kp, w, ws, a, as, out, RM, RN, MIN, SGN);                                   \
    }
#define AVX2_RM 2
QK_AVX2(qk_avx2_off_1, AVX2_RM, 1, 0, 0)
QK_AVX2(qk_avx2_off_2, AVX2_RM, 2, 0, 0)
QK_AVX2(qk_avx2_off_3, AVX2_RM, 3, 0, 0)
QK_AVX2(qk_avx2_off_4, AVX2_RM, 4, 0, 0)
QK_AVX2(qk_avx2_min_1, AVX2_RM, 1, 1, 0)
QK_AVX2(qk_avx2_min_2, AVX2_RM, 2, 1, 0)
QK_AVX2(qk_avx2_min_3, AVX2_RM, 3, 1, 0)
QK_AVX2(qk_avx2_min_4, AVX2_RM, 4, 1, 0)
QK_AVX2(qk_avx2_sgn_1, AVX2_RM, 1, 0, 1)
QK_AVX2(qk_avx2_sgn_2, AVX2_RM, 2, 0, 1)
QK_AVX2(qk_avx2_sgn_3, AVX2_RM, 3, 0, 1)
QK_AVX2(qk_avx2_sgn_4, AVX2_RM, 4, 0, 1)

/* ---------------------------------------------------------------- AVX-512 VNNI */

__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
qk_avx512_body(int64_t kp, const uint8_t *w, int64_t ws, const uint8_t *a, int64_t as,
               float *out, const int RM, const int RN, const int has_min) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < RM; i++)
#pragma GCC unroll 4
        for (int j = 0; j < RN; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t o = 0; o < kp; o += 64) {
        __m512i xv[4], bv[4];
#pragma GCC unroll 4
        for (int j = 0; j < RN; j++) {
            xv[j] = _mm512_load_si512((const void *)(a + j * as + o));
            bv[j] = has_min ? _mm512_setzero_si512()
                            : _mm512_load_si512((const void *)(a + j * as + 2 * kp + o));
        }
#pragma GCC unroll 4
        for (int i = 0; i < RM; i++) {
            const uint8_t *wi = w + i * ws;
            __m512i wv = _mm512_load_si512((const void *)(wi + o));
            __m512 dwv = _mm512_load_ps((const float *)(wi + kp + o));
#pragma GCC unroll 4
            for (int j = 0; j < RN; j++) {
                const uint8_t *aj = a + j * as;
                __m512i d = _mm512_dpbusd_epi32(bv[j], wv, xv[j]);
                __m512 sc = _mm512_mul_ps(dwv, _mm512_load_ps((const float *)(aj + kp + o)));
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[i][j]);
                if (has_min)
                    acc[i][j] = _mm512_fmadd_ps(_mm512_load_ps((const float *)(wi + 2 * kp + o)),
                                                _mm512_load_ps((const float *)(aj + 2 * kp + o)),
                                                acc[i][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < RN; j++)
#pragma GCC unroll 4
        for (int i = 0; i < RM; i++) out[j * RM + i] = _mm512_reduce_add_ps(acc[i][j]);
}

#define QK_AVX512(NAME, RM, RN, MIN)                                                             \
    PL_TARGET_AVX512 static void NAME(int64_t kp, const uint8_t *w, int64_t ws, const uint8_t *a, \
                                      int64_t as, float *out) {                                 \
        qk_avx512_body(kp, w, ws, a, as, out, RM, RN, MIN);                                      \
    }
#define AVX512_RM 4
QK_AVX512(qk_avx512_off_1, AVX512_RM, 1, 0)
QK_AVX512(qk_avx512_off_2, AVX512_RM, 2, 0)
QK_AVX512(qk_avx512_off_3, AVX512_RM, 3, 0)
QK_AVX512(qk_avx512_off_4, AVX512_RM, 4, 0)
QK_AVX512(qk_avx512_min_1, AVX512_RM, 1, 1)
QK_AVX512(qk_avx512_min_2, AVX512_RM, 2, 1)
QK_AVX512(qk_avx512_min_3, AVX512_RM, 3, 1)
QK_AVX512(qk_avx512_min_4, AVX512_RM, 4, 1)

/* ---------------------------------------------------------------- AVX-512 fused matrix-vector
 *
 * Each weight unit is decoded in registers and multiplied at once, so that weights stream from
 * memory exactly once and nothing is stored in between. Weight rows go one at a time:
 * interleaving the streams of two rows measured 2-3x slower from DRAM (decode's case). */

/* Up to eight activation rows (stride as bytes) against the same weight rows: each weight unit is
 * decoded in registers once and multiplied with every activation row, so that a small batch of
 * decode tokens (a server's step) streams the weights once instead of once a token.
 * out[j*ldo + r] = row r · activation j.
 *
 * The hardware prefetchers fall behind on these weight streams (a stall at every new page);
 * prefetching PLX_GEMVN_PREFETCH bytes ahead of the unit being decoded made the 110M model's
 * eight-sequence step 1.3-1.4x faster, and its one-sequence step 1.3-1.5x (184-206 -> 241-298
 * tokens/s, Q8_0). The weights come from DRAM there; in-cache benchmarks do not show it. */
#define PLX_GEMVN_PREFETCH 4096
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
gemv512n_t(const int T, const int RN, const uint8_t *w, size_t wrow, int64_t nrows, int64_t k,
           const uint8_t *act, int64_t as, float *out, int64_t ldo) {
    const int has_min = plx_type_has_min(T);
    const int64_t kp = plx_kpad(k);
    const int64_t span = (int64_t)wrow * 64 / k;
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *row = w + r * wrow;
        __m512 acc[8], accm[8];
#pragma GCC unroll 8
        for (int j = 0; j < RN; j++) acc[j] = accm[j] = _mm512_setzero_ps();
        PLX_FOR_UNITS(T, row, k, ui, o, {
            {
                const char *pf = (const char *)row + PLX_GEMVN_PREFETCH + ui * span;
                _mm_prefetch(pf, _MM_HINT_T0);
                _mm_prefetch(pf + 64, _MM_HINT_T0);
            }
#pragma GCC unroll 8
            for (int j = 0; j < RN; j++) {
                const uint8_t *a = act + j * as + 64 * ui;
                __m512i bias = has_min ? zero : _mm512_load_si512((const void *)(a + 2 * kp));
                __m512i d = _mm512_dpbusd_epi32(bias, o.u, _mm512_load_si512((const void *)a));
                __m512 sc = _mm512_mul_ps(o.dw, _mm512_load_ps((const float *)(a + kp)));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[j]);
                if (has_min) accm[j] = _mm512_fmadd_ps(o.mn, _mm512_load_ps((const float *)(a + 2 * kp)), accm[j]);
            }
        });
#pragma GCC unroll 8
        for (int j = 0; j < RN; j++) out[j * ldo + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[j], accm[j]));
    }
}

#define GEMV512N(NAME, T, RN)                                                                    \
    PL_TARGET_AVX512 static void NAME(const uint8_t *w, size_t wrow, int64_t nrows, int64_t k,   \
                                      const uint8_t *act, int64_t as, float *out, int64_t ldo) { \
        gemv512n_t(T, RN, w, wrow, nrows, k, act, as, out, ldo);                                 \
    }
#define GEMV512N_ALL(T, name)                                                                    \
    GEMV512N(gemv512n_##name##_2, T, 2)                                                          \
    GEMV512N(gemv512n_##name##_3, T, 3)                                                          \
    GEMV512N(gemv512n_##name##_4, T, 4)                                                          \
    GEMV512N(gemv512n_##name##_5, T, 5)                                                          \
    GEMV512N(gemv512n_##name##_6, T, 6)                                                          \
    GEMV512N(gemv512n_##name##_7, T, 7)                                                          \
    GEMV512N(gemv512n_##name##_8, T, 8)
GEMV512N_ALL(PL_Q4_0, q4_0)
GEMV512N_ALL(PL_Q4_1, q4_1)
GEMV512N_ALL(PL_Q5_0, q5_0)
GEMV512N_ALL(PL_Q5_1, q5_1)
GEMV512N_ALL(PL_Q8_0, q8_0)
GEMV512N_ALL(PL_Q2_K, q2_k)
GEMV512N_ALL(PL_Q3_K, q3_k)
GEMV512N_ALL(PL_Q4_K, q4_k)
GEMV512N_ALL(PL_Q5_K, q5_k)
GEMV512N_ALL(PL_Q6_K, q6_k)
GEMV512N_ALL(PL_IQ4_NL, iq4_nl)
GEMV512N_ALL(PL_IQ4_XS, iq4_xs)

/* One activation row: the same kernel (weights streamed exactly once, nothing stored). */
#define GEMV512(NAME, T)                                                                         \
    PL_TARGET_AVX512 static void NAME(const uint8_t *w, size_t wrow, int64_t nrows, int64_t k,   \
                                      const uint8_t *act, float *out) {                          \
        gemv512n_t(T, 1, w, wrow, nrows, k, act, 0, out, 0);                                     \
    }
GEMV512(gemv512_q4_0, PL_Q4_0)
GEMV512(gemv512_q4_1, PL_Q4_1)
GEMV512(gemv512_q5_0, PL_Q5_0)
GEMV512(gemv512_q5_1, PL_Q5_1)
GEMV512(gemv512_q8_0, PL_Q8_0)
GEMV512(gemv512_q2_k, PL_Q2_K)
GEMV512(gemv512_q3_k, PL_Q3_K)
GEMV512(gemv512_q4_k, PL_Q4_K)
GEMV512(gemv512_q5_k, PL_Q5_K)
GEMV512(gemv512_q6_k, PL_Q6_K)
GEMV512(gemv512_iq4_nl, PL_IQ4_NL)
GEMV512(gemv512_iq4_xs, PL_IQ4_XS)

/* ---------------------------------------------------------------- AVX2 fused matrix-vector */

/* Up to four activation rows against the same weight rows (AVX2), as gemv512n_t: each unit is
 * decoded once and multiplied with every activation row, with the operations of one row, so a
 * row's result does not depend on how many rows go with it. Four at most: with the min terms of
 * Q4_1/Q5_1/K-quants, eight accumulators already fill half of the sixteen registers. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
gemv256_t(const int T, const int RN, const uint8_t *w, size_t wrow, int64_t nrows, int64_t k,
          const uint8_t *act, int64_t as, float *out, int64_t ldo) {
    const int has_min = plx_type_has_min(T);
    const int64_t kp = plx_kpad(k);
    const int64_t span = (int64_t)wrow * 32 / k; /* bytes of weights a unit covers */
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *row = w + r * wrow;
        __m256 acc[4], accm[4];
#pragma GCC unroll 4
        for (int j = 0; j < RN; j++) acc[j] = accm[j] = _mm256_setzero_ps();
        PLX_FOR_UNITS8(T, row, k, ui, o, {
            _mm_prefetch((const char *)row + PLX_GEMVN_PREFETCH + ui * span, _MM_HINT_T0);
            /* signed weights (Q8_0, IQ4_NL, IQ4_XS): |w| times x with w's sign */
            const __m256i wa = plx_type_signed(T) ? _mm256_sign_epi8(o.u, o.u) : o.u;
#pragma GCC unroll 4
            for (int j = 0; j < RN; j++) {
                const uint8_t *a = act + j * as + 32 * ui;
                __m256i xv = _mm256_load_si256((const __m256i *)a);
                __m256i d;
                if (plx_type_signed(T)) {
                    d = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv, o.u)), ones);
                } else {
                    d = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xv), ones);
                    if (!has_min) d = _mm256_add_epi32(d, _mm256_load_si256((const __m256i *)(a + 2 * kp)));
                }
                __m256 sc = _mm256_mul_ps(o.dw, _mm256_load_ps((const float *)(a + kp)));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, acc[j]);
                if (has_min) accm[j] = _mm256_fmadd_ps(o.mn, _mm256_load_ps((const float *)(a + 2 * kp)), accm[j]);
            }
        });
#pragma GCC unroll 4
        for (int j = 0; j < RN; j++) out[j * ldo + r] = hsum256(_mm256_add_ps(acc[j], accm[j]));
    }
}

#define GEMV256(NAME, T)                                                                         \
    PL_TARGET_AVX2 static void NAME(const uint8_t *w, size_t wrow, int64_t nrows, int64_t k,     \
                                    const uint8_t *act, float *out) {                            \
        gemv256_t(T, 1, w, wrow, nrows, k, act, 0, out, 0);                                      \
    }
#define GEMV256N(NAME, T, RN)                                                                    \
    PL_TARGET_AVX2 static void NAME(const uint8_t *w, size_t wrow, int64_t nrows, int64_t k,     \
                                    const uint8_t *act, int64_t as, float *out, int64_t ldo) {   \
        gemv256_t(T, RN, w, wrow, nrows, k, act, as, out, ldo);                                  \
    }
#define GEMV256N_ALL(T, name)                                                                    \
    GEMV256N(gemv256n_##name##_2, T, 2)                                                          \
    GEMV256N(gemv256n_##name##_3, T, 3)                                                          \
    GEMV256N(gemv256n_##name##_4, T, 4)
GEMV256(gemv256_q4_0, PL_Q4_0)
GEMV256(gemv256_q4_1, PL_Q4_1)
GEMV256(gemv256_q5_0, PL_Q5_0)
GEMV256(gemv256_q5_1, PL_Q5_1)
GEMV256(gemv256_q8_0, PL_Q8_0)
GEMV256(gemv256_q2_k, PL_Q2_K)
GEMV256(gemv256_q3_k, PL_Q3_K)
GEMV256(gemv256_q4_k, PL_Q4_K)
GEMV256(gemv256_q5_k, PL_Q5_K)
GEMV256(gemv256_q6_k, PL_Q6_K)
GEMV256(gemv256_iq4_nl, PL_IQ4_NL)
GEMV256(gemv256_iq4_xs, PL_IQ4_XS)
GEMV256N_ALL(PL_Q4_0, q4_0)
GEMV256N_ALL(PL_Q4_1, q4_1)
GEMV256N_ALL(PL_Q5_0, q5_0)
GEMV256N_ALL(PL_Q5_1, q5_1)
GEMV256N_ALL(PL_Q8_0, q8_0)
GEMV256N_ALL(PL_Q2_K, q2_k)
GEMV256N_ALL(PL_Q3_K, q3_k)
GEMV256N_ALL(PL_Q4_K, q4_k)
GEMV256N_ALL(PL_Q5_K, q5_k)
GEMV256N_ALL(PL_Q6_K, q6_k)
GEMV256N_ALL(PL_IQ4_NL, iq4_nl)
GEMV256N_ALL(PL_IQ4_XS, iq4_xs)
#endif

/* plx_gemvn_fn: a fused kernel for several activation rows (none without x86 SIMD, but the
 * type is part of mm_job everywhere). */
typedef void (*plx_gemvn_fn)(const uint8_t *w, size_t wrow, int64_t nrows, int64_t k,
                             const uint8_t *act, int64_t as, float *out, int64_t ldo);

typedef void (*plx_gemv_fn)(const uint8_t *w, size_t wrow, int64_t nrows, int64_t k,
                            const uint8_t *act, float *out);

/* plx_gemv_pick returns the fused matrix-vector kernel for wtype under the current ISA, or NULL
 * where one activation row goes through panels and the tiled kernels instead. */
/* PLX_FUSED_TYPES(F) runs F(name) for the weight type of wtype that has fused kernels (their
 * names end in _name), inside a switch on wtype. */
#define PLX_FUSED_TYPES(F)                                                                       \
    switch (wtype) {                                                                             \
    case PL_Q4_0: F(q4_0);                                                                       \
    case PL_Q4_1: F(q4_1);                                                                       \
    case PL_Q5_0: F(q5_0);                                                                       \
    case PL_Q5_1: F(q5_1);                                                                       \
    case PL_Q8_0: F(q8_0);                                                                       \
    case PL_Q2_K: F(q2_k);                                                                       \
    case PL_Q3_K: F(q3_k);                                                                       \
    case PL_Q4_K: F(q4_k);                                                                       \
    case PL_Q5_K: F(q5_k);                                                                       \
    case PL_Q6_K: F(q6_k);                                                                       \
    case PL_IQ4_NL: F(iq4_nl);                                                                   \
    case PL_IQ4_XS: F(iq4_xs);                                                                   \
    }

static plx_gemv_fn plx_gemv_pick(int wtype) {
#if PL_X86
#define PICK512(name) return gemv512_##name
#define PICK256(name) return gemv256_##name
    if (plx_isa >= PL_ISA_AVX512) PLX_FUSED_TYPES(PICK512)
    if (plx_isa >= PL_ISA_AVX2) PLX_FUSED_TYPES(PICK256)
#undef PICK512
#undef PICK256
#endif
    (void)wtype;
    return NULL;
}

/* plx_gemvn_max is the most activation rows one fused kernel takes under the current ISA: 8 with
 * AVX-512, 4 with AVX2 (0: none; the panel kernels serve). */
static int plx_gemvn_max(void) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) return 8;
    if (plx_isa >= PL_ISA_AVX2) return 4;
#endif
    return 0;
}

/* plx_gemvn_pick returns the fused kernel for rn (2..plx_gemvn_max()) activation rows of weights
 * of wtype, or NULL where there is none. */
static plx_gemvn_fn plx_gemvn_pick(int wtype, int rn) {
#if PL_X86
#define PICK512(name)                                                                            \
    {                                                                                            \
        static const plx_gemvn_fn t[9] = {NULL, NULL, gemv512n_##name##_2, gemv512n_##name##_3,  \
                                          gemv512n_##name##_4, gemv512n_##name##_5,               \
                                          gemv512n_##name##_6, gemv512n_##name##_7,               \
                                          gemv512n_##name##_8};                                    \
        return t[rn];                                                                            \
    }
#define PICK256(name)                                                                            \
    {                                                                                            \
        static const plx_gemvn_fn t[5] = {NULL, NULL, gemv256n_##name##_2, gemv256n_##name##_3,  \
                                          gemv256n_##name##_4};                                    \
        return t[rn];                                                                            \
    }
    if (plx_isa >= PL_ISA_AVX512 && rn >= 2 && rn <= 8) PLX_FUSED_TYPES(PICK512)
    if (plx_isa == PL_ISA_AVX2 && rn >= 2 && rn <= 4) PLX_FUSED_TYPES(PICK256)
#undef PICK512
#undef PICK256
#endif
    (void)wtype;
    (void)rn;
    return NULL;
}

/* plx_qk_pick returns the kernels for qi under the current ISA: fns[rn-1] for rn = 1..*rnmax,
 * each handling *rm weight rows. */
static void plx_qk_pick(const plx_qinfo *qi, plx_qk_fn fns[4], int *rm, int *rnmax) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        static const plx_qk_fn off[4] = {qk_avx512_off_1, qk_avx512_off_2, qk_avx512_off_3,
                                         qk_avx512_off_4};
        static const plx_qk_fn min[4] = {qk_avx512_min_1, qk_avx512_min_2, qk_avx512_min_3,
                                         qk_avx512_min_4};
        memcpy(fns, qi->has_min ? min : off, sizeof off);
        *rm = AVX512_RM;
        *rnmax = 4;
        return;
    }
    if (plx_isa >= PL_ISA_AVX2) {
        static const plx_qk_fn off[4] = {qk_avx2_off_1, qk_avx2_off_2, qk_avx2_off_3,
                                         qk_avx2_off_4};
        static const plx_qk_fn min[4] = {qk_avx2_min_1, qk_avx2_min_2, qk_avx2_min_3,
                                         qk_avx2_min_4};
        static const plx_qk_fn sgn[4] = {qk_avx2_sgn_1, qk_avx2_sgn_2, qk_avx2_sgn_3,
                                         qk_avx2_sgn_4};
        memcpy(fns, qi->has_min ? min : qi->signed_u ? sgn : off, sizeof off);
        *rm = AVX2_RM;
        *rnmax = 4;
        return;
    }
#endif
    fns[0] = qi->has_min ? qk_scalar_min : qi->signed_u ? qk_scalar_signed : qk_scalar_off;
    fns[1] = fns[2] = fns[3] = NULL;
    *rm = 1;
    *rnmax = 1;
}

/* ================================================================ float kernels */

/* dot of a float row w with x over k, and the same for F16 / BF16 weight rows (x F32). */
static float dot_f32_scalar(const float *w, const float *x, int64_t k) {
    float s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= k; i += 4)
        for (int t = 0; t < 4; t++) s[t] += w[i + t] * x[i + t];
    for (; i < k; i++) s[0] += w[i] * x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static float dot_f16_scalar(const uint16_t *w, const float *x, int64_t k) {
    float s = 0.0f;
    for (int64_t i = 0; i < k; i++) s += plx_f16_to_f32(w[i]) * x[i];
    return s;
}

static float dot_bf16_scalar(const uint16_t *w, const float *x, int64_t k) {
    float s = 0.0f;
    for (int64_t i = 0; i < k; i++) s += plx_bf16_to_f32(w[i]) * x[i];
    return s;
}

#if PL_X86
/* Four weight rows (stride ws elements) against one x: out[i] = row i · x. */
PL_TARGET_AVX2 static void dot4_f32_avx2(const float *w, int64_t ws, const float *x, int64_t k,
                                         float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + ws + i), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 2 * ws + i), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 3 * ws + i), xv, a3);
    }
    out[0] = hsum256(a0);
    out[1] = hsum256(a1);
    out[2] = hsum256(a2);
    out[3] = hsum256(a3);
    for (; i < k; i++)
        for (int r = 0; r < 4; r++) out[r] += w[r * ws + i] * x[i];
}

PL_TARGET_AVX2 static inline __m256 load8_h(const uint16_t *p, int bf) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (bf) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

PL_TARGET_AVX2 static void dot4_h_avx2(const uint16_t *w, int64_t ws, const float *x, int64_t k,
                                       float *out, int bf) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(load8_h(w + i, bf), xv, a0);
        a1 = _mm256_fmadd_ps(load8_h(w + ws + i, bf), xv, a1);
        a2 = _mm256_fmadd_ps(load8_h(w + 2 * ws + i, bf), xv, a2);
        a3 = _mm256_fmadd_ps(load8_h(w + 3 * ws + i, bf), xv, a3);
    }
    out[0] = hsum256(a0);
    out[1] = hsum256(a1);
    out[2] = hsum256(a2);
    out[3] = hsum256(a3);
    for (; i < k; i++)
        for (int r = 0; r < 4; r++)
            out[r] += (bf ? plx_bf16_to_f32(w[r * ws + i]) : plx_f16_to_f32(w[r * ws + i])) * x[i];
}

PL_TARGET_AVX512 static void dot4_f32_avx512(const float *w, int64_t ws, const float *x,
                                             int64_t k, float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + ws + i), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 2 * ws + i), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 3 * ws + i), xv, a3);
    }
    if (i < k) {
        __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + ws + i), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + 2 * ws + i), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + 3 * ws + i), xv, a3);
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
}

PL_TARGET_AVX512 static inline __m512 load16_h(const uint16_t *p, int bf, __mmask16 m) {
    __m256i h = m == 0xFFFF ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);
    if (bf) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

PL_TARGET_AVX512 static void dot4_h_avx512(const uint16_t *w, int64_t ws, const float *x,
                                           int64_t k, float *out, int bf) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i);
        a0 = _mm512_fmadd_ps(load16_h(w + i, bf, 0xFFFF), xv, a0);
        a1 = _mm512_fmadd_ps(load16_h(w + ws + i, bf, 0xFFFF), xv, a1);
        a2 = _mm512_fmadd_ps(load16_h(w + 2 * ws + i, bf, 0xFFFF), xv, a2);
        a3 = _mm512_fmadd_ps(load16_h(w + 3 * ws + i, bf, 0xFFFF), xv, a3);
    }
    if (i < k) {
        __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
        a0 = _mm512_fmadd_ps(load16_h(w + i, bf, m), xv, a0);
        a1 = _mm512_fmadd_ps(load16_h(w + ws + i, bf, m), xv, a1);
        a2 = _mm512_fmadd_ps(load16_h(w + 2 * ws + i, bf, m), xv, a2);
        a3 = _mm512_fmadd_ps(load16_h(w + 3 * ws + i, bf, m), xv, a3);
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
}

/* RM consecutive float weight rows (F32, F16 or BF16; stride wrow bytes) times RN rows of x
 * (stride lda): out[j*RM + r] = row r · x_j. (One row of x keeps dot4's own AVX-512 kernels
 * above: routed through this one, GEMV 768x768 BF16 measured 3-6x slower and 4096x4096 F32 1.3-2.3x.) Each weight vector is widened once and multiplied
 * with every row of x, whose vectors come from L1; pf (0: none) is a byte distance at which to
 * prefetch the weight rows ahead of the ones being read. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
fdn_t(const int RM, const int RN, const uint8_t *w, size_t wrow, int wt, const float *x,
      int64_t lda, int64_t k, float *out, int64_t pf) {
    __m512 acc[4][4];
    const int esz = wt == PL_F32 ? 4 : 2;
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 4
        for (int j = 0; j < RN; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
        const __mmask16 m = k - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - i)) - 1);
        __m512 wv[4];
        if (pf) /* the RM rows are contiguous: cover the 16·esz·RM bytes this step reads */
            for (int l = 0; l < 16 * esz * RM; l += 64)
                _mm_prefetch((const char *)w + pf + i * esz * RM + l, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) {
            const uint8_t *row = w + r * wrow;
            wv[r] = wt == PL_F32 ? _mm512_maskz_loadu_ps(m, (const float *)row + i)
                                 : load16_h((const uint16_t *)row + i, wt == PL_BF16, m);
        }
#pragma GCC unroll 4
        for (int j = 0; j < RN; j++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + j * lda + i);
#pragma GCC unroll 4
            for (int r = 0; r < RM; r++) acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < RN; j++)
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) out[j * RM + r] = _mm512_reduce_add_ps(acc[r][j]);
}

typedef void (*plx_fdn_fn)(const uint8_t *w, size_t wrow, int wt, const float *x, int64_t lda,
                           int64_t k, float *out, int64_t pf);
#define FDN(RM, RN)                                                                              \
    PL_TARGET_AVX512 static void fdn_##RM##_##RN(const uint8_t *w, size_t wrow, int wt,          \
                                                 const float *x, int64_t lda, int64_t k,         \
                                                 float *out, int64_t pf) {                       \
        fdn_t(RM, RN, w, wrow, wt, x, lda, k, out, pf);                                          \
    }
FDN(4, 1)
FDN(4, 2)
FDN(4, 3)
FDN(4, 4)
FDN(1, 1)
FDN(1, 2)
FDN(1, 3)
FDN(1, 4)
static const plx_fdn_fn fdn4[5] = {NULL, fdn_4_1, fdn_4_2, fdn_4_3, fdn_4_4};
static const plx_fdn_fn fdn1[5] = {NULL, fdn_1_1, fdn_1_2, fdn_1_3, fdn_1_4};
#endif

/* dot4: four consecutive weight rows of type wt (F32, F16, BF16), row stride k elements. */
static void dot4(int wt, const void *w, const float *x, int64_t k, float *out) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        if (wt == PL_F32)
            dot4_f32_avx512((const float *)w, k, x, k, out);
        else
            dot4_h_avx512((const uint16_t *)w, k, x, k, out, wt == PL_BF16);
        return;
    }
    if (plx_isa >= PL_ISA_AVX2) {
        if (wt == PL_F32)
            dot4_f32_avx2((const float *)w, k, x, k, out);
        else
            dot4_h_avx2((const uint16_t *)w, k, x, k, out, wt == PL_BF16);
        return;
    }
#endif
    for (int r = 0; r < 4; r++) {
        if (wt == PL_F32)
            out[r] = dot_f32_scalar((const float *)w + r * k, x, k);
        else if (wt == PL_F16)
            out[r] = dot_f16_scalar((const uint16_t *)w + r * k, x, k);
        else
            out[r] = dot_bf16_scalar((const uint16_t *)w + r * k, x, k);
    }
}

static float dot1(int wt, const void *w, const float *x, int64_t k) {
    if (wt == PL_F32) return dot_f32_scalar((const float *)w, x, k);
    if (wt == PL_F16) return dot_f16_scalar((const uint16_t *)w, x, k);
    return dot_bf16_scalar((const uint16_t *)w, x, k);
}

#if PL_X86
PL_TARGET_AVX2 static void round_f16_avx2(const float *x, float *y, int64_t len) {
    int64_t i = 0;
    for (; i + 8 <= len; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    for (; i < len; i++) y[i] = plx_f16_to_f32(plx_f32_to_f16(x[i]));
}
#endif

/* Round x through F16 / BF16 back to F32 (the value the dot product of ggml's CPU backend sees). */
static void round_rows(int wt, const float *x, float *y, int64_t len) {
    if (wt == PL_F16) {
#if PL_X86
        if (plx_isa >= PL_ISA_AVX2) {
            round_f16_avx2(x, y, len);
            return;
        }
#endif
        for (int64_t i = 0; i < len; i++) y[i] = plx_f16_to_f32(plx_f32_to_f16(x[i]));
    } else {
        for (int64_t i = 0; i < len; i++) y[i] = plx_bf16_to_f32(plx_f32_to_bf16(x[i]));
    }
}

/* ================================================================ AVX-512 float GEMM
 *
 * dst[n, m] = x[n, k] · wᵀ for float weights (F32, F16 or BF16 rows of k). A work item is a
 * block of NR = 32 weight rows; for each KC slice of k it packs the block, widened to F32, as
 * [KC][32] (two vectors a k), then runs an MR = 8 by 32 register tile over all rows of x,
 * adding each slice's product into dst. */

#define FG_NR 32
#define FG_MR 8
#define FG_KC 256

#if PL_X86
/* Loads 16 elements of a weight row of type wt as floats. */
PL_TARGET_AVX512 static inline __m512 fg_load16(const uint8_t *row, int wt, int64_t e) {
    if (wt == PL_F32) return _mm512_loadu_ps((const float *)row + e);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + e));
    if (wt == PL_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* In-register transpose of 16 vectors of 16 floats. */
PL_TARGET_AVX512 static inline void fg_transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    /* r[4q+j] now holds, in each 128-bit lane L, rows 4q..4q+3 of column 4L+j */
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], _MM_SHUFFLE(2, 0, 2, 0));
        t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], _MM_SHUFFLE(3, 1, 3, 1));
        t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], _MM_SHUFFLE(2, 0, 2, 0));
        t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], _MM_SHUFFLE(3, 1, 3, 1));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], _MM_SHUFFLE(2, 0, 2, 0));
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], _MM_SHUFFLE(3, 1, 3, 1));
        r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* Packs rows 0..nr-1 (nr <= 32, the rest zero) of w, elements k0..k0+kc, into pk [kc][32]. */
PL_TARGET_AVX512 static void fg_pack(const uint8_t *w, size_t wrow, int wt, int64_t nr, int64_t k0,
                                     int kc, float *pk) {
    for (int h = 0; h < 2; h++) { /* rows 16h..16h+15 */
        int t = 0;
        for (; t + 16 <= kc; t += 16) {
            __m512 v[16];
            for (int r = 0; r < 16; r++)
                v[r] = 16 * h + r < nr ? fg_load16(w + (size_t)(16 * h + r) * wrow, wt, k0 + t) : _mm512_setzero_ps();
            fg_transpose16(v);
            for (int e = 0; e < 16; e++) _mm512_store_ps(pk + (t + e) * FG_NR + 16 * h, v[e]);
        }
        for (; t < kc; t++) {
            for (int r = 16 * h; r < 16 * h + 16; r++) {
                float f = 0.0f;
                if (r < nr) {
                    const uint8_t *row = w + (size_t)r * wrow;
                    if (wt == PL_F32) f = ((const float *)row)[k0 + t];
                    else if (wt == PL_F16) f = plx_f16_to_f32(((const uint16_t *)row)[k0 + t]);
                    else f = plx_bf16_to_f32(((const uint16_t *)row)[k0 + t]);
                }
                pk[t * FG_NR + r] = f;
            }
        }
    }
}

/* MR rows of x (stride lda) times the packed block: dst rows (stride ldc), columns masked by
 * m0/m1 (16 each); add to dst unless first. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
fg_tile(const float *x, int64_t lda, const float *pk, int kc, float *dst, int64_t ldc, const int MR,
        __mmask16 m0, __mmask16 m1, int first) {
    __m512 c0[FG_MR], c1[FG_MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
    }
    for (int t = 0; t < kc; t++) {
        __m512 b0 = _mm512_load_ps(pk + t * FG_NR), b1 = _mm512_load_ps(pk + t * FG_NR + 16);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 a = _mm512_set1_ps(x[i * lda + t]);
            c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        float *d = dst + i * ldc;
        if (!first) {
            c0[i] = _mm512_add_ps(c0[i], _mm512_maskz_loadu_ps(m0, d));
            c1[i] = _mm512_add_ps(c1[i], _mm512_maskz_loadu_ps(m1, d + 16));
        }
        _mm512_mask_storeu_ps(d, m0, c0[i]);
        _mm512_mask_storeu_ps(d + 16, m1, c1[i]);
    }
}

PL_TARGET_AVX512 static void fg_block(const float *x, int64_t n, int64_t k, const uint8_t *w,
                                      size_t wrow, int wt, int64_t nr, float *dst, int64_t ldc,
                                      float *pk) {
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xFFFF : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
    for (int64_t k0 = 0; k0 < k; k0 += FG_KC) {
        int kc = (int)PL_MIN((int64_t)FG_KC, k - k0);
        fg_pack(w, wrow, wt, nr, k0, kc, pk);
        int first = k0 == 0;
        int64_t i = 0;
        for (; i + FG_MR <= n; i += FG_MR)
            fg_tile(x + i * k + k0, k, pk, kc, dst + i * ldc, ldc, FG_MR, m0, m1, first);
        switch (n - i) {
        case 1: fg_tile(x + i * k + k0, k, pk, kc, dst + i * ldc, ldc, 1, m0, m1, first); break;
        case 2: fg_tile(x + i * k + k0, k, pk, kc, dst + i * ldc, ldc, 2, m0, m1, first); break;
        case 3: fg_tile(x + i * k + k0, k, pk, kc, dst + i * ldc, ldc, 3, m0, m1, first); break;
        case 4: fg_tile(x + i * k + k0, k, pk, kc, dst + i * ldc, ldc, 4, m0, m1, first); break;
        case 5: fg_tile(x + i * k + k0, k, pk, kc, dst + i * ldc, ldc, 5, m0, m1, first); break;
        case 6: fg_tile(x + i * k + k0, k, pk, kc, dst + i * ldc, ldc, 6, m0, m1, first); break;
        case 7: fg_tile(x + i * k + k0, k, pk, kc, dst + i * ldc, ldc, 7, m0, m1, first); break;
        }
    }
}
#endif

/* ================================================================ jobs */

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *x;
    int64_t n, k, m;
    const uint8_t *w;
    int wt;
    size_t wrow; /* bytes of a weight row */
    /* quantised */
    plx_qinfo qi;
    uint8_t *act; /* packed activations [n, act_stride] */
    int64_t as, ps; /* act / panel strides */
    int64_t group;  /* weight rows a work item */
    plx_qk_fn fns[4];
    int rm, rnmax;
    plx_gemv_fn gemv; /* fused kernel for one activation row, or NULL */
    plx_gemvn_fn gemvn[9]; /* fused kernels for 2..gmax activation rows (small batches), or NULL */
    int gmax;              /* the most activation rows one fused kernel takes */
    /* float */
    const float *xr; /* x rounded to the weight type */
} mm_job;

static void job_pack(void *p, int ith, int nth) {
    mm_job *j = (mm_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n) plx_pack_act(&j->qi, j->x + i * j->k, j->k, j->act + i * j->as);
}

static void job_gemv(void *p, int ith, int nth) {
    mm_job *j = (mm_job *)p;
    (void)ith;
    (void)nth;
    int64_t ngroups = (j->m + j->group - 1) / j->group, g;
    while ((g = plx_chunk_next(j->ctx)) < ngroups) {
        int64_t r0 = g * j->group, rows = PL_MIN(j->group, j->m - r0);
        j->gemv(j->w + r0 * j->wrow, j->wrow, rows, j->k, j->act, j->dst + r0);
    }
}

/* Small batches: every group of weight rows against all activation rows, eight at a time. */
static void job_gemvn(void *p, int ith, int nth) {
    mm_job *j = (mm_job *)p;
    (void)ith;
    (void)nth;
    int64_t ngroups = (j->m + j->group - 1) / j->group, g;
    while ((g = plx_chunk_next(j->ctx)) < ngroups) {
        int64_t r0 = g * j->group, rows = PL_MIN(j->group, j->m - r0);
        for (int64_t c0 = 0; c0 < j->n; c0 += j->gmax) {
            int rn = (int)PL_MIN(j->gmax, j->n - c0);
            const uint8_t *a = j->act + c0 * j->as;
            float *d = j->dst + c0 * j->m + r0;
            if (rn == 1) j->gemv(j->w + r0 * j->wrow, j->wrow, rows, j->k, a, d);
            else j->gemvn[rn](j->w + r0 * j->wrow, j->wrow, rows, j->k, a, j->as, d, j->m);
        }
    }
}

static void job_qmm(void *p, int ith, int nth) {
    mm_job *j = (mm_job *)p;
    (void)nth;
    uint8_t *panel = plx_tscratch(j->ctx, ith);
    int64_t kp = plx_kpad(j->k), ngroups = (j->m + j->group - 1) / j->group;
    int rm = j->rm;
    float out[16];
    int64_t g;
    while ((g = plx_chunk_next(j->ctx)) < ngroups) {
        int64_t r0 = g * j->group, rows = PL_MIN(j->group, j->m - r0);
        int64_t prow = (rows + rm - 1) / rm * rm;
        for (int64_t r = 0; r < rows; r++)
            plx_unpack_w(&j->qi, j->w + (r0 + r) * j->wrow, j->k, panel + r * j->ps);
        for (int64_t r = rows; r < prow; r++) memset(panel + r * j->ps, 0, (size_t)(3 * kp));
        for (int64_t c0 = 0; c0 < j->n; c0 += j->rnmax) {
            int rn = (int)PL_MIN(j->rnmax, j->n - c0);
            const uint8_t *a = j->act + c0 * j->as;
            for (int64_t i0 = 0; i0 < rows; i0 += rm) {
                j->fns[rn - 1](kp, panel + i0 * j->ps, j->ps, a, j->as, out);
                int64_t nr = PL_MIN(rm, rows - i0);
                for (int c = 0; c < rn; c++) {
                    float *d = j->dst + (c0 + c) * j->m + r0 + i0;
                    for (int64_t r = 0; r < nr; r++) d[r] = out[c * rm + r];
                }
            }
        }
    }
}

/* plx_mv_group is the number of weight rows a work item of a matrix-vector product takes: two
 * items a thread (at least 16 rows, a multiple of 4). Each item is a separate stream that the
 * hardware prefetchers must pick up anew, which costs more than a little imbalance: on the small
 * matrices of a decode step, 2 items a thread streamed ~1.4x faster from memory than 8 (1 was
 * faster still but stalls whenever the system preempts a thread, nothing being left to share);
 * smaller items also contend for the work counter. */
static int64_t plx_mv_group(const pl_ctx *ctx, int64_t m) {
    int64_t g = (m + 2 * ctx->nth - 1) / (2 * ctx->nth);
    return (PL_MAX(g, 16) + 3) & ~(int64_t)3;
}

#if PL_X86
/* A few rows of x against float weights (AVX-512): each thread streams its own range of weight
 * rows, four at a time, and multiplies every four with all rows of x (four at a time) while they
 * are in L1. */
static void job_fdn(void *p, int ith, int nth) {
    mm_job *j = (mm_job *)p;
    (void)ith;
    (void)nth;
    int64_t ngroups = (j->m + j->group - 1) / j->group, g;
    float out[16];
    while ((g = plx_chunk_next(j->ctx)) < ngroups) {
        int64_t r0 = g * j->group, r1 = PL_MIN(j->m, r0 + j->group);
        for (int64_t r = r0; r < r1; r += 4) {
            const int rm = (int)PL_MIN(4, r1 - r);
            const uint8_t *w = j->w + r * j->wrow;
            for (int64_t c0 = 0; c0 < j->n; c0 += 4) {
                const int rn = (int)PL_MIN(4, j->n - c0);
                const float *x = j->xr + c0 * j->k;
                int64_t pf = c0 == 0 ? PLX_GEMVN_PREFETCH : 0;
                if (rm == 4) {
                    fdn4[rn](w, j->wrow, j->wt, x, j->k, j->k, out, pf);
                } else {
                    for (int i = 0; i < rm; i++)
                        fdn1[rn](w + i * j->wrow, j->wrow, j->wt, x, j->k, j->k, out + 4 * i, 0);
                }
                for (int c = 0; c < rn; c++) {
                    float *d = j->dst + (c0 + c) * j->m + r;
                    for (int i = 0; i < rm; i++) d[i] = rm == 4 ? out[c * 4 + i] : out[4 * i + c];
                }
            }
        }
    }
}
#endif

/* Matrix-vector products of float weights: rows in groups of 4, each against every row of x. */
static void job_fmv(void *p, int ith, int nth) {
    mm_job *j = (mm_job *)p;
    (void)ith;
    (void)nth;
    int64_t ngroups = (j->m + j->group - 1) / j->group, g;
    float out[4];
    while ((g = plx_chunk_next(j->ctx)) < ngroups) {
        int64_t r0 = g * j->group, r1 = PL_MIN(j->m, r0 + j->group);
        for (int64_t c = 0; c < j->n; c++) {
            const float *x = j->xr + c * j->k;
            float *d = j->dst + c * j->m;
            int64_t r = r0;
            for (; r + 4 <= r1; r += 4) {
#if PL_X86
                /* the hardware prefetchers fall behind here too: Whisper tiny's decoder step
                 * (51864x384 F16 output matrix) went from 3.3 to 2.6 ms */
                const char *pf = (const char *)(j->w + r * j->wrow) + PLX_GEMVN_PREFETCH;
                for (int64_t l = 0; l < 4 * (int64_t)j->wrow; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
#endif
                dot4(j->wt, j->w + r * j->wrow, x, j->k, out);
                d[r] = out[0];
                d[r + 1] = out[1];
                d[r + 2] = out[2];
                d[r + 3] = out[3];
            }
            for (; r < r1; r++) d[r] = dot1(j->wt, j->w + r * j->wrow, x, j->k);
        }
    }
}

/* Matrix-matrix products of float weights: blocks of group weight rows (widened to F32 in a
 * per-thread panel unless already F32), each one sgemm. */
static void job_fmm(void *p, int ith, int nth) {
    mm_job *j = (mm_job *)p;
    (void)nth;
    int64_t ngroups = (j->m + j->group - 1) / j->group;
    int64_t g;
    while ((g = plx_chunk_next(j->ctx)) < ngroups) {
        int64_t r0 = g * j->group, rows = PL_MIN(j->group, j->m - r0);
        const float *wf;
        if (j->wt == PL_F32) {
            wf = (const float *)(j->w + r0 * j->wrow);
        } else {
            float *panel = (float *)plx_tscratch(j->ctx, ith);
            for (int64_t r = 0; r < rows; r++)
                plx_dequant_row(j->wt, j->w + (r0 + r) * j->wrow, panel + r * j->k, j->k);
            wf = panel;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->n, (int)rows, (int)j->k, 1.0f,
                    j->xr, (int)j->k, wf, (int)j->k, 0.0f, j->dst + r0, (int)j->m);
    }
}

#if PL_X86
static void job_fg(void *p, int ith, int nth) {
    mm_job *j = (mm_job *)p;
    (void)nth;
    float *pk = (float *)plx_tscratch(j->ctx, ith);
    int64_t ngroups = (j->m + FG_NR - 1) / FG_NR, g;
    while ((g = plx_chunk_next(j->ctx)) < ngroups) {
        int64_t r0 = g * FG_NR;
        fg_block(j->xr, j->n, j->k, j->w + r0 * j->wrow, j->wrow, j->wt, PL_MIN(FG_NR, j->m - r0),
                 j->dst + r0, j->m, pk);
    }
}
#endif

static void job_round(void *p, int ith, int nth) {
    mm_job *j = (mm_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n)
        round_rows(j->wt, j->x + i * j->k, (float *)j->xr + i * j->k, j->k);
}

/* Most rows of x that quantised weights multiply through the fused small-batch kernels. */
#define PLX_GEMVN_MAX_ROWS 16

/* Most rows of x that float weights multiply through the few-row kernels (AVX-512): measured on
 * Whisper's 51864x384 F16 output matrix, 2 threads, they take 0.4-0.55x the time of the packed
 * GEMM from 2 to 16 rows (n = 8: 1.3 ms against 3.3) and lose to it from about 32. */
#define PLX_FDN_MAX_ROWS 16

/* Rows of x from which float weights go through sgemm rather than the matrix-vector kernel. */
#define PLX_SGEMM_MIN_ROWS 4

int pl_matmul(pl_ctx *ctx, float *dst, const float *x, int64_t n, int64_t k, const void *w,
              int wtype, int64_t m) {
    if (ctx == NULL || n < 0 || k <= 0 || m < 0) return PL_ERR_ARG;
    if (pl_vec_dot_type(wtype) < 0) return PL_ERR_UNSUPPORTED;
    int64_t wrow = pl_row_size(wtype, k);
    if (wrow < 0) return PL_ERR_ARG;
    if (n == 0 || m == 0) return PL_OK;
    if (dst == NULL || x == NULL || w == NULL) return PL_ERR_ARG;
    if (n > INT32_MAX || m > INT32_MAX || k > INT32_MAX) return PL_ERR_ARG;
    mm_job j;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.dst = dst;
    j.x = x;
    j.n = n;
    j.k = k;
    j.m = m;
    j.w = (const uint8_t *)w;
    j.wt = wtype;
    j.wrow = (size_t)wrow;

    if (wtype == PL_F32 || wtype == PL_F16 || wtype == PL_BF16) {
        j.xr = x;
        if (wtype != PL_F32) {
            float *xr = (float *)plx_scratch(ctx, (size_t)(n * k) * sizeof(float));
            if (xr == NULL) return PL_ERR_NOMEM;
            j.xr = xr;
            if (n * k <= 16384) {
                round_rows(wtype, x, xr, n * k); /* a few rows: not worth waking the pool */
            } else {
                plx_chunk_reset(ctx);
                plx_run(ctx, job_round, &j);
            }
        }
#if PL_X86
        if (plx_isa >= PL_ISA_AVX512 && !plx_force_blas && n > 1 && n <= PLX_FDN_MAX_ROWS) {
            j.group = plx_mv_group(ctx, m);
            plx_chunk_reset(ctx);
            plx_run(ctx, job_fdn, &j);
            return PL_OK;
        }
#endif
        if (n < PLX_SGEMM_MIN_ROWS) {
            j.group = plx_mv_group(ctx, m);
            plx_chunk_reset(ctx);
            plx_run(ctx, job_fmv, &j);
            return PL_OK;
        }
#if PL_X86
        if (plx_isa >= PL_ISA_AVX512 && !plx_force_blas) {
            if (plx_tscratch_reserve(ctx, (size_t)FG_KC * FG_NR * sizeof(float)) != PL_OK) return PL_ERR_NOMEM;
            plx_chunk_reset(ctx);
            plx_run(ctx, job_fg, &j);
            return PL_OK;
        }
#endif
        /* blocks of weight rows: at least 4 per thread, panels of at most ~512 KiB */
        int64_t g = (m + 4 * ctx->nth - 1) / (4 * ctx->nth);
        if (wtype != PL_F32) g = PL_MIN(g, PL_MAX(16, (int64_t)(512 * 1024) / (4 * k)));
        g = (g + 15) / 16 * 16;
        j.group = g;
        if (wtype != PL_F32 && plx_tscratch_reserve(ctx, (size_t)(g * k) * sizeof(float)) != PL_OK)
            return PL_ERR_NOMEM;
        plx_chunk_reset(ctx);
        plx_run(ctx, job_fmm, &j);
        return PL_OK;
    }

    if (!plx_qinfo_for(wtype, plx_isa, &j.qi)) return PL_ERR_UNSUPPORTED;
    plx_qk_pick(&j.qi, j.fns, &j.rm, &j.rnmax);
    j.as = plx_act_stride(k);
    j.ps = plx_panel_stride(k);
    j.gemv = n == 1 ? plx_gemv_pick(wtype) : NULL;
    /* Small batches (a server's decode steps) stream the weights once per eight tokens through the
     * fused kernels; larger ones (prompts) amortise unpacking weight panels. */
    int small = 0;
    j.gmax = plx_gemvn_max();
    if (n > 1 && n <= PLX_GEMVN_MAX_ROWS && j.gmax >= 2 && plx_gemv_pick(wtype) != NULL) {
        small = 1;
        for (int rn = 2; rn <= j.gmax; rn++) {
            j.gemvn[rn] = plx_gemvn_pick(wtype, rn);
            if (j.gemvn[rn] == NULL) small = 0;
        }
        j.gemv = plx_gemv_pick(wtype);
    }
    /* One activation row: panels of rm rows (L1-resident). Several: panels of up to 32 rows,
     * reused by every tile of activation rows. */
    j.group = n < j.rnmax ? j.rm : PL_MAX(j.rm, (int64_t)32 / j.rm * j.rm);
    if (j.gemv != NULL && (n == 1 || small)) j.group = plx_mv_group(ctx, m);
    else if (plx_tscratch_reserve(ctx, (size_t)(j.group * j.ps)) != PL_OK) return PL_ERR_NOMEM;
    j.act = plx_scratch(ctx, (size_t)(n * j.as));
    if (j.act == NULL) return PL_ERR_NOMEM;
    if (n == 1) {
        plx_pack_act(&j.qi, x, k, j.act); /* one row: not worth waking the pool */
    } else {
        plx_chunk_reset(ctx);
        plx_run(ctx, job_pack, &j);
    }
    plx_chunk_reset(ctx);
    plx_run(ctx, small ? job_gemvn : n == 1 && j.gemv != NULL ? job_gemv : job_qmm, &j);
    return PL_OK;
}

/* ================================================================ GetRows */

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const uint8_t *table;
    int dt;
    int64_t cols, n;
    size_t row;
    const int32_t *ids;
} gr_job;

static void job_getrows(void *p, int ith, int nth) {
    gr_job *j = (gr_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n)
        plx_dequant_row(j->dt, j->table + (size_t)j->ids[i] * j->row, j->dst + i * j->cols, j->cols);
}

int pl_get_rows(pl_ctx *ctx, float *dst, const void *table, int dtype, int64_t rows,
                int64_t cols, const int32_t *ids, int64_t n) {
    if (ctx == NULL || rows < 0 || cols < 0 || n < 0) return PL_ERR_ARG;
    if (!pl_supports(PL_OP_GET_ROWS, dtype)) return PL_ERR_UNSUPPORTED;
    int64_t row = pl_row_size(dtype, cols);
    if (row < 0) return PL_ERR_ARG;
    if (n == 0 || cols == 0) return PL_OK;
    if (dst == NULL || table == NULL || ids == NULL) return PL_ERR_ARG;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= rows) return PL_ERR_ARG;
    gr_job j = {ctx, dst, (const uint8_t *)table, dtype, cols, n, (size_t)row, ids};
    if (n * cols <= 16384) {
        for (int64_t i = 0; i < n; i++)
            plx_dequant_row(dtype, j.table + (size_t)ids[i] * j.row, dst + i * cols, cols);
        return PL_OK;
    }
    plx_chunk_reset(ctx);
    plx_run(ctx, job_getrows, &j);
    return PL_OK;
}
