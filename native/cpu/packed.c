/*
 * packed.c: Q8_0, Q4_0, Q4_K and Q6_K weights interleaved sixteen rows at a time, and their matrix
 * product (AVX-512 VNNI).
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
 * all but Q4_K (4 bytes more a row every 256 elements) are exactly as large as their rows.
 *
 * Activation rows are converted to Q8_0 (for Q8_0 and Q4_0 weights) or Q8_K (for the K-quants)
 * as ggml converts them (quant.c). Weight codes are unsigned for VNNI; a bias made from the
 * activation codes' sums (-128, -8 or -32 times a block's sum for Q8_0, Q4_0 and Q6_K) turns them
 * back into signed ones, and Q4_K subtracts its minimums' term (dmin·m)·(dx·Σx). A row's value is
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

/* A unit is what the layout interleaves at once: a 32-element block (Q8_0, Q4_0) or a 256-element
 * super-block (Q4_K, Q6_K). pk_unit_bytes is the bytes of a unit of sixteen rows: exactly sixteen
 * times the type's block, except Q4_K, whose scales and minimums take a byte each (+4 bytes a row
 * a super-block, 2.8%) instead of 12 bytes of packed 6-bit fields. */
static int64_t pk_unit_elems(int wtype) { return wtype == PL_Q4_K || wtype == PL_Q6_K ? QKK : 32; }
static int64_t pk_unit_bytes(int wtype) {
    switch (wtype) {
    case PL_Q8_0: return 8 * 64 + 2 * PK_ROWS;
    case PL_Q4_0: return 4 * 64 + 2 * PK_ROWS;
    case PL_Q4_K: return 4 * PK_ROWS + 16 * 8 * 2 + 8 * 4 * 64;
    case PL_Q6_K: return 2 * PK_ROWS + 16 * 16 + 8 * 6 * 64;
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

int pl_packed_available(void) {
    plx_init();
    return plx_isa >= PL_ISA_AVX512;
}

/* scale_min_k4: the 6-bit scale and minimum of sub-block j (0..7) of a Q4_K super-block. */
static void pk_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* pk_codes decodes one unit of a row (blk, ggml's layout) into unsigned codes q (0..255) and, for
 * the K-quants, per-sub-block scales and minimums: Q4_K q = 0..15, sc and mn per 32 elements
 * (6 bits each); Q6_K q = 0..63 (the value is q-32), sc per 16 elements (int8). */
static void pk_codes(int wtype, const uint8_t *blk, uint8_t *q, int *sc, int *mn) {
    switch (wtype) {
    case PL_Q8_0:
        for (int e = 0; e < 32; e++) q[e] = (uint8_t)(blk[2 + e] ^ 0x80);
        return;
    case PL_Q4_0:
        for (int e = 0; e < 16; e++) {
            q[e] = blk[2 + e] & 0xF;
            q[e + 16] = blk[2 + e] >> 4;
        }
        return;
    case PL_Q4_K:
        for (int s = 0; s < 8; s++) {
            pk_scale_min_k4(s, blk + 4, &sc[s], &mn[s]);
            const uint8_t *c = blk + 16 + 32 * (s / 2);
            for (int l = 0; l < 32; l++) q[32 * s + l] = s % 2 ? c[l] >> 4 : c[l] & 0xF;
        }
        return;
    case PL_Q6_K:
        for (int e = 0; e < QKK; e++) {
            const int n = e / 128, quarter = (e % 128) / 32, l = e % 32;
            const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
            const int lo = quarter % 2 ? ql[l + 32] : ql[l];
            q[e] = (uint8_t)((quarter < 2 ? lo & 0xF : lo >> 4) | ((qh[l] >> (2 * quarter)) & 3) << 4);
        }
        for (int i = 0; i < 16; i++) sc[i] = (int8_t)blk[192 + i];
        return;
    }
}

/* pk_nibbles writes the 32 codes (< 16) of a 32-element sub-block of row r as four vectors at o:
 * lane r, byte t of vector v holds code 4v+t in its low nibble and code 16+4v+t in its high one. */
static void pk_nibbles(const uint8_t *q, int r, uint8_t *o) {
    for (int v = 0; v < 4; v++)
        for (int t = 0; t < 4; t++) o[64 * v + 4 * r + t] = (uint8_t)((q[4 * v + t] & 0xF) | (q[16 + 4 * v + t] & 0xF) << 4);
}

/* pk_pack_group writes group g of w (m rows of k elements in ggml's layout) at dst, unit after
 * unit. Rows past m are zero weights (zero codes, or zero scales). Unit layouts, sixteen rows:
 *   Q8_0: 8 vectors, lane r of vector v = codes 4v..4v+3 of row r (+128); F16 scales [16].
 *   Q4_0: 4 vectors of nibbles (pk_nibbles); F16 scales [16].
 *   Q4_K: F16 d [16], F16 dmin [16], scales [8 sub-blocks][16], minimums [8][16] (bytes), then
 *         per sub-block 4 vectors of nibbles.
 *   Q6_K: F16 d [16], scales [16 sub-blocks of 16][16] (int8), then per 32-element sub-block 4
 *         vectors of the codes' low nibbles and 2 of their high bits: lane r, byte t of high
 *         vector h holds, in bits 2i and 2i+1, the high bits of code 4(4h+i)+t. */
static void pk_pack_group(int wtype, const uint8_t *w, int64_t m, int64_t k, int64_t g, uint8_t *dst) {
    const int64_t ue = pk_unit_elems(wtype), nu = k / ue, ts = plx_type_size(wtype), ub = pk_unit_bytes(wtype);
    const int64_t row = (k / plx_block_size(wtype)) * ts;
    uint8_t q[QKK];
    int sc[16], mn[8];
    for (int64_t u = 0; u < nu; u++) {
        uint8_t *o = dst + u * ub;
        memset(o, 0, (size_t)ub);
        for (int r = 0; r < PK_ROWS; r++) {
            const int64_t rr = g * PK_ROWS + r;
            const uint8_t *blk = rr < m ? w + rr * row + u * ts : NULL;
            if (blk == NULL) { /* padding: zero scales, and Q8_0's zero code */
                if (wtype == PL_Q8_0)
                    for (int v = 0; v < 8; v++) memset(o + 64 * v + 4 * r, 0x80, 4);
                continue;
            }
            pk_codes(wtype, blk, q, sc, mn);
            switch (wtype) {
            case PL_Q8_0:
                for (int v = 0; v < 8; v++) memcpy(o + 64 * v + 4 * r, q + 4 * v, 4);
                memcpy(o + 512 + 2 * r, blk, 2);
                break;
            case PL_Q4_0:
                pk_nibbles(q, r, o);
                memcpy(o + 256 + 2 * r, blk, 2);
                break;
            case PL_Q4_K:
                memcpy(o + 2 * r, blk, 2);
                memcpy(o + 32 + 2 * r, blk + 2, 2);
                for (int s = 0; s < 8; s++) {
                    o[64 + 16 * s + r] = (uint8_t)sc[s];
                    o[192 + 16 * s + r] = (uint8_t)mn[s];
                    pk_nibbles(q + 32 * s, r, o + 320 + 256 * s);
                }
                break;
            case PL_Q6_K:
                memcpy(o + 2 * r, blk + 208, 2);
                for (int i = 0; i < 16; i++) o[32 + 16 * i + r] = (uint8_t)sc[i];
                for (int s = 0; s < 8; s++) {
                    uint8_t *os = o + 288 + 384 * s;
                    const uint8_t *qs = q + 32 * s;
                    pk_nibbles(qs, r, os);
                    for (int h = 0; h < 2; h++)
                        for (int t = 0; t < 4; t++) {
                            uint8_t b = 0;
                            for (int i = 0; i < 4; i++) b |= (uint8_t)((qs[4 * (4 * h + i) + t] >> 4) << (2 * i));
                            os[256 + 64 * h + 4 * r + t] = b;
                        }
                }
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
 *   Q8_0, Q4_0 weights (x as Q8_0): A = the scale of each 32 as float, B = each 32's bias as
 *         int32: -128 (Q8_0) or -8 (Q4_0) times its code sum;
 *   Q4_K (x as Q8_K): A = the scale of each 256, B = each 32's scale times code sum (float);
 *   Q6_K (x as Q8_K): A = the scale of each 256, B = each 16's bias: -32 times its code sum. */

#if PL_X86
static int64_t pk_r64(int64_t n) { return (n + 63) & ~(int64_t)63; }
static int64_t pk_off_a(int64_t k) { return pk_r64(k); }
static int64_t pk_off_b(int64_t k) { return pk_r64(k) + pk_r64(k / 32 * 4); }
static int64_t pk_act_stride(int64_t k) { return pk_off_b(k) + pk_r64(k / 16 * 4); }

static void pk_pack_act(int wtype, const float *x, int64_t k, uint8_t *dst) {
    int8_t *q = (int8_t *)dst;
    float *a = (float *)(void *)(dst + pk_off_a(k));
    uint8_t *bb = dst + pk_off_b(k);
    if (wtype == PL_Q8_0 || wtype == PL_Q4_0) {
        const int64_t nb = k / 32;
        const int off = wtype == PL_Q8_0 ? 128 : 8;
        int32_t *bias = (int32_t *)(void *)bb;
        uint16_t d[PLX_CHUNK];
        float dfull[PLX_CHUNK];
        int32_t sum[PLX_CHUNK];
        for (int64_t b0 = 0; b0 < nb; b0 += PLX_CHUNK) {
            const int64_t c = PL_MIN(PLX_CHUNK, nb - b0);
            plx_q8_0_blocks(x + b0 * 32, c, q + b0 * 32, d, dfull, sum);
            for (int64_t b = 0; b < c; b++) {
                a[b0 + b] = plx_f16_to_f32(d[b]);
                bias[b0 + b] = -off * sum[b];
            }
        }
        return;
    }
    const int64_t ns = k / QKK;
    int16_t bs[16];
    for (int64_t u = 0; u < ns; u++) {
        plx_q8_k_blocks(x + u * QKK, 1, q + u * QKK, &a[u], bs);
        if (wtype == PL_Q4_K) {
            float *mt = (float *)(void *)bb + 8 * u;
            for (int s = 0; s < 8; s++) mt[s] = a[u] * (float)(bs[2 * s] + bs[2 * s + 1]);
        } else {
            int32_t *bias = (int32_t *)(void *)bb + 16 * u;
            for (int i = 0; i < 16; i++) bias[i] = -32 * bs[i];
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
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void pk_prefetch(const uint8_t *p, int n) {
#pragma GCC unroll 9
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

/* Groups g0 .. g1-1 against RN activation rows (stride as bytes) of k elements:
 * out[j*ldo + 16g + r] for row 16g+r < m. One or two activation rows leave too few independent
 * VNNI chains to hide their latency, so their products are split over two accumulators (integer
 * sums: the same result). */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
pk_kern(const int T, const int RN, const uint8_t *wp, int64_t g0, int64_t g1, int64_t m, int64_t k,
        const uint8_t *act, int64_t as, float *out, int64_t ldo) {
    const int64_t ue = T == PL_Q4_K || T == PL_Q6_K ? QKK : 32, nu = k / ue;
    const int64_t ub = T == PL_Q8_0 ? 8 * 64 + 32 : T == PL_Q4_0 ? 4 * 64 + 32 : T == PL_Q4_K ? 64 + 256 + 2048 : 32 + 256 + 3072;
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
            if (T == PL_Q8_0 || T == PL_Q4_0) {
                /* one 32-element block: sum = bias + Σ codes·x, one FMA with dw·dx */
                pk_prefetch(un, (int)ub);
                if (T == PL_Q8_0) {
#pragma GCC unroll 8
                    for (int v = 0; v < 8; v++) W[v] = _mm512_loadu_si512((const void *)(un + 64 * v));
                } else {
                    pk_nib4(un, W);
                }
                const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(un + (T == PL_Q8_0 ? 512 : 256))));
#pragma GCC unroll 8
                for (int j = 0; j < RN; j++) {
                    D[j] = _mm512_set1_epi32(ld32(act + j * as + ob + 4 * u));
                    E[j] = _mm512_setzero_si512();
                }
                pk_dots(RN, 0, 8, split, W, act + 32 * u, as, D, E);
#pragma GCC unroll 8
                for (int j = 0; j < RN; j++) {
                    const __m512i s = split ? _mm512_add_epi32(D[j], E[j]) : D[j];
                    const float dx = *(const float *)(const void *)(act + j * as + oa + 4 * u);
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[j]);
                }
            } else if (T == PL_Q4_K) {
                /* per 32-element sub-block: sum = Σ codes·x (no bias), then
                 * + float(sum)·(d·sc)·dy - (dmin·m)·(dy·Σx) */
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)un));
                const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(un + 32)));
                for (int s = 0; s < 8; s++) {
                    const uint8_t *sb = un + 320 + 256 * s;
                    pk_prefetch(sb, 256);
                    const __m512 dsc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(un + 64 + 16 * s)))));
                    const __m512 dmn = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(un + 192 + 16 * s)))));
                    pk_nib4(sb, W);
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
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)un));
                const __m512i m2 = _mm512_set1_epi8(0x30);
                for (int s = 0; s < 8; s++) {
                    const uint8_t *sb = un + 288 + 384 * s;
                    pk_prefetch(sb, 384);
                    const __m512 dsa = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(un + 32 + 16 * (2 * s))))));
                    const __m512 dsb = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(un + 32 + 16 * (2 * s + 1))))));
                    pk_nib4(sb, W);
