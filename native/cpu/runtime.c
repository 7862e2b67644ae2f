/*
 * runtime.c: processor-feature detection, the worker-thread pool, scratch memory, and the
 * type tables every other source uses.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

/* ---------------------------------------------------------------- ISA detection */

int plx_isa = PL_ISA_SCALAR;
int plx_force_blas = 0;
static int plx_best = PL_ISA_SCALAR;
static pthread_once_t plx_once = PTHREAD_ONCE_INIT;

static void plx_detect(void) {
    int best = PL_ISA_SCALAR;
#if PL_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        best = PL_ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vnni")) {
            best = PL_ISA_AVX512;
        }
    }
#endif
    plx_best = best;
    plx_isa = best;
    /* PARLEY_CPU_BLAS=openblas routes float matrix products through OpenBLAS even where the
     * AVX-512 kernel would run (for comparisons). */
    const char *blas = getenv("PARLEY_CPU_BLAS");
    plx_force_blas = blas != NULL && strcmp(blas, "openblas") == 0;
}

void plx_init(void) { pthread_once(&plx_once, plx_detect); }

int pl_cpu_isa(void) {
    plx_init();
    return plx_isa;
}

int pl_cpu_best_isa(void) {
    plx_init();
    return plx_best;
}

int pl_cpu_set_isa(int isa) {
    plx_init();
    if (isa < PL_ISA_SCALAR || isa > plx_best) return PL_ERR_UNSUPPORTED;
    plx_isa = isa;
    return PL_OK;
}

const char *pl_isa_name(int isa) {
    switch (isa) {
    case PL_ISA_SCALAR: return "scalar";
    case PL_ISA_AVX2: return "avx2";
    case PL_ISA_AVX512: return "avx512";
    }
    return "unknown";
}

/* ---------------------------------------------------------------- types */

int plx_block_size(int dtype) {
    switch (dtype) {
    case PL_F32: case PL_F16: case PL_BF16: return 1;
    case PL_Q4_0: case PL_Q4_1: case PL_Q5_0: case PL_Q5_1: case PL_Q8_0: case PL_Q8_1:
    case PL_IQ4_NL: return 32;
    case PL_Q2_K: case PL_Q3_K: case PL_Q4_K: case PL_Q5_K: case PL_Q6_K: case PL_Q8_K:
    case PL_IQ4_XS: return 256;
    }
    return 0;
}

int plx_type_size(int dtype) {
    switch (dtype) {
    case PL_F32: return 4;
    case PL_F16: case PL_BF16: return 2;
    case PL_Q4_0: return 18;
    case PL_Q4_1: return 20;
    case PL_Q5_0: return 22;
    case PL_Q5_1: return 24;
    case PL_Q8_0: return 34;
    case PL_Q8_1: return 36;
    case PL_Q2_K: return 84;
    case PL_Q3_K: return 110;
    case PL_Q4_K: return 144;
    case PL_Q5_K: return 176;
    case PL_Q6_K: return 210;
    case PL_Q8_K: return 292;
    case PL_IQ4_NL: return 18;
    case PL_IQ4_XS: return 136;
    }
    return 0;
}

int64_t pl_row_size(int dtype, int64_t n) {
    int bs = plx_block_size(dtype);
    if (bs == 0) return PL_ERR_UNSUPPORTED;
    if (n < 0 || n % bs != 0 || n / bs > INT64_MAX / 512) return PL_ERR_ARG;
    return n / bs * plx_type_size(dtype);
}

int pl_vec_dot_type(int dtype) {
    switch (dtype) {
    case PL_F32: case PL_F16: case PL_BF16: return dtype;
    case PL_Q4_0: case PL_Q5_0: case PL_Q8_0: case PL_IQ4_NL: return PL_Q8_0;
    case PL_Q4_1: case PL_Q5_1: return PL_Q8_1;
    case PL_Q2_K: case PL_Q3_K: case PL_Q4_K: case PL_Q5_K: case PL_Q6_K: case PL_IQ4_XS: return PL_Q8_K;
    }
    return PL_ERR_UNSUPPORTED;
}

