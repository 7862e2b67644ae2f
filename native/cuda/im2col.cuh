// im2col.cuh: the input layout of a 1-D convolution computed as a matrix product
// (plc_im2col_1d).
#ifndef PLC_IM2COL_CUH
#define PLC_IM2COL_CUH
#endif
