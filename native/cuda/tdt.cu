// tdt.cu: greedy transducer decoding kept on the device (plc_tdt_*): each row's frame, run of
// zero-duration tokens and emitted tokens live in a device state array (layout in
// parley_cuda.h), so that a decode step needs no host read and can be recorded in a graph.
#include <math.h>

#include "internal.cuh"
#include "tdt.cuh"

#define PLC_TDT_THREADS 128

// plc_tdt_better reports whether (v, i) comes before (bv, bi) in a first-maximum search that
// never takes a NaN: larger, or equal at a lower index; bi < 0 is nothing yet.
__device__ __forceinline__ bool plc_tdt_better(float v, int i, float bv, int bi) {
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

// plc_tdt_argmax is the block's first maximum of x[0..n) (NaN never counting; -1 when none).
__device__ int plc_tdt_argmax(const float *x, int n, float *sv, int *si) {
    float bv = 0.f;
    int bi = -1;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float v = x[j];
        if (v == v && plc_tdt_better(v, j, bv, bi)) bv = v, bi = j;
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s && plc_tdt_better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            si[threadIdx.x] = si[threadIdx.x + s];
        }
        __syncthreads();
    }
    const int r = si[0];
    __syncthreads();
    return r;
}

// plc_tdt_sum is the block's sum of exp(x[j] - m) over j < n, in double.
__device__ double plc_tdt_sumexp(const float *x, int n, float m, double *sd) {
    double s = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += exp((double)(x[j] - m));
    sd[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) sd[threadIdx.x] += sd[threadIdx.x + k];
        __syncthreads();
    }
    const double r = sd[0];
    __syncthreads();
    return r;
}

// plc_tdt_max is the block's largest value of x[0..n); NaN when one is NaN.
__device__ float plc_tdt_max(const float *x, int n, float *sv, int *si) {
    int nan;
    const float r = plc_tdt_block_max(x, n, &nan, sv, si);
    return nan ? NAN : r;
}

// One block a row.
__global__ void plc_tdt_decide_k(const float *logits, int64_t width, plc_tdt_cfg cfg, int32_t *st, int64_t n) {
    __shared__ float sv[PLC_TDT_THREADS];
    __shared__ int si[PLC_TDT_THREADS];
    __shared__ double sd[PLC_TDT_THREADS];
    const int64_t i = blockIdx.x;
    int32_t *f = st;
    const int64_t ring = cfg.ring;
    if (f[PLC_TDT_DONE * n + i]) {
        if (threadIdx.x == 0) f[PLC_TDT_EMIT * n + i] = 0;
        return;
    }
    const float *row = logits + i * width;
    const int k = plc_tdt_argmax(row, cfg.n_tok, sv, si);
    int d = 0;
    if (cfg.n_dur > 0) d = plc_tdt_argmax(row + cfg.n_tok, cfg.n_dur, sv, si);
    const int blank = cfg.n_tok - 1;
    double sumTok = 0, sumAll = 0;
    float mx = 0;
    if (k >= 0 && d >= 0 && k != blank) {
        sumTok = plc_tdt_sumexp(row, cfg.n_tok, row[k], sd);
        mx = plc_tdt_max(row, (int)width, sv, si);
        if (mx == mx && !isinf(mx)) sumAll = plc_tdt_sumexp(row, (int)width, mx, sd);
    }
    if (threadIdx.x != 0) return;
    if (k < 0 || d < 0) {
        f[PLC_TDT_BAD * n + i] = 1;
        f[PLC_TDT_DONE * n + i] = 1;
        f[PLC_TDT_EMIT * n + i] = 0;
        return;
    }
    const int dur = cfg.n_dur > 0 ? cfg.durations[d] : 0;
    int frame = f[PLC_TDT_FRAME * n + i], run = f[PLC_TDT_RUN * n + i];
    const int end = f[PLC_TDT_END * n + i];
    if (k == blank) {
        frame += dur > 1 ? dur : 1;
        run = 0;
        f[PLC_TDT_EMIT * n + i] = 0;
        f[PLC_TDT_TOK * n + i] = blank;
    } else {
        const int32_t c = f[PLC_TDT_COUNT * n + i];
        const int64_t at = i * ring + c % ring;
        int32_t *rtok = st + PLC_TDT_FIELDS * n, *rframe = rtok + n * ring, *rdur = rframe + n * ring;
        float *rp = (float *)(rdur + n * ring), *rplog = rp + n * ring;
        rtok[at] = k;
        rframe[at] = frame;
        rdur[at] = d;
        rp[at] = (float)(1.0 / sumTok);
        double lse = mx;
        if (mx == mx && !isinf(mx)) lse = (double)mx + log(sumAll);
        rplog[at] = (float)((double)row[k] - lse);
        f[PLC_TDT_COUNT * n + i] = c + 1;
        f[PLC_TDT_EMIT * n + i] = 1;
        f[PLC_TDT_TOK * n + i] = k;
        if (dur > 0) {
            frame += dur;
            run = 0;
        } else if (++run >= cfg.max_symbols) {
            frame++;
            run = 0;
        }
    }
    f[PLC_TDT_FRAME * n + i] = frame;
    f[PLC_TDT_RUN * n + i] = run;
    if (frame >= end) f[PLC_TDT_DONE * n + i] = 1;
    f[PLC_TDT_IDX * n + i] = frame < end ? frame : (end > 0 ? end - 1 : 0);
}

