// attention.cu: plc_attention and plc_full_attention.
//
// Two kernels compute attention. The decode kernel gives one thread block to one query row and
// the query heads of one kv head, up to eight (and, for long contexts, one range of keys: the
// key ranges' partial results are then combined by a second kernel). The flash kernel gives one
// block to 16 consecutive queries of a sequence and one head, streaming keys and values through
// shared memory 32 at a time with an online softmax (64 queries on tensor cores, below).
//
// With F16 (or BF16) keys and values the contract is that the query is rounded to F16 (BF16)
// before q.k and the normalised weights p_j = exp(s_j - max)/sum are rounded to F16 (BF16)
// before p.v. Rounding p_j needs the row's final maximum and sum before any value is weighted,
// so that attention makes two passes over the keys: one for the statistics, one for the weighted
// values. F32 attention makes one, normalising at the end.
#include <limits.h>
#include <string.h>

#include "attention.cuh"
#include "kv.cuh"

#define PLC_DEC_THREADS 128
#define PLC_FA_THREADS 128

enum { PLC_DEC_SINGLE = 0, PLC_DEC_PARTIAL = 1, PLC_DEC_STATS = 2, PLC_DEC_ROUNDED = 3 };

__device__ __forceinline__ int64_t plc_slot(const int32_t *blocks, int boff, int bs, int j) {
    return blocks != NULL ? (int64_t)blocks[boff + j / bs] * bs + j % bs : (int64_t)j;
}

// Decode kernel: grid (tiles, kv heads × head groups, splits), PLC_DEC_THREADS threads, dynamic
// shared memory plc_dec_smem(hd, ng, chunk) bytes. A block serves ng <= PLC_DEC_MAX_G query heads
// that share one kv head (blockIdx.y = kv head * subs + sub, heads kvh*group + sub*PLC_DEC_MAX_G
// ..), so that each key and value row is read once for all of them (grouped-query attention).
// Split s covers keys [s*chunk, (s+1)*chunk) of the tile's range. part [tiles, n_head, splits,
// hd+2]: per query head and split the maximum score, the sum of exp(score-max) and hd outputs.
// Modes:
//   SINGLE   one split: writes dst.
//   PARTIAL  (F32) writes max, sum and the unnormalised sum of exp(s-max)*v.
//   STATS    (F16, BF16: first pass) writes max and sum.
//   ROUNDED  (second pass) reads every split's max and sum, writes sum_j round(p_j)*v_j.
#define PLC_DEC_MAX_G 8
// Dynamic shared memory of a decode block: ng queries of hd, ng rows of chunk scores and chunk
// slots.
static inline size_t plc_dec_smem(int hd, int ng, int chunk) {
    return ((size_t)ng * hd + (size_t)(ng + 1) * chunk) * 4;
}

template <typename KT, bool ROUND>
__global__ void __launch_bounds__(PLC_DEC_THREADS)
    plc_attn_decode(float *dst, const float *q, int64_t qstride, const KT *kc, const KT *vc, int64_t width, int bs,
                    const int32_t *blocks, const plc_tile *tiles, int hd, int n_head, int group, float scale, int chunk,
                    int nsplit, int mode, float *part) {
    extern __shared__ float plc_dec_sm[];
    const int subs = (group + PLC_DEC_MAX_G - 1) / PLC_DEC_MAX_G;
    const int kvh = blockIdx.y / subs, h0 = kvh * group + (blockIdx.y % subs) * PLC_DEC_MAX_G;
    const int ng = min(PLC_DEC_MAX_G, kvh * group + group - h0);  // this block's query heads
    float *sq = plc_dec_sm;                 // [ng][hd] the queries, rounded to KT
    float *ss = sq + ng * hd;               // [ng][chunk] scores, then weights
    int *sslot = (int *)(ss + ng * chunk);  // [chunk] cache rows of the keys
    __shared__ float sM[PLC_DEC_MAX_G], sL[PLC_DEC_MAX_G];
    const plc_tile t = tiles[blockIdx.x];
    const int s = blockIdx.z, tid = threadIdx.x;
    const int limit = min(t.kvlen, t.pos0 + 1);
    const int j0 = s * chunk;
    const int cnt = max(min(j0 + chunk, limit) - j0, 0);
    const float *qh = q + (int64_t)t.row0 * qstride + (int64_t)h0 * hd;
    for (int e = tid; e < ng * hd; e += blockDim.x) sq[e] = plc_round_as<KT>(qh[e]);
    for (int jj = tid; jj < cnt; jj += blockDim.x) sslot[jj] = (int)plc_slot(blocks, t.boff, bs, j0 + jj);
    __syncthreads();
    const int warp = tid / PLC_WARP, lane = tid % PLC_WARP, nw = blockDim.x / PLC_WARP;
    const int64_t hoff = (int64_t)kvh * hd;
    // Scores: a warp a key, each key element read once for the ng heads.
    for (int jj = warp; jj < cnt; jj += nw) {
        const KT *kr = kc + (int64_t)sslot[jj] * width + hoff;
        float dot[PLC_DEC_MAX_G];
#pragma unroll
        for (int g = 0; g < PLC_DEC_MAX_G; g++) dot[g] = 0.f;
        for (int d = lane; d < hd; d += PLC_WARP) {
            const float k = plc_to_f32(kr[d]);
#pragma unroll
            for (int g = 0; g < PLC_DEC_MAX_G; g++)
                if (g < ng) dot[g] += sq[g * hd + d] * k;
        }
#pragma unroll
        for (int g = 0; g < PLC_DEC_MAX_G; g++) {
            if (g >= ng) break;
            const float v = plc_warp_sum(dot[g]);
            if (lane == 0) ss[g * chunk + jj] = scale * v;
        }
    }
    __syncthreads();
    // Softmax statistics: a warp a head.
    const int64_t tile_heads = (int64_t)blockIdx.x * n_head;
    for (int g = warp; g < ng; g += nw) {
        float *sg = ss + g * chunk;
        float mx = -INFINITY;
        for (int jj = lane; jj < cnt; jj += PLC_WARP) mx = fmaxf(mx, sg[jj]);
        mx = plc_warp_max(mx);
        float M = mx, L = 0.f;
        if (mode == PLC_DEC_ROUNDED) {
            const float *p0 = part + (tile_heads + h0 + g) * nsplit * (hd + 2);
            M = -INFINITY;
            for (int u = 0; u < nsplit; u++) M = fmaxf(M, p0[u * (hd + 2)]);
            for (int u = 0; u < nsplit; u++) {
                const float mu = p0[u * (hd + 2)];
                if (mu != -INFINITY) L += p0[u * (hd + 2) + 1] * expf(mu - M);
            }
        }
        float l = 0.f;
        for (int jj = lane; jj < cnt; jj += PLC_WARP) {
            const float e = expf(sg[jj] - M);
            sg[jj] = e;
            l += e;
        }
        l = plc_warp_sum(l);
        if (mode == PLC_DEC_SINGLE) L = l;
        if (ROUND && mode != PLC_DEC_STATS) {
            __syncwarp();
            for (int jj = lane; jj < cnt; jj += PLC_WARP) sg[jj] = plc_round_as<KT>(sg[jj] / L);
        }
        if (lane == 0) {
            sM[g] = mx;
            sL[g] = mode == PLC_DEC_SINGLE ? L : l;
        }
    }
    __syncthreads();
    if (mode == PLC_DEC_STATS) {
        if (tid < ng) {
            float *pp = part + ((tile_heads + h0 + tid) * nsplit + s) * (hd + 2);
            pp[0] = sM[tid];
            pp[1] = sL[tid];
        }
        return;
    }
    // Weighted values: a thread an element, each value element read once for the ng heads.
    for (int d = tid; d < hd; d += blockDim.x) {
        float o[PLC_DEC_MAX_G];
#pragma unroll
        for (int g = 0; g < PLC_DEC_MAX_G; g++) o[g] = 0.f;
        const KT *vcol = vc + hoff + d;
        for (int jj = 0; jj < cnt; jj++) {
            const float v = plc_to_f32(vcol[(int64_t)sslot[jj] * width]);
#pragma unroll
            for (int g = 0; g < PLC_DEC_MAX_G; g++)
                if (g < ng) o[g] += ss[g * chunk + jj] * v;
        }
#pragma unroll
        for (int g = 0; g < PLC_DEC_MAX_G; g++) {
            if (g >= ng) break;
            if (mode == PLC_DEC_SINGLE) {
                dst[(int64_t)t.row0 * qstride + (int64_t)(h0 + g) * hd + d] = ROUND ? o[g] : o[g] / sL[g];
            } else {
                part[((tile_heads + h0 + g) * nsplit + s) * (hd + 2) + 2 + d] = o[g];
            }
        }
    }
    if (mode == PLC_DEC_PARTIAL && tid < ng) {
        float *pp = part + ((tile_heads + h0 + tid) * nsplit + s) * (hd + 2);
        pp[0] = sM[tid];
        pp[1] = sL[tid];
    }
}

