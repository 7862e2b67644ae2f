// emu.h: the CUDA device model on the CPU, for running the kernels of native/cuda without a GPU
// (scripts/cuda-emu). A kernel's threads are fibers on one host thread: each runs until it waits
// at a barrier (__syncthreads, or a warp's shuffle), and the block's threads take turns until
// all have finished; blocks run one after another, at launch (the stream is synchronous).
// __shared__ variables are static, so the threads of a block share them; a barrier that not
// every thread of a block (or of a warp, for shuffles) reaches is reported as a deadlock.
// Numerics are the host's: float arithmetic as written, libm's expf and logf.
#ifndef PARLEY_CUDA_EMU_H
#define PARLEY_CUDA_EMU_H

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <tuple>
#include <type_traits>

#define PLC_EMULATED 1
#define __CUDA_ARCH__ 900
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static const int warpSize = 32;

// ---- the fiber scheduler (runtime.cc) ----
namespace emu {
// Waits until every live thread of the block has arrived at the barrier at site (its place in
// the source); returns the OR of their flags.
int block_barrier(const char *site, int flag);
// Waits until every live lane of the calling thread's warp has arrived at site, after storing
// the lane's bytes; then copies lane src's bytes into out; and waits again before returning.
void warp_exchange(const char *site, const void *mine, size_t n, int src, void *out);
// As warp_exchange, copying every lane's bytes into all (32 * n bytes, by lane).
void warp_gather(const char *site, const void *mine, size_t n, void *all);
// The block's dynamic shared memory.
void *dynamic_shared();
// Notes that the calling kernel has the static __shared__ variable p of n bytes (scripts/cuda-emu
// adds a call after each declaration); reports a block's static and dynamic shared memory over
// 48 KiB.
void static_shared(const void *p, size_t n);
// Reports a fatal error in a kernel (the kernel's name and the thread) and exits.
[[noreturn]] void trap(const char *why);
// Runs (or records, while the stream is captured) one launch of kernel fn.
int launch(const void *fn, dim3 grid, dim3 block, size_t smem, void *stream, std::function<void()> body);
// cfg is a launch's configuration: kernel<<<g, b, s, st>>>(args) becomes
// emu::cfg(g, b, s, st).go(kernel, args), which converts the arguments to the kernel's
// parameter types at the launch, as CUDA copies them, and runs (or records) the kernel.
struct cfg {
    dim3 g, b;
    size_t s;
    void *st;
    template <class S = void *>
    cfg(dim3 g_, dim3 b_, size_t s_ = 0, S st_ = nullptr) : g(g_), b(b_), s(s_), st((void *)st_) {}
    template <class F>
    void run(const void *fn, F f) {
        launch(fn, g, b, s, st, std::function<void()>(f));
    }
    template <class... P, class... A>
    void go(void (*fn)(P...), A &&...a) {
        std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
        launch((const void *)fn, g, b, s, st, [fn, args]() { std::apply(fn, args); });
    }
};
}  // namespace emu

#define EMU_LANE() ((int)((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32))

// ---- synchronisation ----
// The barrier and shuffle functions are macros that pass their place in the source, so that
// threads waiting at different ones (divergent code, which CUDA leaves undefined) are reported
// whatever copies of the code the compiler made.
#define EMU_SITE __FILE__ ":" EMU_STR(__LINE__)
#define EMU_STR(x) EMU_STR2(x)
#define EMU_STR2(x) #x
namespace emu {
template <class T>
inline T shfl(const char *site, T v, int src) {
    T out;
    warp_exchange(site, &v, sizeof v, src, &out);
    return out;
}
inline int lane_src_xor(int m, int width) {
    const int lane = EMU_LANE(), src = lane ^ m;
    return (src & ~(width - 1)) != (lane & ~(width - 1)) ? lane : src;
}
inline int lane_src_up(unsigned d, int width) {
    const int lane = EMU_LANE(), src = lane - (int)d;
    return src < (lane & ~(width - 1)) ? lane : src;
}
inline int lane_src_down(unsigned d, int width) {
    const int lane = EMU_LANE(), src = lane + (int)d;
    return src >= (lane & ~(width - 1)) + width ? lane : src;
}
inline int lane_src_idx(int s, int width) { return (EMU_LANE() & ~(width - 1)) + (s & (width - 1)); }
}  // namespace emu
#define __syncthreads() emu::block_barrier(EMU_SITE, 0)
#define __syncthreads_or(p) emu::block_barrier(EMU_SITE, (p) != 0)
#define __syncwarp(...) ((void)emu::shfl(EMU_SITE, 0, EMU_LANE()))
#define __shfl_sync(mask, v, s, ...) emu::shfl(EMU_SITE, v, emu::lane_src_idx(s, EMU_WIDTH(__VA_ARGS__)))
#define __shfl_xor_sync(mask, v, m, ...) emu::shfl(EMU_SITE, v, emu::lane_src_xor(m, EMU_WIDTH(__VA_ARGS__)))
#define __shfl_up_sync(mask, v, d, ...) emu::shfl(EMU_SITE, v, emu::lane_src_up(d, EMU_WIDTH(__VA_ARGS__)))
#define __shfl_down_sync(mask, v, d, ...) emu::shfl(EMU_SITE, v, emu::lane_src_down(d, EMU_WIDTH(__VA_ARGS__)))
#define EMU_WIDTH(...) emu_width(0 __VA_OPT__(, ) __VA_ARGS__)
inline int emu_width(int) { return 32; }
inline int emu_width(int, int w) { return w; }
unsigned __ballot_sync(unsigned mask, int p);
inline void __threadfence() {}
inline void __threadfence_block() {}
[[noreturn]] inline void __trap() { emu::trap("__trap"); }

