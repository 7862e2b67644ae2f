// sampling.cu: plc_argmax and plc_draw, one thread block per row of logits; only the chosen ids
// leave the device.
#include <limits.h>
#include <math.h>

#include "sampling.cuh"

// plc_row_argmax returns, to thread 0, the index of the largest element of x[0..vocab) (the
// lowest among equal values), or -1 for a row with a NaN or +Inf or nothing above -Inf.
// Contains __syncthreads.
__device__ int32_t plc_row_argmax(const float *x, int64_t vocab) {
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    float best = -INFINITY;
    int64_t bi = -1;
    int bad = 0;  // a NaN or +Inf: the row is refused
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float v = x[j];
        bad |= v != v || v == INFINITY;
        if (v > -INFINITY && (bi < 0 || v > best)) {  // increasing j: the first of equal values stays
            best = v;
            bi = j;
        }
    }
    // (value, index) pairs: larger value first, then lower index; index -1 means none.
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > best || (ov == best && oi < bi))) {
            best = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x % PLC_WARP, warp = threadIdx.x / PLC_WARP;
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
    }
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / PLC_WARP); w++) {
            if (si[w] >= 0 && (bi < 0 || sv[w] > best || (sv[w] == best && si[w] < bi))) {
                best = sv[w];
                bi = si[w];
            }
        }
    }
    return bad || bi < 0 ? -1 : (int32_t)bi;  // bi < 0: nothing above -Inf
}

__global__ void __launch_bounds__(PLC_SELECT_THREADS) plc_argmax_k(int32_t *ids, const float *logits, int64_t vocab) {
    const int32_t id = plc_row_argmax(logits + blockIdx.x * vocab, vocab);
    if (threadIdx.x == 0) ids[blockIdx.x] = id;
}

// One block per row: the argmax where the row's temperature is 0, else a draw (plc_draw).
__global__ void __launch_bounds__(PLC_SELECT_THREADS)
    plc_draw_k(int32_t *ids, const float *logits, int64_t vocab, const plc_draw_row *rows) {
    __shared__ plc_select_smem sm;
    __shared__ float red[32];
    __shared__ unsigned long long found, last1;  // first index past the target; last candidate + 1
    const plc_draw_row r = rows[blockIdx.x];
    const float *x = logits + blockIdx.x * vocab;
    if (!(r.temperature > 0.f)) {
        const int32_t id = plc_row_argmax(x, vocab);
        if (threadIdx.x == 0) ids[blockIdx.x] = id;
        return;
    }
    float M = -INFINITY;
    int bad = 0;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float v = x[j];
        bad |= v != v || v == INFINITY;
        M = fmaxf(M, v);
    }
    bad = __syncthreads_or(bad);
    M = plc_block_max(M, red);
    if (bad || M == -INFINITY) {  // nothing to draw from
        if (threadIdx.x == 0) ids[blockIdx.x] = -1;
        return;
    }
    // The candidates (key(j) >= t) are chosen at temperature 1, the draw's weights at the row's.
    auto key = [&](int64_t j) { return plc_key(x[j]); };
    auto mass = [&](int64_t j) { return expf(x[j] - M); };
    const float inv_temp = 1.f / r.temperature;
    auto weight = [&](int64_t j) { return x[j] == M ? 1.f : expf((x[j] - M) * inv_temp); };
    uint32_t t = 0;
    if (r.top_k > 0 && r.top_k < vocab) t = plc_kth_key(key, vocab, r.top_k, &sm);
    if (r.top_p < 1.f) {
        float zs = 0.f;
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
            if (key(j) >= t) zs += mass(j);
        zs = plc_block_sum(zs, red);
        const uint32_t tp = plc_mass_key(key, mass, vocab, t, r.top_p * zs, &sm);
        if (tp > t) t = tp;
    }
    if (r.min_p > 0.f) {
        const uint32_t tm = plc_key(M + logf(r.min_p));
        if (tm > t) t = tm;
    }
    float zt = 0.f;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
        if (key(j) >= t) zt += weight(j);
    zt = plc_block_sum(zt, red);
    const float u = (float)(r.random >> 40) * 0x1p-24f;
    const float target = u * zt;
    if (threadIdx.x == 0) {
        found = ULLONG_MAX;
        last1 = 0;
    }
    __syncthreads();
    float running = 0.f;
    for (int64_t base = 0; base < vocab; base += blockDim.x) {
        const int64_t j = base + threadIdx.x;
        float e = 0.f;
        if (j < vocab && key(j) >= t) e = weight(j);
        float tot;
        const float incl = plc_block_scan(e, red, &tot);
        if (e > 0.f) {
            atomicMax(&last1, (unsigned long long)j + 1);
            if (running + incl > target) atomicMin(&found, (unsigned long long)j);
        }
        __syncthreads();
        if (found != ULLONG_MAX) break;
        running += tot;
    }
    if (threadIdx.x == 0) {
        // Rounding can leave the running sum just short of the target: the last candidate.
        const unsigned long long id = found != ULLONG_MAX ? found : (last1 > 0 ? last1 - 1 : 0);
        ids[blockIdx.x] = (int32_t)id;
    }
}

