/*
 * internal.h: declarations shared by the CPU kernel sources (not part of the public ABI).
 *
 * Every source in native/cpu is compiled as its own translation unit; names shared between them
 * carry the plx_ prefix.
 */
#ifndef PARLEY_CPU_INTERNAL_H
#define PARLEY_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "parley.h"

#if (defined(__x86_64__) || defined(_M_X64)) && !defined(PL_NO_SIMD)
#define PL_X86 1
#include <immintrin.h>
#define PL_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define PL_TARGET_AVX512 \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#else
#define PL_X86 0
#endif

/* PLX_CASES8(nb, CALL) runs CALL(1) .. CALL(8) as nb is 1 .. 7 or larger: a register-tiled
 * kernel's block count as the compile-time constant it needs. */
#define PLX_CASES8(nb, CALL)                                                                     \
    switch (nb) {                                                                                \
    case 1: CALL(1); break;                                                                      \
    case 2: CALL(2); break;                                                                      \
    case 3: CALL(3); break;                                                                      \
    case 4: CALL(4); break;                                                                      \
    case 5: CALL(5); break;                                                                      \
    case 6: CALL(6); break;                                                                      \
    case 7: CALL(7); break;                                                                      \
    default: CALL(8); break;                                                                     \
    }

#define PL_RESTRICT __restrict__
#define PL_ALIGN 64
#define PL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PL_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- ISA selection (runtime.c) ---- */

/* plx_unary_supports reports whether pl_unary and pl_glu compute the function fn (unary.c). */
int plx_unary_supports(int fn);

/* plx_isa is the level in use; read it after plx_init has run. */
extern int plx_isa;
/* plx_force_blas sends float matrix products to OpenBLAS at every level (PARLEY_CPU_BLAS). */
extern int plx_force_blas;
void plx_init(void);

/* ---- half precision (quant.c) ---- */

static inline uint32_t plx_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float plx_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* plx_f16_to_f32 converts IEEE binary16 to float exactly. */
static inline float plx_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return plx_bits_f32(sign | 0x7f800000u | man << 13);
    if (exp != 0) return plx_bits_f32(sign | (exp + 112) << 23 | man << 13);
    if (man == 0) return plx_bits_f32(sign);
    /* subnormal: man * 2^-24 */
    float f = (float)man * (1.0f / 16777216.0f);
    return sign ? -f : f;
}

/* plx_f32_to_f16 rounds to nearest even, as the F16C instruction does (overflow to infinity, NaN
 * kept quiet with its top payload bits). */
