/*
 * parley.h: the C ABI of Parley's native compute kernels.
 *
 * Plain C only: fixed-width integers, plain structs, opaque handles and int status codes. No
 * function aborts, exits or prints; every failure is a negative status. Callers are expected to
 * have checked their arguments, but every entry point checks again what it cheaply can.
 *
 * Element types are ggml's type ids (PL_F32 ... PL_BF16 below) and quantised rows use ggml's block
 * layouts (ggml-common.h), so GGUF tensor data is used in place.
 *
 * Arrays are row-major. Shapes are written [rows, cols]; n is a number of tokens.
 *
 * CPU kernels exist in a portable scalar form and in AVX2 and AVX-512 forms chosen once at run
 * time from the features the processor reports (never from compile-time flags). All forms compute
 * the same quantities; results differ only by floating-point summation order. Float matrix
 * products of several rows use OpenBLAS (sgemm, one OpenBLAS thread per worker) below AVX-512 and
 * Parley's own AVX-512 kernel above it (OpenBLAS 0.3.21 runs its AVX2 kernels on AVX-512 AMD
 * processors); the environment variable PARLEY_CPU_BLAS=openblas, read once, forces OpenBLAS.
 *
 * Threads: a context's workers spin for a short while (0.3 ms) after each operation, yielding the
 * processor regularly, then sleep until the next one. Operations on a single row (a decode step's
 * norms, RoPE, element-wise operations) run on the calling thread alone.
 */
#ifndef PARLEY_H
#define PARLEY_H

#include <stddef.h>
#include <stdint.h>

#include "parley_fn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
#define PL_OK 0
#define PL_ERR_ARG (-1)         /* an argument is out of range, null or inconsistent */
#define PL_ERR_UNSUPPORTED (-2) /* the case (dtype, shape) is not implemented */
#define PL_ERR_NOMEM (-3)       /* memory allocation failed */
#define PL_ERR_THREAD (-4)      /* a thread could not be started */

/* Element types: ggml type ids. */
#define PL_F32 0
#define PL_F16 1
#define PL_Q4_0 2
#define PL_Q4_1 3
#define PL_Q5_0 6
#define PL_Q5_1 7
#define PL_Q8_0 8
#define PL_Q8_1 9
#define PL_Q2_K 10
#define PL_Q3_K 11
#define PL_Q4_K 12
#define PL_Q5_K 13
#define PL_Q6_K 14
#define PL_Q8_K 15
#define PL_IQ4_NL 20
#define PL_IQ4_XS 23
#define PL_BF16 30

/* Instruction-set levels of the CPU kernels. */
#define PL_ISA_SCALAR 0
#define PL_ISA_AVX2 1   /* AVX2, FMA, F16C */
#define PL_ISA_AVX512 2 /* AVX-512 F, BW, VL, DQ and VNNI, plus AVX2, FMA, F16C */

/* pl_cpu_isa returns the level the kernels use now: the best the processor supports unless
 * lowered with pl_cpu_set_isa. */
int pl_cpu_isa(void);
/* pl_cpu_best_isa returns the best level the processor supports. */
int pl_cpu_best_isa(void);
/* pl_cpu_set_isa makes the kernels use level isa, which must not exceed pl_cpu_best_isa(). It
 * must not be called while any operation runs. */
int pl_cpu_set_isa(int isa);
/* pl_isa_name returns a static name for an ISA level ("scalar", "avx2", "avx512"). */
const char *pl_isa_name(int isa);

/* Operations, for pl_supports. */
#define PL_OP_MATMUL 1   /* dtype: weight type */
#define PL_OP_GET_ROWS 2 /* dtype: table type */
#define PL_OP_KV 3       /* dtype: KV-cache element type (StoreKV, Attention): F32, F16, BF16 */
#define PL_OP_QUANTIZE 4 /* dtype: target of pl_quantize_row */
#define PL_OP_DEQUANTIZE 5
#define PL_OP_UNARY 6 /* dtype: a function of parley_fn.h, of pl_unary and pl_glu */

/* pl_supports reports 1 if operation op handles element type dtype, else 0. */
int pl_supports(int op, int dtype);

/* pl_row_size returns the bytes of n elements of dtype, or a negative status when dtype is not
 * one of the types above or n is not a multiple of its block size. */
int64_t pl_row_size(int dtype, int64_t n);

