/*
 * qunits.h: AVX-512 decoding of quantised weights, 64 elements ("a unit") at a time, into the
 * operands of the integer dot product (see internal.h): 64 uint8 codes u and, per lane of 4
 * elements, the scale dw and the minimum mn. Used both to fill GEMM panels (quant.c) and by the
 * fused matrix-vector kernels (matmul.c), which never store the decoded unit.
 *
 * A unit of a 32-element block type is two consecutive blocks (the second absent at the end of
 * a row of k = 32 mod 64 elements: two = 0). A unit of a 256-element super-block type is a
 * quarter super-block; its scales come from a per-super-block vector S prepared once (and its
 * minimums, for Q2_K, from a second one, M).
 *
 * IQ4_NL and IQ4_XS codes are looked up from their 4-bit indices with a byte shuffle (the
 * sixteen-entry table fits one 128-bit lane), giving the signed values of plx_iq4nl_values, plus
 * 128 on AVX-512 (see internal.h).
 */
#ifndef PARLEY_CPU_QUNITS_H
#define PARLEY_CPU_QUNITS_H

#include "internal.h"

#if PL_X86

typedef struct {
    __m512i u;
    __m512 dw, mn;
} plx_unit;

static inline uint16_t plx_rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t plx_rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* [f16(a) x8, f16(b) x8] */
PL_TARGET_AVX512 static inline __m512 plx_scales2(uint16_t a, uint16_t b) {
    __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)a | (uint32_t)b << 16)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(f));
}

/* Nibbles of two 16-byte arrays a, b -> [a&15, a>>4, b&15, b>>4]: the natural element order of
 * two 32-element blocks of Q4_0/Q4_1/Q5_0/Q5_1. */
PL_TARGET_AVX512 static inline __m512i plx_nib2(__m128i a, __m128i b) {
    __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
    __m512i z = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                         _mm512_castsi256_si512(ab));
    z = _mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4);
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
}

PL_TARGET_AVX512 static inline __m128i plx_ld16(const uint8_t *p) {
    return _mm_loadu_si128((const __m128i *)p);
}

/* The eight sub-block scales of the IQ4_XS super-block at blk less 32, as int32 lanes (see
 * plx_iq4xs_scales). Shared by the AVX-512 and AVX2 decoders. */
PL_TARGET_AVX2 static inline __m256i plx_iq4xs_sc8(const uint8_t *blk) {
    __m256i lo = _mm256_srlv_epi32(_mm256_set1_epi32((int)plx_rd32(blk + 4)),
                                   _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    __m256i hi = _mm256_srlv_epi32(_mm256_set1_epi32((int)plx_rd16(blk + 2)),
                                   _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    lo = _mm256_and_si256(lo, _mm256_set1_epi32(15));
    hi = _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4);
    return _mm256_sub_epi32(_mm256_or_si256(lo, hi), _mm256_set1_epi32(32));
}

/* The IQ4_NL table plus 128 (1..241) in every 128-bit lane, for vpshufb. */
PL_TARGET_AVX512 static inline __m512i plx_iq4nl_lut(void) {
    __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)plx_iq4nl_values));
    return _mm512_xor_si512(t, _mm512_set1_epi8((char)0x80));
}

/* ---- 32-element block types; b0 points at the unit's first block */

PL_TARGET_AVX512 static inline void plx_unit_q4_0(const uint8_t *b0, const int two, plx_unit *o) {
    const uint8_t *b1 = b0 + 18;
    o->u = plx_nib2(plx_ld16(b0 + 2), two ? plx_ld16(b1 + 2) : _mm_setzero_si128());
    o->dw = plx_scales2(plx_rd16(b0), two ? plx_rd16(b1) : 0);
}

PL_TARGET_AVX512 static inline void plx_unit_q4_1(const uint8_t *b0, const int two, plx_unit *o) {
    const uint8_t *b1 = b0 + 20;
    o->u = plx_nib2(plx_ld16(b0 + 4), two ? plx_ld16(b1 + 4) : _mm_setzero_si128());
    o->dw = plx_scales2(plx_rd16(b0), two ? plx_rd16(b1) : 0);
    o->mn = plx_scales2(plx_rd16(b0 + 2), two ? plx_rd16(b1 + 2) : 0);
}

