/*
 * packed.c: quantised weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
 * IQ4_NL, IQ4_XS) interleaved sixteen rows at a time, and their matrix product (AVX-512 VNNI, and
 * AVX2; Q2_K, Q3_K, IQ4_NL and IQ4_XS AVX2 only).
 *
 * In ggml's layout a block's 32 codes lie in one row, so an integer dot product leaves a block's
 * sum spread over the lanes of a vector, and every block costs a conversion, a scale product and
 * an FMA per lane group. Interleaved, lane r of a vector holds four consecutive codes of row r of
 * a group of sixteen rows, and the vectors of a block follow one another: eight VNNI products
 * (each against four activation codes broadcast to every lane) leave a 32-element block's whole
 * integer dot product of each of the sixteen rows in its lane, then one conversion and one FMA
 * apply the block's scales. Per 512 multiply-adds of one activation row: eight VNNI operations, a
 * multiply and an FMA, against twenty-four operations for the row layout. Results land sixteen
 * rows to a vector, so nothing is reduced across lanes. pk_pack_group gives each type's layout;
 * all but Q3_K, Q4_K, Q5_K and IQ4_XS (2-4 bytes more a row every 256 elements) are as large as
 * their rows.
 *
 * Activation rows are converted to Q8_0 or Q8_1 (32-element weight types) or Q8_K (the
 * K-quants) as ggml converts them (quant.c). Weight codes are unsigned for VNNI; a bias made from
 * the activation codes' sums (-128, -8, -16 or -32 times a block's sum for Q8_0, Q4_0, Q5_0 and
 * Q6_K) turns them back into signed ones (the AVX2 kernels take Q8_0's codes back to signed
 * bytes instead, and need no bias for it), and the types with minimums add their term
 * m·(dx·Σx) (Q4_1, Q5_1: with dx·Σx rounded to F16, as ggml's Q8_1 stores it) or subtract
 * (dmin·m)·(dx·Σx) (Q4_K, Q5_K). A row's value is
 *     sum over blocks b, in order, of float(isum_b) * (dw_b * dx_b)    (one FMA a block)
 * with isum_b exact (Q8_0, Q4_0: dw_b·dx_b is a product of two F16 values, exact in float; the
 * K-quants' d·scale products are exact too, their product with dx rounded once). So a row's
 * result does not depend on how many rows of x go with it, nor on the number of threads.
 */
#include <stdlib.h>

#include "internal.h"

#define PK_ROWS 16
#define PK_RN 8 /* activation rows a kernel call takes */

/* ld32 reads four bytes as an int32 (codes and biases are stored as bytes and words). */
static inline int32_t ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* A unit is what the layout interleaves at once: a 32-element block (Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, IQ4_NL) or a 256-element super-block (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS). A unit of
 * sixteen rows holds, for each 32-element sub-block, its code vectors (8 of bytes for Q8_0, 2 of
 * 2-bit planes for Q2_K and Q3_K, 4 of nibbles otherwise, then 1 of fifth bits for
 * Q5_0/Q5_1/Q5_K, of third bits for Q3_K, or 2 of high bit pairs for Q6_K) and the rows' scales;
 * sizes are exactly sixteen times the type's block, except Q4_K and Q5_K, whose scales and
 * minimums take a byte each (+4 bytes a row a super-block, 2.8% and 2.3%) instead of 12 bytes of
 * 6-bit fields, Q3_K (a byte a scale: +4, 3.6%) and IQ4_XS (+2, 1.5%). */
static int pk_kquant(int wtype) {
    return wtype == PL_Q4_K || wtype == PL_Q5_K || wtype == PL_Q6_K || wtype == PL_IQ4_XS || wtype == PL_Q2_K || wtype == PL_Q3_K;
}
static int64_t pk_unit_elems(int wtype) { return pk_kquant(wtype) ? QKK : 32; }

/* pk_avx2_only: the types with AVX2 kernels only (with AVX-512 their VNNI row kernels serve). */
static int pk_avx2_only(int wtype) { return wtype == PL_IQ4_NL || wtype == PL_IQ4_XS || wtype == PL_Q2_K || wtype == PL_Q3_K; }

/* pk_hvecs is the number of high-bit vectors a 32-element sub-block has. */
static int pk_hvecs(int wtype) {
    return wtype == PL_Q5_0 || wtype == PL_Q5_1 || wtype == PL_Q5_K ? 1 : wtype == PL_Q6_K ? 2 : 0;
}
/* pk_sub_bytes is the bytes of one 32-element sub-block's code vectors (sixteen rows). */
static int64_t pk_sub_bytes(int wtype) {
    if (wtype == PL_Q2_K || wtype == PL_Q3_K) return 64 * (wtype == PL_Q2_K ? 2 : 3); /* 2-bit planes (+ high bits) */
    return 64 * ((wtype == PL_Q8_0 ? 8 : 4) + pk_hvecs(wtype));
}
/* pk_head_bytes is the bytes of a K-quant unit's scales, before its sub-blocks. */
static int64_t pk_head_bytes(int wtype) {
    switch (wtype) {
    case PL_Q6_K: case PL_Q3_K: return 2 * PK_ROWS + 16 * PK_ROWS;
    case PL_IQ4_XS: return 2 * PK_ROWS + 8 * PK_ROWS;
    default: return 4 * PK_ROWS + 16 * PK_ROWS; /* Q4_K, Q5_K, Q2_K */
    }
}

static int64_t pk_unit_bytes(int wtype) {
    switch (wtype) {
    case PL_Q8_0: case PL_Q4_0: case PL_Q5_0: case PL_IQ4_NL: return pk_sub_bytes(wtype) + 2 * PK_ROWS;
    case PL_Q4_1: case PL_Q5_1: return pk_sub_bytes(wtype) + 4 * PK_ROWS;
    case PL_Q4_K: case PL_Q5_K: case PL_Q6_K: case PL_IQ4_XS: case PL_Q2_K: case PL_Q3_K:
        return pk_head_bytes(wtype) + 8 * pk_sub_bytes(wtype);
    }
    return 0;
}

int64_t pl_packed_size(int wtype, int64_t m, int64_t k) {
    if (pk_unit_bytes(wtype) == 0) return PL_ERR_UNSUPPORTED;
    if (m < 0 || k <= 0 || k % pk_unit_elems(wtype) != 0) return PL_ERR_ARG;
    const int64_t groups = (m + PK_ROWS - 1) / PK_ROWS, nu = k / pk_unit_elems(wtype), ub = pk_unit_bytes(wtype);
    if (groups > 0 && nu > INT64_MAX / ub / groups) return PL_ERR_ARG;
    return groups * nu * ub;
}

int pl_packed_available(int wtype) {
    plx_init();
    if (pk_unit_bytes(wtype) == 0) return 0;
    if (pk_avx2_only(wtype)) return plx_isa == PL_ISA_AVX2;
    return plx_isa >= PL_ISA_AVX2;
}

