// runtime.cc: the fiber scheduler behind emu.h and the CUDA runtime API of cuda_runtime.h, on
// the CPU. Device memory is host memory (filled with 0xff bytes when allocated, so that reading
// what was never written gives NaNs); every launch runs at once, block after block, unless the
// stream is being captured, in which case it becomes a node of the graph. A block's threads take
// their turns in index order, or from the last with PARLEY_CUDA_EMU_ORDER=reverse: a read of
// shared memory that another thread writes without a barrier between them gets the written value
// in one order and not in the other.
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>

#include <memory>
#include <vector>

#include "cuda_runtime.h"

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

// ---- fibers ----

#if defined(__x86_64__)
extern "C" void emu_switch(void **save_sp, void *to_sp);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
.section .note.GNU-stack,"",@progbits
.text
)");
#else
#error "the CUDA emulation's fibers are written for x86-64"
#endif

const size_t kStack = 256 << 10;
const int kMaxThreads = 1024;

struct Fiber {
    void *sp;
    char *stack;
    uint3 tid;
    int warp, lane;
    bool done;
};

struct Warp {
    int lanes, live, count, gen;  // lanes at launch, lanes not finished
    const char *site;  // the operation the lanes that have arrived are in
    unsigned char slot[32][64];
    // What each lane that has arrived takes: lane src[l]'s slot (or, with src[l] == kGather,
    // every lane's) into out[l], n bytes a lane; the last lane to arrive hands them all out.
    void *out[32];
    int src[32];
    size_t n;
};
constexpr int kGather = -2;

struct Block {
    std::vector<Fiber> fibers;
    Warp warps[kMaxThreads / 32];
    int live;
    int bar_count, bar_gen, bar_or, bar_result[2];
    const char *bar_site;  // the barrier the threads that have arrived wait at
    std::vector<unsigned char> smem;
};

Block blk;
// The running kernel's static __shared__ variables met so far in this launch, and their bytes.
std::vector<const void *> shared_seen;
size_t shared_static;
Fiber *cur;
void *sched_sp;
uint64_t progress;
const std::function<void()> *body;
const void *kernel;
char *stacks;

// kernel_name names a kernel from its address (the test binaries export their symbols).
const char *kernel_name(const void *fn) {
    static char buf[512];
    Dl_info info;
    if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_sname == nullptr) {
        snprintf(buf, sizeof buf, "%p", fn);
        return buf;
    }
    int st = 0;
    char *d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
    snprintf(buf, sizeof buf, "%s", st == 0 && d != nullptr ? d : info.dli_sname);
    free(d);
    return buf;
}

[[noreturn]] void fail(const char *why) {
    fprintf(stderr, "cuda emulation: %s\n", why);
    abort();
}

// The threads of a block run in rounds, in order (or in reverse order): a thread that waits or
// finishes passes straight on to the next unfinished one, the last back to the scheduler.
const bool reverse_order = [] {
    const char *o = getenv("PARLEY_CUDA_EMU_ORDER");
    return o != nullptr && strcmp(o, "reverse") == 0;
}();

// pass_on saves the running thread's stack pointer in *save and runs the next unfinished thread
// of the round, or the scheduler after the last.
void pass_on(void **save) {
    const int n = (int)blk.fibers.size(), step = reverse_order ? -1 : 1;
    for (int j = (int)(cur - blk.fibers.data()) + step; j >= 0 && j < n; j += step) {
        Fiber &f = blk.fibers[j];
        if (f.done) continue;
        cur = &f;
        threadIdx = f.tid;
        emu_switch(save, f.sp);
        return;
    }
    emu_switch(save, sched_sp);
}

void yield_() { pass_on(&cur->sp); }

void release_warp(Warp &w) {
    w.count = 0;
    w.gen++;
    progress++;
}

void release_block() {
    blk.bar_result[blk.bar_gen & 1] = blk.bar_or;
    blk.bar_or = 0;
    blk.bar_count = 0;
    blk.bar_gen++;
    progress++;
}

