/*
 * packed.c: Q8_0 and Q4_0 weights interleaved sixteen rows at a time, and their matrix product
 * (AVX-512 VNNI).
 *
 * In ggml's layout a block's 32 codes lie in one row, so an integer dot product leaves a block's
 * sum spread over the lanes of a vector, and every block costs a conversion, a scale product and
 * an FMA per lane group. Interleaved, lane r of a vector holds four consecutive codes of row r of
 * a group of sixteen rows, and the vectors of a block follow one another: eight VNNI products
 * (each against four activation codes broadcast to every lane) leave block b's whole integer dot
 * product of each of the sixteen rows in its lane, then one conversion and one FMA apply the
 * block's scales. Per 512 multiply-adds of one activation row: eight VNNI operations, a multiply
 * and an FMA, against twenty-four operations for the row layout. Results land sixteen rows to a
 * vector, so nothing is reduced across lanes.
 *
 * Layout of a group (rows 16g .. 16g+15; the last group padded with zero rows), block after block:
 *   Q8_0: eight 64-byte vectors, lane r of vector v = codes 4v .. 4v+3 of row r, each + 128
 *         (unsigned for VNNI), then the sixteen rows' F16 scales (32 bytes): 544 bytes a block;
 *   Q4_0: four 64-byte vectors, lane r of vector v = bytes 4v .. 4v+3 of row r's 16 code bytes
 *         (low nibbles: elements 4v..4v+3; high nibbles: elements 16+4v..16+4v+3), then the F16
 *         scales: 288 bytes a block.
 * Both are exactly as large as the rows they hold.
 *
 * Activation rows are converted to Q8_0 as ggml converts them (quant.c); per block the kernel
 * needs the 32 codes, the F16 scale as float, and a bias: -128 (Q8_0) or -8 (Q4_0) times the code
 * sum, which turns the unsigned weight codes back into signed ones. A row's value is then
 *     sum over blocks b, in order, of float(isum_b) * (dw_b * dx_b)    (one FMA a block)
 * with isum_b exact; dw_b * dx_b is a product of two F16 values, exact in float. So a row's
 * result does not depend on how many rows of x go with it, nor on the number of threads.
 */
#include <stdlib.h>

#include "internal.h"

#define PK_ROWS 16

/* ld32 reads four bytes as an int32 (codes and biases are stored as bytes and words). */
static inline int32_t ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}
#define PK_RN 8 /* activation rows a kernel call takes */

/* Vectors of codes a block, and bytes a block of a group. */
static int pk_vecs(int wtype) { return wtype == PL_Q8_0 ? 8 : 4; }
static int64_t pk_block_bytes(int wtype) { return 64 * (int64_t)pk_vecs(wtype) + 2 * PK_ROWS; }

int64_t pl_packed_size(int wtype, int64_t m, int64_t k) {
    if (wtype != PL_Q8_0 && wtype != PL_Q4_0) return PL_ERR_UNSUPPORTED;
    if (m < 0 || k <= 0 || k % 32 != 0) return PL_ERR_ARG;
    const int64_t groups = (m + PK_ROWS - 1) / PK_ROWS, nb = k / 32, bb = pk_block_bytes(wtype);
    if (groups > 0 && nb > INT64_MAX / bb / groups) return PL_ERR_ARG;
    return groups * nb * bb;
}

int pl_packed_available(void) {
    plx_init();
    return plx_isa >= PL_ISA_AVX512;
}

