/*
 * parley_cuda.h: the C ABI of Parley's CUDA kernels (libparley_cuda.a, built by CMake from
 * native/cuda).
 *
 * Plain C only: fixed-width integers, plain structs, an opaque context and int status codes. C++
 * and CUDA stay inside the library; no function throws, aborts, exits or prints. Status codes and
 * element-type ids have the values of parley.h (PLC_OK == PL_OK, PLC_F16 == PL_F16, ...), so that
 * the two headers can become one.
 *
 * Memory: every pointer documented as "device" is CUDA device memory of the context's device
 * (plc_alloc); every other pointer is host memory, read or written only during the call.
 * Element types are ggml's type ids and quantised rows use ggml's block layouts, as in parley.h.
 * Arrays are row-major; shapes are written [rows, cols]; n is a number of tokens.
 *
 * Execution: a context owns one device, one CUDA stream and one cuBLAS handle. Operations are
 * queued on the stream and return before they finish; they take effect in the order issued.
 * plc_download and plc_sync wait; so do the decoding entry points, which return ids on the host.
 * A context must not be used by two threads at once. Each entry point makes the context's device
 * current on the calling thread first. The small host tables an operation takes (ids, positions,
 * slots, block tables) are copied to the device through pinned memory during the call, without
 * waiting unless the memory kept for them is full; a table equal to one copied since the stream
 * was last idle (after a wait) is not copied again, so the layers of a step share one copy of
 * its positions, slots and block table.
 *
 * Errors: a failing CUDA or cuBLAS call gives PLC_ERR_CUDA and the context keeps a message
 * (plc_ctx_error). A kernel fault surfaces at the next call that waits, and leaves the context
 * unusable (CUDA's rule for sticky errors).
 */
#ifndef PARLEY_CUDA_H
#define PARLEY_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "parley_fn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes (the first four as in parley.h). */
#define PLC_OK 0
#define PLC_ERR_ARG (-1)         /* an argument is out of range, null or inconsistent */
#define PLC_ERR_UNSUPPORTED (-2) /* the case (dtype, shape) is not implemented */
#define PLC_ERR_NOMEM (-3)       /* device or host memory allocation failed */
#define PLC_ERR_CUDA (-5)        /* a CUDA or cuBLAS call failed; see plc_ctx_error */
#define PLC_ERR_NO_DEVICE (-6)   /* no CUDA driver, or no usable device */

/* Element types: ggml type ids. */
#define PLC_F32 0
#define PLC_F16 1
#define PLC_Q4_0 2
#define PLC_Q4_1 3
#define PLC_Q5_0 6
#define PLC_Q5_1 7
#define PLC_Q8_0 8
#define PLC_Q2_K 10
#define PLC_Q3_K 11
#define PLC_Q4_K 12
#define PLC_Q5_K 13
#define PLC_Q6_K 14
#define PLC_IQ4_NL 20
#define PLC_IQ4_XS 23
#define PLC_BF16 30

/* Operations, for plc_supports. */
#define PLC_OP_MATMUL 1   /* dtype: weight type */
#define PLC_OP_GET_ROWS 2 /* dtype: table type */
#define PLC_OP_KV 3       /* dtype: KV-cache element type (store, attention, full attention) */
#define PLC_OP_COPY 4     /* dtype: source or destination type of plc_copy */
#define PLC_OP_UNARY 5    /* dtype: a function of parley_fn.h, of plc_unary and plc_glu */

/* plc_supports reports 1 if operation op handles element type dtype, else 0. */
int plc_supports(int op, int dtype);

/* plc_runtime_version writes the CUDA runtime version the library was built with (11080 for
 * 11.8). */
int plc_runtime_version(int32_t *version);

/* plc_device_count writes the number of CUDA devices the runtime sees. Without a driver, or with
 * no device, it returns PLC_ERR_NO_DEVICE and a message in err (errlen bytes, NUL-terminated). */
int plc_device_count(int32_t *count, char *err, size_t errlen);

typedef struct {
    char name[256];
    char pci_bus_id[32]; /* "0000:65:00.0", lower case */
    int32_t cc_major, cc_minor;
    int32_t sm_count;
    int64_t total_mem; /* bytes */
} plc_device_props;

/* plc_device_info describes CUDA device dev (0 <= dev < plc_device_count). */
int plc_device_info(int32_t dev, plc_device_props *out, char *err, size_t errlen);

typedef struct plc_ctx plc_ctx;

/* plc_ctx_new makes a context on device dev: a stream, a cuBLAS handle (TF32 on), scratch;
 * int8 tensor-core products on where the device has them (plc_ctx_set_mmq). */