int pl_supports(int op, int dtype) {
    switch (op) {
    case PL_OP_MATMUL:
    case PL_OP_GET_ROWS:
        return pl_vec_dot_type(dtype) >= 0;
    case PL_OP_KV:
        return dtype == PL_F32 || dtype == PL_F16 || dtype == PL_BF16;
    case PL_OP_QUANTIZE:
        return dtype == PL_F16 || dtype == PL_BF16 || dtype == PL_Q8_0 || dtype == PL_Q8_1 ||
               dtype == PL_Q8_K;
    case PL_OP_DEQUANTIZE:
        return plx_block_size(dtype) != 0;
    case PL_OP_UNARY:
        return plx_unary_supports(dtype);
    }
    return 0;
}

/* ---------------------------------------------------------------- thread pool */

static inline void plx_pause(void) {
#if PL_X86
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t plx_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#define PLX_CLOSED 0x80000000u

/* Workers spin this long for the next job before sleeping: long enough to cover the gaps
 * between the operations of one forward step, short enough not to burn a core while idle. */
#define PLX_SPIN_NS 300000

typedef struct {
    struct plx_pool *pool;
    int ith;
} plx_worker_arg;

struct plx_pool {
    int nth;
    pthread_t *threads;
    plx_worker_arg *args;
    pl_ctx *ctx;
    plx_job_fn fn;
    void *arg;
    _Alignas(64) uint32_t gen; /* job generation, bumped once per job */
    /* PLX_CLOSED once the caller has finished its share of the current job; below it, the
     * number of workers inside the job. A worker that wakes after the job closed skips it, so
     * the caller never waits for a thread the system has not yet scheduled. */
    _Alignas(64) uint32_t state;
    _Alignas(64) int32_t sleepers;
    int32_t stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};


static void *plx_worker(void *p) {
    plx_worker_arg *wa = (plx_worker_arg *)p;
    struct plx_pool *pool = wa->pool;
    int ith = wa->ith;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = __atomic_load_n(&pool->gen, __ATOMIC_ACQUIRE);
        if (g == seen) {
            int64_t t0 = plx_now_ns();
            for (int i = 1;; i++) {
                plx_pause();
                g = __atomic_load_n(&pool->gen, __ATOMIC_ACQUIRE);
                if (g != seen) break;
                if ((i & 255) == 0) {
                    if (plx_now_ns() - t0 > PLX_SPIN_NS) break;
                    /* give way to any other runnable thread on this core (when the machine
                     * is oversubscribed, the caller itself may be waiting for it) */
                    if ((i & 1023) == 0) sched_yield();
                }
            }
        }
        if (g == seen) {
            pthread_mutex_lock(&pool->mu);
            __atomic_fetch_add(&pool->sleepers, 1, __ATOMIC_SEQ_CST);
            while ((g = __atomic_load_n(&pool->gen, __ATOMIC_SEQ_CST)) == seen &&
                   !__atomic_load_n(&pool->stop, __ATOMIC_SEQ_CST)) {
                pthread_cond_wait(&pool->cv, &pool->mu);
            }
            __atomic_fetch_sub(&pool->sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&pool->mu);
        }
        if (__atomic_load_n(&pool->stop, __ATOMIC_ACQUIRE)) return NULL;
        seen = g;
        uint32_t st = __atomic_load_n(&pool->state, __ATOMIC_RELAXED);
        while (!(st & PLX_CLOSED)) {
            if (__atomic_compare_exchange_n(&pool->state, &st, st + 1, 1, __ATOMIC_ACQUIRE,
                                            __ATOMIC_RELAXED)) {
                pool->fn(pool->arg, ith, pool->nth);
                __atomic_fetch_sub(&pool->state, 1, __ATOMIC_RELEASE);
                break;
            }
        }
    }
}