/* pl_vec_dot_type returns the type a row of activations is converted to before being multiplied
 * by weights of dtype (F32->F32, F16->F16, BF16->BF16, Q4_0/Q5_0/Q8_0/IQ4_NL->Q8_0,
 * Q4_1/Q5_1->Q8_1, Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_XS->Q8_K), or PL_ERR_UNSUPPORTED. */
int pl_vec_dot_type(int dtype);

/* pl_quantize_row converts n floats to dtype in ggml's layout, bit for bit as ggml's x86 CPU
 * backend converts activations (quantize_row_q8_0, _q8_1, _q8_K; F16 and BF16 round to nearest
 * even). dtype is one of F16, BF16, Q8_0, Q8_1, Q8_K. Q8_0 and Q8_1 use d = amax/127 and the
 * multiplier 127/amax with round-half-to-even, as ggml's AVX code does (ggml's portable
 * reference quantizer uses 1/d and round-half-away, which differs in rare last-bit cases).
 * Single-threaded. */
int pl_quantize_row(int dtype, const float *src, void *dst, int64_t n);

/* pl_dequantize_row converts n elements of dtype (any type pl_supports(PL_OP_DEQUANTIZE, ...)
 * accepts) to float. Single-threaded. */
int pl_dequantize_row(int dtype, const void *src, float *dst, int64_t n);

/* A context owns a pool of worker threads and scratch memory. Operations on one context must not
 * run concurrently; each returns when its result is complete. */
typedef struct pl_ctx pl_ctx;

/* pl_ctx_new makes a context computing with threads threads (the calling thread included),
 * 1 <= threads <= 256. */
int pl_ctx_new(int threads, pl_ctx **out);
void pl_ctx_free(pl_ctx *ctx);
int pl_ctx_threads(const pl_ctx *ctx);

/* pl_matmul: dst[i,j] = sum_l x[i,l]*w[j,l]. x [n, k] F32, w [m, k] of wtype in ggml's layout,
 * dst [n, m] F32 (must not overlap x or w). Quantised and half-precision weights are multiplied
 * as ggml's CPU backend does: each row of x is first converted to pl_vec_dot_type(wtype) (for
 * F16/BF16, x is rounded to that type and the products accumulate in float32); integer block dot
 * products are exact, block scales are applied in float32. */
int pl_matmul(pl_ctx *ctx, float *dst, const float *x, int64_t n, int64_t k, const void *w,
              int wtype, int64_t m);

/* Interleaved weights (AVX-512 VNNI, AVX2): quantised matrices (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS) rearranged sixteen rows at a time so that one integer
 * dot product yields whole block sums of sixteen rows (packed.c describes the layouts).
 * pl_packed_size returns the bytes pl_pack_weights writes for w [m, k] of wtype (as many as the
 * rows themselves, Q4_K and Q5_K 4 more a row every 256 elements, Q3_K 4 more, IQ4_XS 2 more, up
 * to a last group padded to sixteen rows), PL_ERR_UNSUPPORTED for other types.
 * pl_packed_available reports 1 when the current ISA level runs pl_matmul_packed for wtype: every
 * type above with AVX-512 VNNI or AVX2, except Q2_K, Q3_K, IQ4_NL and IQ4_XS, which have AVX2
 * kernels only (with AVX-512, pl_matmul's VNNI row kernels serve them).
 * pl_matmul_packed is pl_matmul on packed weights; each block's exact integer sum is scaled and
 * added in block order (one FMA a block), so a row's result depends on neither n nor the number
 * of threads. It returns PL_ERR_UNSUPPORTED below AVX2, where callers use the unpacked rows. */
int64_t pl_packed_size(int wtype, int64_t m, int64_t k);
int pl_packed_available(int wtype);
int pl_pack_weights(pl_ctx *ctx, int wtype, const void *w, int64_t m, int64_t k, void *dst);
int pl_matmul_packed(pl_ctx *ctx, float *dst, const float *x, int64_t n, int64_t k, const void *wp,
                     int wtype, int64_t m);
/* pl_matmul_packed3 is pl_matmul_packed for up to three packed matrices of one type and width
 * against one x: di [n, mi] = x · wiᵀ, each bit for bit what pl_matmul_packed gives it, with x
 * converted once and the threads woken once for all (a layer's query, key and value products).
 * A matrix with mi = 0 is skipped (its di and wi may be NULL). */
int pl_matmul_packed3(pl_ctx *ctx, const float *x, int64_t n, int64_t k, int wtype, float *d0,
                      const void *w0, int64_t m0, float *d1, const void *w1, int64_t m1, float *d2,
                      const void *w2, int64_t m2);

