// sampling.cu: plc_argmax and plc_sample, one thread block per row of logits; only the chosen
// ids leave the device.
#include <limits.h>
#include <math.h>

#include "sampling.cuh"

__global__ void __launch_bounds__(PLC_SELECT_THREADS) plc_argmax_k(int32_t *ids, const float *logits, int64_t vocab) {
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    const float *x = logits + blockIdx.x * vocab;
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
        ids[blockIdx.x] = bad || bi < 0 ? -1 : (int32_t)bi;  // bi < 0: nothing above -Inf
    }
}

// splitmix64: a 64-bit mixing function; the row's uniform draw is its top 24 bits.
__device__ __forceinline__ uint64_t plc_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void __launch_bounds__(PLC_SELECT_THREADS)
    plc_sample_k(int32_t *ids, const float *logits, int64_t vocab, float inv_temp, int top_k, float top_p, const uint64_t *seeds) {
    __shared__ plc_select_smem sm;
    __shared__ float red[32];
    __shared__ unsigned long long found, last1;  // first index past the target; last candidate + 1
    const float *x = logits + blockIdx.x * vocab;
    auto z = [&](int64_t j) {
        const float v = x[j] * inv_temp;
        return v != v ? -INFINITY : v;
    };
    float M = -INFINITY;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) M = fmaxf(M, z(j));
    M = plc_block_max(M, red);
    if (M == -INFINITY) {  // nothing to draw from: the first token
        if (threadIdx.x == 0) ids[blockIdx.x] = 0;
        return;
    }
    auto key = [&](int64_t j) { return plc_key(z(j)); };
    auto mass = [&](int64_t j) { return expf(z(j) - M); };
    uint32_t t = 0;
    if (top_k > 0 && top_k < vocab) t = plc_kth_key(key, vocab, top_k, &sm);
    if (top_p < 1.f) {
        float zs = 0.f;
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
            if (key(j) >= t) zs += mass(j);
        zs = plc_block_sum(zs, red);
        const uint32_t tp = plc_mass_key(key, mass, vocab, t, top_p * zs, &sm);
        if (tp > t) t = tp;
    }
    float zt = 0.f;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
        if (key(j) >= t) zt += mass(j);
    zt = plc_block_sum(zt, red);
    const float u = (float)(plc_mix64(seeds[blockIdx.x]) >> 40) * 0x1p-24f;
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
        if (j < vocab && key(j) >= t) e = mass(j);
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

extern "C" int plc_sample(plc_ctx *ctx, const float *logits, int64_t n, int64_t vocab, const plc_sampling *cfg,
                          const uint64_t *seeds, int32_t *ids) {
    if (ctx == NULL) return PLC_ERR_ARG;
    int st = plc_rows_args(ctx, "sample: bad arguments", logits, n, vocab, ids);
    if (st != PLC_OK) return st;
    if (cfg == NULL || !(cfg->temperature > 0.f) || isinf(cfg->temperature) || cfg->top_k < 0 || !(cfg->top_p > 0.f) ||
        !(cfg->top_p <= 1.f))
        return plc_fail_arg(ctx, "sample: bad sampling parameters");
    if (n == 0) return PLC_OK;
    if (seeds == NULL) return plc_fail_arg(ctx, "sample: null seeds");
    PLC_ENTER(ctx);
    const void *host[1] = {seeds};
    const size_t sizes[1] = {(size_t)n * sizeof(uint64_t)};
    void *dev[1];
    if ((st = plc_meta(ctx, 1, host, sizes, dev)) != PLC_OK) return st;
    void *w;
    if ((st = plc_work(ctx, (size_t)n * sizeof(int32_t), &w)) != PLC_OK) return st;
    plc_sample_k<<<(unsigned)n, PLC_SELECT_THREADS, 0, ctx->stream>>>((int32_t *)w, logits, vocab, 1.f / cfg->temperature,
                                                                     cfg->top_k, cfg->top_p, (const uint64_t *)dev[0]);
    if ((st = plc_launched(ctx, "sample")) != PLC_OK) return st;
    return plc_download(ctx, ids, w, (size_t)n * sizeof(int32_t));
}