// Combines the splits of the decode kernel: grid (tiles, heads), threads over hd. F32: the parts
// are rescaled to the largest maximum and normalised by the total sum; F16 (rounded): the parts
// are already normalised and are summed.
__global__ void plc_attn_combine(float *dst, int64_t qstride, const plc_tile *tiles, int hd, int nsplit, int rounded,
                                 const float *part) {
    const plc_tile t = tiles[blockIdx.x];
    const int h = blockIdx.y;
    const float *p0 = part + ((int64_t)blockIdx.x * gridDim.y + h) * nsplit * (hd + 2);
    float M = -INFINITY;
    for (int u = 0; u < nsplit; u++) M = fmaxf(M, p0[u * (hd + 2)]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.f, den = 0.f;
        for (int u = 0; u < nsplit; u++) {
            const float *pu = p0 + u * (hd + 2);
            if (rounded) {
                num += pu[2 + d];
            } else if (pu[0] != -INFINITY) {
                const float w = expf(pu[0] - M);
                num += w * pu[2 + d];
                den += w * pu[1];
            }
        }
        dst[(int64_t)t.row0 * qstride + (int64_t)h * hd + d] = rounded ? num : num / den;
    }
}

// Flash kernel: grid (tiles, heads), PLC_FA_THREADS threads. Thread tid owns query row
// r = tid/8 of the tile and, of each 32-key tile, keys cg, cg+8, cg+16, cg+24 (cg = tid%8) for
// the scores and output columns cg, cg+8, ... for the values. The eight threads of a row are
// consecutive lanes of one warp and reduce with shuffles.
template <int HD, typename KT, bool ROUND>
__global__ void __launch_bounds__(PLC_FA_THREADS)
    plc_attn_flash(float *dst, const float *q, int64_t qstride, const KT *kc, const KT *vc, int64_t width, int bs,
                   const int32_t *blocks, const plc_tile *tiles, int group, float scale) {
    __shared__ float sQ[PLC_FA_BQ][HD + 1];
    __shared__ float sK[PLC_FA_BK][HD + 1];
    __shared__ float sV[PLC_FA_BK][HD];
    __shared__ float sP[PLC_FA_BQ][PLC_FA_BK + 1];
    __shared__ int64_t sSlot[PLC_FA_BK];
    const plc_tile t = tiles[blockIdx.x];
    const int h = blockIdx.y, tid = threadIdx.x;
    const int64_t hoff = (int64_t)(h / group) * HD;
    const int r = tid / 8, cg = tid % 8;
    for (int e = tid; e < PLC_FA_BQ * HD; e += PLC_FA_THREADS) {
        const int rr = e / HD, d = e % HD;
        float v = 0.f;
        if (rr < t.nq) {
            v = q[(int64_t)(t.row0 + rr) * qstride + (int64_t)h * HD + d];
            v = plc_round_as<KT>(v);
        }
        sQ[rr][d] = v;
    }
    const int rq = r < t.nq ? r : t.nq - 1;  // rows past the tile's end compute row nq-1 again
    const int limit = min(t.kvlen, t.pos0 + rq + 1);
    const int kend = min(t.kvlen, t.pos0 + t.nq);
    float m = -INFINITY, l = 0.f;
    float o[HD / 8];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i] = 0.f;

    for (int pass = ROUND ? 0 : 1; pass < 2; pass++) {
        const bool values = pass == 1;
        for (int kt = 0; kt < kend; kt += PLC_FA_BK) {
            __syncthreads();  // the previous tile's keys, values and weights are no longer read
            for (int c = tid; c < PLC_FA_BK; c += PLC_FA_THREADS)
                sSlot[c] = kt + c < kend ? plc_slot(blocks, t.boff, bs, kt + c) : 0;
            __syncthreads();
            for (int e = tid; e < PLC_FA_BK * HD; e += PLC_FA_THREADS) {
                const int c = e / HD, d = e % HD;
                float kv = 0.f, vv = 0.f;
                if (kt + c < kend) {
                    const int64_t off = sSlot[c] * width + hoff + d;
                    kv = plc_to_f32(kc[off]);
                    if (values) vv = plc_to_f32(vc[off]);
                }
                sK[c][d] = kv;
                if (values) sV[c][d] = vv;
            }
            __syncthreads();
            float sc[PLC_FA_BK / 8];
#pragma unroll
            for (int i = 0; i < PLC_FA_BK / 8; i++) {
                const int c = cg + 8 * i;
                float s = -INFINITY;
                if (kt + c < limit) {
                    float dot = 0.f;
#pragma unroll 8
                    for (int d = 0; d < HD; d++) dot += sQ[r][d] * sK[c][d];
                    s = scale * dot;
                }
                sc[i] = s;
            }
            float alpha = 1.f;
            float p[PLC_FA_BK / 8];
            if (ROUND && values) {
                // Second pass: m and l are the row's final maximum and sum.
#pragma unroll
                for (int i = 0; i < PLC_FA_BK / 8; i++) p[i] = sc[i] == -INFINITY ? 0.f : plc_round_as<KT>(expf(sc[i] - m) / l);
            } else {
                float mt = -INFINITY;
#pragma unroll
                for (int i = 0; i < PLC_FA_BK / 8; i++) mt = fmaxf(mt, sc[i]);
                for (int off = 4; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
                const float mn = fmaxf(m, mt);
                alpha = m == -INFINITY ? 0.f : expf(m - mn);
                float ps = 0.f;
#pragma unroll
                for (int i = 0; i < PLC_FA_BK / 8; i++) {
                    p[i] = sc[i] == -INFINITY ? 0.f : expf(sc[i] - mn);
                    ps += p[i];
                }
                for (int off = 4; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
                l = l * alpha + ps;
                m = mn;
            }
            if (!values) continue;
#pragma unroll
            for (int i = 0; i < PLC_FA_BK / 8; i++) sP[r][cg + 8 * i] = p[i];
            __syncthreads();
#pragma unroll
            for (int i = 0; i < HD / 8; i++) {
                const int d = cg + 8 * i;
                float acc = 0.f;
#pragma unroll 8
                for (int c = 0; c < PLC_FA_BK; c++) acc += sP[r][c] * sV[c][d];
                o[i] = o[i] * alpha + acc;
            }
        }
    }
    if (r < t.nq) {
        float *out = dst + (int64_t)(t.row0 + r) * qstride + (int64_t)h * HD;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) out[cg + 8 * i] = ROUND ? o[i] : o[i] / l;
    }
}

