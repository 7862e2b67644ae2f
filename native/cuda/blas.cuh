// blas.cuh: cuBLAS, opened at run time. The few entry points the kernels use are looked up in
// libcublas.so.<major> with dlopen the first time a context starts, so that the library is linked
// into no binary (static cuBLAS adds about 700 MB to every executable) and a machine without it
// gets an error from the CUDA backend instead of a program that cannot start.
#ifndef PLC_BLAS_CUH
#define PLC_BLAS_CUH

#include <cublas_v2.h>

struct plc_blas_api {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    // NULL when the library has none (it appeared in CUDA 11): the handle then keeps its own.
    cublasStatus_t (*set_workspace)(cublasHandle_t, void *, size_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *, const void *,
                              cudaDataType, int, const void *, cudaDataType, int, const void *, void *, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
};

// plc_blas returns the cuBLAS entry points, or NULL with a message (static storage) in *why
// when the library cannot be opened.
const plc_blas_api *plc_blas(const char **why);

#endif