// deliver copies, for every lane of w that has arrived, what it takes.
void deliver(Warp &w) {
    const int base = cur->warp * 32;
    for (int l = 0; l < 32; l++) {
        if (base + l >= (int)blk.fibers.size() || blk.fibers[base + l].done || w.out[l] == nullptr) continue;
        if (w.src[l] == kGather) {
            for (int m = 0; m < 32; m++) memcpy((char *)w.out[l] + m * w.n, w.slot[m], w.n);
        } else {
            memcpy(w.out[l], w.slot[w.src[l]], w.n);
        }
        w.out[l] = nullptr;
    }
}

extern "C" void emu_entry() {
    (*body)();
    Fiber *f = cur;
    f->done = true;
    progress++;
    blk.live--;
    Warp &w = blk.warps[f->warp];
    w.live--;
    // The kernels' warp operations name every lane (mask 0xffffffff): a lane that finishes while
    // others wait in one leaves them waiting on a GPU.
    if (w.count > 0) {
        char why[512];
        snprintf(why, sizeof why, "a lane of a warp finished while others wait in a shuffle (%s)", w.site);
        emu::trap(why);
    }
    // Threads that have finished count as arrived at the barriers the others wait at.
    if (blk.bar_count > 0 && blk.bar_count >= blk.live) release_block();
    void *dead;
    pass_on(&dead);
    fail("a finished thread was resumed");
}

void run_block(dim3 bd) {
    const int n = (int)(bd.x * bd.y * bd.z);
    blk.fibers.assign(n, Fiber{});
    blk.live = n;
    blk.bar_count = blk.bar_gen = blk.bar_or = 0;
    for (int w = 0; w < (n + 31) / 32; w++) {
        blk.warps[w].lanes = blk.warps[w].live = std::min(32, n - 32 * w);
        blk.warps[w].count = 0;
        blk.warps[w].gen = 0;
        std::fill(std::begin(blk.warps[w].out), std::end(blk.warps[w].out), nullptr);
    }
    for (int i = 0; i < n; i++) {
        Fiber &f = blk.fibers[i];
        f.tid = uint3{(unsigned)i % bd.x, (unsigned)(i / bd.x) % bd.y, (unsigned)(i / (bd.x * bd.y))};
        f.warp = i / 32;
        f.lane = i % 32;
        f.stack = stacks + (size_t)i * kStack;
        // The initial frame: six callee-saved registers, emu_entry as the return address, and a
        // slot below the top so that emu_entry starts with the stack aligned as after a call.
        uintptr_t top = ((uintptr_t)(f.stack + kStack)) & ~(uintptr_t)15;
        void **sp = (void **)top;
        *--sp = nullptr;  // alignment slot
        *--sp = (void *)emu_entry;
        for (int r = 0; r < 6; r++) *--sp = nullptr;
        f.sp = sp;
    }
    for (;;) {
        const uint64_t p0 = progress;
        Fiber *first = nullptr;
        for (int r = 0; r < n && first == nullptr; r++) {
            Fiber &f = blk.fibers[reverse_order ? n - 1 - r : r];
            if (!f.done) first = &f;
        }
        if (first == nullptr) break;
        cur = first;  // a round: the threads pass on from one to the next (pass_on)
        threadIdx = first->tid;
        emu_switch(&sched_sp, first->sp);
        if (progress == p0) {
            char msg[1024];
            int waiting = 0;
            for (auto &f : blk.fibers) waiting += !f.done;
            snprintf(msg, sizeof msg, "deadlock in kernel %s, block (%u,%u,%u): %d threads wait at a barrier that the others never reach",
                     kernel_name(kernel), blockIdx.x, blockIdx.y, blockIdx.z, waiting);
            fail(msg);
        }
    }
    cur = nullptr;
}

// ---- streams, graphs, errors ----

