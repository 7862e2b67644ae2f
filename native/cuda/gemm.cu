// gemm.cu: plc_matmul. Against eight activation rows or fewer (decode), quantised, F16 and BF16
// weights go through matrix-vector kernels of our own that read each weight once; F32 weights,
// and larger batches of F16 and BF16 ones, go to cuBLAS (cublasGemmEx). Larger batches against
// quantised weights take our int8 tensor-core kernel (unless plc_ctx_set_mmq turned it off),
// with the activations quantised as for the matrix-vector kernels; else they are expanded to
// F16 in tiles of rows that cuBLAS multiplies with F16-rounded activations (a row beyond F16's
// range divided by a power of two first, and its products multiplied back).
//
// Row-major x [n, k], w [m, k], dst [n, m] are, in cuBLAS's column-major terms, X (k x n),
// W (k x m) and D (m x n): D = W^T X, so every call is GemmEx(OP_T, OP_N, m, n, k).
#include <float.h>
#include <limits.h>

#include "blas.cuh"
#include "elementwise.cuh"
#include "gemm.cuh"
#include "internal.cuh"
#include "quant.cuh"

int plc_matmul_supports(int dt) {
    switch (dt) {
    case PLC_F32: case PLC_F16: case PLC_BF16:
    case PLC_Q4_0: case PLC_Q4_1: case PLC_Q5_0: case PLC_Q5_1: case PLC_Q8_0: case PLC_IQ4_NL:
    case PLC_Q2_K: case PLC_Q3_K: case PLC_Q4_K: case PLC_Q5_K: case PLC_Q6_K: case PLC_IQ4_XS:
        return 1;
    }
    return 0;
}

// Activations rounded to F16 or BF16 (nearest even). x, y [len].
__global__ void plc_f32_to_f16(__half *y, const float *x, int64_t len) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < len; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2half_rn(x[i]);
}

__global__ void plc_f32_to_bf16(__nv_bfloat16 *y, const float *x, int64_t len) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < len; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

// Activation rows rounded to F16 for the F16 products of quantised weights, each row first
// divided by a power of two s[row] chosen so that it fits F16's range: s = 1 (the row exactly as
// rounded) unless the row's largest finite magnitude exceeds 65504, the largest F16 value; then
// s = 2^(e-15) for the e with max < 2^e, so that every element is below 2^15 after the division.
// A CPU backend converts these rows to 8-bit blocks with a scale per block, which never
// overflows; without the division such a row would become infinities. Dividing by a power of two
// is exact except where an element falls into F16's subnormal range, 2^-40 of the row's largest.
// One block per row. y [n, k], s [n].
__global__ void plc_rows_to_f16(__half *y, float *s, const float *x, int64_t k) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * k;
    float mx = 0.f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
        const float a = fabsf(xr[i]);
        if (a <= FLT_MAX) mx = fmaxf(mx, a);  // NaN and Inf stay as they are: they are not scaled
    }
    mx = plc_block_max(mx, red);
    float inv = 1.f;
    if (mx > 65504.f) {
        int e;
        frexpf(mx, &e);  // mx = f * 2^e, 0.5 <= f < 1
        inv = ldexpf(1.f, 15 - e);
    }
    if (threadIdx.x == 0) s[row] = 1.f / inv;
    __half *yr = y + row * k;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) yr[i] = __float2half_rn(xr[i] * inv);
}

// dst[row, :] *= s[row] for the rows that plc_rows_to_f16 divided. One block per row.
__global__ void plc_rows_rescale(float *dst, const float *s, int64_t m) {
    const int64_t row = blockIdx.x;
    const float f = s[row];
    if (f == 1.f) return;
    float *d = dst + row * m;
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) d[i] *= f;
}

// The matrices of one matrix-vector launch (plc_matmuls: a layer's query, key and value
// products, or its gate and up ones; plc_matmul: one): a warp's row r of the concatenated rows
// is row r - end[s-1] of matrix s, whose products go to dst[s] ([n, end[s] - end[s-1]]).
#define PLC_SEGS 4
struct plc_segs {
    const void *w[PLC_SEGS];
    float *dst[PLC_SEGS];
    int64_t end[PLC_SEGS];
    int vec[PLC_SEGS];  // F16/BF16: the matrix's rows and x are 16-byte aligned (see plc_gemv_h)
    int count;
};

// plc_seg finds the matrix of row: its weights, its row, its output and its output's row
// length, and whether it takes the aligned path (vec); false past the last matrix's rows. Every
// index into segs is a constant of the unrolled loop: a kernel parameter indexed at run time
// would be copied into each thread's local memory first.
__device__ __forceinline__ bool plc_seg(const plc_segs &segs, int64_t row, const void **w, int64_t *r, float **dst,
                                        int64_t *m, int *vec) {
    int64_t start = 0, end = segs.end[0];
    *w = segs.w[0];
    *dst = segs.dst[0];
    *vec = segs.vec[0];
#pragma unroll
    for (int i = 1; i < PLC_SEGS; i++) {
        if (i < segs.count && row >= end) {
            start = end;
            end = segs.end[i];
            *w = segs.w[i];
            *dst = segs.dst[i];
            *vec = segs.vec[i];
        }
    }
    *r = row - start;
    *m = end - start;
    return row < end;
}

// plc_gemv_store ends a matrix-vector kernel's warp: the sums of each lane's partial products
// acc[r] of the n activation rows go to dst[r, row] (rows of m).
template <int NR>
__device__ __forceinline__ void plc_gemv_store(const float *acc, int n, float *dst, int64_t m, int64_t row, int lane) {
#pragma unroll
    for (int r = 0; r < NR; r++) {
        if (r < n) {
            const float s = plc_warp_sum(acc[r]);
            if (lane == 0) dst[r * m + row] = s;
        }
    }
}