// ---- tensor-core flash kernel (F16 or BF16 keys and values) ----
//
// Grid (tiles, heads), PLC_FM_THREADS threads: warp w owns query rows 16w .. 16w+15 of the tile
// and multiplies with mma.sync m16n8k16 (F16 or BF16 inputs, as the cache's type T; F32
// accumulation). In the fragments of
// that instruction, lane l (g = l/4, c = l%4) holds, of a 16x16 A operand, rows g and g+8 at
// columns 2c, 2c+1, 2c+8, 2c+9; of a 16x8 B operand (column-major), column g at rows 2c, 2c+1,
// 2c+8, 2c+9; of the 16x8 F32 result, rows g and g+8 at columns 2c, 2c+1. Scores S = Q K^T come
// out in the result layout of 16x8 tiles, and two adjacent tiles are the A layout of the P V
// product's 16-key step, so the weights go from one product to the next in registers.
//
// The contract for F16 and BF16 caches needs each row's final maximum and sum before any weight
// is rounded, so the kernel makes two passes over the keys: the first for the statistics (S
// only), the second computing S again, the weights p = T(exp(s - max) / sum) and O += P V.
// Keys go through shared memory row-major (the B operand of Q K^T), values transposed (the B
// operand of P V); rows are padded by eight halves, so that the eight groups of a warp read
// different banks.
#define PLC_FM_THREADS 128