/* pl_get_rows: dst[i,:] = float(table[ids[i],:]). table [rows, cols] of dtype, dst [n, cols]. */
int pl_get_rows(pl_ctx *ctx, float *dst, const void *table, int dtype, int64_t rows,
                int64_t cols, const int32_t *ids, int64_t n);

/* pl_add_rows: dst[i,:] = a[i,:] + b[i % b_rows,:], b_rows 1 or n. [n, d]; dst may be a. */
int pl_add_rows(pl_ctx *ctx, float *dst, const float *a, const float *b, int64_t n, int64_t d,
                int64_t b_rows);

/* pl_rms_norm: dst[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * w. x, dst [n, d], w [d].
 * dst may be x. */
int pl_rms_norm(pl_ctx *ctx, float *dst, const float *x, const float *w, int64_t n, int64_t d,
                float eps);

/* pl_scale: dst[i] = x[i] * s for i < len, s finite. dst may be x. */
int pl_scale(pl_ctx *ctx, float *dst, const float *x, float s, int64_t len);

/* pl_unary: dst[i] = f(x[i]) for i < len, f the function fn of parley_fn.h (PL_FN_RELU ...);
 * PL_ERR_UNSUPPORTED for another fn. dst may be x. Each function is computed as its scalar form
 * (libm's expf, tanhf, erfcf, expm1f; GELU's tanh form as x/(1+exp(-2*sqrt(2/pi)*(x+0.044715*x^3))),
 * the same function without cancellation for negative x), or, with AVX2 and AVX-512, by vector
 * forms over whole vectors (the rest of len in the scalar form) within a few float ulp of it:
 * exp from a degree-6 polynomial, tanh as Cephes' tanhf does, erfc by a Chebyshev fit of
 * t*exp(-z^2+P(t)), t = 1/(1+z/2), expm1 by its Taylor polynomial near 0. */
int pl_unary(pl_ctx *ctx, int fn, float *dst, const float *x, int64_t len);

/* pl_glu: dst[i] = f(gate[i]) * up[i] for i < len, f as pl_unary's (PL_FN_SILU: SwiGLU,
 * PL_FN_GELU: GeGLU, PL_FN_SIGMOID: GLU). dst may be gate or up. */
int pl_glu(pl_ctx *ctx, int fn, float *dst, const float *gate, const float *up, int64_t len);

/* Rotary embedding. */
#define PL_ROPE_NORMAL 0 /* pairs (2i, 2i+1) */
#define PL_ROPE_NEOX 1   /* pairs (i, i+dims/2) */
typedef struct {
    int32_t mode;     /* PL_ROPE_NORMAL or PL_ROPE_NEOX */
    int32_t head_dim; /* elements of a head */
    int32_t dims;     /* rotated elements, even, <= head_dim */
    float base;       /* frequency base */
    float freq_scale; /* position multiplier */
    const float *freq_factors; /* [dims/2] finite values above 0, or NULL for none */
    float mscale;     /* multiplies cos and sin (LongRoPE's attention factor); 0 means 1 */
    float ext_factor; /* YaRN when not 0 (0 to 1): see pl_rope */
    float corr_dims[2];
} pl_rope_cfg;

/* pl_rope rotates x [n, n_head*head_dim] in place; token i is at position pos[i] >= 0. Pair i
 * turns by theta = freq_scale * (p * base^(-2i/dims) / freq_factors[i]) (freq_factors: llama.cpp's
 * rope_freqs, as Llama 3.1 scales its frequencies), computed as ggml does (theta_scale powers by
 * repeated multiplication, cosf/sinf, both multiplied by mscale). With ext_factor (YaRN), as
 * ggml's rope_yarn: theta mixes with the unscaled angle theta/freq_scale by
 * ramp = ext_factor*(1 - clamp((i - corr_dims[0])/max(0.001, corr_dims[1]-corr_dims[0]), 0, 1)),
 * and mscale is multiplied by 1 + 0.1*logf(1/freq_scale). The context keeps the angle table of the last call and
 * reuses it while positions and parameters repeat (every layer of a forward step). */
int pl_rope(pl_ctx *ctx, float *x, int64_t n, int64_t n_head, const pl_rope_cfg *r,
            const int32_t *pos);

/* pl_store_kv writes k and v [n, width] F32 into rows slot[i] of the caches kc and vc
 * [slots, width] of kvtype (F32, F16 or BF16; F16 and BF16 rounded to nearest even, NaN kept
 * NaN). With repeated slots, which token's row is kept is unspecified. */