// Activations quantised as ggml quantises them for products with the legacy block types and
// IQ4_NL (quantize_row_q8_0 / q8_1 as its x86 code computes them, which the CPU backends
// follow): per 32 elements d = amax/127, codes round-half-even(x * (127/amax)), d kept as its
// F16 value, and Q8_1's s = F16(d * sum of codes) with d unrounded. One warp per block of 32:
// xq [n, k] codes, xd, xs [n, k/32]; or, with ld > 0, the layout of plc_mmq: codes by chunk,
// [k/32, ld, 32], each block's in the order of plc_mmq_pos, and xd, xs [k/32, ld] (ld >= n).
__device__ __forceinline__ int plc_mmq_pos(int e) { return e < 16 ? (e / 4) * 8 + e % 4 : ((e - 16) / 4) * 8 + 4 + e % 4; }

__global__ void __launch_bounds__(128)
    plc_quant_q8(int8_t *xq, float *xd, float *xs, const float *x, int64_t nblocks, int64_t nch, int64_t ld) {
    const int lane = threadIdx.x % PLC_WARP;
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / PLC_WARP) + threadIdx.x / PLC_WARP;
    if (b >= nblocks) return;  // a whole warp
    const float v = x[b * 32 + lane];
    const float amax = plc_warp_max(fabsf(v));
    const float dd = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
    const int q = (int)fminf(fmaxf(rintf(v * id), -127.f), 127.f);  // a NaN to -127, as on a GPU and the emulation alike
    if (ld > 0) xq[((b % nch) * ld + b / nch) * 32 + plc_mmq_pos(lane)] = (int8_t)q;
    else xq[b * 32 + lane] = (int8_t)q;
    const float sum = plc_warp_sum((float)q);  // at most 32 * 127: exact
    if (lane == 0) {
        const int64_t at = ld > 0 ? (b % nch) * ld + b / nch : b;
        xd[at] = plc_f16_round(dd);
        xs[at] = plc_f16_round(dd * sum);
    }
}

// Activations quantised as ggml quantises them for products with the K-quant types and IQ4_XS
// (quantize_row_q8_K_ref, which its x86 build uses and the CPU backends follow): per 256
// elements the one of largest magnitude (the first on ties) maps to -127, iscale = -127/max,
// codes min(127, round-half-even(iscale * x)), d = 1/iscale kept as float. One warp per block of
// 256, eight elements a lane: xq [n, k] codes, xd [n, k/256] scales, xs [n, k/G] each G
// elements' scale times their code sum (what the weights' minimum multiplies: G = 32, or 16 for
// the weights whose minimums are per 16, plc_kmin16); or, with ld > 0, the layout of plc_mmq:
// codes [k/32, ld, 32], each 32's in the order of plc_mmq_pos, xd [k/256, ld], xs [k/G, ld].
template <int G>
__global__ void __launch_bounds__(128)
    plc_quant_q8k(int8_t *xq, float *xd, float *xs, const float *x, int64_t nblocks, int64_t nsup, int64_t ld) {
    const int lane = threadIdx.x % PLC_WARP;
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / PLC_WARP) + threadIdx.x / PLC_WARP;
    if (b >= nblocks) return;  // a whole warp
    const float *xb = x + b * 256 + lane * 8;
    float v[8], amax = 0.f;
    int at = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xb[i];
        if (fabsf(v[i]) > amax) {
            amax = fabsf(v[i]);
            at = i;
        }
    }
    int idx = lane * 8 + at;  // this lane's first element of largest magnitude
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(0xffffffffu, amax, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) {
            amax = a2;
            idx = i2;
        }
    }
    const float mx = __shfl_sync(0xffffffffu, v[idx % 8], idx / 8);
    const float iscale = amax != 0.f ? -127.f / mx : 0.f;
    int sum = 0;
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int q = (int)fminf(rintf(iscale * v[i]), 127.f);  // a NaN to 127 (fminf takes the number)
        sum += q;
        w[i / 4] |= (uint32_t)(q & 255) << (8 * (i % 4));
    }
    if (ld > 0) {
        // this lane's elements 8(lane%4) .. +7 of its 32, four at a time, where plc_mmq_pos puts them
        int8_t *o = xq + ((b % nsup * 8 + lane / 4) * ld + b / nsup) * 32;
        *reinterpret_cast<uint32_t *>(o + plc_mmq_pos(8 * (lane % 4))) = w[0];
        *reinterpret_cast<uint32_t *>(o + plc_mmq_pos(8 * (lane % 4) + 4)) = w[1];
    } else {
        *reinterpret_cast<uint2 *>(xq + b * 256 + lane * 8) = make_uint2(w[0], w[1]);
    }
    constexpr int lanes = G / 8, groups = 256 / G;  // lanes a sum covers, sums a block
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);     // the two lanes of a 16
    if constexpr (lanes == 4) sum += __shfl_xor_sync(0xffffffffu, sum, 2);  // the four of a 32
    const float dk = amax != 0.f ? 1.f / iscale : 0.f;
    const int64_t row = b / nsup, sup = b % nsup;
    if (lane == 0) xd[ld > 0 ? sup * ld + row : b] = dk;
    if (lane % lanes == 0) xs[ld > 0 ? (sup * groups + lane / lanes) * ld + row : b * groups + lane / lanes] = dk * (float)sum;
}

