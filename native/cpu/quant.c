/*
 * quant.c: ggml block formats. Dequantisation of every supported type, the conversion of
 * activations to the dot-product types (bit-exact with ggml's x86 CPU backend), and the packed
 * operands of the integer matrix product (see internal.h): activation rows packed to int8 codes
 * with per-lane scales, weight rows unpacked to uint8 codes with per-lane scales.
 */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "qunits.h"

/* ================================================================ block accessors */

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline float rdh(const uint8_t *p) { return plx_f16_to_f32(rd16(p)); }
static inline void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block. */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ================================================================ dequantisation */

static void dq_q4_0(const uint8_t *b, float *y) {
    float d = rdh(b);
    for (int j = 0; j < 16; j++) {
        y[j] = ((int)(b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = ((int)(b[2 + j] >> 4) - 8) * d;
    }
}

static void dq_q4_1(const uint8_t *b, float *y) {
    float d = rdh(b), m = rdh(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (b[4 + j] & 0xF) * d + m;
        y[j + 16] = (b[4 + j] >> 4) * d + m;
    }
}

static void dq_q5_0(const uint8_t *b, float *y) {
    float d = rdh(b);
    uint32_t qh = rd32(b + 2);
    for (int j = 0; j < 16; j++) {
        int x0 = (b[6 + j] & 0xF) | (int)(((qh >> j) << 4) & 0x10);
        int x1 = (b[6 + j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
        y[j] = (x0 - 16) * d;
        y[j + 16] = (x1 - 16) * d;
    }
}

static void dq_q5_1(const uint8_t *b, float *y) {
    float d = rdh(b), m = rdh(b + 2);
    uint32_t qh = rd32(b + 4);
    for (int j = 0; j < 16; j++) {
        int x0 = (b[8 + j] & 0xF) | (int)(((qh >> j) << 4) & 0x10);
        int x1 = (b[8 + j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
    }
}

static void dq_q8_0(const uint8_t *b, float *y) {
    float d = rdh(b);
    for (int j = 0; j < 32; j++) y[j] = (int8_t)b[2 + j] * d;
}

static void dq_q8_1(const uint8_t *b, float *y) {
    float d = rdh(b);
    for (int j = 0; j < 32; j++) y[j] = (int8_t)b[4 + j] * d;
}

/* Q2_K: 2-bit codes, a 4-bit scale (low nibble) and a 4-bit minimum (high nibble) per 16
 * elements, times the F16 d and dmin. Codes: bits 2r..2r+1 of byte l of each 32-byte half of qs
 * hold element 32r+l of that half's 128. */
static void dq_q2_k(const uint8_t *b, float *y) {
    float d = rdh(b + 80), dmin = rdh(b + 82);
    const uint8_t *sc = b, *q = b + 16;
    for (int n = 0; n < QKK; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2) {
            uint8_t s = *sc++;
            float dl = d * (s & 0xF), ml = dmin * (s >> 4);
            for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l] >> shift) & 3) - ml;
            s = *sc++;
            dl = d * (s & 0xF);
            ml = dmin * (s >> 4);
            for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16] >> shift) & 3) - ml;
        }
    }
}

/* Q3_K: 3-bit codes, the low two bits laid out as Q2_K's, the third in hmask (bit 4h+r of byte l
 * for element 32r+l of half h); the value is the code less 4 (ggml subtracts 4 where the hmask
 * bit is clear), times d and the group's 6-bit scale less 32. */
static void dq_q3_k(const uint8_t *b, float *y) {
    float d = rdh(b + 108);
    const uint8_t *hm = b, *q = b + 32;
    int8_t sc[16];
    plx_q3k_scales(b + 96, sc);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < QKK; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
            float dl = d * sc[is++];
            for (int l = 0; l < 16; l++) *y++ = dl * (((q[l] >> shift) & 3) - (hm[l] & m ? 0 : 4));
            dl = d * sc[is++];
            for (int l = 0; l < 16; l++)
                *y++ = dl * (((q[l + 16] >> shift) & 3) - (hm[l + 16] & m ? 0 : 4));
        }
    }
}

static void dq_q4_k(const uint8_t *b, float *y) {
    float d = rdh(b), dmin = rdh(b + 2);
    const uint8_t *sc = b + 4, *q = b + 16;
    for (int j = 0, is = 0; j < QKK; j += 64, is += 2) {
        int s, m;
        scale_min_k4(is, sc, &s, &m);
        float d1 = d * s, m1 = dmin * m;
        scale_min_k4(is + 1, sc, &s, &m);
        float d2 = d * s, m2 = dmin * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        q += 32;
    }
}