int pl_store_kv(pl_ctx *ctx, void *kc, void *vc, int kvtype, int64_t slots, int64_t width,
                const float *k, const float *v, int64_t n, const int32_t *slot);

/* One sequence of an attention batch: tokens [start, start+count) of the batch are at positions
 * ctx_len-count .. ctx_len-1; cache position j is in slot blocks[blocks_off + j/block_size] *
 * block_size + j%block_size, for n_blocks >= ceil(ctx_len/block_size) table entries. */
typedef struct {
    int32_t start, count, ctx_len;
    int32_t blocks_off, n_blocks;
} pl_seq;

typedef struct {
    int32_t n_head, n_kv_head, head_dim;
    float scale;
} pl_attn_cfg;

/* pl_attention: for each sequence and each of its tokens i at position p, and each query head h,
 * dst[i, h] = softmax_j(scale * q[i,h] . K[j,h']) . V[j,h'] over cache positions j = 0..p,
 * h' = h / (n_head/n_kv_head). q, dst [n, n_head*head_dim] (must not overlap); kc, vc
 * [slots, width] of kvtype (F32, F16 or BF16), width = n_kv_head*head_dim; blocks holds all
 * block tables, each entry in [0, slots/block_size). Tokens of the batch not in any sequence are
 * left untouched in dst. Over an F16 or BF16 cache the products are those of that type: q is
 * rounded to it before q.K and the normalised weights p_j before p.V (nearest even), the sums in
 * float or wider; F16 sums them in the order of ggml's CPU backend. */
int pl_attention(pl_ctx *ctx, float *dst, const float *q, int64_t n, const void *kc,
                 const void *vc, int kvtype, int64_t slots, int64_t width, int64_t block_size,
                 const pl_attn_cfg *a, const pl_seq *seqs, int64_t n_seqs, const int32_t *blocks,
                 int64_t n_blocks_total);

/* ---- Operations of encoder-decoder models (Whisper) ---- */

/* pl_convert: dst[i] = src[i] for i < n, converted from stype to dtype: F32 to F16 (rounded to
 * nearest even, overflow to infinity), F16 to F32 (exact), or copied when the types are equal
 * (F32 or F16; dst may then overlap src). Other types: PL_ERR_UNSUPPORTED. */
int pl_convert(pl_ctx *ctx, void *dst, int dtype, const void *src, int stype, int64_t n);

/* pl_layer_norm: dst[i,:] = (x[i,:] - mean) / sqrt(var + eps) * w + b with the mean and the
 * biased variance of row i, both summed in double (two passes), eps >= 0. x, dst [n, d];
 * w, b [d]. dst may be x. */
int pl_layer_norm(pl_ctx *ctx, float *dst, const float *x, const float *w, const float *b,
                  int64_t n, int64_t d, float eps);

/* pl_im2col_1d lays out the receptive fields of a 1-D convolution of x [t, c] (row = time step)
 * with kernel k, stride and padding pad: dst[o, ch*k + j] = x[o*stride + j - pad, ch], or 0
 * where that row is outside 0..t-1, for o < t_out = (t + 2*pad - k)/stride + 1. k, stride >= 1,
 * pad >= 0, t + 2*pad >= k. dst [t_out, c*k] must not overlap x. */
int pl_im2col_1d(pl_ctx *ctx, float *dst, const float *x, int64_t t, int64_t c, int64_t k,
                 int64_t stride, int64_t pad);

/* pl_full_attention: attention without a cache or a mask. For each row i < n of q and each query
 * head h, dst[i, h] = softmax_j(scale * q[i,h] . k[j,h']) . v[j,h'] over every row j < m,
 * h' = h / (n_head/n_kv_head). q, dst [n, n_head*head_dim] (must not overlap each other, k or
 * v); k, v [m, n_kv_head*head_dim] of kvtype (F32 or F16; other types, BF16 included, are
 * PL_ERR_UNSUPPORTED), m >= 1. With F16 keys and values the products are computed as
 * pl_attention's over an F16 cache: q rounded to F16 before q.k, the normalised weights rounded
 * to F16 before p.v. */
int pl_full_attention(pl_ctx *ctx, float *dst, const float *q, int64_t n, const void *k,
                      const void *v, int kvtype, int64_t m, const pl_attn_cfg *a);

#ifdef __cplusplus
}
#endif

#endif /* PARLEY_H */