/* scale_min_k4: the 6-bit scale and minimum of sub-block j (0..7) of a Q4_K/Q5_K super-block. */
static void pk_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static uint32_t pk_rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* pk_codes decodes one unit of a row (blk, ggml's layout) into unsigned codes q and, for the
 * K-quants, per-sub-block scales and minimums: Q8_0 q = code+128; Q4_0/Q4_1 0..15; Q5_0/Q5_1
 * 0..31; Q4_K 0..15 and Q5_K 0..31 with a 6-bit scale and minimum per 32 elements; Q6_K 0..63
 * (the value is q-32) with an int8 scale per 16 elements; IQ4_NL 0..15 and IQ4_XS 0..15 with a
 * scale less 32 (-32..31) per 32 elements, indices into plx_iq4nl_values; Q2_K 0..3 with ggml's
 * byte of a 4-bit scale and minimum per 16 elements; Q3_K 0..7 (the value is q-4) with a scale
 * less 32 per 16 elements. */
static void pk_codes(int wtype, const uint8_t *blk, uint8_t *q, int *sc, int *mn) {
    switch (wtype) {
    case PL_Q8_0:
        for (int e = 0; e < 32; e++) q[e] = (uint8_t)(blk[2 + e] ^ 0x80);
        return;
    case PL_Q4_0:
    case PL_Q4_1:
    case PL_IQ4_NL: {
        const uint8_t *qs = blk + (wtype == PL_Q4_1 ? 4 : 2);
        for (int e = 0; e < 16; e++) {
            q[e] = qs[e] & 0xF;
            q[e + 16] = qs[e] >> 4;
        }
        return;
    }
    case PL_Q5_0:
    case PL_Q5_1: {
        const int o = wtype == PL_Q5_0 ? 2 : 4;
        const uint32_t qh = pk_rd32(blk + o);
        const uint8_t *qs = blk + o + 4;
        for (int e = 0; e < 16; e++) {
            q[e] = (uint8_t)((qs[e] & 0xF) | ((qh >> e) & 1) << 4);
            q[e + 16] = (uint8_t)((qs[e] >> 4) | ((qh >> (e + 16)) & 1) << 4);
        }
        return;
    }
    case PL_Q4_K:
    case PL_Q5_K: {
        const uint8_t *qh = blk + 16, *ql = blk + (wtype == PL_Q4_K ? 16 : 48);
        for (int s = 0; s < 8; s++) {
            pk_scale_min_k4(s, blk + 4, &sc[s], &mn[s]);
            const uint8_t *c = ql + 32 * (s / 2);
            for (int l = 0; l < 32; l++) {
                int v = s % 2 ? c[l] >> 4 : c[l] & 0xF;
                if (wtype == PL_Q5_K) v |= ((qh[l] >> s) & 1) << 4;
                q[32 * s + l] = (uint8_t)v;
            }
        }
        return;
    }
    case PL_Q6_K:
        for (int e = 0; e < QKK; e++) {
            const int n = e / 128, quarter = (e % 128) / 32, l = e % 32;
            const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
            const int lo = quarter % 2 ? ql[l + 32] : ql[l];
            q[e] = (uint8_t)((quarter < 2 ? lo & 0xF : lo >> 4) | ((qh[l] >> (2 * quarter)) & 3) << 4);
        }
        for (int i = 0; i < 16; i++) sc[i] = (int8_t)blk[192 + i];
        return;
    case PL_Q2_K: /* scales and minimums stay ggml's bytes (scale | minimum << 4) */
    case PL_Q3_K: {
        const uint8_t *qs = blk + (wtype == PL_Q2_K ? 16 : 32), *hm = blk;
        for (int e = 0; e < QKK; e++) {
            const int n = e / 128, j = (e % 128) / 32, l = e % 32;
            int v = (qs[32 * n + l] >> (2 * j)) & 3;
            if (wtype == PL_Q3_K) v |= ((hm[l] >> (4 * n + j)) & 1) << 2; /* value v-4 */
            q[e] = (uint8_t)v;
        }
        if (wtype == PL_Q2_K) {
            for (int i = 0; i < 16; i++) sc[i] = blk[i];
        } else {
            int8_t s8[16];
            plx_q3k_scales(blk + 96, s8);
            for (int i = 0; i < 16; i++) sc[i] = s8[i];
        }
        return;
    }
    case PL_IQ4_XS: {
        int8_t s8[8];
        plx_iq4xs_scales(blk, s8);
        for (int s = 0; s < 8; s++) {
            sc[s] = s8[s];
            for (int l = 0; l < 16; l++) {
                q[32 * s + l] = blk[8 + 16 * s + l] & 0xF;
                q[32 * s + 16 + l] = blk[8 + 16 * s + l] >> 4;
            }
        }
        return;
    }
    }
}

/* pk_sub writes the 32 codes q of a sub-block of row r into its vectors at o:
 *   Q8_0: lane r, byte t of vector v holds code 4v+t;
 *   Q2_K, Q3_K: lane r, byte t of plane vector p (0..1) holds code 4(4p+i)+t's low two bits in
 *   bits 2i and 2i+1 (i = 0..3), and for Q3_K lane r, byte t of the next vector holds code
 *   4v+t's third bit in bit v (v = 0..7);
 *   others: lane r, byte t of nibble vector v (0..3) holds code 4v+t's low four bits in its low
 *   nibble and code 16+4v+t's in its high one; then, for five-bit codes, lane r, byte t of the
 *   next vector holds code 4v+t's fifth bit in bit v (v = 0..7); for Q6_K, lane r, byte t of high
 *   vector h holds code 4(4h+i)+t's top two bits in bits 2i and 2i+1 (i = 0..3). */
static void pk_sub(int wtype, const uint8_t *q, int r, uint8_t *o) {
    if (wtype == PL_Q2_K || wtype == PL_Q3_K) {
        for (int p = 0; p < 2; p++)
            for (int t = 0; t < 4; t++) {
                uint8_t b = 0;
                for (int i = 0; i < 4; i++) b |= (uint8_t)((q[4 * (4 * p + i) + t] & 3) << (2 * i));
                o[64 * p + 4 * r + t] = b;
            }
        if (wtype == PL_Q3_K)
            for (int t = 0; t < 4; t++) {
                uint8_t b = 0;
                for (int v = 0; v < 8; v++) b |= (uint8_t)(((q[4 * v + t] >> 2) & 1) << v);
                o[128 + 4 * r + t] = b;
            }
        return;
    }
    if (wtype == PL_Q8_0) {
        for (int v = 0; v < 8; v++) memcpy(o + 64 * v + 4 * r, q + 4 * v, 4);
        return;
    }
    for (int v = 0; v < 4; v++)
        for (int t = 0; t < 4; t++) o[64 * v + 4 * r + t] = (uint8_t)((q[4 * v + t] & 0xF) | (q[16 + 4 * v + t] & 0xF) << 4);
    const int hv = pk_hvecs(wtype);
    for (int h = 0; h < hv; h++)
        for (int t = 0; t < 4; t++) {
            uint8_t b = 0;
            if (hv == 1) {
                for (int v = 0; v < 8; v++) b |= (uint8_t)(((q[4 * v + t] >> 4) & 1) << v);
            } else {
                for (int i = 0; i < 4; i++) b |= (uint8_t)((q[4 * (4 * h + i) + t] >> 4) << (2 * i));
            }
            o[256 + 64 * h + 4 * r + t] = b;
        }
}

/* pk_pack_group writes group g of w (m rows of k elements in ggml's layout) at dst, unit after
 * unit. Rows past m are zero weights (zero scales and minimums; Q8_0's zero code). Units:
 *   32-element types: the sub-block's vectors (pk_sub), the rows' F16 scales d [16], and for
 *         Q4_1/Q5_1 their F16 minimums m [16];
 *   Q4_K, Q5_K: F16 d [16], F16 dmin [16], 6-bit scales [8 sub-blocks][16] and minimums [8][16]
 *         as bytes, then each sub-block's vectors;
 *   Q6_K: F16 d [16], int8 scales [16 sub-blocks of 16][16], then each sub-block's vectors;
 *   IQ4_XS: F16 d [16], int8 scales less 32 [8 sub-blocks][16], then each sub-block's vectors
 *         (IQ4_NL, a 32-element type, is laid out as Q4_0: its nibbles are table indices);
 *   Q2_K: F16 d [16], F16 dmin [16], ggml's scale-and-minimum bytes [16 groups of 16][16], then
 *         each sub-block's two plane vectors;
 *   Q3_K: F16 d [16], int8 scales less 32 [16 groups of 16][16], then each sub-block's two plane
 *         vectors and its vector of third bits. */
static void pk_pack_group(int wtype, const uint8_t *w, int64_t m, int64_t k, int64_t g, uint8_t *dst) {
    const int64_t ue = pk_unit_elems(wtype), nu = k / ue, ts = plx_type_size(wtype), ub = pk_unit_bytes(wtype);
    const int64_t row = (k / plx_block_size(wtype)) * ts, sb = pk_sub_bytes(wtype), hb = pk_head_bytes(wtype);
    uint8_t q[QKK];
    int sc[16], mn[8];
    for (int64_t u = 0; u < nu; u++) {
        uint8_t *o = dst + u * ub;
        memset(o, 0, (size_t)ub);
        for (int r = 0; r < PK_ROWS; r++) {
            const int64_t rr = g * PK_ROWS + r;
            if (rr >= m) { /* padding: zero scales, and Q8_0's zero code */
                if (wtype == PL_Q8_0)
                    for (int v = 0; v < 8; v++) memset(o + 64 * v + 4 * r, 0x80, 4);
                continue;
            }
            const uint8_t *blk = w + rr * row + u * ts;
            pk_codes(wtype, blk, q, sc, mn);
            switch (wtype) {
            case PL_Q4_K:
            case PL_Q5_K:
                memcpy(o + 2 * r, blk, 2);
                memcpy(o + 32 + 2 * r, blk + 2, 2);
                for (int s = 0; s < 8; s++) {
                    o[64 + 16 * s + r] = (uint8_t)sc[s];
                    o[192 + 16 * s + r] = (uint8_t)mn[s];
                    pk_sub(wtype, q + 32 * s, r, o + hb + sb * s);
                }
                break;
            case PL_Q2_K:
                memcpy(o + 2 * r, blk + 80, 2);
                memcpy(o + 32 + 2 * r, blk + 82, 2);
                for (int i = 0; i < 16; i++) o[64 + 16 * i + r] = (uint8_t)sc[i];
                for (int s = 0; s < 8; s++) pk_sub(wtype, q + 32 * s, r, o + hb + sb * s);
                break;
            case PL_IQ4_XS:
                memcpy(o + 2 * r, blk, 2);
                for (int s = 0; s < 8; s++) {
                    o[32 + 16 * s + r] = (uint8_t)sc[s];
                    pk_sub(wtype, q + 32 * s, r, o + hb + sb * s);
                }
                break;
            case PL_Q3_K: /* d, then a scale a group of sixteen */
            case PL_Q6_K:
                memcpy(o + 2 * r, blk + (wtype == PL_Q3_K ? 108 : 208), 2);
                for (int i = 0; i < 16; i++) o[32 + 16 * i + r] = (uint8_t)sc[i];
                for (int s = 0; s < 8; s++) pk_sub(wtype, q + 32 * s, r, o + hb + sb * s);
                break;
            default: /* 32-element blocks: d, then m (Q4_1, Q5_1), lead the block */
                pk_sub(wtype, q, r, o);
                memcpy(o + sb + 2 * r, blk, 2);
                if (wtype == PL_Q4_1 || wtype == PL_Q5_1) memcpy(o + sb + 32 + 2 * r, blk + 2, 2);
                break;
            }
        }
    }
}

typedef struct {
    pl_ctx *ctx;
    int wtype;
    const uint8_t *w;
    int64_t m, k, groups;
    uint8_t *dst;
} pk_pack_job;

static void job_pack_w(void *p, int ith, int nth) {
    pk_pack_job *j = (pk_pack_job *)p;
    (void)ith;
    (void)nth;
    const int64_t gb = (j->k / pk_unit_elems(j->wtype)) * pk_unit_bytes(j->wtype);
    int64_t g;
    while ((g = plx_chunk_next(j->ctx)) < j->groups) pk_pack_group(j->wtype, j->w, j->m, j->k, g, j->dst + g * gb);
}

int pl_pack_weights(pl_ctx *ctx, int wtype, const void *w, int64_t m, int64_t k, void *dst) {
    if (ctx == NULL) return PL_ERR_ARG;
    int64_t size = pl_packed_size(wtype, m, k);
    if (size < 0) return (int)size;
    if (m == 0) return PL_OK;
    if (w == NULL || dst == NULL) return PL_ERR_ARG;
    pk_pack_job j = {ctx, wtype, (const uint8_t *)w, m, k, (m + PK_ROWS - 1) / PK_ROWS, (uint8_t *)dst};
    plx_chunk_reset(ctx);
    plx_run(ctx, job_pack_w, &j);
    return PL_OK;
}

/* ================================================================ activations
 *
 * A packed activation row of k elements: its codes (k bytes, rounded up to 64), then two arrays,
 * each region rounded up to 64 bytes:
 *   Q8_0, Q4_0, Q5_0 weights (x as Q8_0): A = each 32's scale as float, B = each 32's bias as
 *         int32: -128, -8 or -16 times its code sum;
 *   Q4_1, Q5_1 (x as Q8_1): A = each 32's scale, B = its F16 product of scale and code sum, as
 *         float (what ggml multiplies the weights' minimum by);
 *   Q4_K, Q5_K (x as Q8_K): A = each 256's scale, B = each 32's scale times code sum (float);
 *   Q6_K (x as Q8_K): A = each 256's scale, B = each 16's bias: -32 times its code sum;
 *   IQ4_NL (x as Q8_0), IQ4_XS (x as Q8_K): A as above, B unused (their values are signed);
 *   Q2_K, Q3_K (x as Q8_K): A = each 256's scale, B = each 16's code sum (Q2_K) or -4 times it
 *         (Q3_K) as a 16-bit integer in the low half of a 32-bit word whose high half is zero. */

/* Most matrices one call of pl_matmul_packed3 multiplies. */
#define PK_MAX_SEGS 3

#if PL_X86
static int64_t pk_r64(int64_t n) { return (n + 63) & ~(int64_t)63; }
static int64_t pk_off_a(int64_t k) { return pk_r64(k); }
static int64_t pk_off_b(int64_t k) { return pk_r64(k) + pk_r64(k / 32 * 4); }
static int64_t pk_act_stride(int64_t k) { return pk_off_b(k) + pk_r64(k / 16 * 4); }

static void pk_pack_act(int wtype, const float *x, int64_t k, uint8_t *dst) {
    int8_t *q = (int8_t *)dst;
    float *a = (float *)(void *)(dst + pk_off_a(k));
    uint8_t *bb = dst + pk_off_b(k);
    if (!pk_kquant(wtype)) {
        const int64_t nb = k / 32;
        const int off = wtype == PL_Q8_0 ? 128 : wtype == PL_Q4_0 ? 8 : wtype == PL_Q5_0 ? 16 : 0;
        uint16_t d[PLX_CHUNK];
        float dfull[PLX_CHUNK];
        int32_t sum[PLX_CHUNK];
        for (int64_t b0 = 0; b0 < nb; b0 += PLX_CHUNK) {
            const int64_t c = PL_MIN(PLX_CHUNK, nb - b0);
            plx_q8_0_blocks(x + b0 * 32, c, q + b0 * 32, d, dfull, sum);
            for (int64_t b = 0; b < c; b++) {
                a[b0 + b] = plx_f16_to_f32(d[b]);
                if (wtype == PL_IQ4_NL) continue; /* signed values: no bias */
                if (off) ((int32_t *)(void *)bb)[b0 + b] = -off * sum[b];
                else ((float *)(void *)bb)[b0 + b] = plx_f16_to_f32(plx_f32_to_f16(dfull[b] * (float)sum[b]));
            }
        }
        return;
    }
    const int64_t ns = k / QKK;
    int16_t bs[16];
    for (int64_t u = 0; u < ns; u++) {
        plx_q8_k_blocks(x + u * QKK, 1, q + u * QKK, &a[u], bs);
        if (wtype == PL_IQ4_XS) continue; /* signed values, no minimums: the codes and A only */
        if (wtype == PL_Q2_K || wtype == PL_Q3_K) { /* 16-bit, zero-extended: vpmaddwd's operand */
            uint32_t *b16 = (uint32_t *)(void *)bb + 16 * u;
            for (int i = 0; i < 16; i++) b16[i] = (uint16_t)(int16_t)(wtype == PL_Q2_K ? bs[i] : -4 * bs[i]);
            continue;
        }
        if (wtype == PL_Q6_K) {
            int32_t *bias = (int32_t *)(void *)bb + 16 * u;
            for (int i = 0; i < 16; i++) bias[i] = -32 * bs[i];
        } else {
            float *mt = (float *)(void *)bb + 8 * u;
            for (int s = 0; s < 8; s++) mt[s] = a[u] * (float)(bs[2 * s] + bs[2 * s + 1]);
        }
    }
}

/* ================================================================ kernels */

/* PK_PREFETCH bytes ahead of the unit being read, the weights are prefetched into L2: the
 * hardware prefetchers fall behind at every new page of a stream (see matmul.c), and into L1 the
 * prefetched lines evict the activation rows that every unit reads again. Over the 110M model's
 * matrices streamed from memory (7 a layer, 12 layers, Q8_0, 2 threads), L2 at 8 KiB against L1
 * at 4 KiB: 3.0-3.8 against 3.6-4.7 ms for one row, 3.5-4.3 against 5.3-5.9 ms for eight. */
#define PK_PREFETCH 8192

/* pk_prefetch prefetches the bytes [p+PK_PREFETCH, p+PK_PREFETCH+n). */
__attribute__((always_inline)) static inline void pk_prefetch(const uint8_t *p, int n) {
    for (int l = 0; l < n; l += 64) _mm_prefetch((const char *)p + PK_PREFETCH + l, _MM_HINT_T1);
}

/* pk_nib4 unpacks four vectors of nibbles at p into the eight code vectors W of a 32-element
 * sub-block (low nibbles: W[0..3], high nibbles: W[4..7]). */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void pk_nib4(const uint8_t *p, __m512i W[8]) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m512i x = _mm512_loadu_si512((const void *)(p + 64 * v));
        W[v] = _mm512_and_si512(x, lo4);
        W[v + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), lo4);
    }
}

