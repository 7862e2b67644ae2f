// blas.cu: opening cuBLAS at run time (see blas.cuh).
#include <dlfcn.h>
#include <stdio.h>

#include <mutex>

#include "blas.cuh"

static plc_blas_api plc_blas_table;
static const plc_blas_api *plc_blas_ok;
static char plc_blas_why[512];
static std::once_flag plc_blas_once;

static void plc_blas_open() {
    char name[64];
    // The runtime's major version names the library (libcublas.so.11 for CUDA 11.x).
    snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(plc_blas_why, sizeof plc_blas_why, "cannot open %s (install CUDA %d's cuBLAS): %s", name, CUBLAS_VER_MAJOR,
                 e ? e : "unknown error");
        return;
    }
    struct {
        const char *sym;
        void **slot;
    } syms[] = {
        {"cublasCreate_v2", (void **)&plc_blas_table.create},
        {"cublasDestroy_v2", (void **)&plc_blas_table.destroy},
        {"cublasSetStream_v2", (void **)&plc_blas_table.set_stream},
        {"cublasGemmEx", (void **)&plc_blas_table.gemm_ex},
    };
    for (auto &s : syms) {
        *s.slot = dlsym(h, s.sym);
        if (*s.slot == NULL) {
            snprintf(plc_blas_why, sizeof plc_blas_why, "%s has no %s", name, s.sym);
            return;
        }
    }
    plc_blas_ok = &plc_blas_table;
}

const plc_blas_api *plc_blas(const char **why) {
    std::call_once(plc_blas_once, plc_blas_open);
    if (plc_blas_ok == NULL && why != NULL) *why = plc_blas_why;
    return plc_blas_ok;
}
