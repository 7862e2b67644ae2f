// cublas.cc: libcublas.so.12 for the CUDA emulation: the entry points native/cuda opens
// (blas.cu), with cublasGemmEx (column-major, as cuBLAS) through OpenBLAS's sgemm: F32, F16 and
// BF16 inputs widened to float, F32 or F16 outputs; under CUBLAS_COMPUTE_32F_FAST_TF32 the inputs
// are first rounded to TF32 (10 bits of mantissa), as tensor cores take them.
#include <cblas.h>

#include <vector>

#include "cublas_v2.h"

struct emu_cublas {
    cudaStream_t stream;
};

static float load(const void *p, cudaDataType t, long i) {
    switch (t) {
        case CUDA_R_32F: return ((const float *)p)[i];
        case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
        case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
        default: return NAN;
    }
}

static float tf32(float v) { return __uint_as_float(emu_tf32_rna(v)); }

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = new emu_cublas{nullptr};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void *, size_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
    if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || (ct != CUDA_R_32F && ct != CUDA_R_16F)) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
    const float a = *(const float *)alpha, b = *(const float *)beta;
    const bool fast = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    // The product is queued on the handle's stream: it runs now, or joins a graph being captured.
    // The operands are widened to float (rounded to TF32 where asked) in their own layouts, and
    // OpenBLAS multiplies them.
    auto run = [=]() {
        auto widen = [fast](const void *p, cudaDataType t, long n) {
            std::vector<float> f(n);
            for (long i = 0; i < n; i++) f[i] = fast ? tf32(load(p, t, i)) : load(p, t, i);
            return f;
        };
        const std::vector<float> af = widen(A, at, (long)lda * (ta == CUBLAS_OP_N ? k : m));
        const std::vector<float> bf = widen(B, bt, (long)ldb * (tb == CUBLAS_OP_N ? n : k));
        std::vector<float> cf((size_t)ldc * n, 0.f);
        if (b != 0.f)
            for (long i = 0; i < (long)ldc * n; i++) cf[i] = load(C, ct, i);
        if (m > 0 && n > 0)
            cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                        m, n, k, a, af.data(), lda, bf.data(), ldb, b, cf.data(), ldc);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const long o = (long)j * ldc + i;
                if (ct == CUDA_R_32F) ((float *)C)[o] = cf[o];
                else ((__half *)C)[o] = __float2half_rn(cf[o]);
            }
    };
    static const char gemm_kernel = 0;
    emu::cfg(dim3(1), dim3(1), 0, h->stream).run(&gemm_kernel, run);
    return CUBLAS_STATUS_SUCCESS;
}
}