// Matrix-vector kernel for the quantised block types against quantised activations, as ggml's
// vec_dot functions compute it: per chunk of 32 the integer dot product of the codes (dp4a).
// Legacy types and IQ4_NL (activations from plc_quant_q8): times d_w * d_x, plus m_w * s_x for
// Q4_1 and Q5_1. K-quants and IQ4_XS (activations from plc_quant_q8k): the two halves' products
// times their scales, times the activations' scale, minus m_w times xs (Q2_K: each half's
// minimum times its own xs). The codes are signed bytes (dp4a's s8 inputs) except the unsigned
// ones of Q4_1, Q5_1, Q2_K, Q4_K and Q5_K, which are below 128 and so read the same. The
// chunks' results summed in F32. One warp per weight row; n <= NR activation rows. dst [n, m].
template <int DT, int NR>
__global__ void __launch_bounds__(128)
    plc_gemv_q8(plc_segs segs, const int8_t *xq, const float *xd, const float *xs, int n, int64_t k, int64_t rowbytes) {
    const int lane = threadIdx.x % PLC_WARP;
    const int64_t grow = (int64_t)blockIdx.x * (blockDim.x / PLC_WARP) + threadIdx.x / PLC_WARP;
    const void *w;
    int64_t row, m;
    float *dst;
    int vec;
    if (!plc_seg(segs, grow, &w, &row, &dst, &m, &vec)) return;
    const uint8_t *wr = (const uint8_t *)w + row * rowbytes;
    const int64_t nch = k / 32;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.f;
    for (int64_t c = lane; c < nch; c += PLC_WARP) {
        uint32_t qw[8];
        float d, d1, mn, mn1;
        if constexpr (plc_kquant<DT>::value) plc_kint32<DT>(wr, c, qw, d, d1, mn, mn1);
        else plc_qint32<DT>(wr, c, qw, d, mn);
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r < n) {
                const uint4 *qx = (const uint4 *)(xq + r * k + c * 32);
                const uint4 a = qx[0], b = qx[1];
                int lo = __dp4a((int)qw[0], (int)a.x, 0);
                lo = __dp4a((int)qw[1], (int)a.y, lo);
                lo = __dp4a((int)qw[2], (int)a.z, lo);
                lo = __dp4a((int)qw[3], (int)a.w, lo);
                int hi = __dp4a((int)qw[4], (int)b.x, 0);
                hi = __dp4a((int)qw[5], (int)b.y, hi);
                hi = __dp4a((int)qw[6], (int)b.z, hi);
                hi = __dp4a((int)qw[7], (int)b.w, hi);
                if constexpr (plc_kmin16<DT>::value) {
                    const float *s = xs + r * 2 * nch + 2 * c;
                    acc[r] += xd[r * (nch / 8) + c / 8] * (d * (float)lo + d1 * (float)hi) - (mn * s[0] + mn1 * s[1]);
                } else if constexpr (plc_kquant<DT>::value) {
                    acc[r] += xd[r * (nch / 8) + c / 8] * (d * (float)lo + d1 * (float)hi) - mn * xs[r * nch + c];
                } else {
                    float v = d * xd[r * nch + c] * (float)(lo + hi);
                    if (DT == PLC_Q4_1 || DT == PLC_Q5_1) v += mn * xs[r * nch + c];
                    acc[r] += v;
                }
            }
        }
    }
    plc_gemv_store<NR>(acc, n, dst, m, row, lane);
}

// Matrix-vector kernel for F16 and BF16 weights: one warp per weight row, n <= NR activation
// rows, each element of x rounded to the weight type as it is read (the contract's rounding,
// without a kernel of its own) and the exact products summed in F32. Where rows are 16-byte
// aligned (k a multiple of 8, x a multiple of 4 floats from 16-byte aligned bases), lane l
// reads eight weights at a time from 8l, 8l + 256, ...; otherwise elements l, l + 32, ....
// x [n, k], w [m, k], dst [n, m].
__device__ __forceinline__ float plc_round_to(float v, const __half *) { return __half2float(__float2half_rn(v)); }
__device__ __forceinline__ float plc_round_to(float v, const __nv_bfloat16 *) { return __bfloat162float(__float2bfloat16_rn(v)); }

template <typename WT, int NR>
__global__ void __launch_bounds__(128) plc_gemv_h(plc_segs segs, const float *x, int n, int64_t k) {
    const int lane = threadIdx.x % PLC_WARP;
    const int64_t grow = (int64_t)blockIdx.x * (blockDim.x / PLC_WARP) + threadIdx.x / PLC_WARP;
    const void *w;
    int64_t row, m;
    float *dst;
    int vec;
    if (!plc_seg(segs, grow, &w, &row, &dst, &m, &vec)) return;
    const WT *wr = (const WT *)w + row * k;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.f;
    if (vec) {
        for (int64_t c = 8 * lane; c < k; c += 8 * PLC_WARP) {
            const uint4 raw = *reinterpret_cast<const uint4 *>(wr + c);
            const WT *h = reinterpret_cast<const WT *>(&raw);
            float wv[8];
#pragma unroll
            for (int i = 0; i < 8; i++) wv[i] = plc_to_f32(h[i]);
#pragma unroll
            for (int r = 0; r < NR; r++) {
                if (r < n) {
                    const float4 a = *reinterpret_cast<const float4 *>(x + r * k + c);
                    const float4 b = *reinterpret_cast<const float4 *>(x + r * k + c + 4);
                    const WT *tag = NULL;
                    float s = wv[0] * plc_round_to(a.x, tag);
                    s += wv[1] * plc_round_to(a.y, tag);
                    s += wv[2] * plc_round_to(a.z, tag);
                    s += wv[3] * plc_round_to(a.w, tag);
                    s += wv[4] * plc_round_to(b.x, tag);
                    s += wv[5] * plc_round_to(b.y, tag);
                    s += wv[6] * plc_round_to(b.z, tag);
                    s += wv[7] * plc_round_to(b.w, tag);
                    acc[r] += s;
                }
            }
        }
    } else {
        for (int64_t c = lane; c < k; c += PLC_WARP) {
            const float wv = plc_to_f32(wr[c]);
#pragma unroll
            for (int r = 0; r < NR; r++)
                if (r < n) acc[r] += wv * plc_round_to(x[r * k + c], (const WT *)NULL);
        }
    }
    plc_gemv_store<NR>(acc, n, dst, m, row, lane);
}

template <typename WT>
static int plc_matmul_gemv_h(plc_ctx *ctx, const plc_segs &segs, const float *x, int64_t n, int64_t k) {
    plc_segs sg = segs;
    for (int i = 0; i < sg.count; i++) sg.vec[i] = k % 8 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)sg.w[i] % 16) == 0;
    const int warps = 4;
    const unsigned blocks = (unsigned)((sg.end[sg.count - 1] + warps - 1) / warps);
    if (n == 1) plc_gemv_h<WT, 1><<<blocks, warps * PLC_WARP, 0, ctx->stream>>>(sg, x, (int)n, k);
    else if (n == 2) plc_gemv_h<WT, 2><<<blocks, warps * PLC_WARP, 0, ctx->stream>>>(sg, x, (int)n, k);
    else if (n <= 4) plc_gemv_h<WT, 4><<<blocks, warps * PLC_WARP, 0, ctx->stream>>>(sg, x, (int)n, k);
    else plc_gemv_h<WT, 8><<<blocks, warps * PLC_WARP, 0, ctx->stream>>>(sg, x, (int)n, k);
    return plc_launched(ctx, "matmul: F16/BF16 matrix-vector kernel");
}

