// quant.cuh: device-side expansion of ggml's quantised blocks to F32, 32 elements (a "chunk")
// at a time. Chunk c of a row holds elements 32c .. 32c+31. Formulas and block layouts are
// ggml's (ggml-common.h, dequantize_row_*): scale products are formed in the same order, so
// results equal the host's up to the compiler contracting a multiply and an add into one FMA.
#ifndef PLC_QUANT_CUH
#define PLC_QUANT_CUH

#include "internal.cuh"

template <int DT> struct plc_qtype;
// bytes: bytes per block; chunks: chunks per block.
template <> struct plc_qtype<PLC_Q4_0> { static constexpr int bytes = 18, chunks = 1; };
template <> struct plc_qtype<PLC_Q4_1> { static constexpr int bytes = 20, chunks = 1; };
template <> struct plc_qtype<PLC_Q5_0> { static constexpr int bytes = 22, chunks = 1; };
template <> struct plc_qtype<PLC_Q5_1> { static constexpr int bytes = 24, chunks = 1; };
template <> struct plc_qtype<PLC_Q8_0> { static constexpr int bytes = 34, chunks = 1; };
template <> struct plc_qtype<PLC_IQ4_NL> { static constexpr int bytes = 18, chunks = 1; };
template <> struct plc_qtype<PLC_Q2_K> { static constexpr int bytes = 84, chunks = 8; };
template <> struct plc_qtype<PLC_Q3_K> { static constexpr int bytes = 110, chunks = 8; };
template <> struct plc_qtype<PLC_Q4_K> { static constexpr int bytes = 144, chunks = 8; };
template <> struct plc_qtype<PLC_Q5_K> { static constexpr int bytes = 176, chunks = 8; };
template <> struct plc_qtype<PLC_Q6_K> { static constexpr int bytes = 210, chunks = 8; };
template <> struct plc_qtype<PLC_IQ4_XS> { static constexpr int bytes = 136, chunks = 8; };

__device__ __forceinline__ uint32_t plc_u32_at(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// Scale and minimum of sub-block j (0..7) of a Q4_K/Q5_K block from its 12 packed bytes.
__device__ __forceinline__ void plc_scale_min_k4(int j, const uint8_t *q, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// IQ4_NL and IQ4_XS store 4-bit indices into one table of sixteen signed values
// (kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113), sixteen bytes qs
// for 32 elements: element j < 16 indexes with the low nibble of qs[j], element j + 16 with its
// high one. plc_iq4_codes32 writes the 32 values of such a qs as bytes into q[0..7], in element
// order. The table is four constant words, values 0..3, 4..7, 8..11 and 12..15, so that the
// lookups read no memory: for each word of qs, __byte_perm looks the eight indices' low three
// bits up in values 0..7 and in 8..15, takes each byte from one or the other by the index's
// fourth bit, and then sorts the eight values into the low nibbles' four and the high nibbles'
// four. (__byte_perm reads only the low three bits of each selector nibble, and only the low 16
// bits of the selector.)
__device__ __forceinline__ void plc_iq4_codes32(const uint8_t *qs, uint32_t *q) {
    constexpr uint32_t t0 = 0xBFAD9881u, t1 = 0xF6EADDCFu, t2 = 0x26190D01u, t3 = 0x71594535u;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const uint32_t v = plc_u32_at(qs + 4 * w);
        uint32_t b[2];  // b[h]: the values of bytes 2h and 2h+1 of v, each byte's low nibble's, then its high one's
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t s = v >> (16 * h);
            const uint32_t lo = __byte_perm(t0, t1, s), hi = __byte_perm(t2, t3, s);
            b[h] = __byte_perm(lo, hi, 0x3210u | ((s & 0x8888u) >> 1));
        }
        q[w] = __byte_perm(b[0], b[1], 0x6420u);      // elements 4w .. 4w+3
        q[w + 4] = __byte_perm(b[0], b[1], 0x7531u);  // elements 16+4w .. 16+4w+3
    }
}

// plc_deq32<DT>(row, c, y): y[0..31] = elements of chunk c of a row of DT.
template <int DT> __device__ void plc_deq32(const uint8_t *row, int64_t c, float *y);

template <> __device__ __forceinline__ void plc_deq32<PLC_Q4_0>(const uint8_t *row, int64_t c, float *y) {
    const uint8_t *x = row + c * 18;
    const float d = plc_f16_at(x);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int q = x[2 + j];
        y[j] = (float)((q & 15) - 8) * d;
        y[j + 16] = (float)((q >> 4) - 8) * d;
    }
}

