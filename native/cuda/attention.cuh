// attention.cuh: attention over a block KV cache (plc_attention) and over dense keys and values
// (plc_full_attention), shared by the decode and flash kernels.
#ifndef PLC_ATTENTION_CUH
#define PLC_ATTENTION_CUH

#include "internal.cuh"

// A tile is the unit of attention work: nq consecutive query rows row0.. of one sequence, query r
// at position pos0+r seeing keys 0 .. min(kvlen, pos0+r+1)-1. Key j is in cache slot
// blocks[boff + j/block_size]*block_size + j%block_size, or row j of dense keys. Unmasked
// attention uses pos0 = PLC_NO_MASK.
struct plc_tile {
    int32_t row0, nq, pos0, boff, kvlen;
};
#define PLC_NO_MASK (1 << 30)

// Flash-attention tiles: PLC_FA_BQ queries by PLC_FA_BK keys.
#define PLC_FA_BQ 16
#define PLC_FA_BK 32
// Tensor-core flash tiles (compute capability 8.0 and later, when the context asks for them):
// PLC_FM_BQ queries (four warps of sixteen) by PLC_FM_BK keys (F16) or PLC_FT_BK (F32 as TF32).
#define PLC_FM_BQ 64
#define PLC_FM_BK 64
// Longest key range one decode block handles (its scores stay in shared memory), and the
// dynamic shared memory a decode block may take: the default limit of 48 KiB, static and dynamic
// together, less a margin for the kernel's static arrays.
#define PLC_DEC_MAX_CHUNK 2048
#define PLC_DEC_SMEM (48 * 1024 - 512)
#define PLC_MAX_HEAD_DIM 256

// plc_flash_head_dim reports whether the flash kernel is compiled for head dimension hd.
static inline int plc_flash_head_dim(int hd) { return hd == 64 || hd == 80 || hd == 128; }

// plc_flash_rows returns how many queries a flash tile holds for these keys, values and output:
// PLC_FM_BQ where a tensor-core kernel takes them (plc_flash_tc), else PLC_FA_BQ.
int plc_flash_rows(const plc_ctx *ctx, int kvtype, int64_t width, const void *kc, const void *vc, const float *dst);

// plc_flash_tc returns which tensor-core flash kernel takes these keys and values: PLC_TC_F16
// and PLC_TC_BF16 (mma.sync with F16 or BF16 inputs), PLC_TC_TF32 (F32 keys and values as TF32 inputs, while TF32 is on),
// or PLC_TC_NONE where the CUDA-core kernel does (plc_ctx_set_flash off, keys or values not
// 16-byte aligned, dst not 8-byte aligned).
enum { PLC_TC_NONE = 0, PLC_TC_F16 = 1, PLC_TC_TF32 = 2, PLC_TC_BF16 = 3 };
int plc_flash_tc(const plc_ctx *ctx, int kvtype, int64_t width, const void *kc, const void *vc, const float *dst);

// plc_flash_mma_built reports whether the library holds the tensor-core kernel for the current
// device (code for compute capability 8.0 or later).
int plc_flash_mma_built(void);

// plc_attend runs the tiles: flash tiles (nq up to plc_flash_rows; head dims of plc_flash_head_dim)
// and decode tiles (nq == 1, any head dim up to PLC_MAX_HEAD_DIM). Tables are host arrays;
// blocks may be null for dense keys and values (then bs is ignored).
int plc_attend(plc_ctx *ctx, float *dst, const float *q, int64_t qstride, const void *kc, const void *vc, int kvtype,
               int64_t width, int bs, const int32_t *blocks, int64_t n_blocks, const plc_tile *flash, int64_t n_flash,
               const plc_tile *dec, int64_t n_dec, int max_kv, const plc_attn_cfg *a);

#endif