// Expands rows [0, rows) of quantised w to F16: y [rows, k]. One thread per chunk.
template <int DT>
__global__ void plc_deq_f16(__half *y, const uint8_t *w, int64_t rowbytes, int64_t rows, int64_t k) {
    const int64_t nch = k / 32;
    float v[32];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * nch; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / nch, c = i % nch;
        plc_deq32<DT>(w + r * rowbytes, c, v);
        __half2 *o = (__half2 *)(y + r * k + c * 32);
#pragma unroll
        for (int j = 0; j < 16; j++) o[j] = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
    }
}

template <int DT, int NR>
static void plc_launch_gemv_q8(plc_ctx *ctx, const plc_segs &segs, const int8_t *xq, const float *xd, const float *xs, int n,
                               int64_t k, int64_t rowbytes) {
    const int warps = 4;
    const int64_t blocks = (segs.end[segs.count - 1] + warps - 1) / warps;
    plc_gemv_q8<DT, NR><<<(unsigned)blocks, warps * PLC_WARP, 0, ctx->stream>>>(segs, xq, xd, xs, n, k, rowbytes);
}

// plc_quant_acts quantises the n rows of x for products with weights of type DT, into
// scratch: to Q8_0/Q8_1 blocks of 32 for the legacy types and IQ4_NL, to Q8_K blocks of 256
// for the K-quants and IQ4_XS (xq [n, k] codes; xd, xs as plc_quant_q8 and plc_quant_q8k write
// them, xs per 16 elements for Q2_K; in plc_mmq's layout where ld > 0).
template <int DT>
static int plc_quant_acts(plc_ctx *ctx, const float *x, int64_t n, int64_t k, int64_t ld, int8_t **xq, float **xd, float **xs) {
    constexpr int g = plc_kmin16<DT>::value ? 16 : 32;  // elements an xs sum covers
    const int64_t nb = n * (k / 32), rows = ld > 0 ? ld : n;
    const size_t qbytes = plc_round_up((size_t)(rows * k), 256),
                 dbytes = plc_round_up((size_t)(rows * (k / 32)) * sizeof(float), 256),
                 sbytes = plc_round_up((size_t)(rows * (k / g)) * sizeof(float), 256);
    void *work;
    int st = plc_work(ctx, qbytes + dbytes + sbytes, &work);
    if (st != PLC_OK) return st;
    *xq = (int8_t *)work;
    *xd = (float *)((char *)work + qbytes);
    *xs = (float *)((char *)work + qbytes + dbytes);
    if constexpr (plc_kquant<DT>::value)
        plc_quant_q8k<g><<<(unsigned)((nb / 8 + 3) / 4), 128, 0, ctx->stream>>>(*xq, *xd, *xs, x, nb / 8, k / 256, ld);
    else
        plc_quant_q8<<<(unsigned)((nb + 3) / 4), 128, 0, ctx->stream>>>(*xq, *xd, *xs, x, nb, k / 32, ld);
    return plc_launched(ctx, "matmul: quantising activations");
}

// plc_gemv_q_segs runs the matrix-vector products of segs (n <= PLC_GEMV_MAX_ROWS) in one launch,
// after quantising the activations.
template <int DT>
static int plc_gemv_q_segs(plc_ctx *ctx, const plc_segs &segs, const float *x, int64_t n, int64_t k) {
    const int64_t rowbytes = k / 32 / plc_qtype<DT>::chunks * plc_qtype<DT>::bytes;
    if (segs.end[segs.count - 1] > (int64_t)INT_MAX * 4) return plc_fail_arg(ctx, "matmul: too many weight rows");
    int8_t *xq;
    float *xd, *xs;
    int st = plc_quant_acts<DT>(ctx, x, n, k, 0, &xq, &xd, &xs);
    if (st != PLC_OK) return st;
    if (n == 1) plc_launch_gemv_q8<DT, 1>(ctx, segs, xq, xd, xs, (int)n, k, rowbytes);
    else if (n == 2) plc_launch_gemv_q8<DT, 2>(ctx, segs, xq, xd, xs, (int)n, k, rowbytes);
    else if (n <= 4) plc_launch_gemv_q8<DT, 4>(ctx, segs, xq, xd, xs, (int)n, k, rowbytes);
    else plc_launch_gemv_q8<DT, 8>(ctx, segs, xq, xd, xs, (int)n, k, rowbytes);
    return plc_launched(ctx, "matmul: matrix-vector kernel");
}

// ---- products of more rows against quantised weights on int8 tensor cores (plc_ctx_set_mmq) ----
//
// The same arithmetic as plc_gemv_q8, activations quantised as there: per chunk of 32 weights
// the integer dot products of the codes, now from mma.sync with s8 inputs and s32 results
// (m16n8k32 for the legacy types and IQ4_NL; for the K-quants and IQ4_XS two m16n8k16, one a
// half of 16 with its own scale), scaled and summed in F32 chunk by chunk. A block's four warps
// take 32 weight rows each, all against the same 64 activation rows (whose codes the L1 cache
// then serves four times). Every eight chunks a warp copies its rows' next eight chunks as stored
// (a K-quant's block of 256) to shared memory, consecutive lanes reading consecutive words of a
// row, so that the weights are read whole cache lines at a time. Per chunk each lane then expands
// its own row's 32 codes from there (plc_qint32/plc_kint32; the rows an odd number of words
// apart, so that no two lanes' reads meet in a bank) into the warp's rows of codes, from which
// the A fragments are read. The activations are quantised for it in a layout of its own: codes by
// chunk, [k/32, ld, 32], so that a fragment's eight rows are one 256-byte run, each 32
// reordered (plc_mmq_pos) so that a lane's two B registers, elements 4t.. and 16+4t.., are one
// 8-byte read; and the scales by chunk, [k/32, ld] with ld a multiple of 8 (Q2_K's sums by half
// chunk, [k/16, ld]), so that the scales of a lane's two result columns are one 8-byte read,
// four lanes' one sector. The weights' codes go to the rows of codes in the same order (rows 8
// words apart: the fragments' 8-byte reads meet in no bank, the 16-byte stores in pairs).

