// beam.cu: plc_beam_step. A first kernel gives each beam a block that takes the log-softmax of
// its logits and gathers its k best tokens (the k-th largest by radix selection, ties taken in
// token order); a second sorts the beams*k candidates in one block (bitonic sort) and keeps the
// best k.
#include <limits.h>
#include <math.h>

#include "beam.cuh"

// Candidates of beam b: cs, ct [beams*k], slot b*k+i: score scores[b] + log p(t), token t.
__global__ void __launch_bounds__(PLC_SELECT_THREADS)
    plc_beam_gather(float *cs, int32_t *ct, const float *logits, int64_t vocab, const float *scores, int k) {
    __shared__ plc_select_smem sm;
    __shared__ float red[32];
    const int b = blockIdx.x;
    const float *x = logits + (int64_t)b * vocab;
    auto val = [&](int64_t j) {
        const float v = x[j];
        return v != v ? -INFINITY : v;
    };
    float M = -INFINITY;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) M = fmaxf(M, val(j));
    M = plc_block_max(M, red);
    float se = 0.f;
    if (M != -INFINITY)
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) se += expf(val(j) - M);
    se = plc_block_sum(se, red);
    const float lse = M + logf(se);
    auto key = [&](int64_t j) { return plc_key(val(j)); };
    const uint32_t t = plc_kth_key(key, vocab, k, &sm);
    float gt = 0.f;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) gt += key(j) > t ? 1.f : 0.f;
    const int n_gt = (int)plc_block_sum(gt, red);  // < k; the rest are ties at t
    float run_gt = 0.f, run_eq = 0.f;
    const float base_score = scores[b];
    for (int64_t base = 0; base < vocab; base += blockDim.x) {
        const int64_t j = base + threadIdx.x;
        const uint32_t kj = j < vocab ? key(j) : 0u;
        const bool is_gt = j < vocab && kj > t, is_eq = j < vocab && kj == t;
        float tg, te;
        const float ig = plc_block_scan(is_gt ? 1.f : 0.f, red, &tg);
        const float ie = plc_block_scan(is_eq ? 1.f : 0.f, red, &te);
        int slot = -1;
        if (is_gt) slot = (int)(run_gt + ig) - 1;
        else if (is_eq && (int)(run_eq + ie) <= k - n_gt) slot = n_gt + (int)(run_eq + ie) - 1;
        if (slot >= 0) {
            const float lp = M == -INFINITY ? -INFINITY : val(j) - lse;
            cs[(int64_t)b * k + slot] = base_score + lp;
            ct[(int64_t)b * k + slot] = (int32_t)j;
        }
        run_gt += tg;
        run_eq += te;
        if ((int)run_gt >= n_gt && (int)run_eq >= k - n_gt) break;  // uniform: every thread has the totals
    }
}

struct plc_beam_out {
    int32_t beam, token;
    float score, norm;
};

// Sorts the total = beams*k candidates by score, best first, ties by candidate index (beam,
// then token), and writes the best k. One block of PLC_SELECT_THREADS threads.
__global__ void __launch_bounds__(PLC_SELECT_THREADS)
    plc_beam_select(plc_beam_out *out, const float *cs, const int32_t *ct, int total, int k, float norm_div) {
    __shared__ float ss[PLC_BEAM_MAX_CAND];
    __shared__ int si[PLC_BEAM_MAX_CAND];
    int p = 1;
    while (p < total) p <<= 1;
    for (int i = threadIdx.x; i < p; i += blockDim.x) {
        const float v = i < total ? cs[i] : -INFINITY;
        ss[i] = v != v ? -INFINITY : v;
        si[i] = i < total ? i : INT_MAX;
    }
    __syncthreads();
    // before(a, b): a ranks ahead of b.
    for (int size = 2; size <= p; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < p; i += blockDim.x) {
                const int j = i ^ stride;
                if (j > i) {
                    const bool up = (i & size) == 0;  // this run is sorted best first
                    const bool j_first = ss[j] > ss[i] || (ss[j] == ss[i] && si[j] < si[i]);
                    if (j_first == up) {
                        const float tv = ss[i];
                        ss[i] = ss[j];
                        ss[j] = tv;
                        const int ti = si[i];
                        si[i] = si[j];
                        si[j] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        const int c = si[i];
        out[i] = plc_beam_out{c / k, ct[c], ss[i], ss[i] / norm_div};
    }
}

extern "C" int plc_beam_step(plc_ctx *ctx, const float *logits, int32_t beams, int64_t vocab, const float *scores, int32_t length,
                             float length_penalty, int32_t k, int32_t *out_beam, int32_t *out_token, float *out_score,
                             float *out_norm) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (beams < 1 || vocab < 1 || vocab > INT_MAX || k < 1 || k > vocab || length < 1 || isnan(length_penalty))
        return plc_fail_arg(ctx, "beam step: bad arguments");
    if ((int64_t)beams * k > PLC_BEAM_MAX_CAND) return PLC_ERR_UNSUPPORTED;
    if (logits == NULL || scores == NULL || out_beam == NULL || out_token == NULL || out_score == NULL || out_norm == NULL)
        return plc_fail_arg(ctx, "beam step: null pointer");
    PLC_ENTER(ctx);
    const int total = beams * k;
    const void *host[1] = {scores};
    const size_t sizes[1] = {(size_t)beams * sizeof(float)};
    void *dev[1];
    int st = plc_meta(ctx, 1, host, sizes, dev);
    if (st != PLC_OK) return st;
    const size_t a = plc_round_up((size_t)total * sizeof(float), 256);
    const size_t b = plc_round_up((size_t)total * sizeof(int32_t), 256);
    void *w;
    if ((st = plc_work(ctx, a + b + (size_t)k * sizeof(plc_beam_out), &w)) != PLC_OK) return st;
    float *cs = (float *)w;
    int32_t *ct = (int32_t *)((char *)w + a);
    plc_beam_out *dout = (plc_beam_out *)((char *)w + a + b);
    plc_beam_gather<<<(unsigned)beams, PLC_SELECT_THREADS, 0, ctx->stream>>>(cs, ct, logits, vocab, (const float *)dev[0], k);
    if ((st = plc_launched(ctx, "beam step: gather")) != PLC_OK) return st;
    const float norm_div = powf((float)length, length_penalty);
    plc_beam_select<<<1, PLC_SELECT_THREADS, 0, ctx->stream>>>(dout, cs, ct, total, k, norm_div);
    if ((st = plc_launched(ctx, "beam step: select")) != PLC_OK) return st;
    plc_beam_out *hout;
    try {
        if (ctx->host.size() < (size_t)k * sizeof(plc_beam_out)) ctx->host.resize((size_t)k * sizeof(plc_beam_out));
    } catch (...) {
        return PLC_ERR_NOMEM;
    }
    hout = (plc_beam_out *)ctx->host.data();
    if ((st = plc_download(ctx, hout, dout, (size_t)k * sizeof(plc_beam_out))) != PLC_OK) return st;
    for (int i = 0; i < k; i++) {
        out_beam[i] = hout[i].beam;
        out_token[i] = hout[i].token;
        out_score[i] = hout[i].score;
        out_norm[i] = hout[i].norm;
    }
    return PLC_OK;
}