int plc_ctx_new(int32_t dev, plc_ctx **out, char *err, size_t errlen);
/* plc_ctx_free waits for the context's work, then frees it (not the buffers made with it). */
void plc_ctx_free(plc_ctx *ctx);
/* plc_ctx_error returns the message of the context's last failure ("" if none). The string
 * belongs to the context and changes with the next failure. */
const char *plc_ctx_error(const plc_ctx *ctx);
/* plc_ctx_set_tf32: on != 0 lets F32 matrix products use TF32 tensor cores (10-bit mantissa
 * inputs, F32 accumulation); 0 computes them in full F32. */
int plc_ctx_set_tf32(plc_ctx *ctx, int32_t on);
/* plc_ctx_set_flash: mma != 0 computes attention over F16 and BF16 keys and values with query
 * tiles of 64 on tensor cores (mma.sync, compute capability 8.0 and later; PLC_ERR_UNSUPPORTED
 * before); 0 (the default) with tiles of 16 on the CUDA cores. Both keep the F16 and BF16 contract of
 * plc_attention. While TF32 is also on (plc_ctx_set_tf32), attention over F32 keys and values
 * takes the tensor cores too, with TF32 inputs: queries, keys, the online softmax's weights and
 * values rounded to 10-bit mantissas (to nearest), products accumulated in F32. */
int plc_ctx_set_flash(plc_ctx *ctx, int32_t mma);
/* plc_ctx_set_mmq: on != 0 (the default from compute capability 8.0) multiplies more than
 * eight rows of x by quantised weights on int8 tensor cores (mma.sync .s8; PLC_ERR_UNSUPPORTED
 * before 8.0), with x quantised as for eight rows or fewer, so that every batch size follows
 * llama.cpp's contract; 0 expands the weights to F16 for cuBLAS and rounds x to F16 (see
 * plc_matmul). */
int plc_ctx_set_mmq(plc_ctx *ctx, int32_t on);
/* plc_sync waits for all work queued on the context. */
int plc_sync(plc_ctx *ctx);
/* Graphs. Between plc_graph_begin and plc_graph_end the operations called on the context are
 * recorded, not run; plc_graph_end then runs them as one CUDA graph, which costs the host one
 * launch instead of one a kernel and lets the device run them without gaps. Each recording
 * updates the graph kept from the last (its kernels' arguments change from step to step) and
 * instantiates a new one only where the operations differ. While recording, calls that wait
 * (plc_sync, plc_download, plc_free, the sampling entry points), plc_upload (its source is not
 * pinned) and calls that would need more scratch or table memory than the context holds fail
 * with PLC_ERR_ARG and a message; the caller then calls plc_graph_abort and runs the operations
 * again without recording (which also grows the memory they needed).
 *
 * plc_graph_begin starts recording. plc_graph_end stops it and runs what was recorded; if it
 * fails, nothing recorded has run and the context is no longer recording. plc_graph_abort stops
 * recording and drops what was recorded (a no-op when not recording). plc_graph_stats writes
 * how many recordings ran, how many of those updated the kept graph and how many instantiated a
 * new one. */
int plc_graph_begin(plc_ctx *ctx);
int plc_graph_end(plc_ctx *ctx);
void plc_graph_abort(plc_ctx *ctx);
int plc_graph_stats(plc_ctx *ctx, int64_t *runs, int64_t *updates, int64_t *instantiations);

/* plc_mem_info writes the device's free and total memory in bytes. */
int plc_mem_info(plc_ctx *ctx, int64_t *free_bytes, int64_t *total_bytes);

/* plc_alloc allocates n bytes (n > 0) of zeroed device memory, 256-byte aligned. */
int plc_alloc(plc_ctx *ctx, size_t n, void **out);
/* plc_free frees device memory from plc_alloc after the work queued before it. */
int plc_free(plc_ctx *ctx, void *p);
/* plc_upload copies n bytes of host memory src to device dst. src must be pageable memory (as
 * Go's is), which CUDA stages before the call returns, so that src may be reused at once; the
 * copy takes effect in stream order. */
int plc_upload(plc_ctx *ctx, void *dst, const void *src, size_t n);
/* plc_download waits for all queued work, then copies n bytes of device src to host dst. */
int plc_download(plc_ctx *ctx, void *dst, const void *src, size_t n);
/* plc_memset0 zeroes n bytes of device memory, in stream order. */
int plc_memset0(plc_ctx *ctx, void *dst, size_t n);