// plc_bits16 is the bits of v rounded to T (F16 or BF16, to nearest even).
__device__ __forceinline__ uint32_t plc_bits16(__half, float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ uint32_t plc_bits16(__nv_bfloat16, float v) {
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    uint16_t u;
    memcpy(&u, &b, sizeof u);
    return u;
}

// plc_pack2<T> packs lo and hi rounded to T into one register, lo in the low half.
template <typename T> __device__ __forceinline__ uint32_t plc_pack2(float lo, float hi) {
    return plc_bits16(T(), lo) | plc_bits16(T(), hi) << 16;
}

__device__ __forceinline__ uint32_t plc_u32_at(const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

// c += a b for a 16x16 A (four registers), a 16x8 B (two) of F16 or BF16, F32 c (four).
__device__ __forceinline__ void plc_mma16816(__half, float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(PLC_EMULATED)
    mma_m16n8k16_f16(c, a, b0, b1);  // scripts/cuda-emu
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
__device__ __forceinline__ void plc_mma16816(__nv_bfloat16, float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(PLC_EMULATED)
    mma_m16n8k16_bf16(c, a, b0, b1);  // scripts/cuda-emu
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// plc_fm_weight is the weight of score s in a row of maximum m and sum l (1 in the statistics
// pass), divided as the CUDA-core kernels divide it, before its rounding to F16.
__device__ __forceinline__ float plc_fm_weight(float s, float m, float l) { return s == -INFINITY ? 0.f : expf(s - m) / l; }

template <int HD, typename T>
__global__ void __launch_bounds__(PLC_FM_THREADS)
    plc_attn_flash_mma(float *dst, const float *q, int64_t qstride, const T *kc, const T *vc, int64_t width,
                       int bs, const int32_t *blocks, const plc_tile *tiles, int group, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int KP = HD + 8;           // row stride of sK, in halves
    constexpr int VP = PLC_FM_BK + 8;    // row stride of sVt
    constexpr int NJ = PLC_FM_BK / 8;    // 8-key tiles of a step
    constexpr int NV = HD / 8;           // 16-byte vectors of a key row
    __shared__ __align__(16) uint16_t sK[PLC_FM_BK * KP];  // [key][dim], bits of T
    __shared__ __align__(16) uint16_t sVt[HD * VP];        // [dim][key]
    __shared__ int64_t sSlot[PLC_FM_BK];
    const plc_tile t = tiles[blockIdx.x];
    const int h = blockIdx.y, tid = threadIdx.x, warp = tid / PLC_WARP, lane = tid % PLC_WARP;
    const int g = lane >> 2, c2 = 2 * (lane & 3);
    const int64_t hoff = (int64_t)(h / group) * HD;
    const int r0 = 16 * warp + g, r1 = r0 + 8;  // this lane's two rows of the tile
    const bool in0 = r0 < t.nq, in1 = r1 < t.nq;
    const float *q0 = q + (int64_t)(t.row0 + (in0 ? r0 : 0)) * qstride + (int64_t)h * HD;
    const float *q1 = q + (int64_t)(t.row0 + (in1 ? r1 : 0)) * qstride + (int64_t)h * HD;
    uint32_t qa[HD / 16][4];  // the queries rounded to F16, as A fragments of 16 dimensions
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const int d = 16 * kk + c2;
        qa[kk][0] = in0 ? plc_pack2<T>(q0[d], q0[d + 1]) : 0u;
        qa[kk][1] = in1 ? plc_pack2<T>(q1[d], q1[d + 1]) : 0u;
        qa[kk][2] = in0 ? plc_pack2<T>(q0[d + 8], q0[d + 9]) : 0u;
        qa[kk][3] = in1 ? plc_pack2<T>(q1[d + 8], q1[d + 9]) : 0u;
    }
    const int lim0 = min(t.kvlen, t.pos0 + r0 + 1), lim1 = min(t.kvlen, t.pos0 + r1 + 1);
    const int kend = min(t.kvlen, t.pos0 + t.nq);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float o[NV][4];
#pragma unroll
    for (int jd = 0; jd < NV; jd++) o[jd][0] = o[jd][1] = o[jd][2] = o[jd][3] = 0.f;
    for (int pass = 0; pass < 2; pass++) {
        const bool values = pass == 1;
        for (int kt = 0; kt < kend; kt += PLC_FM_BK) {
            __syncthreads();  // the previous step's keys and values are no longer read
            for (int c = tid; c < PLC_FM_BK; c += PLC_FM_THREADS)
                sSlot[c] = kt + c < kend ? plc_slot(blocks, t.boff, bs, kt + c) : -1;
            __syncthreads();
            for (int e = tid; e < PLC_FM_BK * NV; e += PLC_FM_THREADS) {
                const int c = e / NV, d = (e % NV) * 8;
                uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
                if (sSlot[c] >= 0) {
                    const int64_t off = sSlot[c] * width + hoff + d;
                    kv = *reinterpret_cast<const uint4 *>(kc + off);
                    if (values) vv = *reinterpret_cast<const uint4 *>(vc + off);
                }
                *reinterpret_cast<uint4 *>(&sK[c * KP + d]) = kv;
                if (values) {
                    const uint32_t w[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        sVt[(d + i) * VP + c] = (uint16_t)(w[i / 2] >> (16 * (i % 2)));
                }
            }
            __syncthreads();
            // s[j]: rows r0 (s[j][0..1]) and r1 (s[j][2..3]), keys kt + 8j + c2 and + 1
            float s[NJ][4];
#pragma unroll
            for (int j = 0; j < NJ; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    const uint16_t *kr = &sK[(8 * j + g) * KP + 16 * kk + c2];
                    plc_mma16816(T(), s[j], qa[kk], plc_u32_at(kr), plc_u32_at(kr + 8));
                }
            }
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int key = kt + 8 * j + c2;
                s[j][0] = key < lim0 ? scale * s[j][0] : -INFINITY;
                s[j][1] = key + 1 < lim0 ? scale * s[j][1] : -INFINITY;
                s[j][2] = key < lim1 ? scale * s[j][2] : -INFINITY;
                s[j][3] = key + 1 < lim1 ? scale * s[j][3] : -INFINITY;
            }
            if (!values) {
                // the rows' running maximum and sum; the four lanes of a group hold one row
                float x0 = -INFINITY, x1 = -INFINITY;
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    x0 = fmaxf(x0, fmaxf(s[j][0], s[j][1]));
                    x1 = fmaxf(x1, fmaxf(s[j][2], s[j][3]));
                }
                for (int off = 1; off < 4; off <<= 1) {
                    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, off));
                    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, off));
                }
                const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
                float e0 = 0.f, e1 = 0.f;
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    e0 += plc_fm_weight(s[j][0], n0, 1.f) + plc_fm_weight(s[j][1], n0, 1.f);
                    e1 += plc_fm_weight(s[j][2], n1, 1.f) + plc_fm_weight(s[j][3], n1, 1.f);
                }
                for (int off = 1; off < 4; off <<= 1) {
                    e0 += __shfl_xor_sync(0xffffffffu, e0, off);
                    e1 += __shfl_xor_sync(0xffffffffu, e1, off);
                }
                l0 = (m0 == -INFINITY ? 0.f : l0 * expf(m0 - n0)) + e0;
                l1 = (m1 == -INFINITY ? 0.f : l1 * expf(m1 - n1)) + e1;
                m0 = n0;
                m1 = n1;
                continue;
            }
#pragma unroll
            for (int kb = 0; kb < PLC_FM_BK / 16; kb++) {
                uint32_t pa[4];
                pa[0] = plc_pack2<T>(plc_fm_weight(s[2 * kb][0], m0, l0), plc_fm_weight(s[2 * kb][1], m0, l0));
                pa[1] = plc_pack2<T>(plc_fm_weight(s[2 * kb][2], m1, l1), plc_fm_weight(s[2 * kb][3], m1, l1));
                pa[2] = plc_pack2<T>(plc_fm_weight(s[2 * kb + 1][0], m0, l0), plc_fm_weight(s[2 * kb + 1][1], m0, l0));
                pa[3] = plc_pack2<T>(plc_fm_weight(s[2 * kb + 1][2], m1, l1), plc_fm_weight(s[2 * kb + 1][3], m1, l1));
#pragma unroll
                for (int jd = 0; jd < NV; jd++) {
                    const uint16_t *vr = &sVt[(8 * jd + g) * VP + 16 * kb + c2];
                    plc_mma16816(T(), o[jd], pa, plc_u32_at(vr), plc_u32_at(vr + 8));
                }
            }
        }
    }
    float *d0 = dst + (int64_t)(t.row0 + r0) * qstride + (int64_t)h * HD;
    float *d1 = dst + (int64_t)(t.row0 + r1) * qstride + (int64_t)h * HD;
#pragma unroll
    for (int jd = 0; jd < NV; jd++) {
        const int d = 8 * jd + c2;
        if (in0) *reinterpret_cast<float2 *>(d0 + d) = make_float2(o[jd][0], o[jd][1]);
        if (in1) *reinterpret_cast<float2 *>(d1 + d) = make_float2(o[jd][2], o[jd][3]);
    }
#else
    __trap();  // never launched: plc_ctx_set_flash refuses a library without code for 8.0 or later
#endif
}