PL_TARGET_AVX512 static inline void plx_unit_q5_0(const uint8_t *b0, const int two, plx_unit *o) {
    const uint8_t *b1 = b0 + 22;
    __m512i u = plx_nib2(plx_ld16(b0 + 6), two ? plx_ld16(b1 + 6) : _mm_setzero_si128());
    __mmask64 h = (__mmask64)plx_rd32(b0 + 2) | (two ? (__mmask64)plx_rd32(b1 + 2) << 32 : 0);
    o->u = _mm512_mask_add_epi8(u, h, u, _mm512_set1_epi8(16));
    o->dw = plx_scales2(plx_rd16(b0), two ? plx_rd16(b1) : 0);
}

PL_TARGET_AVX512 static inline void plx_unit_q5_1(const uint8_t *b0, const int two, plx_unit *o) {
    const uint8_t *b1 = b0 + 24;
    __m512i u = plx_nib2(plx_ld16(b0 + 8), two ? plx_ld16(b1 + 8) : _mm_setzero_si128());
    __mmask64 h = (__mmask64)plx_rd32(b0 + 4) | (two ? (__mmask64)plx_rd32(b1 + 4) << 32 : 0);
    o->u = _mm512_mask_add_epi8(u, h, u, _mm512_set1_epi8(16));
    o->dw = plx_scales2(plx_rd16(b0), two ? plx_rd16(b1) : 0);
    o->mn = plx_scales2(plx_rd16(b0 + 2), two ? plx_rd16(b1 + 2) : 0);
}

/* Q8_0 codes are stored as w+128 (unsigned); the offset 128 is removed through the activation
 * bias. */
PL_TARGET_AVX512 static inline void plx_unit_q8_0(const uint8_t *b0, const int two, plx_unit *o) {
    const uint8_t *b1 = b0 + 34;
    __m256i lo = _mm256_loadu_si256((const __m256i *)(b0 + 2));
    __m512i z = _mm512_castsi256_si512(lo);
    z = _mm512_inserti64x4(z, two ? _mm256_loadu_si256((const __m256i *)(b1 + 2)) : _mm256_set1_epi8((char)0x80), 1);
    o->u = _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80));
    o->dw = plx_scales2(plx_rd16(b0), two ? plx_rd16(b1) : 0);
}

/* IQ4_NL: the nibbles as Q4_0's, looked up; the absent second block's codes are zero, as Q8_0's. */
PL_TARGET_AVX512 static inline void plx_unit_iq4_nl(const uint8_t *b0, const int two, plx_unit *o) {
    const uint8_t *b1 = b0 + 18;
    __m512i z = plx_nib2(plx_ld16(b0 + 2), two ? plx_ld16(b1 + 2) : _mm_setzero_si128());
    o->u = _mm512_maskz_shuffle_epi8(two ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu, plx_iq4nl_lut(), z);
    o->dw = plx_scales2(plx_rd16(b0), two ? plx_rd16(b1) : 0);
}

/* ---- 256-element super-block types */

/* Q4_K/Q5_K: S = [d*sc_0..7, -dmin*m_0..7] of the super-block at blk. */
PL_TARGET_AVX512 static inline __m512 plx_sb_k45(const uint8_t *blk) {
    uint32_t t[4];
    memcpy(t, blk + 4, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    t[3] = ((t[2] >> 4) & m2) | (((t[1] >> 6) & m3) << 4);
    uint32_t aux = t[1] & m1;
    t[1] = (t[2] & m2) | (((t[0] >> 6) & m3) << 4);
    t[2] = aux;
    t[0] &= m1;
    /* bytes 0..7: scales, 8..15: mins */
    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)t)));
    float d = _cvtsh_ss(plx_rd16(blk)), dmin = _cvtsh_ss(plx_rd16(blk + 2));
    return _mm512_mul_ps(v, _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(d), _mm512_set1_ps(-dmin)));
}

/* Lane index vectors selecting S entries for quarter j: sub-blocks 2j (lanes 0-7), 2j+1. */
PL_TARGET_AVX512 static inline __m512i plx_k45_idx(int j, int mins) {
    __m512i base = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_add_epi32(base, _mm512_set1_epi32(2 * j + 8 * mins));
}