/* plc_matmul: dst[i,j] = sum_l x[i,l]*w[j,l]. x [n, k] F32, w [m, k] of wtype, dst [n, m] F32;
 * all device, dst not overlapping x or w.
 *   F32 weights: cuBLAS SGEMM-class product (TF32 tensor cores unless turned off).
 *   F16, BF16: x is rounded to wtype (nearest even), products accumulate in F32 (n <= 8: a
 *   matrix-vector kernel that rounds x as it reads it; larger n: cuBLAS).
 *   Quantised (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS), n <= 8: x is
 *   quantised as llama.cpp quantises it for the weights' dot type (Q8_0 or Q8_1 blocks of 32 for
 *   the first six, Q8_K blocks of 256 for the K-quants and IQ4_XS), then a matrix-vector kernel
 *   takes integer dot products of the codes (dp4a; IQ4_NL's and IQ4_XS's codes are the signed
 *   values of their table) per 32 weights, scaled in F32. n > 8 (plc_ctx_set_mmq on, the default):
 *   the same quantisation and integer products, on int8 tensor cores. n > 8 otherwise: weights are
 *   expanded to F16 in tiles, x is rounded to F16, and cuBLAS multiplies them with F32
 *   accumulation; a row of x whose largest finite magnitude exceeds 65504 is divided by a power
 *   of two before the rounding and its products multiplied by it after, so that it does not
 *   overflow.
 * cuBLAS takes int sizes: n, m, k <= 2^31-1. */
int plc_matmul(plc_ctx *ctx, float *dst, const float *x, int64_t n, int64_t k, const void *w,
               int32_t wtype, int64_t m);

/* plc_matmuls: dst[i] = x · w[i]^T for count (1..4) matrices w[i] [m[i], k] of one type wtype,
 * each bit for bit what plc_matmul gives it; against eight rows of x or fewer and weights other
 * than F32, all in one launch (a layer's query, key and value products), and against more rows
 * of quantised weights on the int8 tensor cores, with x quantised once. No dst[i] may overlap
 * x, a w[j] or another dst[j]. */
int plc_matmuls(plc_ctx *ctx, int32_t count, float *const *dst, const float *x, int64_t n, int64_t k,
                const void *const *w, int32_t wtype, const int64_t *m);

/* plc_get_rows: dst[i,:] = float(table[ids[i],:]). table [rows, cols] of dtype (device),
 * dst [n, cols] F32 (device), ids host [n], each in [0, rows). */
int plc_get_rows(plc_ctx *ctx, float *dst, const void *table, int32_t dtype, int64_t rows,
                 int64_t cols, const int32_t *ids, int64_t n);

/* plc_add_rows: dst[i,:] = a[i,:] + b[i % b_rows,:], b_rows 1 or n. [n, d]; dst may be a. */
int plc_add_rows(plc_ctx *ctx, float *dst, const float *a, const float *b, int64_t n, int64_t d,
                 int64_t b_rows);

/* plc_rms_norm: dst[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * w. x, dst [n, d], w [d].
 * dst may be x. */
int plc_rms_norm(plc_ctx *ctx, float *dst, const float *x, const float *w, int64_t n, int64_t d,
                 float eps);

/* plc_layer_norm: dst[i,:] = (x[i,:] - mean) / sqrt(var + eps) * w + b, the biased variance of
 * row i. x, dst [n, d]; w, b [d]. dst may be x. */
int plc_layer_norm(plc_ctx *ctx, float *dst, const float *x, const float *w, const float *b,
                   int64_t n, int64_t d, float eps);

/* plc_scale: dst[i] = x[i] * s for i < len (device), s finite. dst may be x. */
int plc_scale(plc_ctx *ctx, float *dst, const float *x, float s, int64_t len);

/* plc_unary: dst[i] = f(x[i]) for i < len (device), f the function fn of parley_fn.h
 * (PL_FN_RELU ...), computed with CUDA's float functions (expf, tanhf, erfcf, expm1f; GELU's
 * tanh form as 0.5*x*(1 + tanhf(sqrt(2/pi)*(x + 0.044715*x^3)))); PLC_ERR_UNSUPPORTED for
 * another fn. dst may be x. */
int plc_unary(plc_ctx *ctx, int fn, float *dst, const float *x, int64_t len);

/* plc_glu: dst[i] = f(gate[i]) * up[i] for i < len, f as plc_unary's (PL_FN_SILU: SwiGLU,
 * PL_FN_GELU: GeGLU, PL_FN_SIGMOID: GLU). dst may be gate or up. */
int plc_glu(plc_ctx *ctx, int fn, float *dst, const float *gate, const float *up, int64_t len);

/* plc_copy converts len elements: F32 to F16 (nearest even), F16 to F32, or copies between
 * buffers of one type (F32, F16, BF16). Buffers must not overlap. */