static void dq_q5_k(const uint8_t *b, float *y) {
    float d = rdh(b), dmin = rdh(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < QKK; j += 64, is += 2) {
        int s, m;
        scale_min_k4(is, sc, &s, &m);
        float d1 = d * s, m1 = dmin * m;
        scale_min_k4(is + 1, sc, &s, &m);
        float d2 = d * s, m2 = dmin * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32;
        u1 <<= 2;
        u2 <<= 2;
    }
}

static void dq_q6_k(const uint8_t *b, float *y) {
    float d = rdh(b + 208);
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int n = 0; n < QKK; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is + 0] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

static void dq_q8_k(const uint8_t *b, float *y) {
    float d;
    memcpy(&d, b, 4);
    for (int j = 0; j < QKK; j++) y[j] = d * (int8_t)b[4 + j];
}

/* IQ4_NL: 4-bit indices into plx_iq4nl_values (low nibbles the first 16 elements, high nibbles
 * the last 16), times the F16 d. */
static void dq_iq4_nl(const uint8_t *b, float *y) {
    float d = rdh(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * plx_iq4nl_values[b[2 + j] & 0xF];
        y[j + 16] = d * plx_iq4nl_values[b[2 + j] >> 4];
    }
}

/* IQ4_XS: eight 32-element sub-blocks laid out as IQ4_NL's blocks, each scaled by d times its
 * 6-bit scale less 32. */
static void dq_iq4_xs(const uint8_t *b, float *y) {
    float d = rdh(b);
    int8_t sc[8];
    plx_iq4xs_scales(b, sc);
    const uint8_t *q = b + 8;
    for (int ib = 0; ib < 8; ib++, q += 16, y += 32) {
        float dl = d * sc[ib];
        for (int j = 0; j < 16; j++) {
            y[j] = dl * plx_iq4nl_values[q[j] & 0xF];
            y[j + 16] = dl * plx_iq4nl_values[q[j] >> 4];
        }
    }
}

#if PL_X86
PL_TARGET_AVX2 static void dq_f16_avx2(const uint16_t *s, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) y[i] = plx_f16_to_f32(s[i]);
}
#endif

void plx_dequant_row(int dtype, const void *src, float *dst, int64_t n) {
    const uint8_t *b = (const uint8_t *)src;
    switch (dtype) {
    case PL_F32:
        memcpy(dst, src, (size_t)n * 4);
        return;
    case PL_F16: {
#if PL_X86
        if (plx_isa >= PL_ISA_AVX2) {
            dq_f16_avx2((const uint16_t *)src, dst, n);
            return;
        }
#endif
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = plx_f16_to_f32(s[i]);
        return;
    }
    case PL_BF16: {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = plx_bf16_to_f32(s[i]);
        return;
    }
    }
    void (*f)(const uint8_t *, float *) = NULL;
    switch (dtype) {
    case PL_Q4_0: f = dq_q4_0; break;
    case PL_Q4_1: f = dq_q4_1; break;
    case PL_Q5_0: f = dq_q5_0; break;
    case PL_Q5_1: f = dq_q5_1; break;
    case PL_Q8_0: f = dq_q8_0; break;
    case PL_Q8_1: f = dq_q8_1; break;
    case PL_Q2_K: f = dq_q2_k; break;
    case PL_Q3_K: f = dq_q3_k; break;
    case PL_Q4_K: f = dq_q4_k; break;
    case PL_Q5_K: f = dq_q5_k; break;
    case PL_Q6_K: f = dq_q6_k; break;
    case PL_Q8_K: f = dq_q8_k; break;
    case PL_IQ4_NL: f = dq_iq4_nl; break;
    case PL_IQ4_XS: f = dq_iq4_xs; break;
    default: return;
    }
    int bs = plx_block_size(dtype), ts = plx_type_size(dtype);
    for (int64_t i = 0; i < n / bs; i++) f(b + i * ts, dst + i * bs);
}

/* ================================================================ activation quantisers
 *
 * Q8_0 / Q8_1 follow ggml's AVX code: d = amax/127 stored as F16, codes round(x * (127/amax))
 * with round-half-even. Q8_K follows quantize_row_q8_K_ref (ggml's x86 build uses it): the
 * element of largest magnitude (first one on ties) maps to -127, d = 1/iscale kept as float.
 * Each function writes, for nb blocks, the codes q (contiguous), the F16 scale bits d (Q8_0/1)
 * or float scales dk (Q8_K), and the block sums (Q8_0/1: per 32; Q8_K: per 16).
 */