PL_TARGET_AVX512 static inline void plx_unit_q4_k(const uint8_t *blk, int j, __m512 S, plx_unit *o) {
    __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j)));
    z = _mm512_mask_srli_epi16(z, 0xFFFF0000u, z, 4);
    o->u = _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
    o->dw = _mm512_permutexvar_ps(plx_k45_idx(j, 0), S);
    o->mn = _mm512_permutexvar_ps(plx_k45_idx(j, 1), S);
}

PL_TARGET_AVX512 static inline void plx_unit_q5_k(const uint8_t *blk, int j, __m512 S, plx_unit *o) {
    __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 48 + 32 * j)));
    z = _mm512_mask_srli_epi16(z, 0xFFFF0000u, z, 4);
    z = _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
    __mmask32 h0 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * j))));
    __mmask32 h1 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(2 << (2 * j))));
    __mmask64 h = (__mmask64)h0 | (__mmask64)h1 << 32;
    o->u = _mm512_mask_add_epi8(z, h, z, _mm512_set1_epi8(16));
    o->dw = _mm512_permutexvar_ps(plx_k45_idx(j, 0), S);
    o->mn = _mm512_permutexvar_ps(plx_k45_idx(j, 1), S);
}

/* Lane index vector of quarter j for types with a scale per 16 elements (Q2_K, Q3_K, Q6_K):
 * lanes 4g..4g+3 take entry 4j+g of S. */
PL_TARGET_AVX512 static inline __m512i plx_k16_idx(int j) {
    return _mm512_add_epi32(_mm512_set1_epi32(4 * j),
                            _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
}

/* Q6_K: S = d*sc_0..15 of the super-block at blk. */
PL_TARGET_AVX512 static inline __m512 plx_sb_q6_k(const uint8_t *blk) {
    __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
    return _mm512_mul_ps(sc, _mm512_set1_ps(_cvtsh_ss(plx_rd16(blk + 208))));
}

/* Quarter j: elements 64j..64j+63 = half h = j/2, part j%2 (low or high nibbles of ql). */
PL_TARGET_AVX512 static inline void plx_unit_q6_k(const uint8_t *blk, int j, __m512 S, plx_unit *o) {
    const int h = j >> 1, part = j & 1;
    __m512i l = _mm512_loadu_si512((const void *)(blk + 64 * h));
    __m512i hh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
    if (part) {
        l = _mm512_srli_epi16(l, 4);
        hh = _mm512_srli_epi16(hh, 4);
    }
    hh = _mm512_mask_srli_epi16(hh, 0xFFFF0000u, hh, 2);
    hh = _mm512_slli_epi16(_mm512_and_si512(hh, _mm512_set1_epi8(3)), 4);
    o->u = _mm512_or_si512(_mm512_and_si512(l, _mm512_set1_epi8(0x0F)), hh);
    o->dw = _mm512_permutexvar_ps(plx_k16_idx(j), S);
    o->mn = _mm512_setzero_ps();
}

/* Q2_K: *S = d*scale_0..15 and *M = -dmin*min_0..15 of the super-block at blk. */
PL_TARGET_AVX512 static inline void plx_sb_q2_k(const uint8_t *blk, __m512 *S, __m512 *M) {
    __m128i v = _mm_loadu_si128((const __m128i *)blk);
    __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
    *S = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), _mm512_set1_ps(_cvtsh_ss(plx_rd16(blk + 80))));
    *M = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), _mm512_set1_ps(-_cvtsh_ss(plx_rd16(blk + 82))));
}

/* The 2-bit codes of quarter j (elements 64j..64j+63) of the qs array at q: half h = j/2, bit
 * pairs 2j%4 (first 32) and 2j%4+1 (last 32) of its 32 bytes. */
PL_TARGET_AVX512 static inline __m512i plx_q2bits(const uint8_t *q, int j) {
    __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(q + 32 * (j >> 1))));
    if (j & 1) z = _mm512_srli_epi16(z, 4);
    z = _mm512_mask_srli_epi16(z, 0xFFFF0000u, z, 2);
    return _mm512_and_si512(z, _mm512_set1_epi8(3));
}

