// elementwise.cuh: element-by-element operations (plc_add_rows, plc_scale, plc_unary, plc_glu).
#ifndef PLC_ELEMENTWISE_CUH
#define PLC_ELEMENTWISE_CUH

#include "internal.cuh"

// plc_grid1d returns the number of blocks of `threads` for a grid-stride loop over len
// elements: enough to cover them, at most 32 per multiprocessor.
int plc_grid1d(plc_ctx *ctx, int64_t len, int threads);

// plc_unary_supports reports whether plc_unary and plc_glu compute the function fn.
int plc_unary_supports(int fn);

#endif