/* pk_pack_group writes group g of w (m rows of k elements in ggml's layout) at dst. */
static void pk_pack_group(int wtype, const uint8_t *w, int64_t m, int64_t k, int64_t g, uint8_t *dst) {
    const int64_t nb = k / 32, ts = wtype == PL_Q8_0 ? 34 : 18, row = nb * ts, bb = pk_block_bytes(wtype);
    const int nv = pk_vecs(wtype);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = dst + b * bb;
        uint16_t *sc = (uint16_t *)(void *)(o + 64 * nv);
        for (int r = 0; r < PK_ROWS; r++) {
            const int64_t rr = g * PK_ROWS + r;
            if (rr >= m) { /* padding: zero weights */
                for (int v = 0; v < nv; v++) memset(o + 64 * v + 4 * r, wtype == PL_Q8_0 ? 128 : 0x88, 4);
                sc[r] = 0;
                continue;
            }
            const uint8_t *blk = w + rr * row + b * ts;
            sc[r] = (uint16_t)(blk[0] | blk[1] << 8);
            for (int v = 0; v < nv; v++)
                for (int t = 0; t < 4; t++)
                    o[64 * v + 4 * r + t] = wtype == PL_Q8_0 ? (uint8_t)(blk[2 + 4 * v + t] ^ 0x80) : blk[2 + 4 * v + t];
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
    const int64_t gb = (j->k / 32) * pk_block_bytes(j->wtype);
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
 * A packed activation row of k elements: the nb = k/32 blocks' codes (nb*32 bytes, rounded up to
 * 64), their scales as floats (nb, rounded up to 16), their biases as int32 (likewise). */

#if PL_X86
static int64_t pk_codes_bytes(int64_t nb) { return (nb * 32 + 63) & ~(int64_t)63; }
static int64_t pk_vals_bytes(int64_t nb) { return (nb * 4 + 63) & ~(int64_t)63; }
static int64_t pk_act_stride(int64_t nb) { return pk_codes_bytes(nb) + 2 * pk_vals_bytes(nb); }

static void pk_pack_act(int off, const float *x, int64_t k, uint8_t *dst) {
    const int64_t nb = k / 32;
    int8_t *q = (int8_t *)dst;
    float *dx = (float *)(void *)(dst + pk_codes_bytes(nb));
    int32_t *bias = (int32_t *)(void *)(dst + pk_codes_bytes(nb) + pk_vals_bytes(nb));
    uint16_t d[PLX_CHUNK];
    float dfull[PLX_CHUNK];
    int32_t sum[PLX_CHUNK];
    for (int64_t b0 = 0; b0 < nb; b0 += PLX_CHUNK) {
        const int64_t c = PL_MIN(PLX_CHUNK, nb - b0);
        plx_q8_0_blocks(x + b0 * 32, c, q + b0 * 32, d, dfull, sum);
        for (int64_t b = 0; b < c; b++) {
            dx[b0 + b] = plx_f16_to_f32(d[b]);
            bias[b0 + b] = -off * sum[b];
        }
    }
}

/* ================================================================ kernels */

/* PK_PREFETCH bytes ahead of the block being read, the weights are prefetched: the hardware
 * prefetchers fall behind at every new page of a stream (see matmul.c). */
#define PK_PREFETCH 4096

/* Groups g0 .. g1-1 against RN activation rows (stride as bytes): out[j*ldo + 16g + r] for
 * row 16g+r < m. */
__attribute__((always_inline)) PL_TARGET_AVX512 static inline void
pk_kern(const int T, const int RN, const uint8_t *wp, int64_t g0, int64_t g1, int64_t m, int64_t nb,
        const uint8_t *act, int64_t as, float *out, int64_t ldo) {
    const int NV = T == PL_Q8_0 ? 8 : 4;
    const int64_t bb = 64 * NV + 2 * PK_ROWS, gb = nb * bb;
    const int64_t oq = pk_codes_bytes(nb), ob = oq + pk_vals_bytes(nb);
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    /* One or two activation rows leave too few independent VNNI chains to hide their latency:
     * split each block's eight products over two accumulators (integer sums: the same result). */
    const int split = RN <= 2;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *wg = wp + g * gb;
        __m512 acc[PK_RN];
#pragma GCC unroll 8
        for (int j = 0; j < RN; j++) acc[j] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = wg + b * bb;
#pragma GCC unroll 9
            for (int l = 0; l < (int)bb; l += 64) _mm_prefetch((const char *)blk + PK_PREFETCH + l, _MM_HINT_T0);
            __m512i W[8];
            if (T == PL_Q8_0) {
#pragma GCC unroll 8
                for (int v = 0; v < 8; v++) W[v] = _mm512_loadu_si512((const void *)(blk + 64 * v));
            } else {
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) {
                    const __m512i p = _mm512_loadu_si512((const void *)(blk + 64 * v));
                    W[v] = _mm512_and_si512(p, lo4);
                    W[v + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), lo4);
                }
            }
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 64 * NV)));
            __m512i D[PK_RN], E[PK_RN];