// c += a b for a 16x32 A (four registers of four s8), a 32x8 B (two), s32 c.
__device__ __forceinline__ void plc_mma_s8_k32(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(PLC_EMULATED)
    mma_m16n8k32_s8(c, a, b0, b1);  // scripts/cuda-emu
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();  // never launched: plc_ctx_set_mmq refuses a library without code for 8.0 or later
#endif
}

// c += a b for a 16x16 A (two registers), a 16x8 B (one), s32 c.
__device__ __forceinline__ void plc_mma_s8_k16(int c[4], uint32_t a0, uint32_t a1, uint32_t b0) {
#if defined(PLC_EMULATED)
    mma_m16n8k16_s8(c, a0, a1, b0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
#else
    __trap();  // never launched: plc_ctx_set_mmq refuses a library without code for 8.0 or later
#endif
}

// plc_s32_to_f32 is (float)v for |v| < 2^22, as an integer add and a float subtraction: the
// bits of 1.5 * 2^23 + v read as a float are exactly that number. (The conversion instruction
// runs at a quarter of their rate.)
__device__ __forceinline__ float plc_s32_to_f32(int v) { return __int_as_float(v + 0x4B400000) - 12582912.f; }

#define PLC_MMQ_WARPS 4   // warps a block
#define PLC_MMQ_WROWS 32  // weight rows a warp (two tiles of 16)
#define PLC_MMQ_XROWS 64  // activation rows a block (eight tiles of 8)
#define PLC_MMQ_STRIDE 8  // words from one weight row's codes to the next in shared memory

// plc_mmq_copy copies E elements of T (a whole segment) of each of a warp's first rows rows from
// src (rows rowbytes apart) to dst (rows dstride elements apart): element f of the warp's
// 32 * E is lane f % 32's, eight at a time, so that each lane has eight loads in flight.
template <typename T, int E>
__device__ __forceinline__ void plc_mmq_copy(T *dst, int dstride, const uint8_t *src, int64_t rowbytes, int rows, int lane) {
    for (int f0 = 0; f0 < PLC_MMQ_WROWS * E; f0 += 8 * PLC_WARP) {
        T v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int f = f0 + j * PLC_WARP + lane, r = f / E;
            v[j] = r < rows ? *reinterpret_cast<const T *>(src + r * rowbytes + (int64_t)sizeof(T) * (f - r * E)) : T(0);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int f = f0 + j * PLC_WARP + lane, r = f / E;
            if (r < rows) dst[r * dstride + f - r * E] = v[j];
        }
    }
}

// The bytes of a segment of a weight row: eight chunks (a K-quant's block of 256; eight legacy
// blocks of 32), and the words from one row's segment to the next in shared memory: an odd
// number, so that the lanes reading their own rows' bytes at one offset meet in no bank.
template <int DT> struct plc_mmq_seg {
    static constexpr int bytes = plc_qtype<DT>::chunks == 8 ? plc_qtype<DT>::bytes : 8 * plc_qtype<DT>::bytes;
    static constexpr int stride = ((bytes + 3) / 4) | 1;
};