/* pk_dots adds to D[j] (and, when split, E[j] for the odd vectors) the VNNI products of code
 * vectors W[v0..v1) with the activation codes a + j*as + 4v, broadcast to every lane. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
pk_dots(const int RN, const int v0, const int v1, const int split, const __m512i W[8], const uint8_t *a,
        int64_t as, __m512i D[PK_RN], __m512i E[PK_RN]) {
#pragma GCC unroll 8
    for (int v = v0; v < v1; v++)
#pragma GCC unroll 8
        for (int j = 0; j < RN; j++) {
            const __m512i x = _mm512_set1_epi32(ld32(a + j * as + 4 * v));
            if (split && (v & 1)) E[j] = _mm512_dpbusd_epi32(E[j], W[v], x);
            else D[j] = _mm512_dpbusd_epi32(D[j], W[v], x);
        }
}

/* pk_fifth ORs the fifth bits of a sub-block's codes (the vector at p, see pk_sub) into W[0..7]:
 * bit v of each byte moves to bit 4 of W[v]. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void pk_fifth(const uint8_t *p, __m512i W[8]) {
    const __m512i b4 = _mm512_set1_epi8(0x10), h = _mm512_loadu_si512((const void *)p);
#pragma GCC unroll 8
    for (int v = 0; v < 8; v++) /* shifts within 16-bit lanes: the mask drops the other byte's bits */
        W[v] = _mm512_or_si512(W[v], _mm512_and_si512(v <= 4 ? _mm512_slli_epi16(h, 4 - v) : _mm512_srli_epi16(h, v - 4), b4));
}

