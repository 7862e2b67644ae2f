// choose.cu: plc_choose. One block a row: the dropped ids become a bitmap in shared memory; then
// passes over the row take the maximum and the exponential sum before filtering (where the row
// probes an id), the same after filtering, the group's sum (forcing), the group's best id and
// share, and either the token drawn at the row's temperature or the k best tokens: the k-th largest key by radix selection, then (only when more
// tokens tie at it than are wanted) the last id wanted among the ties by a second selection; the
// tokens above and the ties wanted are gathered through a shared counter and each written to its
// rank.
#include <float.h>
#include <limits.h>
#include <math.h>

#include "choose.cuh"

// Block-wide sum of a double; red: shared scratch of 32 doubles. Contains __syncthreads.
__device__ __forceinline__ double plc_block_sum_d(double v, double *red) {
    const int lane = threadIdx.x % PLC_WARP, warp = threadIdx.x / PLC_WARP, nw = blockDim.x / PLC_WARP;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < nw; w++) s += red[w];
    return s;
}

// Block-wide inclusive prefix sum of a double over the threads in order, with the total in
// *total and in *excl the previous thread's inclusive sum, exactly as it computed it (0 for the
// first), so that the threads' [excl, inclusive) tile [0, total) with no gap; red: shared scratch
// of 32 doubles. Contains __syncthreads.
__device__ __forceinline__ double plc_block_scan_d(double v, double *red, double *excl, double *total) {
    const int lane = threadIdx.x % PLC_WARP, warp = threadIdx.x / PLC_WARP, nw = blockDim.x / PLC_WARP;
    double inc = v;
    for (int o = 1; o < PLC_WARP; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads();
    if (lane == PLC_WARP - 1) red[warp] = inc;
    __syncthreads();
    double off = 0.0, tot = 0.0;
    for (int w = 0; w < nw; w++) {
        if (w < warp) off += red[w];
        tot += red[w];
    }
    const double incl = off + inc;  // for the last lane of warp w-1, the same additions as off
    const double prev = __shfl_up_sync(0xffffffffu, incl, 1);
    *excl = lane == 0 ? off : prev;
    *total = tot;
    return incl;
}

// e^x as the host's vec.Expf rounds its smallest results: 0 below -87.33654 (where a float32
// result would be subnormal), so that sums and probabilities agree with the host rule's.
__device__ __forceinline__ float plc_expf_cut(float x) { return x < -87.33654f ? 0.f : expf(x); }

// Block-wide minimum of an int; red: shared scratch of 32 ints. Contains __syncthreads.
__device__ __forceinline__ int plc_block_min_i(int v, int *red) {
    const int lane = threadIdx.x % PLC_WARP, warp = threadIdx.x / PLC_WARP, nw = blockDim.x / PLC_WARP;
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    int m = INT_MAX;
    for (int w = 0; w < nw; w++) m = min(m, red[w]);
    return m;
}

__global__ void __launch_bounds__(PLC_SELECT_THREADS)
    plc_choose_k(plc_chosen *out, int32_t *out_ids, float *out_lp, const float *logits, int64_t vocab,
                 const plc_choice *choices, const int32_t *drop, int k) {
    extern __shared__ uint32_t dropped[];  // [(vocab + 31) / 32]
    __shared__ plc_select_smem sm;
    __shared__ float red[32];
    __shared__ double redd[32];
    __shared__ int redi[32];
    __shared__ float cand_v[PLC_CHOOSE_MAX_K];
    __shared__ int32_t cand_i[PLC_CHOOSE_MAX_K];
    __shared__ int taken;
    const int row = blockIdx.x;
    const plc_choice c = choices[row];
    const float *x = logits + (int64_t)row * vocab;
    const int words = (int)((vocab + 31) / 32);
    for (int i = threadIdx.x; i < words; i += blockDim.x) dropped[i] = 0u;
    __syncthreads();
    for (int64_t i = c.drop[0] + (int64_t)threadIdx.x; i < c.drop[1]; i += blockDim.x) {
        const int32_t id = drop[i];
        atomicOr(&dropped[id >> 5], 1u << (id & 31));
    }
    __syncthreads();
    auto removed = [&](int64_t j) {
        for (int r = 0; r < 4; r++)
            if (j >= c.cut[r][0] && j < c.cut[r][1]) return true;
        return ((dropped[j >> 5] >> (j & 31)) & 1u) != 0u;
    };
    plc_chosen rep;
    rep.n = -1;
    rep.group = -1;
    rep.share = 0.f;
    rep.probe = 0.f;
    bool fail = false;

    // The probe: its log-probability in the row as it came.
    if (c.probe >= 0) {
        float m = -INFINITY;
        bool bad = false;
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
            const float v = x[j];
            bad |= v != v || v == INFINITY;
            m = fmaxf(m, v);
        }
        bad = __syncthreads_or(bad);
        m = plc_block_max(m, red);
        if (bad || m == -INFINITY) {
            fail = true;
        } else {
            double s = 0.0;
            for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) s += (double)plc_expf_cut(x[j] - m);
            s = plc_block_sum_d(s, redd);
            const float lse = (float)log(s) + m;
            rep.probe = x[c.probe] - lse;
        }
    }

    // At a temperature the row is divided (after taking it relative to its largest value where
    // that value divided would overflow), as the host's ScaleRow does.
    float inv = 1.f, shift = 0.f;
    if (c.temperature > 0.f && !fail) {
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, x[j]);  // NaN ignored
        m = plc_block_max(m, red);
        inv = fminf(1.f / c.temperature, FLT_MAX);
        if (m * inv == INFINITY) shift = m;
    }
    // The filtered row's log-softmax: lp(j) = val(j) - lse.
    const int64_t split = c.split;
    const bool scaled = c.temperature > 0.f;
    auto val = [&](int64_t j) { return removed(j) ? -INFINITY : scaled ? (x[j] - shift) * inv : x[j]; };
    float mt = -INFINITY, ms = -INFINITY;
    bool bad = false;
    if (!fail) {
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
            const float v = val(j);
            bad |= v != v || v == INFINITY;
            if (j < split) mt = fmaxf(mt, v);
            else ms = fmaxf(ms, v);
        }
    }
    bad = __syncthreads_or(bad);
    mt = plc_block_max(mt, red);
    ms = plc_block_max(ms, red);
    const float m = fmaxf(mt, ms);
    fail = fail || bad || m == -INFINITY;
    float lse = 0.f;
    if (!fail) {
        double s = 0.0;
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
            const float v = val(j);
            if (v > -INFINITY) s += (double)plc_expf_cut(v - m);
        }
        s = plc_block_sum_d(s, redd);
        lse = (float)log(s) + m;
    }
    // The group's forcing: when log Σ exp over the group exceeds every id below split.
    bool forced = false;
    if (!fail && split < vocab) {
        const float mxs = ms - lse;  // the largest of the group's log-probabilities
        double s = 0.0;
        if (mxs > -INFINITY)
            for (int64_t j = split + threadIdx.x; j < vocab; j += blockDim.x) {
                const float v = val(j);
                if (v > -INFINITY) s += (double)plc_expf_cut((v - lse) - mxs);
            }
        s = plc_block_sum_d(s, redd);
        const float group = s > 0.0 ? (float)log(s) + mxs : -INFINITY;
        const float below = mt - lse;
        forced = group > below;
    }
    auto fin = [&](int64_t j) {
        if (forced && j < split) return -INFINITY;
        const float v = val(j);
        return v > -INFINITY ? v - lse : -INFINITY;
    };
    // The group's most probable id and its share.
    if (!fail && split < vocab) {
        float best = 0.f;
        double s = 0.0;
        for (int64_t j = split + threadIdx.x; j < vocab; j += blockDim.x) {
            const float p = plc_expf_cut(fin(j));
            s += (double)p;
            best = fmaxf(best, p);
        }
        s = plc_block_sum_d(s, redd);
        best = plc_block_max(best, red);
        int first = INT_MAX;
        if (best > 0.f)
            for (int64_t j = split + threadIdx.x; j < vocab; j += blockDim.x)
                if (plc_expf_cut(fin(j)) == best) {
                    first = (int)j;
                    break;
                }
        first = plc_block_min_i(first, redi);
        if (best > 0.f && first != INT_MAX) {
            rep.group = first;
            rep.share = (float)((double)best / (s + 1e-10));
        }
    }
    // A draw: u times the total of exp(lp) in id order, each thread summing a run of consecutive
    // ids; the thread whose run holds the target walks it. None (rounding: the target at the
    // total): the last id above -inf.
    if (!fail && scaled) {
        const int64_t per = (vocab + blockDim.x - 1) / blockDim.x;
        const int64_t lo = min(vocab, (int64_t)threadIdx.x * per), hi = min(vocab, lo + per);
        double a = 0.0;
        int last = -1;
        for (int64_t j = lo; j < hi; j++) {
            const float f = fin(j);
            a += (double)plc_expf_cut(f);
            if (f > -INFINITY) last = (int)j;
        }
        double before, total;
        const double upto = plc_block_scan_d(a, redd, &before, &total);
        const double target = (double)(c.random << 11 >> 11) * 0x1p-53 * total;
        int found = INT_MAX;
        if (before <= target && target < upto) {  // one thread's run holds the target
            double run = before;
            int pos = -1;  // the run's last id with mass, should rounding keep run from passing target
            for (int64_t j = lo; j < hi; j++) {
                const float p = plc_expf_cut(fin(j));
                run += (double)p;
                if (p > 0.f) pos = (int)j;
                if (run > target) {
                    found = (int)j;
                    break;
                }
            }
            if (found == INT_MAX && pos >= 0) found = pos;
        }
        found = plc_block_min_i(found, redi);
        last = -plc_block_min_i(-last, redi);
        if (threadIdx.x == 0) {
            const int id = found != INT_MAX && fin(found) > -INFINITY ? found : last;
            cand_i[0] = id;
            cand_v[0] = fin(id);
        }
        __syncthreads();
    }
    // The k best: kk = min(k, tokens above -inf).
    int kk = 0;
    if (!fail && scaled) {
        kk = 1;
    } else if (!fail) {
        float cnt = 0.f;
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) cnt += fin(j) > -INFINITY ? 1.f : 0.f;
        cnt = plc_block_sum(cnt, red);
        kk = (int)fminf(cnt, (float)k);
    }
    if (kk > 0 && !scaled) {
        auto key = [&](int64_t j) {
            const float v = fin(j);
            return v > -INFINITY ? plc_key(v) : 0u;
        };
        const uint32_t t = plc_kth_key(key, vocab, kk, &sm);
        float gt = 0.f, eq = 0.f;
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
            const uint32_t kj = key(j);
            gt += kj > t ? 1.f : 0.f;
            eq += kj == t ? 1.f : 0.f;
        }
        const int n_gt = (int)plc_block_sum(gt, red);  // < kk
        const int n_eq = (int)plc_block_sum(eq, red);
        const int need = kk - n_gt;  // ties at t taken, the lowest ids first: 1 <= need <= n_eq
        int64_t end = vocab;         // the ties taken are those below end
        if (n_eq > need) {
            // the need-th largest of ~j over the ties is the need-th lowest id among them
            auto tie = [&](int64_t j) { return key(j) == t ? ~(uint32_t)j : 0u; };
            end = (int64_t)(~plc_kth_key(tie, vocab, need, &sm)) + 1;
        }
        if (threadIdx.x == 0) taken = 0;
        __syncthreads();
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
            const uint32_t kj = key(j);
            if (kj > t || (kj == t && j < end)) {
                const int s = atomicAdd(&taken, 1);
                cand_v[s] = fin(j);
                cand_i[s] = (int32_t)j;
            }
        }
        __syncthreads();
    }
    if (!fail) rep.n = kk;
    else {
        rep.group = -1;
        rep.share = 0.f;
        rep.probe = 0.f;
    }
    // Each token taken goes to its rank: most probable first, the lower id first among equals.
    if ((int)threadIdx.x < kk) {
        const float v = cand_v[threadIdx.x];
        const int32_t id = cand_i[threadIdx.x];
        int rank = 0;
        for (int a = 0; a < kk; a++) rank += (cand_v[a] > v || (cand_v[a] == v && cand_i[a] < id)) ? 1 : 0;
        out_ids[(int64_t)row * k + rank] = id;
        out_lp[(int64_t)row * k + rank] = v;
    }
    for (int i = kk + threadIdx.x; i < k; i += blockDim.x) {
        out_ids[(int64_t)row * k + i] = -1;
        out_lp[(int64_t)row * k + i] = -INFINITY;
    }
    if (threadIdx.x == 0) out[row] = rep;
}