// dst [n, m] (rows col0 .. of n from blockIdx.y) = x w^T for w [m, k] of type DT and x
// quantised by plc_quant_acts in plc_mmq's layout (xq, and xd, xs [chunk, ld], their columns
// from col0 of this launch's first). wide: w, rowbytes and a segment's size are
// multiples of 4, so that the weights can be read a word at a time (else half-words).
template <int DT>
__global__ void __launch_bounds__(PLC_MMQ_WARPS * PLC_WARP)
    plc_mmq(const uint8_t *w, int64_t rowbytes, int64_t m, const int8_t *xq, const float *xd, const float *xs, int64_t ld,
            int64_t n, int64_t k, float *dst, int wide) {
    constexpr bool kq = plc_kquant<DT>::value, minimum = DT == PLC_Q4_1 || DT == PLC_Q5_1, min16 = plc_kmin16<DT>::value;
    constexpr int seg = plc_mmq_seg<DT>::bytes, stride = plc_mmq_seg<DT>::stride;
    __shared__ __align__(16) uint32_t sq[PLC_MMQ_WARPS][PLC_MMQ_WROWS * PLC_MMQ_STRIDE];
    __shared__ float4 ss[PLC_MMQ_WARPS][PLC_MMQ_WROWS];  // d0, d1, m0, m1 of each row's chunk
    __shared__ uint32_t sraw[PLC_MMQ_WARPS][PLC_MMQ_WROWS * stride];  // each row's segment as stored
    const int warp = threadIdx.x / PLC_WARP, lane = threadIdx.x % PLC_WARP, g = lane / 4, t = lane % 4;
    const int64_t row0 = ((int64_t)blockIdx.x * PLC_MMQ_WARPS + warp) * PLC_MMQ_WROWS;
    if (row0 >= m) return;  // a whole warp: nothing below waits for the others
    const int64_t col0 = (int64_t)blockIdx.y * PLC_MMQ_XROWS;
    const int ncols = n - col0 < PLC_MMQ_XROWS ? (int)(n - col0) : PLC_MMQ_XROWS;
    const int rows = m - row0 < PLC_MMQ_WROWS ? (int)(m - row0) : PLC_MMQ_WROWS;
    const uint8_t *wbase = w + row0 * rowbytes;
    uint32_t *sw = sq[warp], *sr = sraw[warp];
    // this lane's row's segment in shared memory (a lane past the last row expands the bytes
    // left there; its results are not stored)
    const uint8_t *wr = reinterpret_cast<const uint8_t *>(sr + lane * stride);
    const int64_t nch = k / 32;
    float acc[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.f;
    for (int64_t c = 0; c < nch; c++) {
        const int cs = (int)(c % 8);  // the chunk's place in its segment
        if (cs == 0) {
            // The warp copies its rows' next segment to shared memory, consecutive lanes reading
            // consecutive words (or half-words) of a row: the last legacy segment of a row may
            // hold fewer than eight chunks.
            const int nb = nch - c < 8 ? (int)(nch - c) * plc_qtype<DT>::bytes : seg;
            const uint8_t *src = wbase + (c / 8) * seg;
            __syncwarp();  // every lane has expanded its chunks of the last segment
            if (nb == seg) {
                if constexpr (seg % 4 == 0) {
                    if (wide) plc_mmq_copy<uint32_t, seg / 4>(sr, stride, src, rowbytes, rows, lane);
                    else plc_mmq_copy<uint16_t, seg / 2>(reinterpret_cast<uint16_t *>(sr), 2 * stride, src, rowbytes, rows, lane);
                } else {
                    plc_mmq_copy<uint16_t, seg / 2>(reinterpret_cast<uint16_t *>(sr), 2 * stride, src, rowbytes, rows, lane);
                }
            } else {
                // a legacy row's last, shorter segment: (r, i) is the row and word (half-word) of
                // this lane's next copy
                if (wide) {
                    const int words = nb / 4;  // nb is a multiple of 4 where rowbytes is
                    int r = 0, i = lane;
                    while (r < rows && i >= words) i -= words, r++;
                    while (r < rows) {
                        sr[r * stride + i] = *reinterpret_cast<const uint32_t *>(src + r * rowbytes + 4 * i);
                        i += PLC_WARP;
                        while (r < rows && i >= words) i -= words, r++;
                    }
                } else {
                    const int halves = nb / 2;  // every block type's size is even
                    uint16_t *sh = reinterpret_cast<uint16_t *>(sr);
                    int r = 0, i = lane;
                    while (r < rows && i >= halves) i -= halves, r++;
                    while (r < rows) {
                        sh[r * 2 * stride + i] = *reinterpret_cast<const uint16_t *>(src + r * rowbytes + 2 * i);
                        i += PLC_WARP;
                        while (r < rows && i >= halves) i -= halves, r++;
                    }
                }
            }
            __syncwarp();
        }
        uint32_t q[8];
        float d0, d1, mn, mn1;
        if constexpr (kq) {
            plc_kint32<DT>(wr, cs, q, d0, d1, mn, mn1);
        } else {
            plc_qint32<DT>(wr, cs, q, d0, mn);
            d1 = d0;
            mn1 = 0.f;
        }
        __syncwarp();  // every lane has read the last chunk's codes
        // the codes in the order of plc_mmq_pos: a lane's two A registers of a row are one word pair
        uint4 *o = reinterpret_cast<uint4 *>(sw + lane * PLC_MMQ_STRIDE);
        o[0] = make_uint4(q[0], q[4], q[1], q[5]);
        o[1] = make_uint4(q[2], q[6], q[3], q[7]);
        ss[warp][lane] = make_float4(d0, d1, mn, mn1);
        __syncwarp();
        uint32_t a[2][4];
        float4 sc[2][2];  // the scales of rows g and g + 8 of each tile
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            const int r = mt * 16 + g;
            const uint2 lo = *reinterpret_cast<const uint2 *>(sw + r * PLC_MMQ_STRIDE + 2 * t);
            const uint2 hi = *reinterpret_cast<const uint2 *>(sw + (r + 8) * PLC_MMQ_STRIDE + 2 * t);
            a[mt][0] = lo.x;  // row r, elements 4t .. 4t+3
            a[mt][1] = hi.x;  // row r + 8
            a[mt][2] = lo.y;  // row r, elements 16+4t .. 16+4t+3
            a[mt][3] = hi.y;
            sc[mt][0] = ss[warp][r];
            sc[mt][1] = ss[warp][r + 8];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            if (nt * 8 >= ncols) break;  // the same for the whole warp
            // B: this lane's activation row nt*8 + g, elements 4t.. and 16 + 4t.. of the chunk,
            // side by side in plc_mmq_pos's order
            uint2 b = make_uint2(0u, 0u);
            if (nt * 8 + g < ncols) b = *reinterpret_cast<const uint2 *>(xq + (c * ld + col0 + nt * 8 + g) * 32 + 8 * t);
            const uint32_t b0 = b.x, b1 = b.y;
            // the activations' scales for this lane's result columns nt*8 + 2t and + 1, side by
            // side in the scales' [chunk, ld] layout (ld even: the second is there, past n or not)
            // (Q2_K: the sums of the chunk's two halves, smv and smv1)
            float2 sx = make_float2(0.f, 0.f), smv = make_float2(0.f, 0.f), smv1 = make_float2(0.f, 0.f);
            if (nt * 8 + 2 * t < ncols) {
                const int64_t at = col0 + nt * 8 + 2 * t;
                sx = *reinterpret_cast<const float2 *>(xd + (kq ? c / 8 : c) * ld + at);
                if constexpr (min16) {
                    smv = *reinterpret_cast<const float2 *>(xs + 2 * c * ld + at);
                    smv1 = *reinterpret_cast<const float2 *>(xs + (2 * c + 1) * ld + at);
                } else if (kq || minimum) {
                    smv = *reinterpret_cast<const float2 *>(xs + c * ld + at);
                }
            }
            const float sxs[2] = {sx.x, sx.y}, sm[2] = {smv.x, smv.y}, sm1[2] = {smv1.x, smv1.y};
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                if constexpr (kq) {
                    int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                    plc_mma_s8_k16(lo, a[mt][0], a[mt][1], b0);
                    plc_mma_s8_k16(hi, a[mt][2], a[mt][3], b1);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float4 r = sc[mt][i / 2];
                        // |lo|, |hi| <= 16 * 127 * 127 < 2^22 (IQ4_XS's values reach -127)
                        const float p = r.x * plc_s32_to_f32(lo[i]) + r.y * plc_s32_to_f32(hi[i]);
                        if constexpr (min16) acc[mt][nt][i] += sxs[i % 2] * p - (r.z * sm[i % 2] + r.w * sm1[i % 2]);
                        else acc[mt][nt][i] += sxs[i % 2] * p - r.z * sm[i % 2];
                    }
                } else {
                    int s4[4] = {0, 0, 0, 0};
                    plc_mma_s8_k32(s4, a[mt], b0, b1);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float4 r = sc[mt][i / 2];
                        float v = r.x * sxs[i % 2] * plc_s32_to_f32(s4[i]);  // |s4| <= 32 * 127 * 127 < 2^22
                        if (minimum) v += r.z * sm[i % 2];
                        acc[mt][nt][i] += v;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int64_t row = row0 + mt * 16 + g + (i / 2) * 8;
                const int col = nt * 8 + 2 * t + i % 2;
                if (row < m && col < ncols) dst[(col0 + col) * m + row] = acc[mt][nt][i];
            }
}

// plc_mmq_segs runs the products of segs (any n) on the int8 tensor cores, after quantising the
// activations once for them all.
template <int DT>
static int plc_mmq_segs(plc_ctx *ctx, const plc_segs &segs, const float *x, int64_t n, int64_t k) {
    const int64_t rowbytes = k / 32 / plc_qtype<DT>::chunks * plc_qtype<DT>::bytes;
    const int64_t ld = (n + 7) & ~(int64_t)7;  // two columns' scales one aligned float2, four lanes' one sector
    int8_t *xq;
    float *xd, *xs;
    int st = plc_quant_acts<DT>(ctx, x, n, k, ld, &xq, &xd, &xs);
    if (st != PLC_OK) return st;
    const int64_t slab = (int64_t)65535 * PLC_MMQ_XROWS;  // activation rows a launch (gridDim.y)
    for (int s = 0; s < segs.count; s++) {
        const int64_t m = segs.end[s] - (s > 0 ? segs.end[s - 1] : 0);
        const int64_t wtile = (int64_t)PLC_MMQ_WARPS * PLC_MMQ_WROWS;
        for (int64_t c0 = 0; c0 < n; c0 += slab) {
            const int64_t nn = n - c0 < slab ? n - c0 : slab;
            const dim3 grid((unsigned)((m + wtile - 1) / wtile), (unsigned)((nn + PLC_MMQ_XROWS - 1) / PLC_MMQ_XROWS));
            plc_mmq<DT><<<grid, PLC_MMQ_WARPS * PLC_WARP, 0, ctx->stream>>>(
                (const uint8_t *)segs.w[s], rowbytes, m, xq + c0 * 32, xd + c0, xs + c0, ld, nn, k, segs.dst[s] + c0 * m,
                plc_mmq_seg<DT>::bytes % 4 == 0 && rowbytes % 4 == 0 && (uintptr_t)segs.w[s] % 4 == 0);
            if ((st = plc_launched(ctx, "matmul: int8 tensor-core kernel")) != PLC_OK) return st;
        }
    }
    return PLC_OK;
}

// plc_mmq_built reports whether the int8 tensor-core kernel was compiled for this device.
int plc_mmq_built(void) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, plc_mmq<PLC_Q8_0>) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return fa.ptxVersion >= 80;
}