/* pk_top2 ORs Q6_K's top two bits (the two vectors at p, see pk_sub) into W[0..7] as bits 4-5. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void pk_top2(const uint8_t *p, __m512i W[8]) {
    const __m512i m2 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i hb = _mm512_loadu_si512((const void *)(p + 64 * h));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) /* bit pair i to bits 4-5 */
            W[4 * h + i] = _mm512_or_si512(W[4 * h + i], _mm512_and_si512(i <= 2 ? _mm512_slli_epi16(hb, 4 - 2 * i) : _mm512_srli_epi16(hb, 2), m2));
    }
}

/* pk_load_sub loads the eight code vectors of a sub-block whose vectors start at p. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void pk_load_sub(const int T, const uint8_t *p, __m512i W[8]) {
    if (T == PL_Q8_0) {
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) W[v] = _mm512_loadu_si512((const void *)(p + 64 * v));
        return;
    }
    pk_nib4(p, W);
    if (T == PL_Q5_0 || T == PL_Q5_1 || T == PL_Q5_K) pk_fifth(p + 256, W);
    if (T == PL_Q6_K) pk_top2(p + 256, W);
}

/* pk_f32x16 widens sixteen bytes at p (signed if sgn) to floats. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline __m512 pk_f32x16(const uint8_t *p, const int sgn) {
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
    return _mm512_cvtepi32_ps(sgn ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
}

/* Groups g0 .. g1-1 against RN activation rows (stride as bytes) of k elements:
 * out[j*ldo + 16g + r] for row 16g+r < m. One or two activation rows leave too few independent
 * VNNI chains to hide their latency, so their products are split over two accumulators (integer
 * sums: the same result). */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
pk_kern(const int T, const int RN, const uint8_t *wp, int64_t g0, int64_t g1, int64_t m, int64_t k,
        const uint8_t *act, int64_t as, float *out, int64_t ldo) {
    const int kq = T == PL_Q4_K || T == PL_Q5_K || T == PL_Q6_K;
    const int has_min = T == PL_Q4_1 || T == PL_Q5_1 || T == PL_Q4_K || T == PL_Q5_K;
    const int64_t nu = k / (kq ? QKK : 32), ub = pk_unit_bytes(T), sb = pk_sub_bytes(T);
    const int64_t gb = nu * ub, oa = pk_off_a(k), ob = pk_off_b(k);
    const int split = RN <= 2;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *wg = wp + g * gb;
        __m512 acc[PK_RN];
#pragma GCC unroll 8
        for (int j = 0; j < RN; j++) acc[j] = _mm512_setzero_ps();
        for (int64_t u = 0; u < nu; u++) {
            const uint8_t *un = wg + u * ub;
            __m512i W[8], D[PK_RN], E[PK_RN];
            if (!kq) {
                /* one 32-element block: sum = bias + Σ codes·x, one FMA with dw·dx, and for
                 * Q4_1/Q5_1 one with the minimum m·(F16 dx·Σx) */
                pk_prefetch(un, (int)ub);
                pk_load_sub(T, un, W);
                const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(un + sb)));
                const __m512 mw = has_min ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(un + sb + 32))) : dw;
