// nvml.cc: libnvidia-ml.so.1 for the CUDA emulation: the NVML calls GPU discovery makes
// (bindings/cuda/devices.go), describing the one emulated device.
#include <stdio.h>
#include <string.h>

extern "C" {
typedef int nvmlReturn_t;  // NVML_SUCCESS = 0, NVML_ERROR_INVALID_ARGUMENT = 2
typedef struct emu_nvml_device *nvmlDevice_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

static int emu_device;
#define DEV ((nvmlDevice_t)&emu_device)

nvmlReturn_t nvmlInit_v2(void) { return 0; }
nvmlReturn_t nvmlInit(void) { return 0; }
nvmlReturn_t nvmlInitWithFlags(unsigned) { return 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(nvmlReturn_t r) { return r == 0 ? "Success" : "emulated NVML error"; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) {
    *n = 1;
    return 0;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (i != 0) return 2;
    *d = DEV;
    return 0;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    if (d != DEV) return 2;
    memset(p, 0, sizeof *p);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:EE:00.0");
    snprintf(p->busId, sizeof p->busId, "00000000:EE:00.0");
    p->bus = 0xee;
    return 0;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned n) {
    if (d != DEV) return 2;
    snprintf(name, n, "Parley CUDA emulation");
    return 0;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned n) {
    if (d != DEV) return 2;
    snprintf(uuid, n, "GPU-00000000-0000-0000-0000-0000000000ee");
    return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (d != DEV) return 2;
    m->total = 8ull << 30;
    m->free = 6ull << 30;
    m->used = 2ull << 30;
    return 0;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    if (d != DEV) return 2;
    *major = 9;
    *minor = 0;
    return 0;
}
}