template <int DT>
static int plc_matmul_q(plc_ctx *ctx, float *dst, const float *x, int64_t n, int64_t k, const void *w, int64_t m) {
    const int64_t rowbytes = k / 32 / plc_qtype<DT>::chunks * plc_qtype<DT>::bytes;
    if (n <= PLC_GEMV_MAX_ROWS || ctx->mmq) {
        plc_segs segs = {};
        segs.w[0] = w;
        segs.dst[0] = dst;
        segs.end[0] = m;
        segs.count = 1;
        return n <= PLC_GEMV_MAX_ROWS ? plc_gemv_q_segs<DT>(ctx, segs, x, n, k) : plc_mmq_segs<DT>(ctx, segs, x, n, k);
    }
    // Weight rows are expanded in tiles of at most 2^25 elements (64 MiB of F16).
    int64_t tile = ((int64_t)1 << 25) / k;
    if (tile < 1) tile = 1;
    if (tile > m) tile = m;
    void *work;
    const size_t xbytes = plc_round_up((size_t)(n * k) * sizeof(__half), 256);
    const size_t sbytes = plc_round_up((size_t)n * sizeof(float), 256);
    int st = plc_work(ctx, xbytes + sbytes + (size_t)(tile * k) * sizeof(__half), &work);
    if (st != PLC_OK) return st;
    __half *xh = (__half *)work, *wh = (__half *)((char *)work + xbytes + sbytes);
    float *xs = (float *)((char *)work + xbytes);
    plc_rows_to_f16<<<(unsigned)n, 256, 0, ctx->stream>>>(xh, xs, x, k);
    if ((st = plc_launched(ctx, "matmul: rounding activations to F16")) != PLC_OK) return st;
    const float one = 1.f, zero = 0.f;
    for (int64_t r0 = 0; r0 < m; r0 += tile) {
        const int64_t rows = m - r0 < tile ? m - r0 : tile;
        plc_deq_f16<DT><<<plc_grid1d(ctx, rows * (k / 32), 128), 128, 0, ctx->stream>>>(
            wh, (const uint8_t *)w + r0 * rowbytes, rowbytes, rows, k);
        if ((st = plc_launched(ctx, "matmul: expanding weights to F16")) != PLC_OK) return st;
        cublasStatus_t s = plc_blas(NULL)->gemm_ex(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)k, &one, wh, CUDA_R_16F,
                                        (int)k, xh, CUDA_R_16F, (int)k, &zero, dst + r0, CUDA_R_32F, (int)m,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) return plc_fail_blas(ctx, "matmul: cublasGemmEx (F16)", s);
    }
    plc_rows_rescale<<<(unsigned)n, 256, 0, ctx->stream>>>(dst, xs, m);
    return plc_launched(ctx, "matmul: scaling rows back");
}