#pragma GCC unroll 8
                for (int j = 0; j < RN; j++) {
                    D[j] = has_min ? _mm512_setzero_si512() : _mm512_set1_epi32(ld32(act + j * as + ob + 4 * u));
                    E[j] = _mm512_setzero_si512();
                }
                pk_dots(RN, 0, 8, split, W, act + 32 * u, as, D, E);
#pragma GCC unroll 8
                for (int j = 0; j < RN; j++) {
                    const __m512i s = split ? _mm512_add_epi32(D[j], E[j]) : D[j];
                    const float dx = *(const float *)(const void *)(act + j * as + oa + 4 * u);
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[j]);
                    if (has_min)
                        acc[j] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*(const float *)(const void *)(act + j * as + ob + 4 * u)), acc[j]);
                }
            } else if (T != PL_Q6_K) {
                /* Q4_K, Q5_K, per 32-element sub-block: sum = Σ codes·x (no bias), then
                 * + float(sum)·(d·sc)·dy - (dmin·m)·(dy·Σx) */
                pk_prefetch(un, (int)ub);
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)un));
                const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(un + 32)));
                for (int s = 0; s < 8; s++) {
                    const uint8_t *sub = un + 320 + sb * s;
                    const __m512 dsc = _mm512_mul_ps(d, pk_f32x16(un + 64 + 16 * s, 0));
                    const __m512 dmn = _mm512_mul_ps(dmin, pk_f32x16(un + 192 + 16 * s, 0));
                    pk_load_sub(T, sub, W);
#pragma GCC unroll 8
                    for (int j = 0; j < RN; j++) D[j] = E[j] = _mm512_setzero_si512();
                    pk_dots(RN, 0, 8, split, W, act + QKK * u + 32 * s, as, D, E);
#pragma GCC unroll 8
                    for (int j = 0; j < RN; j++) {
                        const __m512i sum = split ? _mm512_add_epi32(D[j], E[j]) : D[j];
                        const float dy = *(const float *)(const void *)(act + j * as + oa + 4 * u);
                        const float mt = *(const float *)(const void *)(act + j * as + ob + 4 * (8 * u + s));
                        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dsc, _mm512_set1_ps(dy)), acc[j]);
                        acc[j] = _mm512_fnmadd_ps(dmn, _mm512_set1_ps(mt), acc[j]);
                    }
                }
            } else {
                /* Q6_K, per 16 elements: sum = bias + Σ codes·x, + float(sum)·(d·sc)·dy */
                pk_prefetch(un, (int)ub);
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)un));
                for (int s = 0; s < 8; s++) {
                    const uint8_t *sub = un + 288 + sb * s;
                    const __m512 dsa = _mm512_mul_ps(d, pk_f32x16(un + 32 + 16 * (2 * s), 1));
                    const __m512 dsb = _mm512_mul_ps(d, pk_f32x16(un + 32 + 16 * (2 * s + 1), 1));
                    pk_load_sub(T, sub, W);
#pragma GCC unroll 8
                    for (int j = 0; j < RN; j++) {
                        D[j] = _mm512_set1_epi32(ld32(act + j * as + ob + 4 * (16 * u + 2 * s)));
                        E[j] = _mm512_set1_epi32(ld32(act + j * as + ob + 4 * (16 * u + 2 * s + 1)));
                    }
                    pk_dots(RN, 0, 4, 0, W, act + QKK * u + 32 * s, as, D, E);
                    pk_dots(RN, 4, 8, 0, W, act + QKK * u + 32 * s, as, E, D);
#pragma GCC unroll 8
                    for (int j = 0; j < RN; j++) {
                        const __m512 dy = _mm512_set1_ps(*(const float *)(const void *)(act + j * as + oa + 4 * u));
                        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D[j]), _mm512_mul_ps(dsa, dy), acc[j]);
                        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(E[j]), _mm512_mul_ps(dsb, dy), acc[j]);
                    }
                }
            }
        }
        const int64_t rows = PL_MIN((int64_t)PK_ROWS, m - g * PK_ROWS);
        const __mmask16 mk = rows >= PK_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << rows) - 1);
#pragma GCC unroll 8
        for (int j = 0; j < RN; j++) _mm512_mask_storeu_ps(out + j * ldo + g * PK_ROWS, mk, acc[j]);
    }
}

typedef void (*pk_fn)(const uint8_t *wp, int64_t g0, int64_t g1, int64_t m, int64_t k,
                      const uint8_t *act, int64_t as, float *out, int64_t ldo);

/* PK_KERN defines NAME, the kernel KERN (pk_kern, pk2_kern) for type T and RN rows, compiled for
 * TARGET; PK_KERNS the kernels of prefix P for one to N rows and their table P_name[rn]. */
#define PK_KERN(NAME, TARGET, KERN, T, RN)                                                        \
    TARGET static void NAME(const uint8_t *wp, int64_t g0, int64_t g1, int64_t m, int64_t k,      \
                            const uint8_t *act, int64_t as, float *out, int64_t ldo) {            \
        KERN(T, RN, wp, g0, g1, m, k, act, as, out, ldo);                                         \
    }
#define PK_KERNS4(P, TARGET, KERN, T, name)                                                       \
    PK_KERN(P##_##name##_1, TARGET, KERN, T, 1)                                                   \
    PK_KERN(P##_##name##_2, TARGET, KERN, T, 2)                                                   \
    PK_KERN(P##_##name##_3, TARGET, KERN, T, 3)                                                   \
    PK_KERN(P##_##name##_4, TARGET, KERN, T, 4)
#define PK_KERNS(T, name)                                                                         \
    PK_KERNS4(pk, PL_TARGET_AVX512, pk_kern, T, name)                                             \
    PK_KERN(pk_##name##_5, PL_TARGET_AVX512, pk_kern, T, 5)                                       \
    PK_KERN(pk_##name##_6, PL_TARGET_AVX512, pk_kern, T, 6)                                       \
    PK_KERN(pk_##name##_7, PL_TARGET_AVX512, pk_kern, T, 7)                                       \
    PK_KERN(pk_##name##_8, PL_TARGET_AVX512, pk_kern, T, 8)                                       \
    static const pk_fn pk_##name[PK_RN + 1] = {NULL,           pk_##name##_1, pk_##name##_2,      \
                                               pk_##name##_3,  pk_##name##_4, pk_##name##_5,      \
                                               pk_##name##_6,  pk_##name##_7, pk_##name##_8};
PK_KERNS(PL_Q8_0, q8_0)
PK_KERNS(PL_Q4_0, q4_0)
PK_KERNS(PL_Q4_1, q4_1)
PK_KERNS(PL_Q5_0, q5_0)
PK_KERNS(PL_Q5_1, q5_1)
PK_KERNS(PL_Q4_K, q4_k)
PK_KERNS(PL_Q5_K, q5_k)
PK_KERNS(PL_Q6_K, q6_k)

/* ---------------------------------------------------------------- AVX2
 *
 * The same layouts through 256-bit vectors: a 64-byte vector's first half holds rows 0-7 of a
 * group, its second rows 8-15, so a group is two passes of eight rows. Without VNNI, bytes
 * multiply through vpmaddubsw (pairs of unsigned × signed products summed into 16 bits, which
 * saturate beyond 32767: fine for codes below 64, 2·63·128 at most) and vpmaddwd by ones (into
 * 32 bits). Q8_0's codes + 128 would saturate (2·255·127), so its vectors are taken back to the
 * signed codes (XOR 0x80) and multiplied as the row layout does: |code| (-128 becomes 128,
 * unsigned) against the activation codes given the code's sign (vpsignb; they lie in -127..127),
 * pairs at most 2·128·127 = 32512, and the block sum needs no bias. Block sums and their FMAs are
 * pk_kern's, so results are the AVX-512 kernels' bit for bit. Up to four activation rows a pass
 * (sixteen registers). */

#define PK2_RN 4

__attribute__((always_inline)) PL_TARGET_AVX2 static inline void pk2_nib4(const uint8_t *p, __m256i W[8]) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(p + 64 * v));
        W[v] = _mm256_and_si256(x, lo4);
        W[v + 4] = _mm256_and_si256(_mm256_srli_epi16(x, 4), lo4);
    }
}

__attribute__((always_inline)) PL_TARGET_AVX2 static inline void pk2_fifth(const uint8_t *p, __m256i W[8]) {
    const __m256i b4 = _mm256_set1_epi8(0x10), h = _mm256_loadu_si256((const __m256i *)(const void *)p);
#pragma GCC unroll 8
    for (int v = 0; v < 8; v++)
        W[v] = _mm256_or_si256(W[v], _mm256_and_si256(v <= 4 ? _mm256_slli_epi16(h, 4 - v) : _mm256_srli_epi16(h, v - 4), b4));
}

__attribute__((always_inline)) PL_TARGET_AVX2 static inline void pk2_top2(const uint8_t *p, __m256i W[8]) {
    const __m256i m2 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(const void *)(p + 64 * h));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            W[4 * h + i] = _mm256_or_si256(W[4 * h + i], _mm256_and_si256(i <= 2 ? _mm256_slli_epi16(hb, 4 - 2 * i) : _mm256_srli_epi16(hb, 2), m2));
    }
}

/* pk2_load_sub loads the eight code vectors (eight rows' halves) of a sub-block whose vectors
 * start at p, for the half of the group that p already points into: Q8_0's as signed codes,
 * IQ4_NL's and IQ4_XS's as their signed table values. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void pk2_load_sub(const int T, const uint8_t *p, __m256i W[8]) {
    if (T == PL_Q8_0) {
        const __m256i b7 = _mm256_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) W[v] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + 64 * v)), b7);
        return;
    }
    pk2_nib4(p, W);
    if (T == PL_Q5_0 || T == PL_Q5_1 || T == PL_Q5_K) pk2_fifth(p + 256, W);
    if (T == PL_Q6_K) pk2_top2(p + 256, W);
    if (T == PL_IQ4_NL || T == PL_IQ4_XS) { /* indices to their signed table values */
        const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)plx_iq4nl_values));
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) W[v] = _mm256_shuffle_epi8(tbl, W[v]);
    }
}