int plc_copy(plc_ctx *ctx, void *dst, int32_t dst_type, const void *src, int32_t src_type,
             int64_t len);

/* plc_im2col_1d: for x [t_in, c] and t_out = (t_in + 2*pad - kernel)/stride + 1,
 * dst[t, ci*kernel + kk] = x[t*stride + kk - pad, ci], or 0 outside rows 0..t_in-1.
 * dst [t_out, c*kernel]. */
int plc_im2col_1d(plc_ctx *ctx, float *dst, const float *x, int64_t t_in, int64_t c,
                  int32_t kernel, int32_t stride, int32_t pad, int64_t t_out);

/* ---- Operations of convolutional encoders and transducers (Parakeet) ---- */

/* The geometry of a 2-D convolution over an image of h rows of w pixels (x [h*w, c], pixel
 * (ih, iw) in row ih*w+iw): kernel kh x kw, strides sh, sw, zero padding ph rows above and below
 * and pw columns left and right; ho = (h+2ph-kh)/sh+1 output rows of wo = (w+2pw-kw)/sw+1. Every
 * size >= 1, paddings >= 0, the kernel no larger than the padded image. */
typedef struct {
    int64_t h, w, kh, kw, sh, sw, ph, pw;
} plc_conv_geom;

/* plc_im2col_2d: for output pixel o = oh*wo+ow of a convolution of x [h*w, c],
 * dst[o, ch*kh*kw + i*kw + j] = x[(oh*sh+i-ph)*w + ow*sw+j-pw, ch], or 0 outside the image.
 * dst [ho*wo, c*kh*kw] does not overlap x. */
int plc_im2col_2d(plc_ctx *ctx, float *dst, const float *x, int64_t c, const plc_conv_geom *g);

/* plc_depthwise_conv_2d: dst[o, ch] = b[ch] + sum over the taps (i, j) inside the image of
 * w[ch, i*kw+j] * x[tap, ch], in tap order. x [h*w, c], w [c, kh*kw], b [c], dst [ho*wo, c]
 * overlapping none of them. */
int plc_depthwise_conv_2d(plc_ctx *ctx, float *dst, const float *x, const float *w, const float *b,
                          int64_t c, const plc_conv_geom *g);

/* Relative-position attention heads: n_head heads of head_dim (at most 1024), scores scaled by
 * scale, window 0 (whole clips) or the largest distance attended to. */
typedef struct {
    int32_t n_head, head_dim;
    float scale;
    int32_t window;
} plc_relpos_cfg;

/* plc_relpos_attention: self-attention with Transformer-XL's relative positions over n_clips
 * clips (host array clips, each >= 1 row, together n): for rows i, j of one clip and head h,
 * s(i,j) = scale * ((q[i,h] + u[h]).k[j,h] + (q[i,h] + bv[h]).p[half-(i-j), h]), and dst[i,h] the
 * softmax-weighted sum of v[j,h] over the j with |i-j| <= window (all when 0), half =
 * (p_rows-1)/2 covering every such distance. One block per row and head, keys in tiles with a
 * running softmax. q, k, v, dst [n, n_head*head_dim]; p [p_rows, ...]; u, bv [n_head*head_dim]. */
int plc_relpos_attention(plc_ctx *ctx, float *dst, const float *q, const float *k, const float *v,
                         const float *p, int64_t p_rows, const float *u, const float *bv,
                         const int32_t *clips, int64_t n_clips, const plc_relpos_cfg *a);

/* plc_lstm_cell: for each row r < n of gates [n, 4p] in blocks [i, f, o, g],
 * c[r,:] = sigmoid(f)*c[r,:] + sigmoid(i)*tanh(g) and h[r,:] = sigmoid(o)*tanh(c[r,:]) (expf,
 * tanhf). c, h [n, p]; no two of h, c and gates overlap. */
int plc_lstm_cell(plc_ctx *ctx, float *h, float *c, const float *gates, int64_t n, int64_t p);

/* Rotary embedding. */
#define PLC_ROPE_NORMAL 0 /* pairs (2i, 2i+1) */
#define PLC_ROPE_NEOX 1   /* pairs (i, i+dims/2) */
typedef struct {
    int32_t mode;     /* PLC_ROPE_NORMAL or PLC_ROPE_NEOX */
    int32_t head_dim; /* elements of a head */
    int32_t dims;     /* rotated elements, even, <= head_dim */
    float base;       /* frequency base */
    float freq_scale; /* position multiplier */
    const float *freq_factors; /* host [dims/2], finite values above 0, or NULL for none */
    float mscale;     /* multiplies cos and sin (LongRoPE's attention factor); 0 means 1 */
    float ext_factor; /* YaRN when not 0 (0 to 1), as pl_rope */
    float corr_dims[2];
} plc_rope_cfg;

