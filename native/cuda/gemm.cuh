// gemm.cuh: matrix products (plc_matmul).
#ifndef PLC_GEMM_CUH
#define PLC_GEMM_CUH

// plc_matmul_supports reports whether plc_matmul takes weights of type dt.
int plc_matmul_supports(int dt);

// Quantised products of at most this many activation rows use the matrix-vector kernel; larger
// ones the int8 tensor-core kernel, or (plc_ctx_set_mmq off) expand the weights to F16 for
// cuBLAS.
#define PLC_GEMV_MAX_ROWS 8

// plc_mmq_built reports whether the int8 tensor-core kernel was compiled for the current device
// (compute capability 8.0 and later).
int plc_mmq_built(void);

#endif