/* pk2_dots_by adds to D[j] the products of W[v0..v1) with the activation codes a + j*as + 4v (for
 * signed weights, plx_type_signed: |W| with the codes given W's sign), each pair's 16-bit sum
 * times the 16-bit factor of its lane in ones (both halves of a lane: the same factor); pk2_dots
 * with factors of one. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
pk2_dots_by(const int T, const int RN, const int v0, const int v1, const __m256i W[8], const uint8_t *a,
            int64_t as, __m256i D[PK2_RN], const __m256i ones) {
#pragma GCC unroll 8
    for (int v = v0; v < v1; v++) {
        const __m256i wu = plx_type_signed(T) ? _mm256_abs_epi8(W[v]) : W[v];
#pragma GCC unroll 4
        for (int j = 0; j < RN; j++) {
            __m256i x = _mm256_set1_epi32(ld32(a + j * as + 4 * v));
            if (plx_type_signed(T)) x = _mm256_sign_epi8(x, W[v]);
            D[j] = _mm256_add_epi32(D[j], _mm256_madd_epi16(_mm256_maddubs_epi16(wu, x), ones));
        }
    }
}

__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
pk2_dots(const int T, const int RN, const int v0, const int v1, const __m256i W[8], const uint8_t *a,
         int64_t as, __m256i D[PK2_RN]) {
    pk2_dots_by(T, RN, v0, v1, W, a, as, D, _mm256_set1_epi16(1));
}

__attribute__((always_inline)) PL_TARGET_AVX2 static inline __m256 pk2_f32x8(const uint8_t *p, const int sgn) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p);
    return _mm256_cvtepi32_ps(sgn ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
}

__attribute__((always_inline)) PL_TARGET_AVX2 static inline __m256 pk2_h8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

/* pk2k23_unit adds to acc[j] one super-block (unit un, the u-th) of eight rows (half h of the
 * group) of Q2_K or Q3_K against activation rows act + j*as: their codes unsigned (0..3, 0..7),
 * each group of sixteen elements' pair sums multiplied by its scale in vpmaddwd, so a
 * super-block's sum is one exact integer, as ggml sums it; Q3_K's -4 a code enters as -4 times
 * the group's activation sum times the scale (the same vpmaddwd), Q2_K's minimums as a second
 * integer, the minimums times the groups' activation sums, scaled by dmin·dy. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
pk2k23_unit(const int T, const int RN, const uint8_t *un, int64_t u, int h, int64_t k, const uint8_t *act,
            int64_t as, __m256 acc[PK2_RN]) {
    const int q2 = T == PL_Q2_K;
    const int64_t sb = pk_sub_bytes(T), hb = pk_head_bytes(T), oa = pk_off_a(k), ob = pk_off_b(k), so = q2 ? 64 : 32;
    const __m256i m3 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);
    const __m128i lo4 = _mm_set1_epi16(0x0F);
    __m256i D[PK2_RN], E[PK2_RN];
#pragma GCC unroll 4
    for (int j = 0; j < RN; j++) D[j] = E[j] = _mm256_setzero_si256();
    for (int s = 0; s < 8; s++) {
        const uint8_t *sv = un + hb + sb * s + 32 * h;
        const __m256i hi = q2 ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)(const void *)(sv + 128));
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {
            const int i = 2 * s + p; /* the group of sixteen */
            const __m128i b8 = _mm_loadl_epi64((const __m128i *)(const void *)(un + so + 16 * i + 8 * h));
            const __m128i s16 = q2 ? _mm_and_si128(_mm_cvtepu8_epi16(b8), lo4) : _mm_cvtepi8_epi16(b8);
            const __m256i sc = _mm256_set_m128i(_mm_unpackhi_epi16(s16, s16), _mm_unpacklo_epi16(s16, s16));
            const __m256i pl = _mm256_loadu_si256((const __m256i *)(const void *)(sv + 64 * p));
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                const int v = 4 * p + t;
                __m256i w = _mm256_and_si256(t ? _mm256_srli_epi16(pl, 2 * t) : pl, m3);
                if (!q2) w = _mm256_or_si256(w, _mm256_and_si256(v <= 2 ? _mm256_slli_epi16(hi, 2 - v) : _mm256_srli_epi16(hi, v - 2), b2));
#pragma GCC unroll 4
                for (int j = 0; j < RN; j++) {
                    const __m256i x = _mm256_set1_epi32(ld32(act + j * as + QKK * u + 32 * s + 4 * v));
                    D[j] = _mm256_add_epi32(D[j], _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), sc));
                }
            }
            if (q2) {
                const __m128i n16 = _mm_srli_epi16(_mm_cvtepu8_epi16(b8), 4);
                const __m256i mn = _mm256_set_m128i(_mm_unpackhi_epi16(n16, n16), _mm_unpacklo_epi16(n16, n16));
#pragma GCC unroll 4
                for (int j = 0; j < RN; j++)
                    E[j] = _mm256_add_epi32(E[j], _mm256_madd_epi16(_mm256_set1_epi32(ld32(act + j * as + ob + 4 * (16 * u + i))), mn));
            } else {
#pragma GCC unroll 4
                for (int j = 0; j < RN; j++)
                    D[j] = _mm256_add_epi32(D[j], _mm256_madd_epi16(_mm256_set1_epi32(ld32(act + j * as + ob + 4 * (16 * u + i))), sc));
            }
        }
    }
    const __m256 d = pk2_h8(un + 16 * h), dmin = q2 ? pk2_h8(un + 32 + 16 * h) : d;