static void q8_0_scalar(const float *x, int64_t nb, int8_t *q, uint16_t *d, float *df, int32_t *sum) {
    for (int64_t b = 0; b < nb; b++, x += 32, q += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(x[j]);
            amax = a > amax ? a : amax;
        }
        float dd = amax / 127.f;
        float id = amax != 0.0f ? 127.f / amax : 0.0f;
        d[b] = plx_f32_to_f16(dd);
        df[b] = dd;
        int s = 0;
        for (int j = 0; j < 32; j++) {
            int v = plx_round_even(x[j] * id);
            q[j] = (int8_t)v;
            s += v;
        }
        sum[b] = s;
    }
}

static void q8_k_scalar(const float *x, int64_t nb, int8_t *q, float *dk, int16_t *bsums) {
    for (int64_t b = 0; b < nb; b++, x += QKK, q += QKK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QKK; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            dk[b] = 0.0f;
            memset(q, 0, QKK);
            for (int j = 0; j < 16; j++) bsums[b * 16 + j] = 0;
            continue;
        }
        float iscale = -127.f / max;
        for (int j = 0; j < QKK; j++) {
            int v = plx_round_even(iscale * x[j]);
            q[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += q[j * 16 + i];
            bsums[b * 16 + j] = (int16_t)s;
        }
        dk[b] = 1 / iscale;
    }
}

#if PL_X86
PL_TARGET_AVX2 static void q8_0_avx2(const float *x, int64_t nb, int8_t *q, uint16_t *d,
                                     float *df, int32_t *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++, x += 32, q += 32) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_andnot_ps(sign, v0);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v1));
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v2));
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v3));
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float dd = amax / 127.f;
        d[b] = (uint16_t)_cvtss_sh(dd, 0);
        df[b] = dd;
        __m256 mul = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), _MM_ROUND_NEAREST));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), _MM_ROUND_NEAREST));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), _MM_ROUND_NEAREST));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), _MM_ROUND_NEAREST));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        sum[b] = _mm_cvtsi128_si32(s4);
        i0 = _mm256_packs_epi32(i0, i1);
        i2 = _mm256_packs_epi32(i2, i3);
        i0 = _mm256_packs_epi16(i0, i2);
        i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)q, i0);
    }
}

PL_TARGET_AVX512 static void q8_0_avx512(const float *x, int64_t nb, int8_t *q, uint16_t *d,
                                         float *df, int32_t *sum) {
    for (int64_t b = 0; b < nb; b++, x += 32, q += 32) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
        float amax = _mm512_reduce_max_ps(m);
        float dd = amax / 127.f;
        d[b] = (uint16_t)_cvtss_sh(dd, 0);
        df[b] = dd;
        __m512 mul = _mm512_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, mul),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, mul),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        sum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(i1));
    }
}

PL_TARGET_AVX512 static void q8_k_avx512(const float *x, int64_t nb, int8_t *q, float *dk,
                                         int16_t *bsums) {
    for (int64_t b = 0; b < nb; b++, x += QKK, q += QKK) {
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < QKK; j += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
        float amax = _mm512_reduce_max_ps(m);
        if (amax == 0.0f) {
            dk[b] = 0.0f;
            memset(q, 0, QKK);
            for (int j = 0; j < 16; j++) bsums[b * 16 + j] = 0;
            continue;
        }
        /* the first element of largest magnitude decides the sign */
        __m512 am = _mm512_set1_ps(amax);
        float max = amax;
        for (int j = 0; j < QKK; j += 16) {
            __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)), am, _CMP_EQ_OQ);
            if (hit) {
                max = x[j + __builtin_ctz(hit)];
                break;
            }
        }
        float iscale = -127.f / max;
        __m512 is = _mm512_set1_ps(iscale);
        __m512i c127 = _mm512_set1_epi32(127);
        for (int j = 0; j < QKK; j += 16) {
            __m512i v = _mm512_cvt_roundps_epi32(_mm512_mul_ps(is, _mm512_loadu_ps(x + j)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v = _mm512_min_epi32(v, c127);
            bsums[b * 16 + j / 16] = (int16_t)_mm512_reduce_add_epi32(v);
            _mm_storeu_si128((__m128i *)(q + j), _mm512_cvtsepi32_epi8(v));
        }
        dk[b] = 1 / iscale;
    }
}
#endif