struct Node {
    cudaGraphNodeType type;
    const void *fn;
    dim3 grid, block;
    size_t smem;
    std::function<void()> run;
};

}  // namespace

struct emu_graph_node {
    Node n;
};
struct emu_graph {
    std::vector<std::unique_ptr<emu_graph_node>> nodes;
};
struct emu_graph_exec {
    std::vector<Node> nodes;
};
struct emu_stream {
    emu_graph *capture;
    bool invalidated;
};

namespace {
cudaError_t last_error = cudaSuccess;
emu_stream default_stream;

emu_stream *stream_of(cudaStream_t s) { return s ? s : &default_stream; }

cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

// run_or_record runs n now, or adds it to the graph the stream is capturing.
cudaError_t run_or_record(cudaStream_t s, Node n) {
    emu_stream *st = stream_of(s);
    if (st->capture != nullptr) {
        st->capture->nodes.push_back(std::unique_ptr<emu_graph_node>(new emu_graph_node{std::move(n)}));
        return cudaSuccess;
    }
    n.run();
    return cudaSuccess;
}

void run_kernel(const void *fn, dim3 grid, dim3 block, size_t smem, const std::function<void()> &f) {
    if (stacks == nullptr) {
        stacks = (char *)mmap(nullptr, kStack * kMaxThreads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (stacks == MAP_FAILED) fail("no memory for the fibers' stacks");
    }
    if (cur != nullptr) fail("a kernel launched another");
    const std::function<void()> *saved = body;
    body = &f;
    kernel = fn;
    gridDim = grid;
    blockDim = block;
    blk.smem.assign(smem, 0xff);
    shared_seen.clear();
    shared_static = 0;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = uint3{x, y, z};
                run_block(block);
            }
    body = saved;
}

}  // namespace

namespace emu {

int block_barrier(const char *site, int flag) {
    if (cur == nullptr) fail("__syncthreads outside a kernel");
    // Every thread of a block must wait at the same barrier of the code (the hardware would
    // count arrivals at different ones together).
    if (blk.bar_count == 0) blk.bar_site = site;
    else if (site != blk.bar_site && strcmp(site, blk.bar_site) != 0) {  // one literal a place, usually
        char why[512];
        snprintf(why, sizeof why, "threads of a block wait at different __syncthreads (%s and %s)", blk.bar_site, site);
        trap(why);
    }
    const int g = blk.bar_gen;
    blk.bar_or |= flag;
    blk.bar_count++;
    progress++;
    if (blk.bar_count >= blk.live) {
        release_block();
        return blk.bar_result[g & 1];
    }
    while (blk.bar_gen == g) yield_();
    return blk.bar_result[g & 1];
}

// warp_wait returns when every live lane of w has arrived at site. The last to arrive first
// copies what each lane takes (Warp::out), so that one round of the threads completes an
// exchange.
static void warp_wait(Warp &w, const char *site) {
    // Every lane must take part in the same warp operation of the code.
    if (w.count == 0) w.site = site;
    else if (site != w.site && strcmp(site, w.site) != 0) {
        char why[512];
        snprintf(why, sizeof why, "lanes of a warp are in different shuffles (%s and %s)", w.site, site);
        trap(why);
    }
    if (w.live < w.lanes) {
        char why[512];
        snprintf(why, sizeof why, "a shuffle (%s) after lanes of its warp finished", site);
        trap(why);
    }
    const int g = w.gen;
    w.count++;
    progress++;
    if (w.count >= w.live) {
        deliver(w);
        release_warp(w);
        return;
    }
    while (w.gen == g) yield_();
}

void warp_exchange(const char *site, const void *mine, size_t n, int src, void *out) {
    if (cur == nullptr) fail("a warp operation outside a kernel");
    if (n > sizeof(Warp::slot[0])) fail("a shuffle of more than 64 bytes");
    Warp &w = blk.warps[cur->warp];
    memcpy(w.slot[cur->lane], mine, n);
    w.out[cur->lane] = out;
    w.src[cur->lane] = src < 0 || src >= 32 ? cur->lane : src;
    w.n = n;
    warp_wait(w, site);
}

void warp_gather(const char *site, const void *mine, size_t n, void *all) {
    if (cur == nullptr) fail("a warp operation outside a kernel");
    if (n > sizeof(Warp::slot[0])) fail("a warp exchange of more than 64 bytes");
    Warp &w = blk.warps[cur->warp];
    memcpy(w.slot[cur->lane], mine, n);
    w.out[cur->lane] = all;
    w.src[cur->lane] = kGather;
    w.n = n;
    warp_wait(w, site);
}

void *dynamic_shared() { return blk.smem.empty() ? nullptr : blk.smem.data(); }

void static_shared(const void *p, size_t n) {
    if (std::find(shared_seen.begin(), shared_seen.end(), p) != shared_seen.end()) return;
    shared_seen.push_back(p);
    shared_static += n;
    // A launch fails on a GPU when a block's static and dynamic shared memory together exceed
    // 48 KiB, unless the kernel was given more with cudaFuncSetAttribute, which no kernel is.
    if (shared_static + blk.smem.size() > 48 * 1024) {
        char why[160];
        snprintf(why, sizeof why, "%zu bytes of static and %zu of dynamic shared memory, over 48 KiB", shared_static, blk.smem.size());
        trap(why);
    }
}

void trap(const char *why) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s in kernel %s, block (%u,%u,%u), thread (%u,%u,%u)", why, kernel_name(kernel), blockIdx.x,
             blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    fail(msg);
}