PL_TARGET_AVX512 static inline void plx_unit_q2_k(const uint8_t *blk, int j, __m512 S, __m512 M, plx_unit *o) {
    o->u = plx_q2bits(blk + 16, j);
    o->dw = _mm512_permutexvar_ps(plx_k16_idx(j), S);
    o->mn = _mm512_permutexvar_ps(plx_k16_idx(j), M);
}

/* Q3_K: S = d*(scale_0..15 - 32) of the super-block at blk. */
PL_TARGET_AVX512 static inline __m512 plx_sb_q3_k(const uint8_t *blk) {
    int8_t sc[16];
    plx_q3k_scales(blk + 96, sc);
    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc)));
    return _mm512_mul_ps(v, _mm512_set1_ps(_cvtsh_ss(plx_rd16(blk + 108))));
}

/* Quarter j: the low two bits as Q2_K's, the third from hmask bits 2j (first 32 elements) and
 * 2j+1 (last 32). */
PL_TARGET_AVX512 static inline void plx_unit_q3_k(const uint8_t *blk, int j, __m512 S, plx_unit *o) {
    __m512i z = plx_q2bits(blk + 32, j);
    __m256i hm = _mm256_loadu_si256((const __m256i *)blk);
    __mmask32 h0 = _mm256_test_epi8_mask(hm, _mm256_set1_epi8((char)(1 << (2 * j))));
    __mmask32 h1 = _mm256_test_epi8_mask(hm, _mm256_set1_epi8((char)(2 << (2 * j))));
    __mmask64 h = (__mmask64)h0 | (__mmask64)h1 << 32;
    o->u = _mm512_mask_add_epi8(z, h, z, _mm512_set1_epi8(4));
    o->dw = _mm512_permutexvar_ps(plx_k16_idx(j), S);
    o->mn = _mm512_setzero_ps();
}

/* IQ4_XS: S = d*(scale_0..7 - 32) of the super-block at blk in lanes 0-7 (the unit's permutes read
 * no others). */
PL_TARGET_AVX512 static inline __m512 plx_sb_iq4_xs(const uint8_t *blk) {
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(plx_iq4xs_sc8(blk)), _mm256_set1_ps(_cvtsh_ss(plx_rd16(blk))));
    return _mm512_castps256_ps512(v);
}

/* Quarter j: sub-blocks 2j and 2j+1, the 32 bytes of qs from 32j, laid out as two IQ4_NL blocks
 * (scales as Q4_K's sub-blocks: lanes 0-7 take S[2j], lanes 8-15 S[2j+1]). */
PL_TARGET_AVX512 static inline void plx_unit_iq4_xs(const uint8_t *blk, int j, __m512 S, plx_unit *o) {
    const uint8_t *q = blk + 8 + 32 * j;
    o->u = _mm512_shuffle_epi8(plx_iq4nl_lut(), plx_nib2(plx_ld16(q), plx_ld16(q + 16)));
    o->dw = _mm512_permutexvar_ps(plx_k45_idx(j, 0), S);
    o->mn = _mm512_setzero_ps();
}

/* Bytes of one block of the quantised types (constant-folded for a constant type). */
static inline int plx_ts(int t) {
    switch (t) {
    case PL_Q4_0: return 18;
    case PL_Q4_1: return 20;
    case PL_Q5_0: return 22;
    case PL_Q5_1: return 24;
    case PL_Q8_0: return 34;
    case PL_Q2_K: return 84;
    case PL_Q3_K: return 110;
    case PL_Q4_K: return 144;
    case PL_Q5_K: return 176;
    case PL_Q6_K: return 210;
    case PL_IQ4_NL: return 18;
    case PL_IQ4_XS: return 136;
    }
    return 0;
}

/* plx_kq reports whether t is a 256-element super-block type (constant-folded likewise). */
static inline int plx_kq(int t) {
    return t == PL_Q2_K || t == PL_Q3_K || t == PL_Q4_K || t == PL_Q5_K || t == PL_Q6_K || t == PL_IQ4_XS;
}

/* ---- AVX2: units of 32 elements (one block, or one 32-element sub-block of a super-block),
 * 8 lanes. Q8_0 codes, IQ4_NL's and IQ4_XS's values stay signed (see internal.h). */