/* plc_rope rotates x [n, n_head*head_dim] (device) in place; token i is at position pos[i] >= 0
 * (host [n]). Pair i turns by theta = (p*freq_scale) * base^(-2i/dims) / freq_factors[i], in
 * F32 with powf and sincosf (full-range argument reduction), its cosine and sine multiplied by
 * mscale. */
int plc_rope(plc_ctx *ctx, float *x, int64_t n, int32_t n_head, const plc_rope_cfg *r,
             const int32_t *pos);

/* plc_store_kv writes k and v [n, width] F32 (device) into rows slot[i] (host [n]) of the
 * caches kc and vc [slots, width] of kvtype (F32, or F16 or BF16 rounded to nearest even). */
int plc_store_kv(plc_ctx *ctx, void *kc, void *vc, int32_t kvtype, int64_t slots,
                 int64_t width, const float *k, const float *v, int64_t n, const int32_t *slot);

/* One sequence of an attention batch, as pl_seq: tokens [start, start+count) of the batch are at
 * positions ctx_len-count .. ctx_len-1; cache position j is in slot
 * blocks[blocks_off + j/block_size]*block_size + j%block_size. */
typedef struct {
    int32_t start, count, ctx_len;
    int32_t blocks_off, n_blocks;
} plc_seq;

typedef struct {
    int32_t n_head, n_kv_head, head_dim;
    float scale;
} plc_attn_cfg;

/* plc_attention: causal attention over a block KV cache, as pl_attention: for each sequence,
 * each of its tokens i at position p and each query head h, dst[i,h] = softmax_j(scale *
 * q[i,h].K[j,h']) . V[j,h'] over j = 0..p, h' = h/(n_head/n_kv_head). q, dst [n,
 * n_head*head_dim] F32 (device, not overlapping); kc, vc [slots, width] of kvtype (device),
 * width = n_kv_head*head_dim; seqs host [n_seqs], blocks host [n_blocks_total]. head_dim <= 256.
 *
 * With an F16 (BF16) cache the query is rounded to F16 (BF16) before q.K and the normalised
 * weights softmax(...)_j are rounded to F16 (BF16) before p.V (the backend contract); sums are
 * F32.
 *
 * Sequences of at least two tokens with head_dim 64, 80 or 128 go through a flash-attention
 * kernel (tiles of 16 queries by 32 keys in shared memory, or 64 queries on tensor cores as
 * plc_ctx_set_flash says; online softmax, F32 accumulation; with an F16 or BF16 cache a first
 * pass over the keys finds each row's maximum and sum, so that the second can round normalised
 * weights). Other tokens go through a decode kernel whose blocks serve the query heads of one
 * kv head together (up to eight; grouped-query attention reads each key and value once for
 * them), and that splits long contexts along the keys across blocks and combines the parts.
 * Tokens of the batch in no sequence are left untouched. */
int plc_attention(plc_ctx *ctx, float *dst, const float *q, int64_t n, const void *kc,
                  const void *vc, int32_t kvtype, int64_t slots, int64_t width,
                  int64_t block_size, const plc_attn_cfg *a, const plc_seq *seqs,
                  int64_t n_seqs, const int32_t *blocks, int64_t n_blocks_total);

/* plc_full_attention: unmasked attention of q [n, n_head*head_dim] over k, v [m,
 * n_kv_head*head_dim] of kvtype (F32, F16 or BF16), all device; m >= 1. Roundings as plc_attention. */
int plc_full_attention(plc_ctx *ctx, float *dst, const float *q, int64_t n, const void *k,
                       const void *v, int32_t kvtype, int64_t m, const plc_attn_cfg *a);

/* plc_argmax waits, then writes ids[i] (host [n]) = the index of the largest element of row i
 * of logits [n, vocab] (device); the lowest index among equal maxima; -1 for a row that holds a
 * NaN or +Inf, or no element above -Inf. */
int plc_argmax(plc_ctx *ctx, const float *logits, int64_t n, int64_t vocab, int32_t *ids);

/* How plc_draw chooses the token of one row (Go's backend.Draw has this layout). */
typedef struct {
    float temperature; /* 0: the argmax (as plc_argmax; the rest unread); > 0: the draw's temperature */
    int32_t top_k;     /* keep the top_k largest logits (ties at the boundary all kept); 0: all */
    float top_p;       /* then the smallest top set holding top_p of their mass; 1: all */
    float min_p;       /* then those at least min_p times as likely as the most likely; 0: off */
    uint64_t random;   /* the row's random draw: u = (random >> 40) * 2^-24, in [0, 1) */
} plc_draw_row;