// ---- atomics (one host thread: plain read-modify-write) ----
template <class T>
inline T atomicAdd(T *p, T v) {
    T o = *p;
    *p = o + v;
    return o;
}
template <class T>
inline T atomicMax(T *p, T v) {
    T o = *p;
    *p = std::max(o, v);
    return o;
}
template <class T>
inline T atomicMin(T *p, T v) {
    T o = *p;
    *p = std::min(o, v);
    return o;
}
template <class T>
inline T atomicOr(T *p, T v) {
    T o = *p;
    *p = o | v;
    return o;
}
template <class T>
inline T atomicAnd(T *p, T v) {
    T o = *p;
    *p = o & v;
    return o;
}
template <class T>
inline T atomicExch(T *p, T v) {
    T o = *p;
    *p = v;
    return o;
}
template <class T>
inline T atomicCAS(T *p, T cmp, T v) {
    T o = *p;
    if (o == cmp) *p = v;
    return o;
}

// ---- arithmetic ----
template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type T;
    return (T)a < (T)b ? (T)a : (T)b;
}
template <class A, class B>
inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type T;
    return (T)a < (T)b ? (T)b : (T)a;
}
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline int __float_as_int(float f) {
    int u;
    memcpy(&u, &f, 4);
    return u;
}
inline float __int_as_float(int u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
// Byte n of the result is byte s<4n+2:4n> of the eight bytes x (0..3) and y (4..7); the fourth
// bit of each selector nibble and the upper 16 bits of s are not used, as CUDA documents.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)(v >> (8 * ((s >> (4 * n)) & 7)) & 255) << (8 * n);
    return r;
}
template <class T>
inline T __ldg(const T *p) {
    return *p;
}
using std::isinf;
using std::isnan;

// ---- half and bfloat16 ----
struct __half {
    uint16_t x;
};
struct __half2 {
    __half x, y;
};
struct __nv_bfloat16 {
    uint16_t x;
};
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;

inline float __half2float(__half h) {
    const uint32_t s = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff;
    uint32_t u;
    if (e == 0) {
        if (m == 0) {
            u = s;
        } else {  // subnormal
            float f = (float)m * 0x1p-24f;
            u = __float_as_uint(f) | s;
        }
    } else if (e == 31) {
        u = s | 0x7f800000u | (m << 13);
    } else {
        u = s | ((e + 112) << 23) | (m << 13);
    }
    return __uint_as_float(u);
}
inline __half __float2half_rn(float f) {
    const uint32_t u = __float_as_uint(f), s = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7fffffffu;
    __half h;
    if (a > 0x7f800000u) {  // NaN
        h.x = (uint16_t)(s | 0x7e00u);
    } else if (a >= 0x477ff000u) {  // rounds to infinity (65520 and above)
        h.x = (uint16_t)(s | 0x7c00u);
    } else if (a < 0x38800000u) {  // below F16's normal range: subnormal or zero
        const float v = __uint_as_float(a) * 0x1p24f;  // in units of 2^-24, exact
        h.x = (uint16_t)(s | (uint32_t)nearbyintf(v));  // round half to even (default mode)
    } else {
        const uint32_t e = (a >> 23) - 112, m = a & 0x7fffffu;
        uint32_t r = (e << 10) | (m >> 13);
        const uint32_t rest = m & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) r++;
        h.x = (uint16_t)(s | r);
    }
    return h;
}
inline __half __float2half(float f) { return __float2half_rn(f); }
inline __half __ushort_as_half(unsigned short v) {
    __half h;
    h.x = v;
    return h;
}
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __half2 __floats2half2_rn(float lo, float hi) { return __half2{__float2half_rn(lo), __float2half_rn(hi)}; }
inline __half2 __float2half2_rn(float v) { return __half2{__float2half_rn(v), __float2half_rn(v)}; }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }

inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((uint32_t)b.x << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u = __float_as_uint(f);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.x = (uint16_t)((u >> 16) | 0x40u);
        return b;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    b.x = (uint16_t)(u >> 16);
    return b;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

struct __attribute__((aligned(8))) float2 {
    float x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(16))) int4 {
    int x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned x, y;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned x, y, z, w;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }

// The tensor-core product of attention.cu (mma.sync m16n8k16, F16 inputs, F32 accumulators) for
// the calling lane, with the PTX ISA's fragment layouts; every lane of the warp calls it.
void mma_m16n8k16_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
// The same with BF16 inputs (mma.sync m16n8k16 .bf16).
void mma_m16n8k16_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

// The TF32 tensor-core product of attention.cu (mma.sync m16n8k8 .tf32, F32 accumulators) for
// the calling lane; the inputs' low 13 bits are ignored, as the hardware ignores them.
void mma_m16n8k8_tf32(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
// The int8 tensor-core products of gemm.cu (mma.sync .s8.s8.s32): m16n8k32, and m16n8k16 with
// A in two registers and B in one.
void mma_m16n8k32_s8(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
void mma_m16n8k16_s8(int c[4], uint32_t a0, uint32_t a1, uint32_t b0);

// cvt.rna.tf32.f32: v rounded to TF32 (10-bit mantissa) to nearest, ties away from zero.
inline uint32_t emu_tf32_rna(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7f800000u) == 0x7f800000u) return u & 0xffffe000u;  // Inf and NaN: not rounded, low bits cleared
    return (u + 0x1000u) & 0xffffe000u;
}

#endif
