// rope.cu: plc_rope, one thread per rotated pair.
#include "elementwise.cuh"
#include "rope.cuh"

// x [n, n_head*head_dim]; pairs per token n_head*dims/2. Pair i of a head at position p turns by
// (p*freq_scale) * base^(-2i/dims) / ff[i] (ff: NULL for none), its cosine and sine multiplied
// by mscale.
__global__ void plc_rope_k(float *x, int64_t n, int n_head, int head_dim, int dims, int neox, float base, float freq_scale,
                           float mscale, float ext, float corr0, float corr1, const int32_t *pos, const float *ff) {
    const int half = dims / 2;
    const int64_t per_tok = (int64_t)n_head * half;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n * per_tok; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t tok = t / per_tok;
        const int h = (int)((t % per_tok) / half), i = (int)(t % half);
        float theta = ((float)pos[tok] * freq_scale) * powf(base, -2.f * (float)i / (float)dims);
        if (ff != NULL) theta /= ff[i];
        if (ext != 0.f) { // YaRN: mixed with the unscaled angle over the ramp
            const float y = ((float)i - corr0) / fmaxf(0.001f, corr1 - corr0);
            const float mix = (1.f - fminf(1.f, fmaxf(0.f, y))) * ext;
            theta = theta * (1.f - mix) + theta / freq_scale * mix;
        }
        float s, c;
        sincosf(theta, &s, &c);
        s *= mscale;
        c *= mscale;
        float *hx = x + tok * (int64_t)n_head * head_dim + (int64_t)h * head_dim;
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = hx[a], x1 = hx[b];
        hx[a] = x0 * c - x1 * s;
        hx[b] = x0 * s + x1 * c;
    }
}

extern "C" int plc_rope(plc_ctx *ctx, float *x, int64_t n, int32_t n_head, const plc_rope_cfg *r, const int32_t *pos) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (r == NULL) return plc_fail_arg(ctx, "rope: null configuration");
    if (r->mode != PLC_ROPE_NORMAL && r->mode != PLC_ROPE_NEOX) return PLC_ERR_UNSUPPORTED;
    if (n < 0 || n_head <= 0 || r->head_dim <= 0 || r->dims < 0 || r->dims % 2 != 0 || r->dims > r->head_dim)
        return plc_fail_arg(ctx, "rope: bad shape");
    if (!(r->mscale >= 0.f) || isinf(r->mscale)) return plc_fail_arg(ctx, "rope: attention factor not 0 or finite and above 0");
    if (!(r->ext_factor >= 0.f && r->ext_factor <= 1.f) || !isfinite(r->corr_dims[0]) || !isfinite(r->corr_dims[1]))
        return plc_fail_arg(ctx, "rope: YaRN extrapolation not 0 to 1 or bounds not finite");
    float mscale = r->mscale == 0.f ? 1.f : r->mscale;
    if (r->ext_factor != 0.f) mscale *= 1.f + 0.1f * logf(1.f / r->freq_scale);
    if (n == 0 || r->dims == 0) return PLC_OK;
    if (x == NULL || pos == NULL) return plc_fail_arg(ctx, "rope: null pointer");
    for (int64_t i = 0; i < n; i++)
        if (pos[i] < 0) return plc_fail_arg(ctx, "rope: negative position");
    const int nff = r->freq_factors != NULL ? r->dims / 2 : 0;
    for (int i = 0; i < nff; i++)
        if (!(r->freq_factors[i] > 0.f) || isinf(r->freq_factors[i])) return plc_fail_arg(ctx, "rope: frequency factor not finite and above 0");
    PLC_ENTER(ctx);
    const void *host[2] = {pos, r->freq_factors};
    const size_t sizes[2] = {(size_t)n * sizeof(int32_t), (size_t)nff * sizeof(float)};
    void *dev[2];
    int st = plc_meta(ctx, nff > 0 ? 2 : 1, host, sizes, dev);
    if (st != PLC_OK) return st;
    const int64_t pairs = n * n_head * (r->dims / 2);
    plc_rope_k<<<plc_grid1d(ctx, pairs, 256), 256, 0, ctx->stream>>>(x, n, n_head, r->head_dim, r->dims, r->mode == PLC_ROPE_NEOX,
                                                                     r->base, r->freq_scale, mscale, r->ext_factor, r->corr_dims[0], r->corr_dims[1],
                                                                     (const int32_t *)dev[0],
                                                                     nff > 0 ? (const float *)dev[1] : NULL);
    return plc_launched(ctx, "rope");
}