static inline uint16_t plx_f32_to_f16(float f) {
    uint32_t b = plx_f32_bits(f);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
    int32_t exp = (int32_t)((b >> 23) & 0xff);
    uint32_t man = b & 0x7fffff;
    if (exp == 0xff) return man ? (uint16_t)(sign | 0x7e00 | (man >> 13)) : (uint16_t)(sign | 0x7c00);
    int32_t he = exp - 127 + 15;
    if (he >= 0x1f) return (uint16_t)(sign | 0x7c00);
    if (he <= 0) {
        if (he < -10) return sign;
        uint32_t m = man | 0x800000;
        uint32_t shift = (uint32_t)(14 - he);
        uint32_t h = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (uint32_t)he << 10 | man >> 13;
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static inline float plx_bf16_to_f32(uint16_t h) { return plx_bits_f32((uint32_t)h << 16); }

/* plx_f32_to_bf16 rounds to nearest even; NaN stays a quiet NaN (as ggml does). */
static inline uint16_t plx_f32_to_bf16(float f) {
    uint32_t u = plx_f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

/* plx_round_even rounds |v| < 2^22 to the nearest integer, ties to even (as the default
 * floating-point rounding mode and _mm256_round_ps(v, _MM_ROUND_NEAREST) do). */
static inline int plx_round_even(float v) {
    float t = v + 12582912.0f; /* 1.5 * 2^23 */
    uint32_t i = plx_f32_bits(t);
    return (int)(i & 0x007fffff) - 0x00400000;
}

/* ---- block formats (ggml-common.h layouts, byte offsets) ---- */

#define QK32 32
#define QKK 256

/* plx_block_size and plx_type_size give elements and bytes per block, 0 for unknown types. */
int plx_block_size(int dtype);
int plx_type_size(int dtype);

/* Dequantisation of whole rows (quant.c), n a multiple of the block size. */
void plx_dequant_row(int dtype, const void *src, float *dst, int64_t n);

/* ---- packed operands of the integer matrix product (quant.c) ----
 *
 * Rows are handled in units of 64 elements (kp = k rounded up to 64; elements past k are zero)
 * and lanes of 4 consecutive elements (16 lanes a unit, one int32 / float each).
 *
 * An activation row converted to the weights' dot type (Q8_0, Q8_1 or Q8_K, bit-exact with
 * ggml) is packed as 3*kp bytes: int8 codes q [kp]; the float block scale of each lane's block
 * dx [kp/4]; and one auxiliary word per lane, aux [kp/4]: for offset types the int32
 * -off * (sum of the lane's 4 codes), for types with minimums the float that multiplies the
 * minimum (Q8_1: s/8, ggml's F16 s = d*sum shared by the 8 lanes of a block; Q8_K: d * the
 * lane's code sum).
 *
 * A weight row is unpacked (into a panel) as 3*kp bytes: uint8 codes u [kp], the float scale of
 * each lane dw [kp/4] (Q4_K/Q5_K: d*scale of the sub-block; Q2_K, Q3_K, Q6_K: d*scale of the
 * 16-element group, Q3_K's scale less 32; IQ4_XS: d*(scale-32) of the 32-element sub-block),
 * and for types with minimums the float minimum term mn [kp/4] (Q4_1/Q5_1: m; Q4_K/Q5_K:
 * -dmin*min of the sub-block; Q2_K: -dmin*min of the 16-element group). Then
 *     w . x = sum_l dw[l]*dx[l]*(sum_t u[4l+t]*q[4l+t] + bias[l]) + sum_l mn[l]*aux[l]
 * with every integer part exact, as ggml's kernels decompose it.
 *
 * Offsets: Q3_K 4, Q4_0 8, Q5_0 16, Q6_K 32, Q8_0 128 (codes stored as w+128, AVX-512 only);
 * Q4_1, Q5_1, Q2_K, Q4_K, Q5_K have minimums instead. Below AVX-512 Q8_0 codes are stored signed
 * (no offset): the 16-bit pair sums of vpmaddubsw would saturate on w+128, so the AVX2 kernel
 * applies the sign trick instead. IQ4_NL and IQ4_XS weights are signed bytes too, once each
 * 4-bit index is looked up in plx_iq4nl_values, and are handled as Q8_0's codes: stored as
 * value+128 (1..241) with offset 128 on AVX-512, signed below it (plx_type_signed).
 */
typedef struct {
    int wtype;    /* weight type */
    int vtype;    /* activation dot type: PL_Q8_0, PL_Q8_1 or PL_Q8_K */
    int off;      /* code offset, 0 when has_min */
    int has_min;  /* type has per-block minimums */
    int signed_u; /* codes are signed bytes (Q8_0, IQ4_NL, IQ4_XS below AVX-512) */
} plx_qinfo;

/* plx_type_has_min reports whether weights of quantised type t carry minimums (value =
 * scale*code - min) rather than a code offset; constant-folded for a constant t. */
static inline int plx_type_has_min(int t) {
    return t == PL_Q4_1 || t == PL_Q5_1 || t == PL_Q2_K || t == PL_Q4_K || t == PL_Q5_K;
}

/* plx_type_signed reports whether the weights of quantised type t are signed bytes (Q8_0's codes,
 * IQ4_NL's and IQ4_XS's table values): stored as such below AVX-512, where the kernels multiply
 * them with the sign trick, and plus 128 on AVX-512 (constant-folded likewise). */
static inline int plx_type_signed(int t) { return t == PL_Q8_0 || t == PL_IQ4_NL || t == PL_IQ4_XS; }

/* plx_iq4nl_values is the table of IQ4_NL and IQ4_XS: a 4-bit index stands for the value of its
 * entry (ggml's kvalues_iq4nl), times the block's or sub-block's scale. */
static const int8_t plx_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

/* plx_iq4xs_scales unpacks the eight 6-bit sub-block scales of an IQ4_XS super-block at blk, less
 * 32 (-32..31): the low four bits of scale ib are bits 4*ib..4*ib+3 of the little-endian 32-bit
 * scales_l at byte 4 (nibble ib%2 of byte ib/2), the high two bits 2*ib..2*ib+1 of the 16-bit
 * scales_h at byte 2. */
static inline void plx_iq4xs_scales(const uint8_t *blk, int8_t sc[8]) {
    const uint32_t sh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8;
    const uint32_t sl = (uint32_t)blk[4] | (uint32_t)blk[5] << 8 | (uint32_t)blk[6] << 16 | (uint32_t)blk[7] << 24;
    for (int ib = 0; ib < 8; ib++) {
        const int ls = (int)(((sl >> 4 * ib) & 15) | ((sh >> 2 * ib) & 3) << 4);
        sc[ib] = (int8_t)(ls - 32);
    }
}

/* plx_q3k_scales unpacks the twelve bytes of a Q3_K super-block's scales into its sixteen 6-bit
 * scales less 32 (-32..31), as ggml does: the low four bits of scale s are nibble s/8 of byte
 * s%8, the high two bits are bits 2*(s/4)..2*(s/4)+1 of byte 8 + s%4. */
static inline void plx_q3k_scales(const uint8_t *p, int8_t sc[16]) {
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t a[4];
    memcpy(a, p, 12);
    const uint32_t tmp = a[2];
    a[2] = ((a[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    a[3] = ((a[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    a[0] = (a[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    a[1] = (a[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    const uint8_t *b = (const uint8_t *)a;
    for (int s = 0; s < 16; s++) sc[s] = (int8_t)(b[s] - 32);
}

/* plx_qinfo_for fills qi for weights of wtype under ISA isa; returns 0 if wtype is not a
 * quantised type the integer kernels handle. */
int plx_qinfo_for(int wtype, int isa, plx_qinfo *qi);

static inline int64_t plx_kpad(int64_t k) { return (k + 63) & ~(int64_t)63; }

/* Bytes of one packed activation row / one unpacked weight row of k elements. */
static inline int64_t plx_act_stride(int64_t k) { return plx_kpad(k) * 3; }
static inline int64_t plx_panel_stride(int64_t k) { return plx_kpad(k) * 3; }

/* plx_pack_act converts x [k] to the activation form of qi at dst (plx_act_stride(k) bytes,
 * 64-byte aligned): codes at dst, dx at dst+kp, aux at dst+2kp. */
void plx_pack_act(const plx_qinfo *qi, const float *x, int64_t k, uint8_t *dst);

/* plx_q8_0_blocks converts nb blocks of 32 floats to Q8_0 as ggml's x86 backend does: the codes
 * q (contiguous), the F16 scale bits d, the unrounded scales df and the code sums. */
void plx_q8_0_blocks(const float *x, int64_t nb, int8_t *q, uint16_t *d, float *df, int32_t *sum);
/* plx_q8_k_blocks converts nb blocks of 256 floats to Q8_K as ggml does: codes, the float scale
 * of each block and the code sums of each 16. */
void plx_q8_k_blocks(const float *x, int64_t nb, int8_t *q, float *dk, int16_t *bsums);
#define PLX_CHUNK 64 /* blocks converted per step through stack buffers */

/* plx_unpack_w unpacks one weight row (ggml layout, k elements) to dst (plx_panel_stride(k)
 * bytes, 64-byte aligned): codes at dst, dw at dst+kp, mn at dst+2kp. */
void plx_unpack_w(const plx_qinfo *qi, const void *row, int64_t k, uint8_t *dst);

/* ---- thread pool (runtime.c) ---- */

/* A job is run as fn(arg, ith, nth) on every thread of the context, ith = 0..nth-1 (0 being the
 * calling thread). Jobs share work with plx_chunk_next. */
typedef void (*plx_job_fn)(void *arg, int ith, int nth);

struct pl_ctx {
    int nth;
    struct plx_pool *pool;
    /* shared scratch, grown on demand (never shrunk) */
    uint8_t *scratch;
    size_t scratch_size;
    /* per-thread scratch */
    uint8_t **tscratch;
    size_t *tscratch_size;
    /* RoPE angle table of the last call (ops.c): every layer of a step rotates the same
     * positions with the same parameters */
    float *rope_tab;   /* [rope_n][dims]: cos, sin of each pair */
    int32_t *rope_pos; /* [rope_n] */
    int64_t rope_cap, rope_n;
    pl_rope_cfg rope_cfg;
    float *rope_ff; /* [rope_ff_n]: a copy of rope_cfg.freq_factors, compared with the next call's */
    int64_t rope_ff_n;
    /* work counter for dynamic chunking; own cache line */
    _Alignas(64) volatile int64_t chunk;
    char pad[64 - sizeof(int64_t)];
};

/* plx_run runs fn on all threads of ctx and returns when all have finished. */
void plx_run(pl_ctx *ctx, plx_job_fn fn, void *arg);

/* plx_chunk_reset and plx_chunk_next hand out work items 0,1,2,... to threads of a job. Reset
 * before plx_run. */
static inline void plx_chunk_reset(pl_ctx *ctx) { __atomic_store_n(&ctx->chunk, 0, __ATOMIC_RELAXED); }
static inline int64_t plx_chunk_next(pl_ctx *ctx) {
    return __atomic_fetch_add(&ctx->chunk, 1, __ATOMIC_RELAXED);
}

/* plx_scratch returns at least size bytes of 64-byte-aligned shared scratch, NULL on failure.
 * The memory is reused by the next call. */
uint8_t *plx_scratch(pl_ctx *ctx, size_t size);
/* plx_tscratch returns at least size bytes of scratch private to thread ith, reserved beforehand
 * with plx_tscratch_reserve (threads must not grow it themselves). */
uint8_t *plx_tscratch(pl_ctx *ctx, int ith);
int plx_tscratch_reserve(pl_ctx *ctx, size_t size);

/* plx_blas_threads pins OpenBLAS to n threads (runtime.c). */
void plx_blas_threads(int n);

#endif
