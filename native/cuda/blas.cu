// blas.cu: opening cuBLAS at run time (see blas.cuh).
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <mutex>

#include "blas.cuh"

static plc_blas_api plc_blas_table;
static const plc_blas_api *plc_blas_ok;
static char plc_blas_why[512];
static std::once_flag plc_blas_once;

static void plc_blas_open() {
    char name[64], first[256] = "";
    // The runtime's major version names the library (libcublas.so.11 for CUDA 11.x): first where
    // the loader looks, then in the toolkit's own directories, which a CUDA installation does not
    // always add to the loader's path.
    snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(first, sizeof first, "%s", e ? e : "unknown error");
        const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
        char path[1024];
        for (const char *home : homes) {
            if (home == NULL || home[0] == '\0') continue;
            snprintf(path, sizeof path, "%s/lib64/%s", home, name);
            if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL) break;
        }
        if (h == NULL) {
            snprintf(path, sizeof path, "/usr/local/cuda-%d/lib64/%s", CUBLAS_VER_MAJOR, name);
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (h == NULL) {
        snprintf(plc_blas_why, sizeof plc_blas_why,
                 "cannot open %s (install CUDA %d's cuBLAS, or add its directory to LD_LIBRARY_PATH): %s", name,
                 CUBLAS_VER_MAJOR, first);
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
    plc_blas_table.set_workspace = (cublasStatus_t(*)(cublasHandle_t, void *, size_t))dlsym(h, "cublasSetWorkspace_v2");
    plc_blas_ok = &plc_blas_table;
}

const plc_blas_api *plc_blas(const char **why) {
    std::call_once(plc_blas_once, plc_blas_open);
    if (plc_blas_ok == NULL && why != NULL) *why = plc_blas_why;
    return plc_blas_ok;
}