static void q8_0_blocks(const float *x, int64_t nb, int8_t *q, uint16_t *d, float *df, int32_t *sum) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        q8_0_avx512(x, nb, q, d, df, sum);
        return;
    }
    if (plx_isa >= PL_ISA_AVX2) {
        q8_0_avx2(x, nb, q, d, df, sum);
        return;
    }
#endif
    q8_0_scalar(x, nb, q, d, df, sum);
}

void plx_q8_0_blocks(const float *x, int64_t nb, int8_t *q, uint16_t *d, float *df, int32_t *sum) {
    q8_0_blocks(x, nb, q, d, df, sum);
}

static void q8_k_blocks(const float *x, int64_t nb, int8_t *q, float *dk, int16_t *bsums) {
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        q8_k_avx512(x, nb, q, dk, bsums);
        return;
    }
#endif
    q8_k_scalar(x, nb, q, dk, bsums);
}

void plx_q8_k_blocks(const float *x, int64_t nb, int8_t *q, float *dk, int16_t *bsums) {
    q8_k_blocks(x, nb, q, dk, bsums);
}

/* The s field of Q8_1 as ggml's AVX code stores it: F16 of d * float(sum), d unrounded. */
static inline uint16_t q8_1_s(float df, int32_t sum) { return plx_f32_to_f16(df * (float)sum); }


int pl_quantize_row(int dtype, const float *src, void *dst, int64_t n) {
    plx_init();
    if (src == NULL || dst == NULL || n < 0) return PL_ERR_ARG;
    if (!pl_supports(PL_OP_QUANTIZE, dtype)) return PL_ERR_UNSUPPORTED;
    if (n % plx_block_size(dtype) != 0) return PL_ERR_ARG;
    uint8_t *y = (uint8_t *)dst;
    switch (dtype) {
    case PL_F16: {
        uint16_t *h = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) h[i] = plx_f32_to_f16(src[i]);
        return PL_OK;
    }
    case PL_BF16: {
        uint16_t *h = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) h[i] = plx_f32_to_bf16(src[i]);
        return PL_OK;
    }
    case PL_Q8_0:
    case PL_Q8_1: {
        int8_t q[32 * PLX_CHUNK];
        uint16_t d[PLX_CHUNK];
        float df[PLX_CHUNK];
        int32_t sum[PLX_CHUNK];
        int ts = plx_type_size(dtype), qoff = dtype == PL_Q8_0 ? 2 : 4;
        for (int64_t b0 = 0; b0 < n / 32; b0 += PLX_CHUNK) {
            int64_t nb = PL_MIN(PLX_CHUNK, n / 32 - b0);
            q8_0_blocks(src + b0 * 32, nb, q, d, df, sum);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *blk = y + (b0 + b) * ts;
                wr16(blk, d[b]);
                if (dtype == PL_Q8_1) wr16(blk + 2, q8_1_s(df[b], sum[b]));
                memcpy(blk + qoff, q + b * 32, 32);
            }
        }
        return PL_OK;
    }
    case PL_Q8_K: {
        int8_t q[QKK];
        float dk;
        int16_t bs[16];
        for (int64_t b = 0; b < n / QKK; b++) {
            q8_k_blocks(src + b * QKK, 1, q, &dk, bs);
            uint8_t *blk = y + b * 292;
            memcpy(blk, &dk, 4);
            memcpy(blk + 4, q, QKK);
            memcpy(blk + 4 + QKK, bs, 32);
        }
        return PL_OK;
    }
    }
    return PL_ERR_UNSUPPORTED;
}

int pl_dequantize_row(int dtype, const void *src, float *dst, int64_t n) {
    plx_init();
    if (src == NULL || dst == NULL || n < 0) return PL_ERR_ARG;
    if (!pl_supports(PL_OP_DEQUANTIZE, dtype)) return PL_ERR_UNSUPPORTED;
    if (n % plx_block_size(dtype) != 0) return PL_ERR_ARG;
    plx_dequant_row(dtype, src, dst, n);
    return PL_OK;
}

/* ================================================================ packed operands */