#pragma GCC unroll 2
                    for (int h = 0; h < 2; h++) {
                        const __m512i hb = _mm512_loadu_si512((const void *)(sb + 256 + 64 * h));
                        /* field i (bits 2i, 2i+1) to bits 4 and 5 */
                        W[4 * h + 0] = _mm512_or_si512(W[4 * h + 0], _mm512_and_si512(_mm512_slli_epi16(hb, 4), m2));
                        W[4 * h + 1] = _mm512_or_si512(W[4 * h + 1], _mm512_and_si512(_mm512_slli_epi16(hb, 2), m2));
                        W[4 * h + 2] = _mm512_or_si512(W[4 * h + 2], _mm512_and_si512(hb, m2));
                        W[4 * h + 3] = _mm512_or_si512(W[4 * h + 3], _mm512_and_si512(_mm512_srli_epi16(hb, 2), m2));
                    }
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

#define PK_KERN(NAME, T, RN)                                                                      \
    PL_TARGET_AVX512 static void NAME(const uint8_t *wp, int64_t g0, int64_t g1, int64_t m,       \
                                      int64_t k, const uint8_t *act, int64_t as, float *out,      \
                                      int64_t ldo) {                                              \
        pk_kern(T, RN, wp, g0, g1, m, k, act, as, out, ldo);                                      \
    }