int launch(const void *fn, dim3 grid, dim3 block, size_t smem, void *stream, std::function<void()> f) {
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu ||
        grid.y > 65535 || grid.z > 65535)
        return set_error(cudaErrorInvalidConfiguration);
    if (smem > 48 * 1024) return set_error(cudaErrorInvalidValue);
    Node n{cudaGraphNodeTypeKernel, fn, grid, block, smem, nullptr};
    n.run = [fn, grid, block, smem, f]() { run_kernel(fn, grid, block, smem, f); };
    return run_or_record((cudaStream_t)stream, std::move(n));
}

}  // namespace emu

unsigned __ballot_sync(unsigned, int p) {
    int v = p != 0, flags[32];
    emu::warp_gather(EMU_SITE, &v, sizeof v, flags);
    unsigned all = 0;
    for (int l = 0; l < 32; l++)
        if (flags[l]) all |= 1u << l;
    return all;
}

// mma_m16n8k16 is mma.sync m16n8k16 with 16-bit inputs, elem(r, hi) the low (hi == 0) or high
// half of register r as a float.
static void mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, float (*elem)(uint32_t, int)) {
    struct Frag {
        uint32_t a[4], b[2];
    } mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}}, all[32];
    emu::warp_gather("mma.sync", &mine, sizeof mine, all);
    // A[row][k] and B[k][col] from the fragments' owners (PTX ISA, mma.m16n8k16 .f16 and .bf16).
    auto A = [&](int row, int k) {
        const int g = row % 8, t = (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        return elem(all[g * 4 + t].a[reg], k % 2);
    };
    auto B = [&](int k, int col) {
        const int t = (k % 8) / 2, reg = k >= 8 ? 1 : 0;
        return elem(all[col * 4 + t].b[reg], k % 2);
    };
    const int lane = EMU_LANE(), g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >= 2 ? 8 : 0), col = t * 2 + (i % 2);
        float s = c[i];
        for (int k = 0; k < 16; k++) s += A(row, k) * B(k, col);
        c[i] = s;
    }
}

void mma_m16n8k16_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    mma_m16n8k16(c, a, b0, b1, [](uint32_t r, int hi) {
        __half h;
        h.x = (uint16_t)(hi ? r >> 16 : r & 0xffffu);
        return __half2float(h);
    });
}