int plx_qinfo_for(int wtype, int isa, plx_qinfo *qi) {
    memset(qi, 0, sizeof *qi);
    qi->wtype = wtype;
    switch (wtype) {
    case PL_Q4_0: qi->vtype = PL_Q8_0; qi->off = 8; break;
    case PL_Q5_0: qi->vtype = PL_Q8_0; qi->off = 16; break;
    case PL_Q8_0: qi->vtype = PL_Q8_0; break;
    case PL_Q4_1: qi->vtype = PL_Q8_1; qi->has_min = 1; break;
    case PL_Q5_1: qi->vtype = PL_Q8_1; qi->has_min = 1; break;
    case PL_Q2_K: qi->vtype = PL_Q8_K; qi->has_min = 1; break;
    case PL_Q3_K: qi->vtype = PL_Q8_K; qi->off = 4; break;
    case PL_Q4_K: qi->vtype = PL_Q8_K; qi->has_min = 1; break;
    case PL_Q5_K: qi->vtype = PL_Q8_K; qi->has_min = 1; break;
    case PL_Q6_K: qi->vtype = PL_Q8_K; qi->off = 32; break;
    case PL_IQ4_NL: qi->vtype = PL_Q8_0; break;
    case PL_IQ4_XS: qi->vtype = PL_Q8_K; break;
    default: return 0;
    }
    if (plx_type_signed(wtype)) { /* Q8_0, IQ4_NL, IQ4_XS: see internal.h */
        if (isa >= PL_ISA_AVX512) qi->off = 128;
        else qi->signed_u = 1;
    }
    return 1;
}

/* Lane sums of four codes. */
static inline int sum4(const int8_t *q) { return q[0] + q[1] + q[2] + q[3]; }

void plx_pack_act(const plx_qinfo *qi, const float *x, int64_t k, uint8_t *dst) {
    int64_t kp = plx_kpad(k);
    int8_t *q = (int8_t *)dst;
    float *dx = (float *)(dst + kp);
    int32_t *bias = (int32_t *)(dst + 2 * kp);
    float *aux = (float *)(dst + 2 * kp);
    if (qi->vtype == PL_Q8_K) {
        float dk[PLX_CHUNK];
        int16_t bs[16 * PLX_CHUNK];
        for (int64_t b0 = 0; b0 < k / QKK; b0 += PLX_CHUNK) {
            int64_t nb = PL_MIN(PLX_CHUNK, k / QKK - b0);
            q8_k_blocks(x + b0 * QKK, nb, q + b0 * QKK, dk, bs);
            for (int64_t b = 0; b < nb; b++) {
                int64_t l0 = (b0 + b) * 64; /* 64 lanes a super-block */
                for (int l = 0; l < 64; l++) {
                    dx[l0 + l] = dk[b];
                    int s = sum4(q + (l0 + l) * 4);
                    if (qi->has_min) {
                        aux[l0 + l] = dk[b] * (float)s;
                    } else {
                        bias[l0 + l] = -qi->off * s;
                    }
                }
            }
        }
    } else {
        uint16_t d[PLX_CHUNK];
        float dfull[PLX_CHUNK];
        int32_t sum[PLX_CHUNK];
        for (int64_t b0 = 0; b0 < k / 32; b0 += PLX_CHUNK) {
            int64_t nb = PL_MIN(PLX_CHUNK, k / 32 - b0);
            q8_0_blocks(x + b0 * 32, nb, q + b0 * 32, d, dfull, sum);
            for (int64_t b = 0; b < nb; b++) {
                int64_t l0 = (b0 + b) * 8; /* 8 lanes a block */
                float df = plx_f16_to_f32(d[b]);
                if (qi->vtype == PL_Q8_1) {
                    /* ggml multiplies the block minimum by the F16 value s = d*sum. */
                    float s = plx_f16_to_f32(q8_1_s(dfull[b], sum[b])) * 0.125f;
                    for (int l = 0; l < 8; l++) {
                        dx[l0 + l] = df;
                        aux[l0 + l] = s;
                    }
                } else {
                    for (int l = 0; l < 8; l++) {
                        dx[l0 + l] = df;
                        bias[l0 + l] = -qi->off * sum4(q + (l0 + l) * 4);
                    }
                }
            }
        }
    }
    /* zero padding up to kp */
    memset(q + k, 0, (size_t)(kp - k));
    for (int64_t l = k / 4; l < kp / 4; l++) {
        dx[l] = 0.0f;
        bias[l] = 0;
    }
}

/* ---------------------------------------------------------------- weight unpacking, scalar */

/* Each unpacker writes one block: codes u[bs], per-lane scales dw[bs/4], minimums mn[bs/4]. */