#pragma GCC unroll 8
            for (int j = 0; j < RN; j++) {
                D[j] = _mm512_set1_epi32(ld32(act + j * as + ob + 4 * b));
                E[j] = _mm512_setzero_si512();
            }
            const uint8_t *a = act + 32 * b;
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++)
#pragma GCC unroll 8
                for (int j = 0; j < RN; j++) {
                    const __m512i x = _mm512_set1_epi32(ld32(a + j * as + 4 * v));
                    if (split && (v & 1)) E[j] = _mm512_dpbusd_epi32(E[j], W[v], x);
                    else D[j] = _mm512_dpbusd_epi32(D[j], W[v], x);
                }
#pragma GCC unroll 8
            for (int j = 0; j < RN; j++) {
                const __m512i s = split ? _mm512_add_epi32(D[j], E[j]) : D[j];
                const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(*(const float *)(const void *)(act + j * as + oq + 4 * b)));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc[j]);
            }
        }
        const int64_t rows = PL_MIN((int64_t)PK_ROWS, m - g * PK_ROWS);
        const __mmask16 mk = rows >= PK_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << rows) - 1);
#pragma GCC unroll 8
        for (int j = 0; j < RN; j++) _mm512_mask_storeu_ps(out + j * ldo + g * PK_ROWS, mk, acc[j]);
    }
}

typedef void (*pk_fn)(const uint8_t *wp, int64_t g0, int64_t g1, int64_t m, int64_t nb,
                      const uint8_t *act, int64_t as, float *out, int64_t ldo);

#define PK_KERN(NAME, T, RN)                                                                      \
    PL_TARGET_AVX512 static void NAME(const uint8_t *wp, int64_t g0, int64_t g1, int64_t m,       \
                                      int64_t nb, const uint8_t *act, int64_t as, float *out,     \
                                      int64_t ldo) {                                              \
        pk_kern(T, RN, wp, g0, g1, m, nb, act, as, out, ldo);                                     \
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
#endif

/* ================================================================ matrix product */

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *x;
    int64_t n, k, m, nb;
    const uint8_t *wp;
    int wtype, off;
    uint8_t *act;
    int64_t as;
    int64_t groups, per; /* groups of 16 rows, groups a work item */
} pk_job;

#if PL_X86
static void job_pk_act(void *p, int ith, int nth) {
    pk_job *j = (pk_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n) pk_pack_act(j->off, j->x + i * j->k, j->k, j->act + i * j->as);
}

/* A work item: its groups against every activation row, eight rows at a time. The item's weights
 * (a few groups) stay in L1/L2 across the passes of a long batch. */
static void job_pk_mm(void *p, int ith, int nth) {
    pk_job *j = (pk_job *)p;
    (void)ith;
    (void)nth;
    const pk_fn *fns = j->wtype == PL_Q8_0 ? pk_q8_0 : pk_q4_0;
    const int64_t items = (j->groups + j->per - 1) / j->per;
    int64_t it;
    while ((it = plx_chunk_next(j->ctx)) < items) {
        const int64_t g0 = it * j->per, g1 = PL_MIN(j->groups, g0 + j->per);
        for (int64_t c0 = 0; c0 < j->n; c0 += PK_RN) {
            const int rn = (int)PL_MIN((int64_t)PK_RN, j->n - c0);
            fns[rn](j->wp, g0, g1, j->m, j->nb, j->act + c0 * j->as, j->as, j->dst + c0 * j->m, j->m);
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
    pk_job j;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.dst = dst;
    j.x = x;
    j.n = n;
    j.k = k;
    j.m = m;
    j.nb = k / 32;
    j.wp = (const uint8_t *)wp;
    j.wtype = wtype;
    j.off = wtype == PL_Q8_0 ? 128 : 8;
    j.as = pk_act_stride(j.nb);
    j.groups = (m + PK_ROWS - 1) / PK_ROWS;
    /* A decode step's few rows: two items a thread, each a long stream of weights. Longer batches:
     * items of four groups, whose weights stay in cache while every row of x passes. */
    if (n <= PK_RN) j.per = (j.groups + 2 * ctx->nth - 1) / (2 * ctx->nth);
    else j.per = 4;
    j.per = PL_MAX(j.per, 1);
    j.act = plx_scratch(ctx, (size_t)(n * j.as));
    if (j.act == NULL) return PL_ERR_NOMEM;
    if (n == 1) {
        pk_pack_act(j.off, x, k, j.act); /* one row: not worth waking the pool */
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