#pragma GCC unroll 4
    for (int j = 0; j < RN; j++) {
        const __m256 dy = _mm256_set1_ps(*(const float *)(const void *)(act + j * as + oa + 4 * u));
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D[j]), _mm256_mul_ps(d, dy), acc[j]);
        if (q2) acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(E[j]), _mm256_mul_ps(dmin, dy), acc[j]);
    }
}

/* pk_kern with 256-bit vectors (RN <= 4): each group as two halves of eight rows. */
__attribute__((always_inline)) PL_TARGET_AVX2 static inline void
pk2_kern(const int T, const int RN, const uint8_t *wp, int64_t g0, int64_t g1, int64_t m, int64_t k,
         const uint8_t *act, int64_t as, float *out, int64_t ldo) {
    const int kq = pk_kquant(T);
    const int has_min = T == PL_Q4_1 || T == PL_Q5_1 || T == PL_Q4_K || T == PL_Q5_K;
    const int64_t nu = k / (kq ? QKK : 32), ub = pk_unit_bytes(T), sb = pk_sub_bytes(T);
    const int64_t gb = nu * ub, oa = pk_off_a(k), ob = pk_off_b(k);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *wg = wp + g * gb;
        for (int h = 0; h < 2; h++) {
            const int64_t r0 = g * PK_ROWS + 8 * h;
            if (r0 >= m) break;
            __m256 acc[PK2_RN];
#pragma GCC unroll 4
            for (int j = 0; j < RN; j++) acc[j] = _mm256_setzero_ps();
            for (int64_t u = 0; u < nu; u++) {
                const uint8_t *un = wg + u * ub;
                if (h == 0) pk_prefetch(un, (int)ub);
                __m256i W[8], D[PK2_RN], E[PK2_RN];
                if (!kq) {
                    pk2_load_sub(T, un + 32 * h, W);
                    const __m256 dw = pk2_h8(un + sb + 16 * h);
                    const __m256 mw = has_min ? pk2_h8(un + sb + 32 + 16 * h) : dw;
                    /* sum = bias + Σ codes·x (Q8_0: signed codes, no bias) */
#pragma GCC unroll 4
                    for (int j = 0; j < RN; j++)
                        D[j] = has_min || plx_type_signed(T) ? _mm256_setzero_si256() : _mm256_set1_epi32(ld32(act + j * as + ob + 4 * u));
                    pk2_dots(T, RN, 0, 8, W, act + 32 * u, as, D);
#pragma GCC unroll 4
                    for (int j = 0; j < RN; j++) {
                        const float dx = *(const float *)(const void *)(act + j * as + oa + 4 * u);
                        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D[j]), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[j]);
                        if (has_min)
                            acc[j] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*(const float *)(const void *)(act + j * as + ob + 4 * u)), acc[j]);
                    }
                } else if (T == PL_Q2_K || T == PL_Q3_K) {
                    pk2k23_unit(T, RN, un, u, h, k, act, as, acc);
                } else if (T == PL_IQ4_XS) {
                    /* the sub-blocks' scales (-32..31) multiply their pair sums (at most 2·127·127)
                     * in vpmaddwd, so a super-block's whole sum is one exact integer, as ggml
                     * sums it, scaled by d·dy once */
#pragma GCC unroll 4
                    for (int j = 0; j < RN; j++) D[j] = _mm256_setzero_si256();
                    for (int s = 0; s < 8; s++) {
                        const __m128i s16 = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(un + 32 + 16 * s + 8 * h)));
                        const __m256i sc = _mm256_set_m128i(_mm_unpackhi_epi16(s16, s16), _mm_unpacklo_epi16(s16, s16));
                        pk2_load_sub(T, un + 160 + sb * s + 32 * h, W);
                        pk2_dots_by(T, RN, 0, 8, W, act + QKK * u + 32 * s, as, D, sc);
                    }
                    const __m256 d = pk2_h8(un + 16 * h);
#pragma GCC unroll 4
                    for (int j = 0; j < RN; j++) {
                        const float dy = *(const float *)(const void *)(act + j * as + oa + 4 * u);
                        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D[j]), _mm256_mul_ps(d, _mm256_set1_ps(dy)), acc[j]);
                    }
                } else if (T != PL_Q6_K) {
                    const __m256 d = pk2_h8(un + 16 * h), dmin = pk2_h8(un + 32 + 16 * h);
                    for (int s = 0; s < 8; s++) {
                        const __m256 dsc = _mm256_mul_ps(d, pk2_f32x8(un + 64 + 16 * s + 8 * h, 0));
                        const __m256 dmn = _mm256_mul_ps(dmin, pk2_f32x8(un + 192 + 16 * s + 8 * h, 0));
                        pk2_load_sub(T, un + 320 + sb * s + 32 * h, W);
#pragma GCC unroll 4
                        for (int j = 0; j < RN; j++) D[j] = _mm256_setzero_si256();
                        pk2_dots(T, RN, 0, 8, W, act + QKK * u + 32 * s, as, D);
#pragma GCC unroll 4
                        for (int j = 0; j < RN; j++) {
                            const float dy = *(const float *)(const void *)(act + j * as + oa + 4 * u);
                            const float mt = *(const float *)(const void *)(act + j * as + ob + 4 * (8 * u + s));
                            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D[j]), _mm256_mul_ps(dsc, _mm256_set1_ps(dy)), acc[j]);
                            acc[j] = _mm256_fnmadd_ps(dmn, _mm256_set1_ps(mt), acc[j]);
                        }
                    }
                } else {
                    const __m256 d = pk2_h8(un + 16 * h);
                    for (int s = 0; s < 8; s++) {
                        const __m256 dsa = _mm256_mul_ps(d, pk2_f32x8(un + 32 + 16 * (2 * s) + 8 * h, 1));
                        const __m256 dsb = _mm256_mul_ps(d, pk2_f32x8(un + 32 + 16 * (2 * s + 1) + 8 * h, 1));
                        pk2_load_sub(T, un + 288 + sb * s + 32 * h, W);
#pragma GCC unroll 4
                        for (int j = 0; j < RN; j++) {
                            D[j] = _mm256_set1_epi32(ld32(act + j * as + ob + 4 * (16 * u + 2 * s)));
                            E[j] = _mm256_set1_epi32(ld32(act + j * as + ob + 4 * (16 * u + 2 * s + 1)));
                        }
                        pk2_dots(T, RN, 0, 4, W, act + QKK * u + 32 * s, as, D);
                        pk2_dots(T, RN, 4, 8, W, act + QKK * u + 32 * s, as, E);
#pragma GCC unroll 4
                        for (int j = 0; j < RN; j++) {
                            const __m256 dy = _mm256_set1_ps(*(const float *)(const void *)(act + j * as + oa + 4 * u));
                            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D[j]), _mm256_mul_ps(dsa, dy), acc[j]);
                            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(E[j]), _mm256_mul_ps(dsb, dy), acc[j]);
                        }
                    }
                }
            }
            const int rows = (int)PL_MIN((int64_t)8, m - r0);
            const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
            for (int j = 0; j < RN; j++) _mm256_maskstore_ps(out + j * ldo + r0, mk, acc[j]);
        }
    }
}

