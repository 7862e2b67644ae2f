/*
 * unary.c: the elementwise functions of parley_fn.h, applied alone (pl_unary: y = f(x)) or as
 * the gate of a gated unit (pl_glu: y = f(gate)*up).
 *
 * Each function has a scalar form (libm) and, on x86, AVX2 and AVX-512 forms for whole vectors;
 * a span runs the vector form over its whole vectors and the scalar form over the rest, as
 * ggml's vectorised activations do. Small operations run on the calling thread; larger ones hand
 * out spans to the pool. Every element of x (gate) and up is read before the element of y at the
 * same index is written, so y may be either.
 *
 * Adding a function: its scalar form and a row of fns below, and where a vector form pays, the
 * vector forms and their rows.
 */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "simd.h"

/* Elements below which an operation runs on the calling thread alone, and a unit of the job. */
#define UNARY_INLINE_ELEMS 16384
#define UNARY_SPAN 4096

/* ================================================================ Scalar forms */

#define GELU_2C (-1.5957691216057308f) /* -2*sqrt(2/pi) */
#define GELU_A 0.044715f
#define SQRT1_2 0.70710678118654752f

static inline float fn_relu(float x) { return x > 0.0f ? x : 0.0f; }
static inline float fn_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float fn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float fn_tanh(float x) { return tanhf(x); }
/* 0.5*x*(1 + tanh(u)) with u = sqrt(2/pi)*(x + 0.044715*x^3) equals x / (1 + exp(-2u)), which
 * has no cancellation where x is negative: where exp(-2u) overflows the result is -0, where it
 * underflows x. */
static inline float fn_gelu(float x) { return x / (1.0f + expf(GELU_2C * x * fmaf(GELU_A * x, x, 1.0f))); }
/* erfc, not 1 + erf, keeps the relative precision of the small values of negative x. */
static inline float fn_gelu_erf(float x) { return 0.5f * x * erfcf(-x * SQRT1_2); }
static inline float fn_elu(float x) { return x > 0.0f ? x : expm1f(x); }
static inline float fn_exp(float x) { return expf(x); }

/* A span function computes n elements: y = f(x), or f(x)*u when u is not NULL. */
typedef void (*span_fn)(float *y, const float *x, const float *u, int64_t n);

#define SCALAR_SPAN(name, F)                                                                       \
    static void name##_scalar(float *y, const float *x, const float *u, int64_t n) {               \
        if (u != NULL)                                                                             \
            for (int64_t i = 0; i < n; i++) y[i] = F(x[i]) * u[i];                                 \
        else                                                                                       \
            for (int64_t i = 0; i < n; i++) y[i] = F(x[i]);                                        \
    }

SCALAR_SPAN(relu, fn_relu)
SCALAR_SPAN(silu, fn_silu)
SCALAR_SPAN(sigmoid, fn_sigmoid)
SCALAR_SPAN(tanh, fn_tanh)
SCALAR_SPAN(gelu, fn_gelu)
SCALAR_SPAN(gelu_erf, fn_gelu_erf)
SCALAR_SPAN(elu, fn_elu)
SCALAR_SPAN(exp, fn_exp)

/* ================================================================ Vector forms */

#if PL_X86

/* The Chebyshev fit of erfc (Numerical Recipes' erfcc): for z >= 0, erfc(z) = t*exp(-z*z + P(t)),
 * t = 1/(1 + z/2), within 1.2e-7 relative in exact arithmetic; in float the rounding of z*z
 * adds about z*z ulp. */
#define ERFC_P(V, FMA, SET)                                                                        \
    FMA(FMA(FMA(FMA(FMA(FMA(FMA(FMA(FMA(SET(0.17087277f), V, SET(-0.82215223f)), V, SET(1.48851587f)), \
                                V, SET(-1.13520398f)),                                             \
                            V, SET(0.27886807f)),                                                  \
                        V, SET(-0.18628806f)),                                                     \
                    V, SET(0.09678418f)),                                                          \
                V, SET(0.37409196f)),                                                              \
            V, SET(1.00002368f)),                                                                  \
        V, SET(-1.26551223f))