static int plc_rows_args(plc_ctx *ctx, const char *what, const float *logits, int64_t n, int64_t vocab, const void *out) {
    if (n < 0 || n > INT_MAX || vocab <= 0 || vocab > INT_MAX) return plc_fail_arg(ctx, what);
    if (n > 0 && (logits == NULL || out == NULL)) return plc_fail_arg(ctx, what);
    return PLC_OK;
}

extern "C" int plc_argmax(plc_ctx *ctx, const float *logits, int64_t n, int64_t vocab, int32_t *ids) {
    if (ctx == NULL) return PLC_ERR_ARG;
    int st = plc_rows_args(ctx, "argmax: bad arguments", logits, n, vocab, ids);
    if (st != PLC_OK || n == 0) return st;
    PLC_ENTER(ctx);
    void *w;
    if ((st = plc_work(ctx, (size_t)n * sizeof(int32_t), &w)) != PLC_OK) return st;
    plc_argmax_k<<<(unsigned)n, PLC_SELECT_THREADS, 0, ctx->stream>>>((int32_t *)w, logits, vocab);
    if ((st = plc_launched(ctx, "argmax")) != PLC_OK) return st;
    return plc_download(ctx, ids, w, (size_t)n * sizeof(int32_t));
}

extern "C" int plc_draw(plc_ctx *ctx, const float *logits, int64_t n, int64_t vocab, const plc_draw_row *rows, int32_t *ids) {
    if (ctx == NULL) return PLC_ERR_ARG;
    int st = plc_rows_args(ctx, "draw: bad arguments", logits, n, vocab, ids);
    if (st != PLC_OK || n == 0) return st;
    if (rows == NULL) return plc_fail_arg(ctx, "draw: null rows");
    for (int64_t i = 0; i < n; i++) {
        const plc_draw_row r = rows[i];
        if (r.temperature == 0.f) continue;  // the argmax
        if (!(r.temperature > 0.f) || isinf(r.temperature) || r.top_k < 0 || !(r.top_p > 0.f) || !(r.top_p <= 1.f) ||
            !(r.min_p >= 0.f) || !(r.min_p <= 1.f))
            return plc_fail_arg(ctx, "draw: bad sampling parameters");
    }
    PLC_ENTER(ctx);
    const void *host[1] = {rows};
    const size_t sizes[1] = {(size_t)n * sizeof(plc_draw_row)};
    void *dev[1];
    if ((st = plc_meta(ctx, 1, host, sizes, dev)) != PLC_OK) return st;
    void *w;
    if ((st = plc_work(ctx, (size_t)n * sizeof(int32_t), &w)) != PLC_OK) return st;
    plc_draw_k<<<(unsigned)n, PLC_SELECT_THREADS, 0, ctx->stream>>>((int32_t *)w, logits, vocab, (const plc_draw_row *)dev[0]);
    if ((st = plc_launched(ctx, "draw")) != PLC_OK) return st;
    return plc_download(ctx, ids, w, (size_t)n * sizeof(int32_t));
}
