// tdt.cuh: block-wide reductions the transducer decoding kernels share (tdt.cu's greedy rule,
// tdtbeam.cu's beam rounds), one thread block per row of joint logits.
#ifndef PLC_TDT_CUH
#define PLC_TDT_CUH

#include "internal.cuh"

// plc_tdt_block_max is the block's largest value of x[0..n) that is not NaN (-INFINITY when
// none), and sets *nan to whether one is NaN. sv and si are shared scratch of blockDim.x each.
__device__ static float plc_tdt_block_max(const float *x, int n, int *nan, float *sv, int *si) {
    float m = -INFINITY;
    int bad = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float v = x[j];
        if (v != v) bad = 1;
        else if (v > m) m = v;
    }
    sv[threadIdx.x] = m;
    si[threadIdx.x] = bad;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) {
            if (sv[threadIdx.x + k] > sv[threadIdx.x]) sv[threadIdx.x] = sv[threadIdx.x + k];
            si[threadIdx.x] |= si[threadIdx.x + k];
        }
        __syncthreads();
    }
    const float r = sv[0];
    *nan = si[0];
    __syncthreads();
    return r;
}

#endif