static int plc_matmul_float(plc_ctx *ctx, float *dst, const float *x, int64_t n, int64_t k, const void *w, int wt, int64_t m) {
    // Decode-sized batches against F16 and BF16 weights: one kernel reading the weights once,
    // instead of rounding x in a kernel of its own and then cuBLAS.
    if (n <= PLC_GEMV_MAX_ROWS && m <= (int64_t)INT_MAX * 4 && wt != PLC_F32) {
        plc_segs segs = {};
        segs.w[0] = w;
        segs.dst[0] = dst;
        segs.end[0] = m;
        segs.count = 1;
        return wt == PLC_F16 ? plc_matmul_gemv_h<__half>(ctx, segs, x, n, k) : plc_matmul_gemv_h<__nv_bfloat16>(ctx, segs, x, n, k);
    }
    const float one = 1.f, zero = 0.f;
    const void *xin = x;
    cudaDataType_t type = CUDA_R_32F;
    cublasComputeType_t compute = ctx->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    if (wt != PLC_F32) {
        void *work;
        int st = plc_work(ctx, (size_t)(n * k) * 2, &work);
        if (st != PLC_OK) return st;
        if (wt == PLC_F16) {
            plc_f32_to_f16<<<plc_grid1d(ctx, n * k, 256), 256, 0, ctx->stream>>>((__half *)work, x, n * k);
            type = CUDA_R_16F;
        } else {
            plc_f32_to_bf16<<<plc_grid1d(ctx, n * k, 256), 256, 0, ctx->stream>>>((__nv_bfloat16 *)work, x, n * k);
            type = CUDA_R_16BF;
        }
        if ((st = plc_launched(ctx, "matmul: rounding activations")) != PLC_OK) return st;
        xin = work;
        compute = CUBLAS_COMPUTE_32F;
    }
    cublasStatus_t s = plc_blas(NULL)->gemm_ex(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, w, type, (int)k, xin,
                                    type, (int)k, &zero, dst, CUDA_R_32F, (int)m, compute, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) return plc_fail_blas(ctx, "matmul: cublasGemmEx", s);
    return PLC_OK;
}

extern "C" int plc_matmul(plc_ctx *ctx, float *dst, const float *x, int64_t n, int64_t k, const void *w, int32_t wtype,
                          int64_t m) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (!plc_matmul_supports(wtype)) return PLC_ERR_UNSUPPORTED;
    if (n < 0 || k < 0 || m < 0 || n > INT_MAX || k > INT_MAX || m > INT_MAX) return plc_fail_arg(ctx, "matmul: size out of range");
    if (plc_row_bytes(wtype, k) < 0) return plc_fail_arg(ctx, "matmul: k is not a multiple of the block size");
    if (n == 0 || m == 0) return PLC_OK;
    if (dst == NULL || x == NULL || w == NULL) return plc_fail_arg(ctx, "matmul: null pointer");
    PLC_ENTER(ctx);
    if (k == 0) {
        cudaError_t e = cudaMemsetAsync(dst, 0, (size_t)(n * m) * sizeof(float), ctx->stream);
        return e == cudaSuccess ? PLC_OK : plc_fail_cuda(ctx, "matmul: cudaMemsetAsync", e);
    }
    switch (wtype) {
    case PLC_F32: case PLC_F16: case PLC_BF16: return plc_matmul_float(ctx, dst, x, n, k, w, wtype, m);
#define PLC_CASE(DT) case DT: return plc_matmul_q<DT>(ctx, dst, x, n, k, w, m);
    PLC_FOR_QTYPES(PLC_CASE)
#undef PLC_CASE
    }
    return PLC_ERR_UNSUPPORTED;
}

extern "C" int plc_matmuls(plc_ctx *ctx, int32_t count, float *const *dst, const float *x, int64_t n, int64_t k,
                           const void *const *w, int32_t wtype, const int64_t *m) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (count < 1 || count > PLC_SEGS || dst == NULL || w == NULL || m == NULL) return plc_fail_arg(ctx, "matmuls: bad matrices");
    if (!plc_matmul_supports(wtype)) return PLC_ERR_UNSUPPORTED;
    // One launch for them all where they take the matrix-vector kernels, and activations
    // quantised once for them all where they take the int8 tensor cores; else one product each.
    const bool sizes = n >= 1 && k > 0 && n <= INT_MAX && k <= INT_MAX && plc_row_bytes(wtype, k) >= 0;
    const bool quantised = wtype != PLC_F32 && wtype != PLC_F16 && wtype != PLC_BF16;
    const bool gemv = sizes && n <= PLC_GEMV_MAX_ROWS && wtype != PLC_F32;
    const bool mmq = sizes && n > PLC_GEMV_MAX_ROWS && quantised && ctx->mmq;
    if (!gemv && !mmq) {
        for (int i = 0; i < count; i++) {
            int st = plc_matmul(ctx, dst[i], x, n, k, w[i], wtype, m[i]);
            if (st != PLC_OK) return st;
        }
        return PLC_OK;
    }
    if (x == NULL) return plc_fail_arg(ctx, "matmuls: null pointer");
    plc_segs segs = {};
    int64_t end = 0;
    for (int i = 0; i < count; i++) {
        if (m[i] < 0 || m[i] > INT_MAX) return plc_fail_arg(ctx, "matmuls: size out of range");
        if (m[i] == 0) continue;
        if (dst[i] == NULL || w[i] == NULL) return plc_fail_arg(ctx, "matmuls: null pointer");
        end += m[i];
        segs.w[segs.count] = w[i];
        segs.dst[segs.count] = dst[i];
        segs.end[segs.count] = end;
        segs.count++;
    }
    if (segs.count == 0) return PLC_OK;
    PLC_ENTER(ctx);
    switch (wtype) {
    case PLC_F16: return plc_matmul_gemv_h<__half>(ctx, segs, x, n, k);
    case PLC_BF16: return plc_matmul_gemv_h<__nv_bfloat16>(ctx, segs, x, n, k);
#define PLC_CASE(DT) case DT: return gemv ? plc_gemv_q_segs<DT>(ctx, segs, x, n, k) : plc_mmq_segs<DT>(ctx, segs, x, n, k);
    PLC_FOR_QTYPES(PLC_CASE)
#undef PLC_CASE
    }
    return PLC_ERR_UNSUPPORTED;
}