void mma_m16n8k16_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    mma_m16n8k16(c, a, b0, b1, [](uint32_t r, int hi) { return __uint_as_float((hi ? r >> 16 : r & 0xffffu) << 16); });
}

void mma_m16n8k8_tf32(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    struct Frag {
        uint32_t a[4], b[2];
    } mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}}, all[32];
    emu::warp_gather("mma.sync", &mine, sizeof mine, all);
    auto tf32_at = [](uint32_t r) { return __uint_as_float(r & 0xffffe000u); };
    // A[row][k] and B[k][col] from the fragments' owners (PTX ISA, mma.m16n8k8 .tf32).
    auto A = [&](int row, int k) { return tf32_at(all[(row % 8) * 4 + k % 4].a[(row >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0)]); };
    auto B = [&](int k, int col) { return tf32_at(all[col * 4 + k % 4].b[k >= 4 ? 1 : 0]); };
    const int lane = EMU_LANE(), g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >= 2 ? 8 : 0), col = t * 2 + (i % 2);
        float s = c[i];
        for (int k = 0; k < 8; k++) s += A(row, k) * B(k, col);
        c[i] = s;
    }
}

// s8_at is byte i (0..3) of register r as a signed integer.
static int s8_at(uint32_t r, int i) { return (int)(int8_t)(uint8_t)(r >> (8 * i)); }

// mma_s8 is mma.sync m16n8k<kk> .s8.s8.s32 (kk 16 or 32), A's registers a[0..kk/8), B's b[0..kk/16):
// A[row][k] is byte k%4 of register (row >= 8) + 2*(k >= 16) of lane (row%8)*4 + (k%16)/4, and
// B[k][col] byte k%4 of register (k >= 16) of lane col*4 + (k%16)/4 (PTX ISA, the fragments of
// mma.m16n8k16 and mma.m16n8k32 with .s8 inputs). The sums wrap as 32-bit integers.
static void mma_s8(int c[4], const uint32_t *a, const uint32_t *b, int kk) {
    struct Frag {
        uint32_t a[4], b[2];
    } mine = {{a[0], a[1], kk == 32 ? a[2] : 0u, kk == 32 ? a[3] : 0u}, {b[0], kk == 32 ? b[1] : 0u}}, all[32];
    emu::warp_gather("mma.sync", &mine, sizeof mine, all);
    auto A = [&](int row, int k) { return s8_at(all[(row % 8) * 4 + (k % 16) / 4].a[(row >= 8 ? 1 : 0) + (k >= 16 ? 2 : 0)], k % 4); };
    auto B = [&](int k, int col) { return s8_at(all[col * 4 + (k % 16) / 4].b[k >= 16 ? 1 : 0], k % 4); };
    const int lane = EMU_LANE(), g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >= 2 ? 8 : 0), col = t * 2 + (i % 2);
        uint32_t s = (uint32_t)c[i];
        for (int k = 0; k < kk; k++) s += (uint32_t)(A(row, k) * B(k, col));
        c[i] = (int)s;
    }
}

void mma_m16n8k32_s8(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    const uint32_t b[2] = {b0, b1};
    mma_s8(c, a, b, 32);
}

void mma_m16n8k16_s8(int c[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    const uint32_t a[2] = {a0, a1}, b[1] = {b0};
    mma_s8(c, a, b, 16);
}

// ---- the runtime API ----

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (dev != 0) return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "Parley CUDA emulation");
    p->totalGlobalMem = (size_t)8 << 30;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;  // as an H100, so that launches take the shapes they take there
    p->pciBusID = 0xee;
    p->sharedMemPerBlock = 48 * 1024;
    p->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev) {
    if (dev != 0) return set_error(cudaErrorInvalidDevice);
    switch (a) {
        case cudaDevAttrMultiProcessorCount: *v = 132; break;
        case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
        case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
        default: return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : set_error(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int *dev) {
    *dev = 0;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
    *total = (size_t)8 << 30;
    *free = (size_t)6 << 30;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
        case cudaErrorGraphExecUpdateFailure: return "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
        default: return "unknown error";
    }
}
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaError"; }

cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, std::max<size_t>(256, (n + 255) / 256 * 256));
    if (*p == nullptr) return set_error(cudaErrorMemoryAllocation);
    memset(*p, 0xff, n);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { return cudaMalloc(p, n); }
cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind) {
    if (n > 0) memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind, cudaStream_t s) {
    Node nd{cudaGraphNodeTypeMemcpy, nullptr, dim3(), dim3(), 0, [dst, src, n]() {
                if (n > 0) memmove(dst, src, n);
            }};
    return run_or_record(s, std::move(nd));
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s) {
    Node nd{cudaGraphNodeTypeMemset, nullptr, dim3(), dim3(), 0, [dst, v, n]() { memset(dst, v, n); }};
    return run_or_record(s, std::move(nd));
}
cudaError_t cudaMemset(void *dst, int v, size_t n) {
    memset(dst, v, n);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = new emu_stream{nullptr, false};
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (s != nullptr) {
        delete s->capture;
        delete s;
    }
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    emu_stream *st = stream_of(s);
    if (st->capture != nullptr) {
        st->invalidated = true;
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode) {
    emu_stream *st = stream_of(s);
    if (st->capture != nullptr) return set_error(cudaErrorInvalidValue);
    st->capture = new emu_graph;
    st->invalidated = false;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    emu_stream *st = stream_of(s);
    *g = nullptr;
    if (st->capture == nullptr) return set_error(cudaErrorInvalidValue);
    emu_graph *graph = st->capture;
    st->capture = nullptr;
    if (st->invalidated) {
        delete graph;
        return set_error(cudaErrorStreamCaptureInvalidated);
    }
    *g = graph;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long) {
    emu_graph_exec *e = new emu_graph_exec;
    for (auto &n : g->nodes) e->nodes.push_back(n->n);
    *x = e;
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s) {
    if (stream_of(s)->capture != nullptr) return set_error(cudaErrorStreamCaptureUnsupported);
    for (auto &n : x->nodes) n.run();
    return cudaSuccess;
}
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t x, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info) {
    bool same = x->nodes.size() == g->nodes.size();
    for (size_t i = 0; same && i < x->nodes.size(); i++) {
        const Node &a = x->nodes[i], &b = g->nodes[i]->n;
        same = a.type == b.type && a.fn == b.fn;
    }
    if (info != nullptr) {
        info->result = same ? cudaGraphExecUpdateSuccess : cudaGraphExecUpdateError;
        info->errorNode = info->errorFromNode = nullptr;
    }
    if (!same) return set_error(cudaErrorGraphExecUpdateFailure);
    for (size_t i = 0; i < x->nodes.size(); i++) x->nodes[i] = g->nodes[i]->n;
    return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n) {
    if (nodes == nullptr) {
        *n = g->nodes.size();
        return cudaSuccess;
    }
    const size_t m = std::min(*n, g->nodes.size());
    for (size_t i = 0; i < m; i++) nodes[i] = g->nodes[i].get();
    *n = m;
    return cudaSuccess;
}
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t n, enum cudaGraphNodeType *t) {
    *t = n->n.type;
    return cudaSuccess;
}
cudaError_t cudaGraphKernelNodeGetParams(cudaGraphNode_t n, cudaKernelNodeParams *p) {
    if (n->n.type != cudaGraphNodeTypeKernel) return set_error(cudaErrorInvalidValue);
    *p = cudaKernelNodeParams{};
    p->func = (void *)n->n.fn;
    p->gridDim = n->n.grid;
    p->blockDim = n->n.block;
    p->sharedMemBytes = (unsigned)n->n.smem;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
    delete x;
    return cudaSuccess;
}