// ---- tensor-core flash kernel (F32 keys and values, TF32 inputs) ----
//
// While TF32 is on (plc_ctx_set_tf32), the tensor-core setting also takes attention over F32
// keys and values: queries, keys, weights and values are rounded to TF32 (10-bit mantissas, to
// nearest) and multiplied with mma.sync m16n8k8 .tf32, with F32 accumulation. In that
// instruction's fragments lane l (g = l/4, c = l%4) holds, of a 16x8 A operand, rows g and g+8
// at columns c and c+4; of an 8x8 B operand (column-major), column g at rows c and c+4; of the
// 16x8 result, rows g and g+8 at columns 2c, 2c+1. So S = Q K^T leaves keys 2c and 2c+1 of an
// 8-key tile with lane c, where P V's A operand wants columns c and c+4: the product takes the
// tile's keys in the order 0, 2, 4, 6, 1, 3, 5, 7, reading V's rows in that order too, and the
// weights stay in registers. The F32 contract rounds no weight, so one pass with an online
// softmax does. Keys and values go through shared memory row-major, rows padded by four floats
// (a row stride of 4 mod 16 words puts the lanes of both operands' reads in different banks).
#define PLC_FT_BK 32

// plc_tf32 rounds v to TF32 (to nearest, ties away from zero), as the bits mma.sync takes.
__device__ __forceinline__ uint32_t plc_tf32(float v) {
#if defined(PLC_EMULATED)
    return emu_tf32_rna(v);  // scripts/cuda-emu
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t u;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(u) : "f"(v));
    return u;
#else
    return __float_as_uint(v);
#endif
}

// c += a b for a 16x8 TF32 A (four registers), an 8x8 TF32 B (two), F32 c (four).
__device__ __forceinline__ void plc_mma1688(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(PLC_EMULATED)
    mma_m16n8k8_tf32(c, a, b0, b1);  // scripts/cuda-emu
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <int HD>
__global__ void __launch_bounds__(PLC_FM_THREADS)
    plc_attn_flash_tf32(float *dst, const float *q, int64_t qstride, const float *kc, const float *vc, int64_t width,
                        int bs, const int32_t *blocks, const plc_tile *tiles, int group, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int P = HD + 4;          // row stride of sK and sV, in words
    constexpr int NJ = PLC_FT_BK / 8;  // 8-key tiles of a step
    constexpr int NV = HD / 4;         // 16-byte vectors of a row
    __shared__ __align__(16) uint32_t sK[PLC_FT_BK * P];  // [key][dim], TF32 bits
    __shared__ __align__(16) uint32_t sV[PLC_FT_BK * P];  // [key][dim], TF32 bits
    __shared__ int64_t sSlot[PLC_FT_BK];
    const plc_tile t = tiles[blockIdx.x];
    const int h = blockIdx.y, tid = threadIdx.x, warp = tid / PLC_WARP, lane = tid % PLC_WARP;
    const int g = lane >> 2, c = lane & 3;
    const int64_t hoff = (int64_t)(h / group) * HD;
    const int r0 = 16 * warp + g, r1 = r0 + 8;  // this lane's two rows of the tile
    const bool in0 = r0 < t.nq, in1 = r1 < t.nq;
    const float *q0 = q + (int64_t)(t.row0 + (in0 ? r0 : 0)) * qstride + (int64_t)h * HD;
    const float *q1 = q + (int64_t)(t.row0 + (in1 ? r1 : 0)) * qstride + (int64_t)h * HD;
    uint32_t qa[HD / 8][4];  // the queries rounded to TF32, as A fragments of 8 dimensions
#pragma unroll
    for (int kk = 0; kk < HD / 8; kk++) {
        const int d = 8 * kk + c;
        qa[kk][0] = in0 ? plc_tf32(q0[d]) : 0u;
        qa[kk][1] = in1 ? plc_tf32(q1[d]) : 0u;
        qa[kk][2] = in0 ? plc_tf32(q0[d + 4]) : 0u;
        qa[kk][3] = in1 ? plc_tf32(q1[d + 4]) : 0u;
    }
    const int lim0 = min(t.kvlen, t.pos0 + r0 + 1), lim1 = min(t.kvlen, t.pos0 + r1 + 1);
    const int kend = min(t.kvlen, t.pos0 + t.nq);
    // the rows' running maxima; l0, l1 are this lane's part of the rows' sums
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float o[HD / 8][4];
#pragma unroll
    for (int jd = 0; jd < HD / 8; jd++) o[jd][0] = o[jd][1] = o[jd][2] = o[jd][3] = 0.f;
    for (int kt = 0; kt < kend; kt += PLC_FT_BK) {
        __syncthreads();  // the previous step's keys and values are no longer read
        for (int k = tid; k < PLC_FT_BK; k += PLC_FM_THREADS) sSlot[k] = kt + k < kend ? plc_slot(blocks, t.boff, bs, kt + k) : -1;
        __syncthreads();
        for (int e = tid; e < PLC_FT_BK * NV; e += PLC_FM_THREADS) {
            const int k = e / NV, d = (e % NV) * 4;
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
            if (sSlot[k] >= 0) {
                const int64_t off = sSlot[k] * width + hoff + d;
                kv = *reinterpret_cast<const float4 *>(kc + off);
                vv = *reinterpret_cast<const float4 *>(vc + off);
            }
            *reinterpret_cast<uint4 *>(&sK[k * P + d]) = make_uint4(plc_tf32(kv.x), plc_tf32(kv.y), plc_tf32(kv.z), plc_tf32(kv.w));
            *reinterpret_cast<uint4 *>(&sV[k * P + d]) = make_uint4(plc_tf32(vv.x), plc_tf32(vv.y), plc_tf32(vv.z), plc_tf32(vv.w));
        }
        __syncthreads();
        // s[j]: rows r0 (s[j][0..1]) and r1 (s[j][2..3]), keys kt + 8j + 2c and + 1
        float s[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 8; kk++) {
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const uint32_t *kr = &sK[(8 * j + g) * P + 8 * kk + c];
                plc_mma1688(s[j], qa[kk], kr[0], kr[4]);
            }
        }
        float x0 = -INFINITY, x1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int key = kt + 8 * j + 2 * c;
            s[j][0] = key < lim0 ? scale * s[j][0] : -INFINITY;
            s[j][1] = key + 1 < lim0 ? scale * s[j][1] : -INFINITY;
            s[j][2] = key < lim1 ? scale * s[j][2] : -INFINITY;
            s[j][3] = key + 1 < lim1 ? scale * s[j][3] : -INFINITY;
            x0 = fmaxf(x0, fmaxf(s[j][0], s[j][1]));
            x1 = fmaxf(x1, fmaxf(s[j][2], s[j][3]));
        }
        // the four lanes of a group hold one row
        for (int off = 1; off < 4; off <<= 1) {
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, off));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, off));
        }
        const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
        const float a0 = m0 == -INFINITY ? 0.f : expf(m0 - n0), a1 = m1 == -INFINITY ? 0.f : expf(m1 - n1);
        m0 = n0;
        m1 = n1;
        l0 *= a0;
        l1 *= a1;