/* Cephes' tanhf polynomial for |x| < 0.625: x + x^3*P(x^2). */
#define TANH_P(S, FMA, SET)                                                                        \
    FMA(FMA(FMA(FMA(SET(-5.70498872745e-3f), S, SET(2.06390887954e-2f)), S, SET(-5.37397155531e-2f)), \
            S, SET(1.33314422036e-1f)),                                                            \
        S, SET(-3.33332819422e-1f))

/* exp(x)-1 near 0 (|x| <= 0.5): x + x^2*(1/2 + x/6 + ... + x^6/8!), its Taylor polynomial. */
#define EXPM1_P(X, FMA, SET)                                                                       \
    FMA(FMA(FMA(FMA(FMA(FMA(SET(1.0f / 40320), X, SET(1.0f / 5040)), X, SET(1.0f / 720)), X, SET(1.0f / 120)), \
                X, SET(1.0f / 24)),                                                                \
            X, SET(1.0f / 6)),                                                                     \
        X, SET(0.5f))

#define F256(a, b, c) _mm256_fmadd_ps(a, b, c)
#define S256(v) _mm256_set1_ps(v)

PL_TARGET_AVX2 static inline __m256 v256_relu(__m256 x) { return _mm256_max_ps(x, _mm256_setzero_ps()); }

PL_TARGET_AVX2 static inline __m256 v256_silu(__m256 x) {
    __m256 e = plx_exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(S256(1.0f), e));
}

PL_TARGET_AVX2 static inline __m256 v256_sigmoid(__m256 x) {
    __m256 e = plx_exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(S256(1.0f), _mm256_add_ps(S256(1.0f), e));
}

PL_TARGET_AVX2 static inline __m256 v256_tanh(__m256 x) {
    const __m256 sign = S256(-0.0f), one = S256(1.0f);
    __m256 z = _mm256_andnot_ps(sign, x);
    __m256 s = _mm256_mul_ps(x, x);
    __m256 small = F256(_mm256_mul_ps(TANH_P(s, F256, S256), s), x, x);
    __m256 e = plx_exp256(_mm256_add_ps(z, z));
    __m256 large = _mm256_sub_ps(one, _mm256_div_ps(S256(2.0f), _mm256_add_ps(e, one)));
    large = _mm256_or_ps(large, _mm256_and_ps(sign, x));
    return _mm256_blendv_ps(large, small, _mm256_cmp_ps(z, S256(0.625f), _CMP_LT_OQ));
}

PL_TARGET_AVX2 static inline __m256 v256_gelu(__m256 x) {
    __m256 t = _mm256_fmadd_ps(_mm256_mul_ps(S256(GELU_A), x), x, S256(1.0f));
    __m256 e = plx_exp256(_mm256_mul_ps(_mm256_mul_ps(S256(GELU_2C), x), t));
    return _mm256_div_ps(x, _mm256_add_ps(S256(1.0f), e));
}

PL_TARGET_AVX2 static inline __m256 v256_gelu_erf(__m256 x) {
    __m256 w = _mm256_mul_ps(x, S256(-SQRT1_2)); /* erfc's argument */
    __m256 z = _mm256_andnot_ps(S256(-0.0f), w);
    __m256 t = _mm256_div_ps(S256(1.0f), F256(z, S256(0.5f), S256(1.0f)));
    __m256 r = _mm256_mul_ps(t, plx_exp256(_mm256_fnmadd_ps(z, z, ERFC_P(t, F256, S256))));
    r = _mm256_blendv_ps(_mm256_sub_ps(S256(2.0f), r), r, _mm256_cmp_ps(w, _mm256_setzero_ps(), _CMP_GE_OQ));
    return _mm256_mul_ps(_mm256_mul_ps(S256(0.5f), x), r);
}

PL_TARGET_AVX2 static inline __m256 v256_elu(__m256 x) {
    __m256 near = _mm256_fmadd_ps(_mm256_mul_ps(x, x), EXPM1_P(x, F256, S256), x);
    __m256 far = _mm256_sub_ps(plx_exp256(x), S256(1.0f));
    __m256 neg = _mm256_blendv_ps(far, near, _mm256_cmp_ps(x, S256(-0.5f), _CMP_GE_OQ));
    return _mm256_blendv_ps(neg, x, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ));
}