typedef struct {
    __m256i u;
    __m256 dw, mn;
} plx_unit8;

/* 32 bits -> 32 bytes 0x10 where set (element order). */
PL_TARGET_AVX2 static inline __m256i plx_bits16(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    const __m256i sel = _mm256_set1_epi64x((long long)0x7fbfdfeff7fbfdfeULL);
    v = _mm256_or_si256(v, sel);
    v = _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

PL_TARGET_AVX2 static inline __m256i plx_nib1(const uint8_t *q) {
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    __m256i z = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(z, _mm256_set1_epi8(0x0F));
}

PL_TARGET_AVX2 static inline float plx_h2f(const uint8_t *p) { return _cvtsh_ss(plx_rd16(p)); }

/* The IQ4_NL table (signed) in both 128-bit lanes, for vpshufb. */
PL_TARGET_AVX2 static inline __m256i plx_iq4nl_lut8(void) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)plx_iq4nl_values));
}

/* Block b of a 32-element block type T. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
plx_unit8_32(const int T, const uint8_t *b, plx_unit8 *o) {
    switch (T) {
    case PL_Q4_0:
        o->u = plx_nib1(b + 2);
        break;
    case PL_Q4_1:
        o->u = plx_nib1(b + 4);
        o->mn = _mm256_set1_ps(plx_h2f(b + 2));
        break;
    case PL_Q5_0:
        o->u = _mm256_or_si256(plx_nib1(b + 6), plx_bits16(plx_rd32(b + 2)));
        break;
    case PL_Q5_1:
        o->u = _mm256_or_si256(plx_nib1(b + 8), plx_bits16(plx_rd32(b + 4)));
        o->mn = _mm256_set1_ps(plx_h2f(b + 2));
        break;
    case PL_IQ4_NL: /* signed values, looked up */
        o->u = _mm256_shuffle_epi8(plx_iq4nl_lut8(), plx_nib1(b + 2));
        break;
    default: /* Q8_0, signed codes */
        o->u = _mm256_loadu_si256((const __m256i *)(b + 2));
        break;
    }
    o->dw = _mm256_set1_ps(plx_h2f(b));
}

/* Q4_K/Q5_K super-block scales: sc[0..7] = d*scale, mn[0..7] = -dmin*min. */
PL_TARGET_AVX2 static inline void plx_sb8_k45(const uint8_t *blk, float sc[8], float mn[8]) {
    uint32_t t[4];
    memcpy(t, blk + 4, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    t[3] = ((t[2] >> 4) & m2) | (((t[1] >> 6) & m3) << 4);
    uint32_t aux = t[1] & m1;
    t[1] = (t[2] & m2) | (((t[0] >> 6) & m3) << 4);
    t[2] = aux;
    t[0] &= m1;
    const uint8_t *b8 = (const uint8_t *)t;
    float d = plx_h2f(blk), dmin = plx_h2f(blk + 2);
    for (int i = 0; i < 8; i++) {
        sc[i] = d * (float)b8[i];
        mn[i] = -dmin * (float)b8[8 + i];
    }
}

/* Sub-block j (0..7) of a Q4_K (T) or Q5_K super-block. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
plx_unit8_k45(const int T, const uint8_t *blk, int j, const float *sc, const float *mn, plx_unit8 *o) {
    const uint8_t *ql = blk + (T == PL_Q4_K ? 16 : 48) + 32 * (j >> 1);
    __m256i q = _mm256_loadu_si256((const __m256i *)ql);
    if (j & 1) q = _mm256_srli_epi16(q, 4);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
    if (T == PL_Q5_K) {
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        __m256i bit = _mm256_set1_epi8((char)(1 << j));
        __m256i hb = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        q = _mm256_or_si256(q, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
    }
    o->u = q;
    o->dw = _mm256_set1_ps(sc[j]);
    o->mn = _mm256_set1_ps(mn[j]);
}

/* 32-element unit j (0..7) of a Q6_K super-block; dsc[16] = d*scale. */
PL_TARGET_AVX2 static inline void plx_unit8_q6_k(const uint8_t *blk, int j, const float *dsc, plx_unit8 *o) {
    const int h = j >> 2, qq = j & 3;
    __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (qq & 1)));
    if (qq >> 1) l = _mm256_srli_epi16(l, 4);
    l = _mm256_and_si256(l, _mm256_set1_epi8(0x0F));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    qh = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * qq));
    qh = _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(3)), 4);
    o->u = _mm256_or_si256(l, qh);
    int s0 = 8 * h + 2 * qq;
    o->dw = _mm256_setr_m128(_mm_set1_ps(dsc[s0]), _mm_set1_ps(dsc[s0 + 1]));
    o->mn = _mm256_setzero_ps();
}