template <> __device__ __forceinline__ void plc_deq32<PLC_Q4_1>(const uint8_t *row, int64_t c, float *y) {
    const uint8_t *x = row + c * 20;
    const float d = plc_f16_at(x), m = plc_f16_at(x + 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int q = x[4 + j];
        y[j] = (float)(q & 15) * d + m;
        y[j + 16] = (float)(q >> 4) * d + m;
    }
}

template <> __device__ __forceinline__ void plc_deq32<PLC_Q5_0>(const uint8_t *row, int64_t c, float *y) {
    const uint8_t *x = row + c * 22;
    const float d = plc_f16_at(x);
    const uint32_t qh = plc_u32_at(x + 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int q = x[6 + j];
        const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)(((q & 15) | h0) - 16) * d;
        y[j + 16] = (float)(((q >> 4) | h1) - 16) * d;
    }
}

template <> __device__ __forceinline__ void plc_deq32<PLC_Q5_1>(const uint8_t *row, int64_t c, float *y) {
    const uint8_t *x = row + c * 24;
    const float d = plc_f16_at(x), m = plc_f16_at(x + 2);
    const uint32_t qh = plc_u32_at(x + 4);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int q = x[8 + j];
        const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)((q & 15) | h0) * d + m;
        y[j + 16] = (float)((q >> 4) | h1) * d + m;
    }
}

template <> __device__ __forceinline__ void plc_deq32<PLC_Q8_0>(const uint8_t *row, int64_t c, float *y) {
    const uint8_t *x = row + c * 34;
    const float d = plc_f16_at(x);
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)x[2 + j] * d;
}

// IQ4_NL: d (F16), qs[16]; an element is d times its value.
template <> __device__ __forceinline__ void plc_deq32<PLC_IQ4_NL>(const uint8_t *row, int64_t c, float *y) {
    const uint8_t *x = row + c * 18;
    const float d = plc_f16_at(x);
    uint32_t q[8];
    plc_iq4_codes32(x + 2, q);
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)(q[j >> 2] >> (8 * (j & 3)));
}

// The legacy block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and IQ4_NL, a block of 32 with one scale
// like Q4_0's, as integers, for products with activations quantised to 8-bit blocks as ggml's
// vec_dot functions take them: plc_qint32<DT>(row, c, q, d, m) writes the 32 codes of chunk c
// (Q4_0: nibble - 8; Q5_0: five bits - 16; Q4_1, Q5_1: unsigned; Q8_0: as stored; IQ4_NL: the
// table's signed values) as bytes into q[0..7], its scale d and, for Q4_1 and Q5_1, its minimum m
// (else 0). An element is d*code + m.
template <int DT> struct plc_legacy { static constexpr bool value = false; };
template <> struct plc_legacy<PLC_Q4_0> { static constexpr bool value = true; };
template <> struct plc_legacy<PLC_Q4_1> { static constexpr bool value = true; };
template <> struct plc_legacy<PLC_Q5_0> { static constexpr bool value = true; };
template <> struct plc_legacy<PLC_Q5_1> { static constexpr bool value = true; };
template <> struct plc_legacy<PLC_Q8_0> { static constexpr bool value = true; };
template <> struct plc_legacy<PLC_IQ4_NL> { static constexpr bool value = true; };

__device__ __forceinline__ uint32_t plc_pack4(int a, int b, int c, int d) {
    return (uint32_t)(a & 255) | ((uint32_t)(b & 255) << 8) | ((uint32_t)(c & 255) << 16) | ((uint32_t)(d & 255) << 24);
}

template <int DT> __device__ void plc_qint32(const uint8_t *row, int64_t c, uint32_t *q, float &d, float &m);

// The codes of a 4-bit (and, with qh, 5-bit) block: element j < 16 from the low nibble of byte
// j, element j + 16 from its high nibble; bias subtracted from each.
__device__ __forceinline__ void plc_nibbles(const uint8_t *qs, uint32_t qh, bool five, int bias, uint32_t *q) {
#pragma unroll
    for (int w = 0; w < 4; w++) {
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = 4 * w + i, b = qs[j];
            lo[i] = ((b & 15) | (five ? (int)((qh >> j) & 1) << 4 : 0)) - bias;
            hi[i] = ((b >> 4) | (five ? (int)((qh >> (j + 16)) & 1) << 4 : 0)) - bias;
        }
        q[w] = plc_pack4(lo[0], lo[1], lo[2], lo[3]);
        q[w + 4] = plc_pack4(hi[0], hi[1], hi[2], hi[3]);
    }
}