PL_TARGET_AVX2 static inline __m256 v256_exp(__m256 x) { return plx_exp256(x); }

#define F512(a, b, c) _mm512_fmadd_ps(a, b, c)
#define S512(v) _mm512_set1_ps(v)

PL_TARGET_AVX512 static inline __m512 v512_relu(__m512 x) { return _mm512_max_ps(x, _mm512_setzero_ps()); }

PL_TARGET_AVX512 static inline __m512 v512_silu(__m512 x) {
    __m512 e = plx_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(S512(1.0f), e));
}

PL_TARGET_AVX512 static inline __m512 v512_sigmoid(__m512 x) {
    __m512 e = plx_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(S512(1.0f), _mm512_add_ps(S512(1.0f), e));
}

PL_TARGET_AVX512 static inline __m512 v512_tanh(__m512 x) {
    const __m512 one = S512(1.0f);
    __m512 z = _mm512_abs_ps(x);
    __m512 s = _mm512_mul_ps(x, x);
    __m512 small = F512(_mm512_mul_ps(TANH_P(s, F512, S512), s), x, x);
    __m512 e = plx_exp512(_mm512_add_ps(z, z));
    __m512 large = _mm512_sub_ps(one, _mm512_div_ps(S512(2.0f), _mm512_add_ps(e, one)));
    large = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(large),
                                                _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, S512(0.625f), _CMP_LT_OQ), large, small);
}

PL_TARGET_AVX512 static inline __m512 v512_gelu(__m512 x) {
    __m512 t = _mm512_fmadd_ps(_mm512_mul_ps(S512(GELU_A), x), x, S512(1.0f));
    __m512 e = plx_exp512(_mm512_mul_ps(_mm512_mul_ps(S512(GELU_2C), x), t));
    return _mm512_div_ps(x, _mm512_add_ps(S512(1.0f), e));
}

PL_TARGET_AVX512 static inline __m512 v512_gelu_erf(__m512 x) {
    __m512 w = _mm512_mul_ps(x, S512(-SQRT1_2));
    __m512 z = _mm512_abs_ps(w);
    __m512 t = _mm512_div_ps(S512(1.0f), F512(z, S512(0.5f), S512(1.0f)));
    __m512 r = _mm512_mul_ps(t, plx_exp512(_mm512_fnmadd_ps(z, z, ERFC_P(t, F512, S512))));
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(w, _mm512_setzero_ps(), _CMP_GE_OQ), _mm512_sub_ps(S512(2.0f), r), r);
    return _mm512_mul_ps(_mm512_mul_ps(S512(0.5f), x), r);
}

PL_TARGET_AVX512 static inline __m512 v512_elu(__m512 x) {
    __m512 near = _mm512_fmadd_ps(_mm512_mul_ps(x, x), EXPM1_P(x, F512, S512), x);
    __m512 far = _mm512_sub_ps(plx_exp512(x), S512(1.0f));
    __m512 neg = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, S512(-0.5f), _CMP_GE_OQ), far, near);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), neg, x);
}

PL_TARGET_AVX512 static inline __m512 v512_exp(__m512 x) { return plx_exp512(x); }

/* The vector spans: whole vectors in the vector form, the rest in the scalar form. */
#define VECTOR_SPANS(name)                                                                         \
    PL_TARGET_AVX2 static void name##_avx2(float *y, const float *x, const float *u, int64_t n) {   \
        int64_t i = 0;                                                                             \
        for (; i + 8 <= n; i += 8) {                                                               \
            __m256 r = v256_##name(_mm256_loadu_ps(x + i));                                        \
            if (u != NULL) r = _mm256_mul_ps(r, _mm256_loadu_ps(u + i));                           \
            _mm256_storeu_ps(y + i, r);                                                            \
        }                                                                                          \
        name##_scalar(y + i, x + i, u != NULL ? u + i : NULL, n - i);                              \
    }                                                                                              \
    PL_TARGET_AVX512 static void name##_avx512(float *y, const float *x, const float *u, int64_t n) { \
        int64_t i = 0;                                                                             \
        for (; i + 16 <= n; i += 16) {                                                             \
            __m512 r = v512_##name(_mm512_loadu_ps(x + i));                                        \
            if (u != NULL) r = _mm512_mul_ps(r, _mm512_loadu_ps(u + i));                           \
            _mm512_storeu_ps(y + i, r);                                                            \
        }                                                                                          \
        name##_scalar(y + i, x + i, u != NULL ? u + i : NULL, n - i);                              \
    }