extern "C" int plc_tdt_decide(plc_ctx *ctx, const float *logits, int64_t n, int64_t width, const plc_tdt_cfg *cfg, int32_t *st) {
    if (ctx == NULL || cfg == NULL) return PLC_ERR_ARG;
    if (n < 0 || n > 65535 || cfg->n_tok < 1 || cfg->n_dur < 0 || cfg->n_dur > PLC_TDT_MAX_DURATIONS || cfg->max_symbols < 1 ||
        cfg->ring < 1 || width != (int64_t)cfg->n_tok + cfg->n_dur)
        return plc_fail_arg(ctx, "tdt decide: bad shape");
    for (int j = 0; j < cfg->n_dur; j++)
        if (cfg->durations[j] < 0) return plc_fail_arg(ctx, "tdt decide: negative duration");
    if (n == 0) return PLC_OK;
    if (logits == NULL || st == NULL) return plc_fail_arg(ctx, "tdt decide: null pointer");
    PLC_ENTER(ctx);
    plc_tdt_decide_k<<<(unsigned)n, PLC_TDT_THREADS, 0, ctx->stream>>>(logits, width, *cfg, st, n);
    return plc_launched(ctx, "tdt decide");
}

__global__ void plc_tdt_start_k(int32_t *st, int64_t n, int64_t row, int32_t frame, int32_t end, int32_t tok, int32_t emit) {
    st[PLC_TDT_FRAME * n + row] = frame;
    st[PLC_TDT_RUN * n + row] = 0;
    st[PLC_TDT_END * n + row] = end;
    st[PLC_TDT_DONE * n + row] = frame >= end;
    st[PLC_TDT_EMIT * n + row] = emit != 0;
    st[PLC_TDT_TOK * n + row] = tok;
    st[PLC_TDT_IDX * n + row] = frame < end ? frame : (end > 0 ? end - 1 : 0);
    st[PLC_TDT_COUNT * n + row] = 0;
    st[PLC_TDT_BAD * n + row] = 0;
}

extern "C" int plc_tdt_start(plc_ctx *ctx, int32_t *st, int64_t n, int64_t row, int32_t frame, int32_t end, int32_t tok, int32_t emit) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (st == NULL || row < 0 || row >= n || frame < 0 || end < 0 || tok < 0) return plc_fail_arg(ctx, "tdt start: bad row");
    PLC_ENTER(ctx);
    plc_tdt_start_k<<<1, 1, 0, ctx->stream>>>(st, n, row, frame, end, tok, emit);
    return plc_launched(ctx, "tdt start");
}

// One block a row: row i of dst is table[st[field][i]] (tables[i] its own table when tables
// differ by row).
__global__ void plc_tdt_gather_k(float *dst, const float *const *tables, const float *table, int64_t cols, const int32_t *idx) {
    const int64_t i = blockIdx.x;
    const float *src = (tables != NULL ? tables[i] : table) + (int64_t)idx[i] * cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dst[i * cols + j] = src[j];
}

__global__ void plc_tdt_gather_f16_k(float *dst, const __half *table, int64_t cols, const int32_t *idx) {
    const int64_t i = blockIdx.x;
    const __half *src = table + (int64_t)idx[i] * cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dst[i * cols + j] = __half2float(src[j]);
}

extern "C" int plc_tdt_gather(plc_ctx *ctx, float *dst, const void *const *tables, const void *table, int32_t dtype, int64_t cols,
                              const int32_t *st, int64_t n, int32_t field) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (n < 0 || n > 65535 || cols < 0 || (field != PLC_TDT_IDX && field != PLC_TDT_TOK) || (dtype != PLC_F32 && dtype != PLC_F16) ||
        (tables != NULL && dtype != PLC_F32))
        return plc_fail_arg(ctx, "tdt gather: bad shape");
    if (n == 0 || cols == 0) return PLC_OK;
    if (dst == NULL || st == NULL || (tables == NULL && table == NULL)) return plc_fail_arg(ctx, "tdt gather: null pointer");
    PLC_ENTER(ctx);
    const float *const *dt = NULL;
    if (tables != NULL) {
        for (int64_t i = 0; i < n; i++)
            if (tables[i] == NULL) return plc_fail_arg(ctx, "tdt gather: null table");
        const void *host[1] = {tables};
        const size_t sizes[1] = {(size_t)n * sizeof(void *)};
        void *dev[1];
        int s = plc_meta(ctx, 1, host, sizes, dev);
        if (s != PLC_OK) return s;
        dt = (const float *const *)dev[0];
    }
    const int32_t *idx = st + field * n;
    if (dtype == PLC_F16) plc_tdt_gather_f16_k<<<(unsigned)n, 128, 0, ctx->stream>>>(dst, (const __half *)table, cols, idx);
    else plc_tdt_gather_k<<<(unsigned)n, 128, 0, ctx->stream>>>(dst, dt, (const float *)table, cols, idx);
    return plc_launched(ctx, "tdt gather");
}

__global__ void plc_tdt_keep_k(float *dst, const float *src, int64_t cols, const int32_t *emit) {
    const int64_t i = blockIdx.x;
    if (!emit[i]) return;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dst[i * cols + j] = src[i * cols + j];
}

extern "C" int plc_tdt_keep(plc_ctx *ctx, float *dst, const float *src, int64_t cols, const int32_t *st, int64_t n) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (n < 0 || n > 65535 || cols < 0) return plc_fail_arg(ctx, "tdt keep: bad shape");
    if (n == 0 || cols == 0) return PLC_OK;
    if (dst == NULL || src == NULL || st == NULL) return plc_fail_arg(ctx, "tdt keep: null pointer");
    PLC_ENTER(ctx);
    plc_tdt_keep_k<<<(unsigned)n, 128, 0, ctx->stream>>>(dst, src, cols, st + PLC_TDT_EMIT * n);
    return plc_launched(ctx, "tdt keep");
}