template <> __device__ __forceinline__ void plc_qint32<PLC_Q4_0>(const uint8_t *row, int64_t c, uint32_t *q, float &d, float &m) {
    const uint8_t *x = row + c * 18;
    d = plc_f16_at(x);
    m = 0.f;
    plc_nibbles(x + 2, 0, false, 8, q);
}
template <> __device__ __forceinline__ void plc_qint32<PLC_Q4_1>(const uint8_t *row, int64_t c, uint32_t *q, float &d, float &m) {
    const uint8_t *x = row + c * 20;
    d = plc_f16_at(x);
    m = plc_f16_at(x + 2);
    plc_nibbles(x + 4, 0, false, 0, q);
}
template <> __device__ __forceinline__ void plc_qint32<PLC_Q5_0>(const uint8_t *row, int64_t c, uint32_t *q, float &d, float &m) {
    const uint8_t *x = row + c * 22;
    d = plc_f16_at(x);
    m = 0.f;
    plc_nibbles(x + 6, plc_u32_at(x + 2), true, 16, q);
}
template <> __device__ __forceinline__ void plc_qint32<PLC_Q5_1>(const uint8_t *row, int64_t c, uint32_t *q, float &d, float &m) {
    const uint8_t *x = row + c * 24;
    d = plc_f16_at(x);
    m = plc_f16_at(x + 2);
    plc_nibbles(x + 8, plc_u32_at(x + 4), true, 0, q);
}
template <> __device__ __forceinline__ void plc_qint32<PLC_Q8_0>(const uint8_t *row, int64_t c, uint32_t *q, float &d, float &m) {
    const uint8_t *x = row + c * 34;
    d = plc_f16_at(x);
    m = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) q[w] = plc_u32_at(x + 2 + 4 * w);
}
template <> __device__ __forceinline__ void plc_qint32<PLC_IQ4_NL>(const uint8_t *row, int64_t c, uint32_t *q, float &d, float &m) {
    const uint8_t *x = row + c * 18;
    d = plc_f16_at(x);
    m = 0.f;
    plc_iq4_codes32(x + 2, q);
}

// Q2_K: scales[16] (low nibble a scale, high nibble a minimum), qs[64], d, dmin (F16). Half
// h = s/4 of the block covers 128 elements; chunk g = s%4 of the half takes its two-bit codes
// from qs[32h + l] >> 2g, and the scale and minimum of its elements 0..15 from scales[2s], of
// 16..31 from scales[2s + 1]. An element is d*scale*code - dmin*minimum.
struct plc_q2k_chunk {
    float d, dmin;
    const uint8_t *qs, *sc;
    int shift;
    // code returns element l's two bits.
    __device__ __forceinline__ int code(int l) const { return (qs[l] >> shift) & 3; }
};
__device__ __forceinline__ plc_q2k_chunk plc_q2k_at(const uint8_t *row, int64_t c) {
    const uint8_t *x = row + (c >> 3) * 84;
    const int s = (int)(c & 7);
    return plc_q2k_chunk{plc_f16_at(x + 80), plc_f16_at(x + 82), x + 16 + 32 * (s >> 2), x + 2 * s, 2 * (s & 3)};
}
template <> __device__ __forceinline__ void plc_deq32<PLC_Q2_K>(const uint8_t *row, int64_t c, float *y) {
    const plc_q2k_chunk k = plc_q2k_at(row, c);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float dl = k.d * (float)(k.sc[h] & 0xF), ml = k.dmin * (float)(k.sc[h] >> 4);
#pragma unroll
        for (int l = 16 * h; l < 16 * h + 16; l++) y[l] = dl * (float)k.code(l) - ml;
    }
}