VECTOR_SPANS(relu)
VECTOR_SPANS(silu)
VECTOR_SPANS(sigmoid)
VECTOR_SPANS(tanh)
VECTOR_SPANS(gelu)
VECTOR_SPANS(gelu_erf)
VECTOR_SPANS(elu)
VECTOR_SPANS(exp)

#define VEC(name) name##_avx2, name##_avx512
#else
#define VEC(name) NULL, NULL
#endif /* PL_X86 */

/* ================================================================ The functions */

static const struct {
    int fn;
    span_fn scalar, avx2, avx512; /* the vector forms NULL where there are none */
} fns[] = {
    {PL_FN_RELU, relu_scalar, VEC(relu)},
    {PL_FN_SILU, silu_scalar, VEC(silu)},
    {PL_FN_SIGMOID, sigmoid_scalar, VEC(sigmoid)},
    {PL_FN_TANH, tanh_scalar, VEC(tanh)},
    {PL_FN_GELU, gelu_scalar, VEC(gelu)},
    {PL_FN_GELU_ERF, gelu_erf_scalar, VEC(gelu_erf)},
    {PL_FN_ELU, elu_scalar, VEC(elu)},
    {PL_FN_EXP, exp_scalar, VEC(exp)},
};

/* span_of returns the span function of fn at the current ISA level, NULL for an unknown fn. */
static span_fn span_of(int fn) {
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        if (fns[i].fn != fn) continue;
        if (plx_isa >= PL_ISA_AVX512 && fns[i].avx512 != NULL) return fns[i].avx512;
        if (plx_isa >= PL_ISA_AVX2 && fns[i].avx2 != NULL) return fns[i].avx2;
        return fns[i].scalar;
    }
    return NULL;
}

typedef struct {
    pl_ctx *ctx;
    span_fn span;
    float *y;
    const float *x, *u;
    int64_t n;
} unary_job;

static void job_unary(void *p, int ith, int nth) {
    unary_job *j = (unary_job *)p;
    (void)ith;
    (void)nth;
    int64_t c, nc = (j->n + UNARY_SPAN - 1) / UNARY_SPAN;
    while ((c = plx_chunk_next(j->ctx)) < nc) {
        int64_t o = c * UNARY_SPAN;
        j->span(j->y + o, j->x + o, j->u != NULL ? j->u + o : NULL, PL_MIN(UNARY_SPAN, j->n - o));
    }
}

static int unary_run(pl_ctx *ctx, span_fn span, float *y, const float *x, const float *u, int64_t n) {
    if (n <= UNARY_INLINE_ELEMS) {
        span(y, x, u, n);
        return PL_OK;
    }
    unary_job j = {ctx, span, y, x, u, n};
    plx_chunk_reset(ctx);
    plx_run(ctx, job_unary, &j);
    return PL_OK;
}

int plx_unary_supports(int fn) { return span_of(fn) != NULL; }

int pl_unary(pl_ctx *ctx, int fn, float *dst, const float *x, int64_t len) {
    if (ctx == NULL || len < 0) return PL_ERR_ARG;
    span_fn span = span_of(fn);
    if (span == NULL) return PL_ERR_UNSUPPORTED;
    if (len == 0) return PL_OK;
    if (dst == NULL || x == NULL) return PL_ERR_ARG;
    return unary_run(ctx, span, dst, x, NULL, len);
}

int pl_glu(pl_ctx *ctx, int fn, float *dst, const float *gate, const float *up, int64_t len) {
    if (ctx == NULL || len < 0) return PL_ERR_ARG;
    span_fn span = span_of(fn);
    if (span == NULL) return PL_ERR_UNSUPPORTED;
    if (len == 0) return PL_OK;
    if (dst == NULL || gate == NULL || up == NULL) return PL_ERR_ARG;
    return unary_run(ctx, span, dst, gate, up, len);
}