/* Types with a scale per 16 elements keep a super-block's sixteen scales in two vectors, groups
 * 0-7 and 8-15. plx_pair8 returns the lanes of 32-element unit j (0..7): [s[2j] x4, s[2j+1] x4]. */
PL_TARGET_AVX2 static inline __m256 plx_pair8(const __m256 s[2], int j) {
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(2 * (j & 3)), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    return _mm256_permutevar8x32_ps(s[j >> 2], idx);
}

/* [f(b[0..7]), f(b[8..15])] * m for sixteen bytes b: as unsigned or signed integers. */
PL_TARGET_AVX2 static inline void plx_bytes16_ps(__m128i b, int sgn, __m256 m, __m256 o[2]) {
    __m128i hi = _mm_unpackhi_epi64(b, b);
    __m256i v0 = sgn ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
    __m256i v1 = sgn ? _mm256_cvtepi8_epi32(hi) : _mm256_cvtepu8_epi32(hi);
    o[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(v0), m);
    o[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(v1), m);
}

/* The 2-bit codes of 32-element unit j (0..7) of the qs array at q (Q2_K, Q3_K): bit pair j%4 of
 * the 32 bytes of half j/4. */
PL_TARGET_AVX2 static inline __m256i plx_q2bits8(const uint8_t *q, int j) {
    __m256i z = _mm256_loadu_si256((const __m256i *)(q + 32 * (j >> 2)));
    z = _mm256_srl_epi16(z, _mm_cvtsi32_si128(2 * (j & 3)));
    return _mm256_and_si256(z, _mm256_set1_epi8(3));
}

/* Q2_K super-block scales (see plx_pair8): sc = d*scale, mn = -dmin*min of each 16 elements. */
PL_TARGET_AVX2 static inline void plx_sb8_q2_k(const uint8_t *blk, __m256 sc[2], __m256 mn[2]) {
    __m128i v = _mm_loadu_si128((const __m128i *)blk);
    __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
    plx_bytes16_ps(lo, 0, _mm256_set1_ps(plx_h2f(blk + 80)), sc);
    plx_bytes16_ps(hi, 0, _mm256_set1_ps(-plx_h2f(blk + 82)), mn);
}

/* 32-element unit j (0..7) of a Q2_K super-block. */
PL_TARGET_AVX2 static inline void plx_unit8_q2_k(const uint8_t *blk, int j, const __m256 sc[2], const __m256 mn[2], plx_unit8 *o) {
    o->u = plx_q2bits8(blk + 16, j);
    o->dw = plx_pair8(sc, j);
    o->mn = plx_pair8(mn, j);
}

/* Q3_K super-block scales (see plx_pair8): d*(scale-32) of each 16 elements. */
PL_TARGET_AVX2 static inline void plx_sb8_q3_k(const uint8_t *blk, __m256 dsc[2]) {
    int8_t sc[16];
    plx_q3k_scales(blk + 96, sc);
    plx_bytes16_ps(_mm_loadu_si128((const __m128i *)sc), 1, _mm256_set1_ps(plx_h2f(blk + 108)), dsc);
}

/* 32-element unit j (0..7) of a Q3_K super-block: the low two bits as Q2_K's, the third from bit
 * j of the 32 hmask bytes. */
PL_TARGET_AVX2 static inline void plx_unit8_q3_k(const uint8_t *blk, int j, const __m256 dsc[2], plx_unit8 *o) {
    __m256i q = plx_q2bits8(blk + 32, j);
    __m256i hm = _mm256_loadu_si256((const __m256i *)blk);
    /* bit j to bit 2 (16-bit shifts: the mask drops the other byte's bits) */
    __m256i hb = j >= 2 ? _mm256_srli_epi16(hm, j - 2) : _mm256_slli_epi16(hm, 2 - j);
    o->u = _mm256_or_si256(q, _mm256_and_si256(hb, _mm256_set1_epi8(4)));
    o->dw = plx_pair8(dsc, j);
    o->mn = _mm256_setzero_ps();
}