/* plc_draw waits, then writes ids[i] (host [n]) for each row i of logits [n, vocab] (device) as
 * rows[i] (host [n]) says, as llama.cpp's sampler chain draws: the candidates are chosen at
 * temperature 1 (top-k, then top-p by mass exp(x - max x), then min-p: x >= max x + log min_p),
 * and the token is drawn from them with weights exp((x - max x)/temperature): the first, in id
 * order, at which the running weight exceeds u times their total. -1 for a row that holds a NaN
 * or +Inf, or no element above -Inf. */
int plc_draw(plc_ctx *ctx, const float *logits, int64_t n, int64_t vocab, const plc_draw_row *rows,
             int32_t *ids);

/* plc_beam_step: one step of beam search over logits [beams, vocab] (device). Candidate
 * (b, t) scores scores[b] + log_softmax(logits[b])[t] (scores host [beams], running sums of
 * log-probabilities). The k best candidates over beams x vocab (ties: lower beam, then lower
 * token first) are written, best first, to the host arrays out_beam, out_token, out_score (the
 * new running sums) and out_norm (out_score / length^length_penalty, the score a finished
 * hypothesis of `length` tokens is compared by). 1 <= k <= vocab, beams*k <= 4096. Waits. */
int plc_beam_step(plc_ctx *ctx, const float *logits, int32_t beams, int64_t vocab,
                  const float *scores, int32_t length, float length_penalty, int32_t k,
                  int32_t *out_beam, int32_t *out_token, float *out_score, float *out_norm);

/* plc_choice says how a row of a decoder's logits is filtered before its best tokens are chosen
 * (plc_choose): the ids of every cut [lo, hi) (lo >= hi: none) and drop[d0..d1) of the call's
 * drop list are set to -inf; the row's log-softmax is taken; the ids from split up form a group
 * (vocab: none), and when log sum exp over the group exceeds every id below split, those ids are
 * set to -inf (not renormalised). probe (-1: none) is an id whose log-probability in the row as
 * it came is reported. temperature > 0 divides the row before filtering (taken relative to its
 * largest value first where that would overflow; 1/temperature at most FLT_MAX), and one token
 * is drawn instead of the k best: the first id at which the running sum of exp(log-probability),
 * in id order, exceeds u times their total, u = (random mod 2^53) * 2^-53 (the last id above
 * -inf where rounding leaves none). Laid out as the Go backend.Choice. */
typedef struct {
    int32_t cut[4][2];
    int32_t drop[2];
    int32_t split;
    int32_t probe;
    float temperature;
    uint64_t random;
} plc_choice;

/* plc_chosen is what plc_choose reports of a row: n tokens found (at most k; 1 for a draw; -1 for a row that
 * holds a NaN or +inf or nothing above -inf, before filtering where it probes, or after); the
 * group's most probable id (the lowest among equal float probabilities; -1: none) and its
 * probability over the group's total + 1e-10; the probe's log-probability (0: none). Laid out as
 * the Go backend.Chosen. */
typedef struct {
    int32_t n;
    int32_t group;
    float share;
    float probe;
} plc_chosen;

/* plc_choose waits, then for each row i of logits [n, vocab] (device) applies choices[i] (host
 * [n]; drop: host [ndrop] ids) and writes rows[i] (host [n]) and the k most probable tokens
 * after filtering, most probable first (the lower id first among equals), or the one drawn, to
 * ids[i*k..] and their log-probabilities to logp[i*k..] (host [n*k]; -1 and -inf past the n
 * found). Sums are float64. 1 <= k <= vocab; k <= 64 and vocab <= 327680, else
 * PLC_ERR_UNSUPPORTED. */
int plc_choose(plc_ctx *ctx, const float *logits, int64_t n, int64_t vocab, const plc_choice *choices,
               const int32_t *drop, int32_t ndrop, int32_t k, plc_chosen *rows, int32_t *ids, float *logp);

/* ---- Operations of streaming codecs and flow-matching heads (Pocket TTS) ---- */

/* plc_mul: dst[i,:] = a[i,:] * b[i % b_rows,:] elementwise, b_rows 1 or n. [n, d]; dst may be
 * a, and b when b_rows is n. */
int plc_mul(plc_ctx *ctx, float *dst, const float *a, const float *b, int64_t n, int64_t d,
            int64_t b_rows);

/* ---- Greedy transducer decoding on the device (Parakeet TDT and RNN-T) ---- */