extern "C" int plc_choose(plc_ctx *ctx, const float *logits, int64_t n, int64_t vocab, const plc_choice *choices,
                          const int32_t *drop, int32_t ndrop, int32_t k, plc_chosen *rows, int32_t *ids, float *logp) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (n < 0 || n > INT_MAX || vocab <= 0 || vocab > INT_MAX || ndrop < 0 || k < 1 || k > vocab)
        return plc_fail_arg(ctx, "choose: bad arguments");
    if (n == 0) return PLC_OK;
    if (logits == NULL || choices == NULL || rows == NULL || ids == NULL || logp == NULL || (ndrop > 0 && drop == NULL))
        return plc_fail_arg(ctx, "choose: null pointer");
    if (k > PLC_CHOOSE_MAX_K || vocab > PLC_CHOOSE_MAX_VOCAB) return PLC_ERR_UNSUPPORTED;
    for (int32_t i = 0; i < ndrop; i++)
        if (drop[i] < 0 || drop[i] >= vocab) return plc_fail_arg(ctx, "choose: drop list id outside the vocabulary");
    for (int64_t i = 0; i < n; i++) {
        const plc_choice c = choices[i];
        for (int r = 0; r < 4; r++)
            if (c.cut[r][0] < c.cut[r][1] && (c.cut[r][0] < 0 || c.cut[r][1] > vocab))
                return plc_fail_arg(ctx, "choose: cut outside the vocabulary");
        if (c.drop[0] < 0 || c.drop[0] > c.drop[1] || c.drop[1] > ndrop)
            return plc_fail_arg(ctx, "choose: drop range outside the list");
        if (c.split < 0 || c.split > vocab || c.probe < -1 || c.probe >= vocab)
            return plc_fail_arg(ctx, "choose: split or probe outside the vocabulary");
        if (!(c.temperature >= 0.f) || isinf(c.temperature)) return plc_fail_arg(ctx, "choose: bad temperature");
    }
    PLC_ENTER(ctx);
    int st = plc_not_recording(ctx, "choose (it waits for the logits)");
    if (st != PLC_OK) return st;
    const void *host[2] = {choices, drop};
    const size_t sizes[2] = {(size_t)n * sizeof(plc_choice), (size_t)ndrop * sizeof(int32_t)};
    void *dev[2];
    st = plc_meta(ctx, 2, host, sizes, dev);
    if (st != PLC_OK) return st;
    const size_t rb = (size_t)n * sizeof(plc_chosen), ib = (size_t)n * k * sizeof(int32_t);
    const size_t total = rb + 2 * ib;
    void *w;
    if ((st = plc_work(ctx, total, &w)) != PLC_OK) return st;
    plc_chosen *drows = (plc_chosen *)w;
    int32_t *dids = (int32_t *)((char *)w + rb);
    float *dlp = (float *)((char *)w + rb + ib);
    const size_t shared = (size_t)((vocab + 31) / 32) * sizeof(uint32_t);
    plc_choose_k<<<(unsigned)n, PLC_SELECT_THREADS, shared, ctx->stream>>>(drows, dids, dlp, logits, vocab,
                                                                           (const plc_choice *)dev[0],
                                                                           (const int32_t *)dev[1], k);
    if ((st = plc_launched(ctx, "choose")) != PLC_OK) return st;
    try {
        if (ctx->host.size() < total) ctx->host.resize(total);
    } catch (...) {
        return PLC_ERR_NOMEM;
    }
    char *h = (char *)ctx->host.data();
    if ((st = plc_download(ctx, h, w, total)) != PLC_OK) return st;
    memcpy(rows, h, rb);
    memcpy(ids, h + rb, ib);
    memcpy(logp, h + rb + ib, ib);
    return PLC_OK;
}