#pragma unroll
        for (int jd = 0; jd < HD / 8; jd++) {
            o[jd][0] *= a0;
            o[jd][1] *= a0;
            o[jd][2] *= a1;
            o[jd][3] *= a1;
        }
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const float p00 = plc_fm_weight(s[j][0], n0, 1.f), p01 = plc_fm_weight(s[j][1], n0, 1.f);
            const float p10 = plc_fm_weight(s[j][2], n1, 1.f), p11 = plc_fm_weight(s[j][3], n1, 1.f);
            l0 += p00 + p01;
            l1 += p10 + p11;
            const uint32_t pa[4] = {plc_tf32(p00), plc_tf32(p10), plc_tf32(p01), plc_tf32(p11)};
#pragma unroll
            for (int jd = 0; jd < HD / 8; jd++) {
                const uint32_t *vr = &sV[(8 * j + 2 * c) * P + 8 * jd + g];
                plc_mma1688(o[jd], pa, vr[0], vr[P]);
            }
        }
    }
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    float *d0 = dst + (int64_t)(t.row0 + r0) * qstride + (int64_t)h * HD;
    float *d1 = dst + (int64_t)(t.row0 + r1) * qstride + (int64_t)h * HD;
#pragma unroll
    for (int jd = 0; jd < HD / 8; jd++) {
        const int d = 8 * jd + 2 * c;
        if (in0) *reinterpret_cast<float2 *>(d0 + d) = make_float2(o[jd][0] / l0, o[jd][1] / l0);
        if (in1) *reinterpret_cast<float2 *>(d1 + d) = make_float2(o[jd][2] / l1, o[jd][3] / l1);
    }
#else
    __trap();  // never launched: plc_ctx_set_flash refuses a library without code for 8.0 or later
#endif
}

int plc_flash_mma_built(void) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, plc_attn_flash_mma<64, __half>) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return fa.ptxVersion >= 80;
}

int plc_flash_rows(const plc_ctx *ctx, int kvtype, int64_t width, const void *kc, const void *vc, const float *dst) {
    return plc_flash_tc(ctx, kvtype, width, kc, vc, dst) ? PLC_FM_BQ : PLC_FA_BQ;
}

int plc_flash_tc(const plc_ctx *ctx, int kvtype, int64_t width, const void *kc, const void *vc, const float *dst) {
    // keys and values are read 16 bytes at a time, results written 8
    if (!ctx->flash_mma || ((uintptr_t)kc % 16) != 0 || ((uintptr_t)vc % 16) != 0 || ((uintptr_t)dst % 8) != 0)
        return PLC_TC_NONE;
    if (kvtype == PLC_F16 && width % 8 == 0) return PLC_TC_F16;
    if (kvtype == PLC_BF16 && width % 8 == 0) return PLC_TC_BF16;
    if (kvtype == PLC_F32 && ctx->tf32 && width % 4 == 0) return PLC_TC_TF32;
    return PLC_TC_NONE;
}

template <typename T>
static void plc_launch_mma(plc_ctx *ctx, int hd, dim3 grid, float *dst, const float *q, int64_t qstride, const void *kc,
                           const void *vc, int64_t width, int bs, const int32_t *blocks, const plc_tile *tiles, int group,
                           float scale) {
    const T *k = (const T *)kc, *v = (const T *)vc;
    switch (hd) {
    case 64: plc_attn_flash_mma<64, T><<<grid, PLC_FM_THREADS, 0, ctx->stream>>>(dst, q, qstride, k, v, width, bs, blocks, tiles, group, scale); break;
    case 80: plc_attn_flash_mma<80, T><<<grid, PLC_FM_THREADS, 0, ctx->stream>>>(dst, q, qstride, k, v, width, bs, blocks, tiles, group, scale); break;
    case 128: plc_attn_flash_mma<128, T><<<grid, PLC_FM_THREADS, 0, ctx->stream>>>(dst, q, qstride, k, v, width, bs, blocks, tiles, group, scale); break;
    }
}

// plc_launch_decode runs the decode kernel over ns splits of chunk keys (and the combining
// kernel when ns > 1): one pass for F32, two for rounded weights.
template <typename KT, bool ROUND>
static void plc_launch_decode(plc_ctx *ctx, dim3 grid, dim3 grid2, size_t smem, float *dst, const float *q, int64_t qstride,
                              const void *kc, const void *vc, int64_t width, int bs, const int32_t *blocks,
                              const plc_tile *tiles, int hd, int n_head, int group, float scale, int chunk, int ns,
                              float *part) {
    const KT *k = (const KT *)kc, *v = (const KT *)vc;
    if (ns == 1) {
        plc_attn_decode<KT, ROUND><<<grid, PLC_DEC_THREADS, smem, ctx->stream>>>(dst, q, qstride, k, v, width, bs, blocks, tiles, hd, n_head, group, scale, chunk, ns, PLC_DEC_SINGLE, part);
        return;
    }
    if (ROUND) {
        plc_attn_decode<KT, ROUND><<<grid, PLC_DEC_THREADS, smem, ctx->stream>>>(dst, q, qstride, k, v, width, bs, blocks, tiles, hd, n_head, group, scale, chunk, ns, PLC_DEC_STATS, part);
        plc_attn_decode<KT, ROUND><<<grid, PLC_DEC_THREADS, smem, ctx->stream>>>(dst, q, qstride, k, v, width, bs, blocks, tiles, hd, n_head, group, scale, chunk, ns, PLC_DEC_ROUNDED, part);
    } else {
        plc_attn_decode<KT, ROUND><<<grid, PLC_DEC_THREADS, smem, ctx->stream>>>(dst, q, qstride, k, v, width, bs, blocks, tiles, hd, n_head, group, scale, chunk, ns, PLC_DEC_PARTIAL, part);
    }
    plc_attn_combine<<<grid2, 128, 0, ctx->stream>>>(dst, qstride, tiles, hd, ns, ROUND ? 1 : 0, part);
}

template <typename KT, bool ROUND>
static void plc_launch_flash(plc_ctx *ctx, int hd, dim3 grid, float *dst, const float *q, int64_t qstride, const void *kc,
                             const void *vc, int64_t width, int bs, const int32_t *blocks, const plc_tile *tiles, int group,
                             float scale) {
    const KT *k = (const KT *)kc, *v = (const KT *)vc;
    switch (hd) {
    case 64: plc_attn_flash<64, KT, ROUND><<<grid, PLC_FA_THREADS, 0, ctx->stream>>>(dst, q, qstride, k, v, width, bs, blocks, tiles, group, scale); break;
    case 80: plc_attn_flash<80, KT, ROUND><<<grid, PLC_FA_THREADS, 0, ctx->stream>>>(dst, q, qstride, k, v, width, bs, blocks, tiles, group, scale); break;
    case 128: plc_attn_flash<128, KT, ROUND><<<grid, PLC_FA_THREADS, 0, ctx->stream>>>(dst, q, qstride, k, v, width, bs, blocks, tiles, group, scale); break;
    }
}

