// select.cuh: block-wide selection helpers for the decoding kernels (one thread block per row of
// logits): an order-preserving integer key for floats, radix selection of the k-th largest key
// by count or by probability mass, and a block-wide prefix sum.
#ifndef PLC_SELECT_CUH
#define PLC_SELECT_CUH

#include "internal.cuh"

#define PLC_SELECT_THREADS 1024

// plc_key maps floats to unsigned keys in the same order (-inf lowest of the numbers; -0 and +0
// one key, as they compare equal); NaN maps to 0, below everything.
__device__ __forceinline__ uint32_t plc_key(float v) {
    if (v != v) return 0u;
    if (v == 0.f) return 0x80000000u;
    const uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Shared state of a radix selection.
struct plc_select_smem {
    unsigned count[256];
    float mass[256];
    uint32_t prefix;
    long long remaining;
    float remaining_mass;
};

// plc_kth_key returns, to every thread, the k-th largest of key(j) over j < n (1 <= k <= n):
// four passes of an 8-bit histogram, each narrowing the prefix of the answer.
template <typename Key>
__device__ uint32_t plc_kth_key(Key key, int64_t n, int64_t k, plc_select_smem *sm) {
    uint32_t prefix = 0, mask = 0;
    long long remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) sm->count[i] = 0;
        __syncthreads();
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const uint32_t kj = key(j);
            if ((kj & mask) == prefix) atomicAdd(&sm->count[(kj >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            long long cum = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (cum + (long long)sm->count[b] >= remaining) break;
                cum += sm->count[b];
            }
            sm->prefix = prefix | ((uint32_t)b << shift);
            sm->remaining = remaining - cum;
        }
        __syncthreads();
        prefix = sm->prefix;
        remaining = sm->remaining;
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

// plc_mass_key returns, to every thread, the largest key t such that the elements with
// key(j) >= t (among those with key(j) >= floor) carry at least `target` of mass(j). Float
// atomics make the histogram sums' order vary, so an element whose inclusion depends on the
// last bits of those sums may be kept in one run and not in another.
template <typename Key, typename Mass>
__device__ uint32_t plc_mass_key(Key key, Mass mass, int64_t n, uint32_t floor, float target, plc_select_smem *sm) {
    uint32_t prefix = 0, mask = 0;
    float remaining = target;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) sm->mass[i] = 0.f;
        __syncthreads();
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const uint32_t kj = key(j);
            if (kj >= floor && (kj & mask) == prefix) atomicAdd(&sm->mass[(kj >> shift) & 255u], mass(j));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float cum = 0.f;
            int b = 255;
            for (; b > 0; b--) {
                if (cum + sm->mass[b] >= remaining) break;
                cum += sm->mass[b];
            }
            sm->prefix = prefix | ((uint32_t)b << shift);
            sm->remaining_mass = remaining - cum;
        }
        __syncthreads();
        prefix = sm->prefix;
        remaining = sm->remaining_mass;
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

// plc_block_scan returns the inclusive prefix sum of v over the block's threads in order, and
// the block's total in *total. ws: shared scratch of 32 floats. Contains __syncthreads.
__device__ __forceinline__ float plc_block_scan(float v, float *ws, float *total) {
    const int lane = threadIdx.x % PLC_WARP, warp = threadIdx.x / PLC_WARP, nw = blockDim.x / PLC_WARP;
    for (int o = 1; o < PLC_WARP; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    __syncthreads();
    if (lane == PLC_WARP - 1) ws[warp] = v;
    __syncthreads();
    float off = 0.f, tot = 0.f;
    for (int w = 0; w < nw; w++) {
        if (w < warp) off += ws[w];
        tot += ws[w];
    }
    *total = tot;
    return v + off;
}

#endif