static void up_q4_0(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)mn;
    (void)isa;
    for (int j = 0; j < 16; j++) {
        u[j] = b[2 + j] & 0xF;
        u[j + 16] = b[2 + j] >> 4;
    }
    float d = rdh(b);
    for (int l = 0; l < 8; l++) dw[l] = d;
}

static void up_q4_1(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)isa;
    for (int j = 0; j < 16; j++) {
        u[j] = b[4 + j] & 0xF;
        u[j + 16] = b[4 + j] >> 4;
    }
    float d = rdh(b), m = rdh(b + 2);
    for (int l = 0; l < 8; l++) {
        dw[l] = d;
        mn[l] = m;
    }
}

static void up_q5_0(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)mn;
    (void)isa;
    uint32_t qh = rd32(b + 2);
    for (int j = 0; j < 16; j++) {
        u[j] = (uint8_t)((b[6 + j] & 0xF) | (((qh >> j) & 1) << 4));
        u[j + 16] = (uint8_t)((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    float d = rdh(b);
    for (int l = 0; l < 8; l++) dw[l] = d;
}

static void up_q5_1(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)isa;
    uint32_t qh = rd32(b + 4);
    for (int j = 0; j < 16; j++) {
        u[j] = (uint8_t)((b[8 + j] & 0xF) | (((qh >> j) & 1) << 4));
        u[j + 16] = (uint8_t)((b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    float d = rdh(b), m = rdh(b + 2);
    for (int l = 0; l < 8; l++) {
        dw[l] = d;
        mn[l] = m;
    }
}

static void up_q8_0(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)mn;
    if (isa >= PL_ISA_AVX512) {
        for (int j = 0; j < 32; j++) u[j] = b[2 + j] ^ 0x80;
    } else {
        memcpy(u, b + 2, 32);
    }
    float d = rdh(b);
    for (int l = 0; l < 8; l++) dw[l] = d;
}

/* Q2_K: codes 0..3 in element order; per lane d*scale and -dmin*min of its 16-element group. */
static void up_q2_k(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)isa;
    float d = rdh(b + 80), dmin = rdh(b + 82);
    const uint8_t *q = b + 16;
    for (int h = 0; h < 2; h++, q += 32, u += 128) {
        for (int r = 0; r < 4; r++) {
            for (int l = 0; l < 32; l++) u[32 * r + l] = (q[l] >> (2 * r)) & 3;
        }
    }
    for (int s = 0; s < 16; s++) {
        for (int l = 0; l < 4; l++) {
            dw[s * 4 + l] = d * (float)(b[s] & 0xF);
            mn[s * 4 + l] = -dmin * (float)(b[s] >> 4);
        }
    }
}

/* Q3_K: codes 0..7 (the value is the code less 4, removed through the activation bias); per lane
 * d*(scale-32) of its 16-element group. */
static void up_q3_k(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)mn;
    (void)isa;
    const uint8_t *hm = b, *q = b + 32;
    for (int h = 0; h < 2; h++, q += 32, u += 128) {
        for (int r = 0; r < 4; r++) {
            for (int l = 0; l < 32; l++)
                u[32 * r + l] = (uint8_t)(((q[l] >> (2 * r)) & 3) | (((hm[l] >> (4 * h + r)) & 1) << 2));
        }
    }
    int8_t sc[16];
    plx_q3k_scales(b + 96, sc);
    float d = rdh(b + 108);
    for (int s = 0; s < 16; s++) {
        for (int l = 0; l < 4; l++) dw[s * 4 + l] = d * (float)sc[s];
    }
}

/* IQ4_NL: the table values in element order, plus 128 on AVX-512 (as Q8_0's codes); per lane d. */
static void up_iq4_nl(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)mn;
    const uint8_t x = isa >= PL_ISA_AVX512 ? 0x80 : 0;
    for (int j = 0; j < 16; j++) {
        u[j] = (uint8_t)plx_iq4nl_values[b[2 + j] & 0xF] ^ x;
        u[j + 16] = (uint8_t)plx_iq4nl_values[b[2 + j] >> 4] ^ x;
    }
    float d = rdh(b);
    for (int l = 0; l < 8; l++) dw[l] = d;
}