/* A greedy decoding state of n rows is one device int32 array st: PLC_TDT_FIELDS fields of n
 * values each (field f of row i at st[f*n + i]), then each row's ring of `ring` emitted tokens:
 * ids [n, ring], frames [n, ring], duration indices [n, ring] (int32), then p [n, ring] and plog
 * [n, ring] (float). Row i's token number c (counting from its start) is at i*ring + c%ring. */
#define PLC_TDT_FRAME 0  /* the frame the next joint row reads */
#define PLC_TDT_RUN 1    /* zero-duration tokens emitted at that frame */
#define PLC_TDT_END 2    /* the frame after the row's last */
#define PLC_TDT_DONE 3   /* 1: the row has reached its end (or failed) */
#define PLC_TDT_EMIT 4   /* 1: the last decision emitted TOK (the prediction network must take it) */
#define PLC_TDT_TOK 5    /* the last token decided (the blank when none) */
#define PLC_TDT_IDX 6    /* FRAME clamped to [0, END): the encoder row the next joint reads */
#define PLC_TDT_COUNT 7  /* tokens emitted since the row's start */
#define PLC_TDT_BAD 8    /* 1: the row's token (or duration) logits were all NaN */
#define PLC_TDT_FIELDS 9
#define PLC_TDT_MAX_DURATIONS 16

/* The greedy rule: n_tok token logits (the blank last), then n_dur duration logits (0: an RNN-T)
 * advancing durations[d] frames; max_symbols zero-duration tokens at a frame before it is
 * forced on; ring entries per row. */
typedef struct {
    int32_t n_tok, n_dur, max_symbols, ring;
    int32_t durations[PLC_TDT_MAX_DURATIONS];
} plc_tdt_cfg;

/* plc_tdt_start (re)starts row of st (device, n rows) at frame `frame` (0 <= frame) of a clip of
 * end frames, with no zero-duration run and no token emitted yet: TOK is tok, and the
 * prediction network is to take it when emit is set (EMIT; a clip's start: the blank, emit 1).
 * The row is DONE when frame >= end. */
int plc_tdt_start(plc_ctx *ctx, int32_t *st, int64_t n, int64_t row, int32_t frame, int32_t end, int32_t tok, int32_t emit);

/* plc_tdt_decide applies the rule to row i of logits [n, n_tok+n_dur] (device) for each row of
 * st not DONE, as Go's decode.TDT.Step does: k and d the first maxima (NaN never counting) of
 * the token and duration logits; a blank moves FRAME on by max(durations[d], 1); another token
 * goes to the row's ring with its frame, d, p = 1/sum_{j<n_tok} exp(z_j - z_k) and plog = z_k -
 * logsumexp(z) (sums in double), and FRAME moves on by durations[d] when above 0, else RUN grows
 * and at max_symbols FRAME moves on by one. A row whose FRAME reaches END is DONE; one whose
 * logits are all NaN is BAD and DONE. */
int plc_tdt_decide(plc_ctx *ctx, const float *logits, int64_t n, int64_t width, const plc_tdt_cfg *cfg, int32_t *st);

/* plc_tdt_gather: dst[i,:] = table[st[field*n + i],:] for the n rows of dst [n, cols] F32
 * (device), field PLC_TDT_IDX or PLC_TDT_TOK. With tables (host [n] device addresses, F32) row i
 * reads tables[i] instead of table; table (device) is F32 or F16 (dtype). The indices are the
 * state's own, in range by construction: nothing is checked on the host. */
int plc_tdt_gather(plc_ctx *ctx, float *dst, const void *const *tables, const void *table, int32_t dtype, int64_t cols,
                   const int32_t *st, int64_t n, int32_t field);

/* plc_tdt_keep: dst[i,:] = src[i,:] for each row i of [n, cols] F32 (device) whose EMIT is set
 * in st; the other rows of dst are left as they are. */
int plc_tdt_keep(plc_ctx *ctx, float *dst, const float *src, int64_t cols, const int32_t *st, int64_t n);

/* ---- Transducer beam search on the device (Parakeet TDT and RNN-T) ---- */

/* A beam state of n streams of width w (1 to PLC_TDTB_MAX_WIDTH) keeps w hypothesis rows per
 * stream (row s*w + j, rows = n*w), in one device buffer laid out as:
 *   double score[rows]                 the hypotheses' scores
 *   uint64 hash[rows]                  a hash of each one's token sequence
 *   int32  hyp[PLC_TDTB_HFIELDS][rows] per-hypothesis fields (PLC_TDTB_H*)
 *   int32  stream[PLC_TDTB_SFIELDS][n] per-stream fields (PLC_TDTB_S*)
 *   node   nodes[n][cap]               each stream's pool of emitted tokens
 * A node is six 32-bit words: token, frame, duration index, parent node (-1: none), then p and
 * plog as floats (decode.TDTStep's). A hypothesis points at its last token's node; nodes are
 * never freed before the stream restarts. The hypothesis fields PRED, TOK and IDX have the greedy
 * state's numbers (PLC_TDT_EMIT, _TOK, _IDX), so plc_tdt_gather and plc_tdt_keep read the
 * hypothesis block as a greedy state of rows rows (ring 1). */