/* 32-element unit j (0..7) of an IQ4_XS super-block, sub-block j (as an IQ4_NL block); ds[8] =
 * d*(scale-32). */
PL_TARGET_AVX2 static inline void plx_unit8_iq4_xs(const uint8_t *blk, int j, __m256 ds, plx_unit8 *o) {
    o->u = _mm256_shuffle_epi8(plx_iq4nl_lut8(), plx_nib1(blk + 8 + 16 * j));
    o->dw = _mm256_permutevar8x32_ps(ds, _mm256_set1_epi32(j));
    o->mn = _mm256_setzero_ps();
}

/* PLX_FOR_UNITS8 runs BODY for each 32-element unit of a weight row (as PLX_FOR_UNITS). */
#define PLX_FOR_UNITS8(T, row, k, UI, O, BODY)                                              \
    do {                                                                                    \
        plx_unit8 O;                                                                        \
        if ((T) == PL_Q4_K || (T) == PL_Q5_K) {                                             \
            float sc_[8], mn_[8];                                                           \
            for (int64_t sb_ = 0; sb_ < (k) / 256; sb_++) {                                 \
                const uint8_t *blk_ = (row) + sb_ * plx_ts(T);                              \
                plx_sb8_k45(blk_, sc_, mn_);                                                \
                for (int j_ = 0; j_ < 8; j_++) {                                            \
                    const int64_t UI = sb_ * 8 + j_;                                        \
                    plx_unit8_k45(T, blk_, j_, sc_, mn_, &O);                               \
                    BODY                                                                    \
                }                                                                           \
            }                                                                               \
        } else if ((T) == PL_Q2_K) {                                                        \
            __m256 sc_[2], mn_[2];                                                          \
            for (int64_t sb_ = 0; sb_ < (k) / 256; sb_++) {                                 \
                const uint8_t *blk_ = (row) + sb_ * 84;                                     \
                plx_sb8_q2_k(blk_, sc_, mn_);                                               \
                for (int j_ = 0; j_ < 8; j_++) {                                            \
                    const int64_t UI = sb_ * 8 + j_;                                        \
                    plx_unit8_q2_k(blk_, j_, sc_, mn_, &O);                                 \
                    BODY                                                                    \
                }                                                                           \
            }                                                                               \
        } else if ((T) == PL_Q3_K) {                                                        \
            __m256 ds_[2];                                                                  \
            for (int64_t sb_ = 0; sb_ < (k) / 256; sb_++) {                                 \
                const uint8_t *blk_ = (row) + sb_ * 110;                                    \
                plx_sb8_q3_k(blk_, ds_);                                                    \
                for (int j_ = 0; j_ < 8; j_++) {                                            \
                    const int64_t UI = sb_ * 8 + j_;                                        \
                    plx_unit8_q3_k(blk_, j_, ds_, &O);                                      \
                    BODY                                                                    \
                }                                                                           \
            }                                                                               \
        } else if ((T) == PL_IQ4_XS) {                                                      \
            for (int64_t sb_ = 0; sb_ < (k) / 256; sb_++) {                                 \
                const uint8_t *blk_ = (row) + sb_ * 136;                                    \
                const __m256 ds_ = _mm256_mul_ps(_mm256_cvtepi32_ps(plx_iq4xs_sc8(blk_)),   \
                                                 _mm256_set1_ps(plx_h2f(blk_)));            \
                for (int j_ = 0; j_ < 8; j_++) {                                            \
                    const int64_t UI = sb_ * 8 + j_;                                        \
                    plx_unit8_iq4_xs(blk_, j_, ds_, &O);                                    \
                    BODY                                                                    \
                }                                                                           \
            }                                                                               \
        } else if ((T) == PL_Q6_K) {                                                        \
            float ds_[16];                                                                  \
            for (int64_t sb_ = 0; sb_ < (k) / 256; sb_++) {                                 \
                const uint8_t *blk_ = (row) + sb_ * 210;                                    \
                float d_ = plx_h2f(blk_ + 208);                                             \
                for (int i_ = 0; i_ < 16; i_++) ds_[i_] = d_ * (float)(int8_t)blk_[192 + i_]; \
                for (int j_ = 0; j_ < 8; j_++) {                                            \
                    const int64_t UI = sb_ * 8 + j_;                                        \
                    plx_unit8_q6_k(blk_, j_, ds_, &O);                                      \
                    BODY                                                                    \
                }                                                                           \
            }                                                                               \
        } else {                                                                            \
            for (int64_t UI = 0; UI < (k) / 32; UI++) {                                     \
                plx_unit8_32(T, (row) + UI * plx_ts(T), &O);                                \
                BODY                                                                        \
            }                                                                               \
        }                                                                                   \
    } while (0)