/* IQ4_XS: each sub-block as an IQ4_NL block; per lane d*(scale-32) of its sub-block. */
static void up_iq4_xs(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)mn;
    const uint8_t x = isa >= PL_ISA_AVX512 ? 0x80 : 0;
    const uint8_t *q = b + 8;
    int8_t sc[8];
    plx_iq4xs_scales(b, sc);
    float d = rdh(b);
    for (int ib = 0; ib < 8; ib++, q += 16, u += 32) {
        for (int j = 0; j < 16; j++) {
            u[j] = (uint8_t)plx_iq4nl_values[q[j] & 0xF] ^ x;
            u[j + 16] = (uint8_t)plx_iq4nl_values[q[j] >> 4] ^ x;
        }
        for (int l = 0; l < 8; l++) dw[ib * 8 + l] = d * (float)sc[ib];
    }
}

static void up_q4_k(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)isa;
    float d = rdh(b), dmin = rdh(b + 2);
    const uint8_t *q = b + 16;
    for (int j = 0; j < 4; j++, q += 32) {
        for (int l = 0; l < 32; l++) {
            u[64 * j + l] = q[l] & 0xF;
            u[64 * j + 32 + l] = q[l] >> 4;
        }
    }
    for (int s = 0; s < 8; s++) {
        int sc, m;
        scale_min_k4(s, b + 4, &sc, &m);
        for (int l = 0; l < 8; l++) {
            dw[s * 8 + l] = d * (float)sc;
            mn[s * 8 + l] = -dmin * (float)m;
        }
    }
}

static void up_q5_k(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)isa;
    float d = rdh(b), dmin = rdh(b + 2);
    const uint8_t *qh = b + 16, *ql = b + 48;
    for (int j = 0; j < 4; j++, ql += 32) {
        for (int l = 0; l < 32; l++) {
            u[64 * j + l] = (uint8_t)((ql[l] & 0xF) | (((qh[l] >> (2 * j)) & 1) << 4));
            u[64 * j + 32 + l] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4));
        }
    }
    for (int s = 0; s < 8; s++) {
        int sc, m;
        scale_min_k4(s, b + 4, &sc, &m);
        for (int l = 0; l < 8; l++) {
            dw[s * 8 + l] = d * (float)sc;
            mn[s * 8 + l] = -dmin * (float)m;
        }
    }
}