#define PLC_TDTB_HFRAME 0   /* the frame the hypothesis reads next */
#define PLC_TDTB_HRUN 1     /* zero-duration tokens it emitted at that frame */
#define PLC_TDTB_HNODE 2    /* its last token's node, -1 none */
#define PLC_TDTB_HNTOK 3    /* its token count */
#define PLC_TDTB_HPRED 4    /* 1: its last round emitted TOK: the prediction network must take it */
#define PLC_TDTB_HTOK 5     /* the prediction network's next input (the blank at a start) */
#define PLC_TDTB_HIDX 6     /* FRAME clamped to [0, END): the encoder row its joint reads */
#define PLC_TDTB_HPARENT 7  /* the row whose prediction state the row takes in plc_tdtb_gather */
#define PLC_TDTB_HFIELDS 16 /* (14 at least: a greedy state of ring 1) */
#define PLC_TDTB_SEND 0     /* the stream's frame count */
#define PLC_TDTB_SDONE 1    /* 1: every hypothesis has finished (or the stream failed) */
#define PLC_TDTB_SBAD 2     /* 1: an expanded joint row held a NaN, +Inf, or no finite maximum; 2: the node pool is full */
#define PLC_TDTB_SNHYP 3    /* hypotheses in the beam (rows s*w to s*w+NHYP-1, best first) */
#define PLC_TDTB_SNODES 4   /* nodes used */
#define PLC_TDTB_SROUNDS 5  /* rounds made since the start */
#define PLC_TDTB_SWIDTH 6   /* the stream's beam width, 1 to w: hypotheses kept, pairs taken from each row */
#define PLC_TDTB_SFIELDS 8
#define PLC_TDTB_NODE_WORDS 6
#define PLC_TDTB_MAX_WIDTH 8

/* The search: the greedy rule's logits, durations and max_symbols (plc_tdt_cfg), the width w, lse
 * 1 to merge hypotheses by log-sum-exp (0: keep the better), cap nodes per stream. */
typedef struct {
    int32_t n_tok, n_dur, max_symbols, width, lse, cap;
    int32_t durations[PLC_TDT_MAX_DURATIONS];
} plc_tdtb_cfg;

/* plc_tdtb_start (re)starts stream s of beam state st (n streams) at frame 0 of a clip of end
 * frames with a beam of width (1 to the state's w): one hypothesis, no tokens, score 0, its
 * prediction network to take the blank. end 0 makes the stream done. */
int plc_tdtb_start(plc_ctx *ctx, void *st, int64_t n, const plc_tdtb_cfg *cfg, int64_t s, int32_t end, int32_t width,
                   int32_t blank);

/* plc_tdtb_round makes one round of Go's decode.TDTBeamSearch for every stream not done, one
 * block a stream: logits [n*w, n_tok+n_dur] hold each hypothesis row's joint row at its IDX.
 * The hypotheses at the stream's lowest frame t are expanded: log-softmax in double over the
 * token logits and, separately, the duration logits; the w best (token, duration) pairs of each;
 * moves by the greedy rule; candidates (waiting hypotheses, then the expansions) in the same state
 * (same token sequence: length, hash, then the node chains compared; same frame and run) merged;
 * the stream's WIDTH best kept with the host's tie-breaking (each row gives its WIDTH best pairs). The new hypotheses are written best first, each
 * row's PARENT the row whose state it continues, PRED set where it emitted a token. When all have
 * reached END the stream is finished (hypotheses of the same tokens merged, sorted) and DONE. */
int plc_tdtb_round(plc_ctx *ctx, const float *logits, int64_t n, int64_t width, const plc_tdtb_cfg *cfg, void *st);

/* plc_tdtb_gather: dst[r,:] = src[PARENT of r,:] for the rows = n*w rows of [rows, cols] F32
 * (device); dst and src must not overlap. */
int plc_tdtb_gather(plc_ctx *ctx, float *dst, const float *src, int64_t cols, const void *st, int64_t n, int32_t w);

/* plc_ctx_downloads reports how many times the context has copied device memory to the host
 * (plc_download and the entry points that wait and return results). */
int plc_ctx_downloads(plc_ctx *ctx, int64_t *n);

#ifdef __cplusplus
}
#endif

#endif /* PARLEY_CUDA_H */