// Q3_K: hmask[32], qs[64], scales[12] (sixteen 6-bit scales, packed), d (F16). Half h = s/4 of
// the block covers 128 elements; chunk g = s%4 of the half takes the low two bits of its codes
// from qs[32h + l] >> 2g and the high bit from bit s of hmask[l]: a code is those two bits, less
// 4 where the high bit is clear. Its elements 0..15 take scale 2s, 16..31 scale 2s + 1, each
// stored as its value plus 32. An element is d*scale*code.
//
// plc_q3k_scale returns scale i (0..15) of a Q3_K block from its 12 packed bytes q: the low four
// bits are the low (i < 8) or high nibble of q[i%8], the high two bits are bits 2(i/4).. of
// q[8 + i%4]; less 32.
__device__ __forceinline__ int plc_q3k_scale(const uint8_t *q, int i) {
    return (((q[i & 7] >> (4 * (i >> 3))) & 0xF) | (((q[8 + (i & 3)] >> (2 * (i >> 2))) & 3) << 4)) - 32;
}
struct plc_q3k_chunk {
    float d;
    const uint8_t *qs, *hm;
    int shift, hbit;
    int sc[2];  // the scales of elements 0..15 and 16..31
    // code returns element l's code, -4..3.
    __device__ __forceinline__ int code(int l) const { return ((qs[l] >> shift) & 3) - (((hm[l] >> hbit) & 1) ? 0 : 4); }
};
__device__ __forceinline__ plc_q3k_chunk plc_q3k_at(const uint8_t *row, int64_t c) {
    const uint8_t *x = row + (c >> 3) * 110;
    const int s = (int)(c & 7);
    return plc_q3k_chunk{plc_f16_at(x + 108), x + 32 + 32 * (s >> 2), x, 2 * (s & 3), s,
                         {plc_q3k_scale(x + 96, 2 * s), plc_q3k_scale(x + 96, 2 * s + 1)}};
}
template <> __device__ __forceinline__ void plc_deq32<PLC_Q3_K>(const uint8_t *row, int64_t c, float *y) {
    const plc_q3k_chunk k = plc_q3k_at(row, c);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float dl = k.d * (float)k.sc[h];
#pragma unroll
        for (int l = 16 * h; l < 16 * h + 16; l++) y[l] = dl * (float)k.code(l);
    }
}

// Q4_K: d, dmin (F16), scales[12], qs[128]. Chunk s (0..7) of a block uses qs[32*(s/2) ..],
// the low nibbles for even s and the high ones for odd s.
template <> __device__ __forceinline__ void plc_deq32<PLC_Q4_K>(const uint8_t *row, int64_t c, float *y) {
    const uint8_t *x = row + (c >> 3) * 144;
    const int s = (int)(c & 7);
    const float d = plc_f16_at(x), dmin = plc_f16_at(x + 2);
    int sc, m;
    plc_scale_min_k4(s, x + 4, sc, m);
    const float d1 = d * (float)sc, m1 = dmin * (float)m;
    const uint8_t *q = x + 16 + 32 * (s >> 1);
    const int shift = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++) y[l] = d1 * (float)((q[l] >> shift) & 0xF) - m1;
}

// Q5_K: d, dmin, scales[12], qh[32], qs[128]; the fifth bit of element l of chunk s is bit s of
// qh[l].
template <> __device__ __forceinline__ void plc_deq32<PLC_Q5_K>(const uint8_t *row, int64_t c, float *y) {
    const uint8_t *x = row + (c >> 3) * 176;
    const int s = (int)(c & 7);
    const float d = plc_f16_at(x), dmin = plc_f16_at(x + 2);
    int sc, m;
    plc_scale_min_k4(s, x + 4, sc, m);
    const float d1 = d * (float)sc, m1 = dmin * (float)m;
    const uint8_t *qh = x + 16;
    const uint8_t *q = x + 48 + 32 * (s >> 1);
    const int shift = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> s) & 1) << 4);
        y[l] = d1 * (float)v - m1;
    }
}