void plx_run(pl_ctx *ctx, plx_job_fn fn, void *arg) {
    struct plx_pool *pool = ctx->pool;
    if (pool == NULL || pool->nth == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    __atomic_store_n(&pool->state, 0, __ATOMIC_RELEASE);
    __atomic_fetch_add(&pool->gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool->sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
    }
    fn(arg, 0, pool->nth);
    __atomic_fetch_or(&pool->state, PLX_CLOSED, __ATOMIC_ACQ_REL);
    for (int i = 1; (__atomic_load_n(&pool->state, __ATOMIC_ACQUIRE) & ~PLX_CLOSED) != 0; i++) {
        plx_pause();
        if ((i & 1023) == 0) sched_yield();
    }
}

static void plx_pool_free(struct plx_pool *pool, int started) {
    if (pool == NULL) return;
    pthread_mutex_lock(&pool->mu);
    __atomic_store_n(&pool->stop, 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&pool->gen, 1, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < started; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->threads);
    free(pool->args);
    free(pool);
}

static int plx_pool_new(pl_ctx *ctx, int nth, struct plx_pool **out) {
    *out = NULL;
    if (nth <= 1) return PL_OK;
    struct plx_pool *pool = NULL;
    if (posix_memalign((void **)&pool, 64, sizeof *pool) != 0) return PL_ERR_NOMEM;
    memset(pool, 0, sizeof *pool);
    pool->nth = nth;
    pool->ctx = ctx;
    pool->threads = calloc((size_t)nth, sizeof(pthread_t));
    pool->args = calloc((size_t)nth, sizeof(plx_worker_arg));
    if (pool->threads == NULL || pool->args == NULL) {
        free(pool->threads);
        free(pool->args);
        free(pool);
        return PL_ERR_NOMEM;
    }
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    for (int i = 1; i < nth; i++) {
        pool->args[i].pool = pool;
        pool->args[i].ith = i;
        if (pthread_create(&pool->threads[i - 1], NULL, plx_worker, &pool->args[i]) != 0) {
            plx_pool_free(pool, i - 1);
            return PL_ERR_THREAD;
        }
    }
    *out = pool;
    return PL_OK;
}

/* ---------------------------------------------------------------- context */

int pl_ctx_new(int threads, pl_ctx **out) {
    if (out == NULL) return PL_ERR_ARG;
    *out = NULL;
    if (threads < 1 || threads > 256) return PL_ERR_ARG;
    plx_init();
    pl_ctx *ctx = NULL;
    if (posix_memalign((void **)&ctx, 64, sizeof *ctx) != 0) return PL_ERR_NOMEM;
    memset(ctx, 0, sizeof *ctx);
    ctx->nth = threads;
    ctx->tscratch = calloc((size_t)threads, sizeof(uint8_t *));
    ctx->tscratch_size = calloc((size_t)threads, sizeof(size_t));
    if (ctx->tscratch == NULL || ctx->tscratch_size == NULL) {
        free(ctx->tscratch);
        free(ctx->tscratch_size);
        free(ctx);
        return PL_ERR_NOMEM;
    }
    int st = plx_pool_new(ctx, threads, &ctx->pool);
    if (st != PL_OK) {
        free(ctx->tscratch);
        free(ctx->tscratch_size);
        free(ctx);
        return st;
    }
    plx_blas_threads(1);
    *out = ctx;
    return PL_OK;
}

void pl_ctx_free(pl_ctx *ctx) {
    if (ctx == NULL) return;
    if (ctx->pool != NULL) plx_pool_free(ctx->pool, ctx->nth - 1);
    for (int i = 0; i < ctx->nth; i++) free(ctx->tscratch[i]);
    free(ctx->tscratch);
    free(ctx->tscratch_size);
    free(ctx->scratch);
    free(ctx->rope_tab);
    free(ctx->rope_pos);
    free(ctx->rope_ff);
    free(ctx);
}

int pl_ctx_threads(const pl_ctx *ctx) { return ctx ? ctx->nth : 0; }

uint8_t *plx_scratch(pl_ctx *ctx, size_t size) {
    if (size <= ctx->scratch_size) return ctx->scratch;
    size_t want = size + size / 4;
    want = (want + 4095) & ~(size_t)4095;
    void *p = NULL;
    if (posix_memalign(&p, 4096, want) != 0) return NULL;
    free(ctx->scratch);
    ctx->scratch = p;
    ctx->scratch_size = want;
    return ctx->scratch;
}

int plx_tscratch_reserve(pl_ctx *ctx, size_t size) {
    for (int i = 0; i < ctx->nth; i++) {
        if (ctx->tscratch_size[i] >= size) continue;
        size_t want = (size + 4095) & ~(size_t)4095;
        void *p = NULL;
        if (posix_memalign(&p, 4096, want) != 0) return PL_ERR_NOMEM;
        free(ctx->tscratch[i]);
        ctx->tscratch[i] = p;
        ctx->tscratch_size[i] = want;
    }
    return PL_OK;
}

uint8_t *plx_tscratch(pl_ctx *ctx, int ith) { return ctx->tscratch[ith]; }