/* plx_unit32 decodes the unit of a 32-element block type T starting at block b0. */
#define PLX_UNIT32(T, b0, two, o)                        \
    do {                                                 \
        if ((T) == PL_Q4_0) plx_unit_q4_0(b0, two, o);   \
        else if ((T) == PL_Q4_1) plx_unit_q4_1(b0, two, o); \
        else if ((T) == PL_Q5_0) plx_unit_q5_0(b0, two, o); \
        else if ((T) == PL_Q5_1) plx_unit_q5_1(b0, two, o); \
        else if ((T) == PL_IQ4_NL) plx_unit_iq4_nl(b0, two, o); \
        else plx_unit_q8_0(b0, two, o);                  \
    } while (0)

/* PLX_FOR_UNITS runs BODY for each unit of the weight row of k elements of type T (a constant),
 * with UI the unit index and O (a plx_unit) its decoded operands. */
#define PLX_FOR_UNITS(T, row, k, UI, O, BODY)                                              \
    do {                                                                                   \
        plx_unit O;                                                                        \
        if (plx_kq(T)) {                                                                   \
            for (int64_t sb_ = 0; sb_ < (k) / 256; sb_++) {                                \
                const uint8_t *blk_ = (row) + sb_ * plx_ts(T);                             \
                __m512 S_, M_ = _mm512_setzero_ps(); /* M_: Q2_K's minimums */             \
                if ((T) == PL_Q2_K) plx_sb_q2_k(blk_, &S_, &M_);                           \
                else if ((T) == PL_Q3_K) S_ = plx_sb_q3_k(blk_);                           \
                else if ((T) == PL_Q6_K) S_ = plx_sb_q6_k(blk_);                           \
                else if ((T) == PL_IQ4_XS) S_ = plx_sb_iq4_xs(blk_);                       \
                else S_ = plx_sb_k45(blk_);                                                \
                for (int j_ = 0; j_ < 4; j_++) {                                           \
                    const int64_t UI = sb_ * 4 + j_;                                       \
                    if ((T) == PL_Q2_K) plx_unit_q2_k(blk_, j_, S_, M_, &O);               \
                    else if ((T) == PL_Q3_K) plx_unit_q3_k(blk_, j_, S_, &O);              \
                    else if ((T) == PL_Q4_K) plx_unit_q4_k(blk_, j_, S_, &O);              \
                    else if ((T) == PL_Q5_K) plx_unit_q5_k(blk_, j_, S_, &O);              \
                    else if ((T) == PL_IQ4_XS) plx_unit_iq4_xs(blk_, j_, S_, &O);          \
                    else plx_unit_q6_k(blk_, j_, S_, &O);                                  \
                    BODY                                                                   \
                }                                                                          \
            }                                                                              \
        } else {                                                                           \
            const int64_t nb_ = (k) / 32;                                                  \
            for (int64_t UI = 0; 2 * UI < nb_; UI++) {                                     \
                const uint8_t *b0_ = (row) + 2 * UI * plx_ts(T);                           \
                if (2 * UI + 2 <= nb_) PLX_UNIT32(T, b0_, 1, &O);                          \
                else PLX_UNIT32(T, b0_, 0, &O);                                            \
                BODY                                                                       \
            }                                                                              \
        }                                                                                  \
    } while (0)

#endif /* PL_X86 */

#endif