int plc_attend(plc_ctx *ctx, float *dst, const float *q, int64_t qstride, const void *kc, const void *vc, int kvtype,
               int64_t width, int bs, const int32_t *blocks, int64_t n_blocks, const plc_tile *flash, int64_t n_flash,
               const plc_tile *dec, int64_t n_dec, int max_kv, const plc_attn_cfg *a) {
    const int hd = a->head_dim, group = a->n_head / a->n_kv_head;
    if (n_flash > INT_MAX || n_dec > INT_MAX) return plc_fail_arg(ctx, "attention: too many tiles");
    const void *host[3] = {blocks, flash, dec};
    const size_t sizes[3] = {blocks != NULL ? (size_t)n_blocks * sizeof(int32_t) : 0, (size_t)n_flash * sizeof(plc_tile),
                             (size_t)n_dec * sizeof(plc_tile)};
    void *devp[3];
    int st = plc_meta(ctx, 3, host, sizes, devp);
    if (st != PLC_OK) return st;
    const int32_t *dblocks = (const int32_t *)devp[0];
    const plc_tile *dflash = (const plc_tile *)devp[1], *ddec = (const plc_tile *)devp[2];
    if (n_flash > 0) {
        const dim3 grid((unsigned)n_flash, (unsigned)a->n_head);
        const int tc = plc_flash_tc(ctx, kvtype, width, kc, vc, dst);
        if (tc == PLC_TC_TF32) {
            const float *k = (const float *)kc, *v = (const float *)vc;
            switch (hd) {
            case 64: plc_attn_flash_tf32<64><<<grid, PLC_FM_THREADS, 0, ctx->stream>>>(dst, q, qstride, k, v, width, bs, dblocks, dflash, group, a->scale); break;
            case 80: plc_attn_flash_tf32<80><<<grid, PLC_FM_THREADS, 0, ctx->stream>>>(dst, q, qstride, k, v, width, bs, dblocks, dflash, group, a->scale); break;
            case 128: plc_attn_flash_tf32<128><<<grid, PLC_FM_THREADS, 0, ctx->stream>>>(dst, q, qstride, k, v, width, bs, dblocks, dflash, group, a->scale); break;
            }
        } else if (tc == PLC_TC_F16) {
            plc_launch_mma<__half>(ctx, hd, grid, dst, q, qstride, kc, vc, width, bs, dblocks, dflash, group, a->scale);
        } else if (tc == PLC_TC_BF16) {
            plc_launch_mma<__nv_bfloat16>(ctx, hd, grid, dst, q, qstride, kc, vc, width, bs, dblocks, dflash, group, a->scale);
        } else if (kvtype == PLC_F16)
            plc_launch_flash<__half, true>(ctx, hd, grid, dst, q, qstride, kc, vc, width, bs, dblocks, dflash, group, a->scale);
        else if (kvtype == PLC_BF16)
            plc_launch_flash<__nv_bfloat16, true>(ctx, hd, grid, dst, q, qstride, kc, vc, width, bs, dblocks, dflash, group, a->scale);
        else
            plc_launch_flash<float, false>(ctx, hd, grid, dst, q, qstride, kc, vc, width, bs, dblocks, dflash, group, a->scale);
        if ((st = plc_launched(ctx, "attention: flash kernel")) != PLC_OK) return st;
    }
    if (n_dec == 0) return PLC_OK;
    // A block for each kv head's query heads, PLC_DEC_MAX_G at a time. Splits along the keys:
    // enough blocks for about two per multiprocessor, each split at least 256 keys, and at most
    // max_chunk keys per split (its scores stay in shared memory).
    const int subs = (group + PLC_DEC_MAX_G - 1) / PLC_DEC_MAX_G, ng = group < PLC_DEC_MAX_G ? group : PLC_DEC_MAX_G;
    const int64_t base = n_dec * a->n_kv_head * subs;
    int64_t nsplit = (2 * (int64_t)ctx->sm_count + base - 1) / base;
    const int64_t by_len = ((int64_t)max_kv + 255) / 256;
    if (nsplit > by_len) nsplit = by_len;
    int max_chunk = (PLC_DEC_SMEM / 4 - ng * hd) / (ng + 1);
    if (max_chunk > PLC_DEC_MAX_CHUNK) max_chunk = PLC_DEC_MAX_CHUNK;
    const int64_t min_split = ((int64_t)max_kv + max_chunk - 1) / max_chunk;
    if (nsplit < min_split) nsplit = min_split;
    if (nsplit < 1) nsplit = 1;
    if (nsplit > 65535) return plc_fail_arg(ctx, "attention: context too long");
    const int chunk = (int)((max_kv + nsplit - 1) / nsplit);
    const size_t smem = plc_dec_smem(hd, ng, chunk);
    float *part = NULL;
    if (nsplit > 1) {
        void *w;
        if ((st = plc_work(ctx, (size_t)(n_dec * a->n_head * nsplit * (hd + 2)) * sizeof(float), &w)) != PLC_OK) return st;
        part = (float *)w;
    }
    const dim3 grid((unsigned)n_dec, (unsigned)(a->n_kv_head * subs), (unsigned)nsplit);
    const dim3 grid2((unsigned)n_dec, (unsigned)a->n_head);
    const int ns = (int)nsplit;
    if (kvtype == PLC_F16)
        plc_launch_decode<__half, true>(ctx, grid, grid2, smem, dst, q, qstride, kc, vc, width, bs, dblocks, ddec, hd, a->n_head, group, a->scale, chunk, ns, part);
    else if (kvtype == PLC_BF16)
        plc_launch_decode<__nv_bfloat16, true>(ctx, grid, grid2, smem, dst, q, qstride, kc, vc, width, bs, dblocks, ddec, hd, a->n_head, group, a->scale, chunk, ns, part);
    else
        plc_launch_decode<float, false>(ctx, grid, grid2, smem, dst, q, qstride, kc, vc, width, bs, dblocks, ddec, hd, a->n_head, group, a->scale, chunk, ns, part);
    return plc_launched(ctx, "attention: decode kernel");
}

