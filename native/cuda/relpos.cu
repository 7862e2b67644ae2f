// relpos.cu: plc_relpos_attention, self-attention with Transformer-XL's relative positions over
// several clips. One block per (row, head): the keys the row attends to are taken in tiles,
// each key's score by one warp (content and position terms together), then the tile's
// exponentials and the values they weigh, with a running maximum and sum (online softmax): the
// scores of one tile of one row at a time, never a clip's matrix.
#include "elementwise.cuh"
#include "internal.cuh"

#define PLC_RP_THREADS 128
#define PLC_RP_TILE 64
// Head elements a thread accumulates: head_dim at most PLC_RP_THREADS * PLC_RP_ACC.
#define PLC_RP_ACC 8

// Dynamic shared memory: qu, qv [hd], scores [PLC_RP_TILE].
__global__ void __launch_bounds__(PLC_RP_THREADS)
    plc_relpos_k(float *dst, const float *q, const float *k, const float *v, const float *p, const float *u, const float *bv,
                 const int32_t *clip_start, int32_t n_clips, int64_t half, plc_relpos_cfg a) {
    extern __shared__ float sm[];
    __shared__ float red[32];
    const int hd = a.head_dim, h = blockIdx.y;
    const int64_t width = (int64_t)a.n_head * hd, off = (int64_t)h * hd, gi = blockIdx.x;
    float *qu = sm, *qv = sm + hd, *sc = sm + 2 * hd;
    // the clip of row gi: the last start at or before it
    int lo_c = 0, hi_c = n_clips - 1;
    while (lo_c < hi_c) {
        const int mid = (lo_c + hi_c + 1) / 2;
        if (clip_start[mid] <= gi) lo_c = mid; else hi_c = mid - 1;
    }
    const int64_t s0 = clip_start[lo_c], n = clip_start[lo_c + 1] - s0, i = gi - s0;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        const float x = q[gi * width + off + d];
        qu[d] = x + u[off + d];
        qv[d] = x + bv[off + d];
    }
    int64_t lo = 0, hi = n - 1;
    if (a.window > 0) {
        lo = i - a.window > 0 ? i - a.window : 0;
        hi = i + a.window < n - 1 ? i + a.window : n - 1;
    }
    float acc[PLC_RP_ACC];
#pragma unroll
    for (int r = 0; r < PLC_RP_ACC; r++) acc[r] = 0.f;
    float m = -INFINITY, l = 0.f;
    const int lane = threadIdx.x % PLC_WARP, warp = threadIdx.x / PLC_WARP, nw = blockDim.x / PLC_WARP;
    __syncthreads();
    for (int64_t t0 = lo; t0 <= hi; t0 += PLC_RP_TILE) {
        const int cnt = (int)(hi - t0 + 1 < PLC_RP_TILE ? hi - t0 + 1 : PLC_RP_TILE);
        for (int x = warp; x < cnt; x += nw) {
            const int64_t j = t0 + x;
            const float *kr = k + (s0 + j) * width + off, *pr = p + (half - i + j) * width + off;
            float s = 0.f;
            for (int d = lane; d < hd; d += PLC_WARP) s = fmaf(qu[d], kr[d], fmaf(qv[d], pr[d], s));
            s = plc_warp_sum(s);
            if (lane == 0) sc[x] = s * a.scale;
        }
        __syncthreads();
        float tm = -INFINITY;
        for (int x = threadIdx.x; x < cnt; x += blockDim.x) tm = fmaxf(tm, sc[x]);
        tm = plc_block_max(tm, red);
        const float nm = fmaxf(m, tm);
        const float corr = expf(m - nm); // 0 on the first tile (m = -inf)
        float ts = 0.f;
        for (int x = threadIdx.x; x < cnt; x += blockDim.x) {
            const float e = expf(sc[x] - nm);
            sc[x] = e;
            ts += e;
        }
        ts = plc_block_sum(ts, red); // ends in a barrier: the exponentials are all written
        l = l * corr + ts;
        m = nm;
#pragma unroll
        for (int r = 0; r < PLC_RP_ACC; r++) {
            const int d = threadIdx.x + r * blockDim.x;
            if (d >= hd) break;
            float s = acc[r] * corr;
            const float *vr = v + (s0 + t0) * width + off + d;
            for (int x = 0; x < cnt; x++) s = fmaf(sc[x], vr[x * width], s);
            acc[r] = s;
        }
        __syncthreads(); // the tile's weights are read before the next tile's scores
    }
    const float inv = 1.f / l;
#pragma unroll
    for (int r = 0; r < PLC_RP_ACC; r++) {
        const int d = threadIdx.x + r * blockDim.x;
        if (d >= hd) break;
        dst[gi * width + off + d] = acc[r] * inv;
    }
}

extern "C" int plc_relpos_attention(plc_ctx *ctx, float *dst, const float *q, const float *k, const float *v, const float *p,
                                    int64_t p_rows, const float *u, const float *bv, const int32_t *clips, int64_t n_clips,
                                    const plc_relpos_cfg *a) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (a == NULL || a->n_head <= 0 || a->head_dim <= 0 || a->window < 0 || n_clips < 0 || p_rows < 1 || p_rows % 2 != 1 ||
        a->n_head > 65535 || isnan(a->scale) || isinf(a->scale))
        return plc_fail_arg(ctx, "relpos attention: bad arguments");
    if (a->head_dim > PLC_RP_THREADS * PLC_RP_ACC) return PLC_ERR_UNSUPPORTED;
    if (n_clips == 0) return PLC_OK;
    if (dst == NULL || q == NULL || k == NULL || v == NULL || p == NULL || u == NULL || bv == NULL || clips == NULL)
        return plc_fail_arg(ctx, "relpos attention: null pointer");
    int64_t n = 0, longest = 0;
    for (int64_t c = 0; c < n_clips; c++) {
        if (clips[c] < 1 || n > 0x7fffffff - clips[c]) return plc_fail_arg(ctx, "relpos attention: bad clips");
        n += clips[c];
        if (clips[c] > longest) longest = clips[c];
    }
    int64_t reach = longest - 1;
    if (a->window > 0 && a->window < reach) reach = a->window;
    const int64_t half = (p_rows - 1) / 2;
    if (half < reach) return plc_fail_arg(ctx, "relpos attention: p too short for the distances attended to");
    PLC_ENTER(ctx);
    // the clips' first rows, and the end
    ctx->host.resize((size_t)(n_clips + 1) * sizeof(int32_t));
    int32_t *starts = (int32_t *)ctx->host.data();
    int64_t row = 0;
    for (int64_t c = 0; c < n_clips; c++) {
        starts[c] = (int32_t)row;
        row += clips[c];
    }
    starts[n_clips] = (int32_t)row;
    const void *host[1] = {starts};
    const size_t sizes[1] = {(size_t)(n_clips + 1) * sizeof(int32_t)};
    void *dev[1];
    int st = plc_meta(ctx, 1, host, sizes, dev);
    if (st != PLC_OK) return st;
    const size_t shared = (size_t)(2 * a->head_dim + PLC_RP_TILE) * sizeof(float);
    plc_relpos_k<<<dim3((unsigned)n, (unsigned)a->n_head), PLC_RP_THREADS, shared, ctx->stream>>>(
        dst, q, k, v, p, u, bv, (const int32_t *)dev[0], (int32_t)n_clips, half, *a);
    return plc_launched(ctx, "relpos attention");
}