static void up_q6_k(const uint8_t *b, uint8_t *u, float *dw, float *mn, int isa) {
    (void)mn;
    (void)isa;
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = rdh(b + 208);
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, u += 128) {
        for (int l = 0; l < 32; l++) {
            u[l] = (uint8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
            u[l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            u[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            u[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
    for (int s = 0; s < 16; s++) {
        for (int l = 0; l < 4; l++) dw[s * 4 + l] = d * (float)sc[s];
    }
}

typedef void (*plx_up_fn)(const uint8_t *, uint8_t *, float *, float *, int);

static plx_up_fn up_scalar_for(int wtype) {
    switch (wtype) {
    case PL_Q4_0: return up_q4_0;
    case PL_Q4_1: return up_q4_1;
    case PL_Q5_0: return up_q5_0;
    case PL_Q5_1: return up_q5_1;
    case PL_Q8_0: return up_q8_0;
    case PL_Q2_K: return up_q2_k;
    case PL_Q3_K: return up_q3_k;
    case PL_Q4_K: return up_q4_k;
    case PL_Q5_K: return up_q5_k;
    case PL_Q6_K: return up_q6_k;
    case PL_IQ4_NL: return up_iq4_nl;
    case PL_IQ4_XS: return up_iq4_xs;
    }
    return NULL;
}

static void unpack_scalar(const plx_qinfo *qi, const uint8_t *row, int64_t k, uint8_t *u,
                          float *dw, float *mn, int isa) {
    plx_up_fn f = up_scalar_for(qi->wtype);
    int bs = plx_block_size(qi->wtype), ts = plx_type_size(qi->wtype);
    for (int64_t b = 0; b < k / bs; b++) {
        f(row + b * ts, u + b * bs, dw + b * bs / 4, mn + b * bs / 4, isa);
    }
}

/* ---------------------------------------------------------------- weight unpacking, AVX-512 */

#if PL_X86
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
unpack512_t(const int T, const uint8_t *row, int64_t k, uint8_t *u, float *dw, float *mn) {
    PLX_FOR_UNITS(T, row, k, ui, o, {
        _mm512_store_si512((__m512i *)(u + 64 * ui), o.u);
        _mm512_store_ps(dw + 16 * ui, o.dw);
        if (plx_type_has_min(T))
            _mm512_store_ps(mn + 16 * ui, o.mn);
    });
}

__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
unpack256_t(const int T, const uint8_t *row, int64_t k, uint8_t *u, float *dw, float *mn) {
    PLX_FOR_UNITS8(T, row, k, ui, o, {
        _mm256_store_si256((__m256i *)(u + 32 * ui), o.u);
        _mm256_store_ps(dw + 8 * ui, o.dw);
        if (plx_type_has_min(T))
            _mm256_store_ps(mn + 8 * ui, o.mn);
    });
}

PL_TARGET_AVX2 static void unpack_avx2(const plx_qinfo *qi, const uint8_t *row, int64_t k,
                                       uint8_t *u, float *dw, float *mn) {
    switch (qi->wtype) {
    case PL_Q4_0: unpack256_t(PL_Q4_0, row, k, u, dw, mn); break;
    case PL_Q4_1: unpack256_t(PL_Q4_1, row, k, u, dw, mn); break;
    case PL_Q5_0: unpack256_t(PL_Q5_0, row, k, u, dw, mn); break;
    case PL_Q5_1: unpack256_t(PL_Q5_1, row, k, u, dw, mn); break;
    case PL_Q8_0: unpack256_t(PL_Q8_0, row, k, u, dw, mn); break;
    case PL_Q2_K: unpack256_t(PL_Q2_K, row, k, u, dw, mn); break;
    case PL_Q3_K: unpack256_t(PL_Q3_K, row, k, u, dw, mn); break;
    case PL_Q4_K: unpack256_t(PL_Q4_K, row, k, u, dw, mn); break;
    case PL_Q5_K: unpack256_t(PL_Q5_K, row, k, u, dw, mn); break;
    case PL_Q6_K: unpack256_t(PL_Q6_K, row, k, u, dw, mn); break;
    case PL_IQ4_NL: unpack256_t(PL_IQ4_NL, row, k, u, dw, mn); break;
    case PL_IQ4_XS: unpack256_t(PL_IQ4_XS, row, k, u, dw, mn); break;
    }
}

PL_TARGET_AVX512 static void unpack_avx512(const plx_qinfo *qi, const uint8_t *row, int64_t k,
                                           uint8_t *u, float *dw, float *mn) {
    switch (qi->wtype) {
    case PL_Q4_0: unpack512_t(PL_Q4_0, row, k, u, dw, mn); break;
    case PL_Q4_1: unpack512_t(PL_Q4_1, row, k, u, dw, mn); break;
    case PL_Q5_0: unpack512_t(PL_Q5_0, row, k, u, dw, mn); break;
    case PL_Q5_1: unpack512_t(PL_Q5_1, row, k, u, dw, mn); break;
    case PL_Q8_0: unpack512_t(PL_Q8_0, row, k, u, dw, mn); break;
    case PL_Q2_K: unpack512_t(PL_Q2_K, row, k, u, dw, mn); break;
    case PL_Q3_K: unpack512_t(PL_Q3_K, row, k, u, dw, mn); break;
    case PL_Q4_K: unpack512_t(PL_Q4_K, row, k, u, dw, mn); break;
    case PL_Q5_K: unpack512_t(PL_Q5_K, row, k, u, dw, mn); break;
    case PL_Q6_K: unpack512_t(PL_Q6_K, row, k, u, dw, mn); break;
    case PL_IQ4_NL: unpack512_t(PL_IQ4_NL, row, k, u, dw, mn); break;
    case PL_IQ4_XS: unpack512_t(PL_IQ4_XS, row, k, u, dw, mn); break;
    }
}
#endif

void plx_unpack_w(const plx_qinfo *qi, const void *row, int64_t k, uint8_t *dst) {
    int64_t kp = plx_kpad(k);
    uint8_t *u = dst;
    float *dw = (float *)(dst + kp), *mn = (float *)(dst + 2 * kp);
#if PL_X86
    if (plx_isa >= PL_ISA_AVX512) {
        unpack_avx512(qi, (const uint8_t *)row, k, u, dw, mn);
    } else if (plx_isa >= PL_ISA_AVX2) {
        unpack_avx2(qi, (const uint8_t *)row, k, u, dw, mn);
    } else
#endif
    {
        unpack_scalar(qi, (const uint8_t *)row, k, u, dw, mn, plx_isa);
        if (!qi->has_min) memset(mn, 0, (size_t)k);
    }
    int64_t done = (k + 31) / 32 * 32;
    if (done < kp) { /* pad to a whole 64-element unit */
        memset(u + done, 0, (size_t)(kp - done));
        memset(dw + done / 4, 0, (size_t)(kp - done));
        memset(mn + done / 4, 0, (size_t)(kp - done));
    }
}