#define PK2_KERNS(T, name)                                                                        \
    PK_KERNS4(pk2, PL_TARGET_AVX2, pk2_kern, T, name)                                             \
    static const pk_fn pk2_##name[PK_RN + 1] = {NULL, pk2_##name##_1, pk2_##name##_2,             \
                                                pk2_##name##_3, pk2_##name##_4};
PK2_KERNS(PL_Q8_0, q8_0)
PK2_KERNS(PL_Q4_0, q4_0)
PK2_KERNS(PL_Q4_1, q4_1)
PK2_KERNS(PL_Q5_0, q5_0)
PK2_KERNS(PL_Q5_1, q5_1)
PK2_KERNS(PL_Q4_K, q4_k)
PK2_KERNS(PL_Q5_K, q5_k)
PK2_KERNS(PL_Q6_K, q6_k)
PK2_KERNS(PL_IQ4_NL, iq4_nl)
PK2_KERNS(PL_IQ4_XS, iq4_xs)
PK2_KERNS(PL_Q2_K, q2_k)
PK2_KERNS(PL_Q3_K, q3_k)

/* ================================================================ matrix product */

/* One weight matrix of a product: dst [n, m] = x · wpᵀ, its groups of 16 rows cut into items of
 * per groups, numbered from item0 among the product's items. */
typedef struct {
    float *dst;
    const uint8_t *wp;
    int64_t m, groups, item0, items;
} pk_seg;


typedef struct {
    pl_ctx *ctx;
    const float *x;
    int64_t n, k;
    int wtype;
    const pk_fn *fns;
    int rnmax; /* activation rows a kernel call takes */
    uint8_t *act;
    int64_t as;
    int64_t per; /* groups a work item */
    int nseg;
    int64_t items;
    pk_seg seg[PK_MAX_SEGS];
} pk_job;

static void job_pk_act(void *p, int ith, int nth) {
    pk_job *j = (pk_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n) pk_pack_act(j->wtype, j->x + i * j->k, j->k, j->act + i * j->as);
}

/* A work item: some groups of one matrix against every activation row, eight rows at a time. The
 * item's weights (a few groups) stay in L1/L2 across the passes of a long batch. */
static void job_pk_mm(void *p, int ith, int nth) {
    pk_job *j = (pk_job *)p;
    (void)ith;
    (void)nth;
    int64_t it;
    while ((it = plx_chunk_next(j->ctx)) < j->items) {
        const pk_seg *sg = &j->seg[0];
        while (it >= sg->item0 + sg->items) sg++;
        const int64_t g0 = (it - sg->item0) * j->per, g1 = PL_MIN(sg->groups, g0 + j->per);
        for (int64_t c0 = 0; c0 < j->n; c0 += j->rnmax) {
            const int rn = (int)PL_MIN((int64_t)j->rnmax, j->n - c0);
            j->fns[rn](sg->wp, g0, g1, sg->m, j->k, j->act + c0 * j->as, j->as, sg->dst + c0 * sg->m, sg->m);
        }
    }
}
#endif

int pl_matmul_packed(pl_ctx *ctx, float *dst, const float *x, int64_t n, int64_t k, const void *wp,
                     int wtype, int64_t m) {
    return pl_matmul_packed3(ctx, x, n, k, wtype, dst, wp, m, NULL, NULL, 0, NULL, NULL, 0);
}

int pl_matmul_packed3(pl_ctx *ctx, const float *x, int64_t n, int64_t k, int wtype, float *d0,
                      const void *w0, int64_t m0, float *d1, const void *w1, int64_t m1, float *d2,
                      const void *w2, int64_t m2) {
    float *const d[PK_MAX_SEGS] = {d0, d1, d2};
    const void *const w[PK_MAX_SEGS] = {w0, w1, w2};
    const int64_t m[PK_MAX_SEGS] = {m0, m1, m2};
    if (ctx == NULL || n < 0) return PL_ERR_ARG;
    int64_t total = 0;
    for (int s = 0; s < PK_MAX_SEGS; s++) {
        if (m[s] < 0) return PL_ERR_ARG;
        int64_t size = pl_packed_size(wtype, m[s], k);
        if (size < 0) return (int)size;
        if (n > 0 && m[s] > 0 && (d[s] == NULL || w[s] == NULL)) return PL_ERR_ARG;
        if (m[s] > INT32_MAX) return PL_ERR_ARG;
        total += m[s];
    }
    if (!pl_packed_available(wtype)) return PL_ERR_UNSUPPORTED;
    if (n == 0 || total == 0) return PL_OK;
    if (x == NULL) return PL_ERR_ARG;
    if (n > INT32_MAX || k > INT32_MAX) return PL_ERR_ARG;
#if PL_X86
    pk_job j = {.ctx = ctx, .x = x, .n = n, .k = k, .wtype = wtype, .as = pk_act_stride(k)};
    const int v512 = plx_isa >= PL_ISA_AVX512;
    j.rnmax = v512 ? PK_RN : PK2_RN;
    switch (wtype) {
    case PL_IQ4_NL: j.fns = pk2_iq4_nl; j.rnmax = PK2_RN; break; /* AVX2 only (pl_packed_available) */
    case PL_IQ4_XS: j.fns = pk2_iq4_xs; j.rnmax = PK2_RN; break;
    case PL_Q2_K: j.fns = pk2_q2_k; j.rnmax = PK2_RN; break;
    case PL_Q3_K: j.fns = pk2_q3_k; j.rnmax = PK2_RN; break;
    case PL_Q8_0: j.fns = v512 ? pk_q8_0 : pk2_q8_0; break;
    case PL_Q4_0: j.fns = v512 ? pk_q4_0 : pk2_q4_0; break;
    case PL_Q4_1: j.fns = v512 ? pk_q4_1 : pk2_q4_1; break;
    case PL_Q5_0: j.fns = v512 ? pk_q5_0 : pk2_q5_0; break;
    case PL_Q5_1: j.fns = v512 ? pk_q5_1 : pk2_q5_1; break;
    case PL_Q4_K: j.fns = v512 ? pk_q4_k : pk2_q4_k; break;
    case PL_Q5_K: j.fns = v512 ? pk_q5_k : pk2_q5_k; break;
    default: j.fns = v512 ? pk_q6_k : pk2_q6_k; break;
    }
    const int64_t groups = (total + PK_ROWS - 1) / PK_ROWS; /* about: each matrix rounds up its own */
    /* A decode step's few rows: two items a thread, each a long stream of weights. Longer batches:
     * items of four groups, whose weights stay in cache while every row of x passes. */
    if (n <= PK_RN) j.per = (groups + 2 * ctx->nth - 1) / (2 * ctx->nth);
    else j.per = 4;
    j.per = PL_MAX(j.per, 1);
    for (int s = 0; s < PK_MAX_SEGS; s++) {
        if (m[s] == 0) continue;
        pk_seg *sg = &j.seg[j.nseg++];
        sg->dst = d[s];
        sg->wp = (const uint8_t *)w[s];
        sg->m = m[s];
        sg->groups = (m[s] + PK_ROWS - 1) / PK_ROWS;
        sg->item0 = j.items;
        sg->items = (sg->groups + j.per - 1) / j.per;
        j.items += sg->items;
    }
    j.act = plx_scratch(ctx, (size_t)(n * j.as));
    if (j.act == NULL) return PL_ERR_NOMEM;
    if (n == 1) {
        pk_pack_act(wtype, x, k, j.act); /* one row: not worth waking the pool */
    } else {
        plx_chunk_reset(ctx);
        plx_run(ctx, job_pk_act, &j);
    }
    plx_chunk_reset(ctx);
    plx_run(ctx, job_pk_mm, &j);
    return PL_OK;
#else
    return PL_ERR_UNSUPPORTED;
#endif
}