#define PK_KERNS(T, name)                                                                         \
    PK_KERN(pk_##name##_1, T, 1)                                                                  \
    PK_KERN(pk_##name##_2, T, 2)                                                                  \
    PK_KERN(pk_##name##_3, T, 3)                                                                  \
    PK_KERN(pk_##name##_4, T, 4)                                                                  \
    PK_KERN(pk_##name##_5, T, 5)                                                                  \
    PK_KERN(pk_##name##_6, T, 6)                                                                  \
    PK_KERN(pk_##name##_7, T, 7)                                                                  \
    PK_KERN(pk_##name##_8, T, 8)                                                                  \
    static const pk_fn pk_##name[PK_RN + 1] = {NULL,           pk_##name##_1, pk_##name##_2,      \
                                               pk_##name##_3,  pk_##name##_4, pk_##name##_5,      \
                                               pk_##name##_6,  pk_##name##_7, pk_##name##_8};
PK_KERNS(PL_Q8_0, q8_0)
PK_KERNS(PL_Q4_0, q4_0)
PK_KERNS(PL_Q4_K, q4_k)
PK_KERNS(PL_Q6_K, q6_k)

/* ================================================================ matrix product */

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *x;
    int64_t n, k, m;
    const uint8_t *wp;
    int wtype;
    const pk_fn *fns;
    uint8_t *act;
    int64_t as;
    int64_t groups, per; /* groups of 16 rows, groups a work item */
} pk_job;

static void job_pk_act(void *p, int ith, int nth) {
    pk_job *j = (pk_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n) pk_pack_act(j->wtype, j->x + i * j->k, j->k, j->act + i * j->as);
}

/* A work item: its groups against every activation row, eight rows at a time. The item's weights
 * (a few groups) stay in L1/L2 across the passes of a long batch. */
static void job_pk_mm(void *p, int ith, int nth) {
    pk_job *j = (pk_job *)p;
    (void)ith;
    (void)nth;
    const int64_t items = (j->groups + j->per - 1) / j->per;
    int64_t it;
    while ((it = plx_chunk_next(j->ctx)) < items) {
        const int64_t g0 = it * j->per, g1 = PL_MIN(j->groups, g0 + j->per);
        for (int64_t c0 = 0; c0 < j->n; c0 += PK_RN) {
            const int rn = (int)PL_MIN((int64_t)PK_RN, j->n - c0);
            j->fns[rn](j->wp, g0, g1, j->m, j->k, j->act + c0 * j->as, j->as, j->dst + c0 * j->m, j->m);
        }
    }
}
#endif

int pl_matmul_packed(pl_ctx *ctx, float *dst, const float *x, int64_t n, int64_t k, const void *wp,
                     int wtype, int64_t m) {
    if (ctx == NULL || n < 0 || m < 0) return PL_ERR_ARG;
    int64_t size = pl_packed_size(wtype, m, k);
    if (size < 0) return (int)size;
    if (!pl_packed_available()) return PL_ERR_UNSUPPORTED;
    if (n == 0 || m == 0) return PL_OK;
    if (dst == NULL || x == NULL || wp == NULL) return PL_ERR_ARG;
    if (n > INT32_MAX || m > INT32_MAX || k > INT32_MAX) return PL_ERR_ARG;
#if PL_X86
    pk_job j = {.ctx = ctx, .dst = dst, .x = x, .n = n, .k = k, .m = m, .wp = (const uint8_t *)wp,
                .wtype = wtype, .as = pk_act_stride(k), .groups = (m + PK_ROWS - 1) / PK_ROWS};
    j.fns = wtype == PL_Q8_0 ? pk_q8_0 : wtype == PL_Q4_0 ? pk_q4_0 : wtype == PL_Q4_K ? pk_q4_k : pk_q6_k;
    /* A decode step's few rows: two items a thread, each a long stream of weights. Longer batches:
     * items of four groups, whose weights stay in cache while every row of x passes. */
    if (n <= PK_RN) j.per = (j.groups + 2 * ctx->nth - 1) / (2 * ctx->nth);
    else j.per = 4;
    j.per = PL_MAX(j.per, 1);
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