static int plc_attn_cfg_ok(plc_ctx *ctx, const plc_attn_cfg *a, int64_t width) {
    if (a == NULL) return plc_fail_arg(ctx, "attention: null configuration");
    if (a->n_head <= 0 || a->n_kv_head <= 0 || a->head_dim <= 0 || a->n_head % a->n_kv_head != 0 || a->n_head > 65535)
        return plc_fail_arg(ctx, "attention: bad head counts");
    if ((int64_t)a->n_kv_head * a->head_dim != width) return plc_fail_arg(ctx, "attention: n_kv_head*head_dim != width");
    if (a->head_dim > PLC_MAX_HEAD_DIM) return PLC_ERR_UNSUPPORTED;
    return PLC_OK;
}

// plc_tiles_reserve makes the context's host staging hold n tiles and returns it (NULL when out of
// memory).
static plc_tile *plc_tiles_reserve(plc_ctx *ctx, size_t n) {
    try {
        if (ctx->host.size() < n * sizeof(plc_tile)) ctx->host.resize(n * sizeof(plc_tile));
    } catch (...) {
        return NULL;
    }
    return (plc_tile *)ctx->host.data();
}

extern "C" int plc_attention(plc_ctx *ctx, float *dst, const float *q, int64_t n, const void *kc, const void *vc, int32_t kvtype,
                             int64_t slots, int64_t width, int64_t block_size, const plc_attn_cfg *a, const plc_seq *seqs,
                             int64_t n_seqs, const int32_t *blocks, int64_t n_blocks_total) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (!plc_kv_supports(kvtype)) return PLC_ERR_UNSUPPORTED;
    int st = plc_attn_cfg_ok(ctx, a, width);
    if (st != PLC_OK) return st;
    if (n < 0 || n > INT_MAX || slots < 0 || slots > INT_MAX || block_size <= 0 || block_size > INT_MAX || n_seqs < 0 ||
        n_blocks_total < 0 || n_blocks_total > INT_MAX)
        return plc_fail_arg(ctx, "attention: bad sizes");
    if (n_seqs > 0 && seqs == NULL) return plc_fail_arg(ctx, "attention: null sequences");
    if (n_blocks_total > 0 && blocks == NULL) return plc_fail_arg(ctx, "attention: null block table");
    const int64_t nblk = slots / block_size;
    const int hd = a->head_dim;
    const bool use_flash = plc_flash_head_dim(hd);
    const int bq = plc_flash_rows(ctx, kvtype, width, kc, vc, dst);
    int64_t n_flash = 0, n_dec = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        const plc_seq s = seqs[i];
        if (s.start < 0 || s.count < 0 || s.ctx_len < s.count || (int64_t)s.start + s.count > n || s.blocks_off < 0 ||
            s.n_blocks < 0 || (int64_t)s.blocks_off + s.n_blocks > n_blocks_total)
            return plc_fail_arg(ctx, "attention: sequence out of range");
        const int64_t need = (s.ctx_len + block_size - 1) / block_size;
        if (need > s.n_blocks) return plc_fail_arg(ctx, "attention: context longer than the block table");
        for (int64_t b = 0; b < need; b++) {
            const int32_t id = blocks[s.blocks_off + b];
            if (id < 0 || id >= nblk) return plc_fail_arg(ctx, "attention: block id out of range");
        }
        if (use_flash && s.count >= 2) n_flash += (s.count + bq - 1) / bq;
        else n_dec += s.count;
    }
    if (n_flash + n_dec == 0) return PLC_OK;
    if (dst == NULL || q == NULL || kc == NULL || vc == NULL) return plc_fail_arg(ctx, "attention: null pointer");
    PLC_ENTER(ctx);
    plc_tile *tiles = plc_tiles_reserve(ctx, (size_t)(n_flash + n_dec));
    if (tiles == NULL) return PLC_ERR_NOMEM;
    plc_tile *ft = tiles, *dt = tiles + n_flash;
    int64_t fi = 0, di = 0;
    int max_kv = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        const plc_seq s = seqs[i];
        if (s.count == 0) continue;
        const int p0 = s.ctx_len - s.count;
        if (use_flash && s.count >= 2) {
            for (int c = 0; c < s.count; c += bq)
                ft[fi++] = plc_tile{s.start + c, s.count - c < bq ? s.count - c : bq, p0 + c, s.blocks_off, s.ctx_len};
        } else {
            for (int c = 0; c < s.count; c++) dt[di++] = plc_tile{s.start + c, 1, p0 + c, s.blocks_off, s.ctx_len};
            if (s.ctx_len > max_kv) max_kv = s.ctx_len;
        }
    }
    return plc_attend(ctx, dst, q, (int64_t)a->n_head * hd, kc, vc, kvtype, width, (int)block_size, blocks, n_blocks_total, ft,
                      n_flash, dt, n_dec, max_kv, a);
}

extern "C" int plc_full_attention(plc_ctx *ctx, float *dst, const float *q, int64_t n, const void *k, const void *v,
                                  int32_t kvtype, int64_t m, const plc_attn_cfg *a) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (!plc_kv_supports(kvtype)) return PLC_ERR_UNSUPPORTED;
    if (a == NULL) return plc_fail_arg(ctx, "full attention: null configuration");
    int st = plc_attn_cfg_ok(ctx, a, (int64_t)a->n_kv_head * a->head_dim);
    if (st != PLC_OK) return st;
    if (n < 0 || n > INT_MAX || m < 1 || m > PLC_NO_MASK) return plc_fail_arg(ctx, "full attention: bad sizes"); // positions past PLC_NO_MASK would be masked
    if (n == 0) return PLC_OK;
    if (dst == NULL || q == NULL || k == NULL || v == NULL) return plc_fail_arg(ctx, "full attention: null pointer");
    PLC_ENTER(ctx);
    const int hd = a->head_dim;
    const bool use_flash = plc_flash_head_dim(hd) && n >= 2;
    const int bq = plc_flash_rows(ctx, kvtype, (int64_t)a->n_kv_head * hd, k, v, dst);
    const int64_t nt = use_flash ? (n + bq - 1) / bq : n;
    plc_tile *tiles = plc_tiles_reserve(ctx, (size_t)nt);
    if (tiles == NULL) return PLC_ERR_NOMEM;
    for (int64_t i = 0; i < nt; i++) {
        if (use_flash) {
            const int r0 = (int)(i * bq);
            tiles[i] = plc_tile{r0, n - r0 < bq ? (int)(n - r0) : bq, PLC_NO_MASK, 0, (int)m};
        } else {
            tiles[i] = plc_tile{(int)i, 1, PLC_NO_MASK, 0, (int)m};
        }
    }
    const int64_t width = (int64_t)a->n_kv_head * hd;
    return plc_attend(ctx, dst, q, (int64_t)a->n_head * hd, k, v, kvtype, width, 1, NULL, 0, use_flash ? tiles : NULL,
                      use_flash ? nt : 0, use_flash ? NULL : tiles, use_flash ? 0 : nt, (int)m, a);
}