// Q6_K: ql[128], qh[64], scales[16] (int8), d (F16). Half h = s/4 of the block covers 128
// elements; chunk g = s%4 of the half takes its low bits from ql[64h + (g&1)*32 + l] (low nibble
// for g < 2, high for g >= 2), its high two bits from qh[32h + l] >> 2g, and its scale from
// scales[8h + 2g + l/16].
struct plc_q6k_chunk {
    float d;
    const uint8_t *ql, *qh;
    const int8_t *sc;
    int lshift, hshift;
    // code returns element l's six bits less 32.
    __device__ __forceinline__ int code(int l) const { return (((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32; }
};
__device__ __forceinline__ plc_q6k_chunk plc_q6k_at(const uint8_t *row, int64_t c) {
    const uint8_t *x = row + (c >> 3) * 210;
    const int s = (int)(c & 7);
    const int h = s >> 2, g = s & 3;
    return plc_q6k_chunk{plc_f16_at(x + 208), x + 64 * h + (g & 1) * 32, x + 128 + 32 * h,
                         (const int8_t *)(x + 192 + 8 * h + 2 * g), (g >> 1) * 4, 2 * g};
}
template <> __device__ __forceinline__ void plc_deq32<PLC_Q6_K>(const uint8_t *row, int64_t c, float *y) {
    const plc_q6k_chunk k = plc_q6k_at(row, c);
#pragma unroll
    for (int l = 0; l < 32; l++) y[l] = k.d * (float)k.sc[l >> 4] * (float)k.code(l);
}

// IQ4_XS: d (F16), scales_h (16 bits), scales_l[4], qs[128]. Chunk s (0..7) of a block takes its
// indices from qs[16s ..] and a 6-bit scale, the low four bits from nibble s%2 of scales_l[s/2]
// and the high two from bits 2s.. of scales_h, stored as its value plus 32: an element is
// d*(scale - 32) times its value, d*(scale - 32) formed first.
__device__ __forceinline__ float plc_iq4xs_scale(const uint8_t *x, int s) {
    const int h = x[2] | (x[3] << 8);
    const int ls = ((x[4 + (s >> 1)] >> (4 * (s & 1))) & 0xF) | (((h >> (2 * s)) & 3) << 4);
    return plc_f16_at(x) * (float)(ls - 32);
}
template <> __device__ __forceinline__ void plc_deq32<PLC_IQ4_XS>(const uint8_t *row, int64_t c, float *y) {
    const uint8_t *x = row + (c >> 3) * 136;
    const int s = (int)(c & 7);
    const float dl = plc_iq4xs_scale(x, s);
    uint32_t q[8];
    plc_iq4_codes32(x + 8 + 16 * s, q);
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = dl * (float)(int8_t)(q[j >> 2] >> (8 * (j & 3)));
}

// The K-quant types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS, a block of 256 with a scale per
// 32, as integers, for products with activations quantised to Q8_K as ggml's x86 vec_dot
// functions take them: plc_kint32<DT>(row, c, q, d0, d1, m0, m1) writes the 32 codes of chunk c
// (Q2_K: two bits; Q3_K: three bits - 4 where the high bit is clear; Q4_K: nibble; Q5_K: five
// bits; Q6_K: six bits - 32; IQ4_XS: the table's signed values) as bytes into q[0..7], the
// scales of its elements 0..15 (d0) and 16..31 (d1; IQ4_XS: one for the chunk, d0 = d1), and
// their minimums m0 and m1 (Q2_K: one each; Q4_K, Q5_K: one for the chunk, m0 = m1; else 0). An
// element is d*code - m with d = d0 or d1 and m = m0 or m1. plc_kmin16<DT> marks the types
// whose minimums differ between the halves (Q2_K), for which the activations' code sums are kept
// per 16 elements instead of per 32.
template <int DT> struct plc_kquant { static constexpr bool value = false; };
template <> struct plc_kquant<PLC_Q2_K> { static constexpr bool value = true; };
template <> struct plc_kquant<PLC_Q3_K> { static constexpr bool value = true; };
template <> struct plc_kquant<PLC_Q4_K> { static constexpr bool value = true; };
template <> struct plc_kquant<PLC_Q5_K> { static constexpr bool value = true; };
template <> struct plc_kquant<PLC_Q6_K> { static constexpr bool value = true; };
template <> struct plc_kquant<PLC_IQ4_XS> { static constexpr bool value = true; };
template <int DT> struct plc_kmin16 { static constexpr bool value = false; };
template <> struct plc_kmin16<PLC_Q2_K> { static constexpr bool value = true; };

template <int DT>
__device__ void plc_kint32(const uint8_t *row, int64_t c, uint32_t *q, float &d0, float &d1, float &m0, float &m1);

// plc_codes32 packs 32 codes of 4 bits at shift of qs[0..31] (and a fifth bit, bit hbit of
// qh[0..31], when qh is not null) into q[0..7].
__device__ __forceinline__ void plc_codes32(const uint8_t *qs, int shift, const uint8_t *qh, int hbit, uint32_t *q) {
#pragma unroll
    for (int w = 0; w < 8; w++) {
        int v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int l = 4 * w + i;
            v[i] = ((qs[l] >> shift) & 0xF) | (qh != NULL ? ((qh[l] >> hbit) & 1) << 4 : 0);
        }
        q[w] = plc_pack4(v[0], v[1], v[2], v[3]);
    }
}

// plc_kint32_k45 is plc_kint32 for chunk s of a Q4_K (qh null) or Q5_K block x, the low four
// bits of whose codes are in qs.
__device__ __forceinline__ void plc_kint32_k45(const uint8_t *x, int s, const uint8_t *qs, const uint8_t *qh, uint32_t *q,
                                               float &d0, float &d1, float &m0, float &m1) {
    int sc, mn;
    plc_scale_min_k4(s, x + 4, sc, mn);
    d0 = d1 = plc_f16_at(x) * (float)sc;
    m0 = m1 = plc_f16_at(x + 2) * (float)mn;
    plc_codes32(qs + 32 * (s >> 1), (s & 1) * 4, qh, s, q);
}
template <> __device__ __forceinline__ void plc_kint32<PLC_Q2_K>(const uint8_t *row, int64_t c, uint32_t *q, float &d0, float &d1,
                                                                 float &m0, float &m1) {
    const plc_q2k_chunk k = plc_q2k_at(row, c);
    d0 = k.d * (float)(k.sc[0] & 0xF);
    d1 = k.d * (float)(k.sc[1] & 0xF);
    m0 = k.dmin * (float)(k.sc[0] >> 4);
    m1 = k.dmin * (float)(k.sc[1] >> 4);
#pragma unroll
    for (int w = 0; w < 8; w++) q[w] = plc_pack4(k.code(4 * w), k.code(4 * w + 1), k.code(4 * w + 2), k.code(4 * w + 3));
}
template <> __device__ __forceinline__ void plc_kint32<PLC_Q3_K>(const uint8_t *row, int64_t c, uint32_t *q, float &d0, float &d1,
                                                                 float &m0, float &m1) {
    const plc_q3k_chunk k = plc_q3k_at(row, c);
    d0 = k.d * (float)k.sc[0];
    d1 = k.d * (float)k.sc[1];
    m0 = m1 = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) q[w] = plc_pack4(k.code(4 * w), k.code(4 * w + 1), k.code(4 * w + 2), k.code(4 * w + 3));
}
template <> __device__ __forceinline__ void plc_kint32<PLC_Q4_K>(const uint8_t *row, int64_t c, uint32_t *q, float &d0, float &d1,
                                                                 float &m0, float &m1) {
    const uint8_t *x = row + (c >> 3) * 144;
    plc_kint32_k45(x, (int)(c & 7), x + 16, NULL, q, d0, d1, m0, m1);
}
template <> __device__ __forceinline__ void plc_kint32<PLC_Q5_K>(const uint8_t *row, int64_t c, uint32_t *q, float &d0, float &d1,
                                                                 float &m0, float &m1) {
    const uint8_t *x = row + (c >> 3) * 176;
    plc_kint32_k45(x, (int)(c & 7), x + 48, x + 16, q, d0, d1, m0, m1);
}
template <> __device__ __forceinline__ void plc_kint32<PLC_Q6_K>(const uint8_t *row, int64_t c, uint32_t *q, float &d0, float &d1,
                                                                 float &m0, float &m1) {
    const plc_q6k_chunk k = plc_q6k_at(row, c);
    d0 = k.d * (float)k.sc[0];
    d1 = k.d * (float)k.sc[1];
    m0 = m1 = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) q[w] = plc_pack4(k.code(4 * w), k.code(4 * w + 1), k.code(4 * w + 2), k.code(4 * w + 3));
}
template <> __device__ __forceinline__ void plc_kint32<PLC_IQ4_XS>(const uint8_t *row, int64_t c, uint32_t *q, float &d0, float &d1,
                                                                   float &m0, float &m1) {
    const uint8_t *x = row + (c >> 3) * 136;
    const int s = (int)(c & 7);
    d0 = d1 = plc_iq4xs_scale(x, s);
    m0 = m1 = 0.f;
    plc_iq4_codes32(x + 8 + 16 * s, q);
}

// PLC_FOR_QTYPES(X) expands X(DT) for every quantised type.
#define PLC_FOR_QTYPES(X) X(PLC_Q4_0) X(PLC_Q4_1) X(PLC_Q5_0) X(PLC_Q5_1) X(PLC_Q8_0) X(PLC_IQ4_NL) \
    X(PLC_Q2_K) X(PLC_Q3_K) X(PLC_Q4_K) X(PLC_Q5_K) X(PLC_Q6_K) X(PLC_IQ4_XS)

#endif
