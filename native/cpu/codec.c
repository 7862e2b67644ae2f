/*
 * codec.c: the operations of streaming codecs and flow-matching heads: Mul.
 *
 * Small operations (a frame's few rows) run on the calling thread: waking the pool would cost
 * more than the work.
 */
#include "internal.h"

/* Elements below which an operation runs on the calling thread alone. */
#define CODEC_INLINE_ELEMS 16384

/* ================================================================ Mul */

static void mul_span(float *y, const float *a, const float *b, int64_t len) {
    /* plain loop: vectorised by the compiler for the baseline ISA (one rounding per element, as
     * any vector width gives) */
    for (int64_t i = 0; i < len; i++) y[i] = a[i] * b[i];
}

typedef struct {
    pl_ctx *ctx;
    float *dst;
    const float *a, *b;
    int64_t n, d, brows;
} mul_job;

static void job_mul(void *p, int ith, int nth) {
    mul_job *j = (mul_job *)p;
    (void)ith;
    (void)nth;
    int64_t i;
    while ((i = plx_chunk_next(j->ctx)) < j->n)
        mul_span(j->dst + i * j->d, j->a + i * j->d, j->b + (j->brows == 1 ? 0 : i * j->d), j->d);
}

int pl_mul(pl_ctx *ctx, float *dst, const float *a, const float *b, int64_t n, int64_t d,
           int64_t b_rows) {
    if (ctx == NULL || n < 0 || d < 0) return PL_ERR_ARG;
    if (b_rows != 1 && b_rows != n) return PL_ERR_ARG;
    if (n == 0 || d == 0) return PL_OK;
    if (dst == NULL || a == NULL || b == NULL) return PL_ERR_ARG;
    if (n * d <= CODEC_INLINE_ELEMS) {
        for (int64_t i = 0; i < n; i++) mul_span(dst + i * d, a + i * d, b + (b_rows == 1 ? 0 : i * d), d);
        return PL_OK;
    }
    mul_job j = {ctx, dst, a, b, n, d, b_rows};
    plx_chunk_reset(ctx);
    plx_run(ctx, job_mul, &j);
    return PL_OK;
}
