// graph.cu: recording a context's operations as a CUDA graph and running it (plc_graph_*).
//
// A decode step is a few hundred small kernels. Launched one by one, each costs the host a few
// microseconds and the device a gap between kernels; a graph is launched once. Every step is
// recorded afresh (stream capture), so its kernels' arguments (batch sizes, table addresses) are
// the step's own; an executable graph kept from an earlier step of the same kernels is then
// updated in place, which is much cheaper than instantiating one, and a new one is instantiated
// only where there is none or the update is refused. A context keeps a few, for the few shapes
// of one model's steps.
#include <stdio.h>

#include "internal.cuh"

int plc_not_recording(plc_ctx *ctx, const char *what) {
    if (!ctx->recording) return PLC_OK;
    snprintf(ctx->err, sizeof ctx->err, "%s cannot be recorded in a graph", what);
    return PLC_ERR_ARG;
}

// PLC_GRAPHS is how many executable graphs a context keeps: the decode steps of one model come
// in a few shapes (batch sizes take different kernels), and a graph updates only from a
// recording of the same kernels.
#define PLC_GRAPHS 4

void plc_graph_free(plc_ctx *ctx) {
    for (const plc_graph_exec &x : ctx->execs) cudaGraphExecDestroy(x.exec);
    ctx->execs.clear();
}

// plc_graph_sig hashes the kinds of g's nodes and its kernels' functions, in the graph's order:
// recordings with the same signature run the same kernels and can update one another's graph.
static uint64_t plc_graph_sig(plc_ctx *ctx, cudaGraph_t g) {
    const uint64_t prime = 1099511628211ull;
    size_t n = 0;
    uint64_t h = 14695981039346656037ull;
    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess) {
        cudaGetLastError();
        return h;
    }
    try {
        ctx->nodes.resize(n);
    } catch (...) {
        return h;
    }
    if (n > 0 && cudaGraphGetNodes(g, ctx->nodes.data(), &n) != cudaSuccess) {
        cudaGetLastError();
        return h;
    }
    h = (h ^ n) * prime;
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType t;
        if (cudaGraphNodeGetType(ctx->nodes[i], &t) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        h = (h ^ (uint64_t)t) * prime;
        cudaKernelNodeParams p;
        if (t == cudaGraphNodeTypeKernel) {
            if (cudaGraphKernelNodeGetParams(ctx->nodes[i], &p) == cudaSuccess) h = (h ^ (uint64_t)(uintptr_t)p.func) * prime;
            else cudaGetLastError();
        }
    }
    return h;
}

extern "C" int plc_graph_begin(plc_ctx *ctx) {
    PLC_ENTER(ctx);
    if (ctx->recording) return plc_fail_arg(ctx, "graph: already recording");
    ctx->rec_meta_used = ctx->meta_used;
    ctx->rec_meta_tables = ctx->meta_tables.size();
    // Relaxed: the library's own host calls between the recorded ones (cudaGetLastError, the
    // context's device) are allowed while recording.
    cudaError_t e = cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return plc_fail_cuda(ctx, "graph: starting to record", e);
    }
    ctx->recording = 1;
    return PLC_OK;
}

// plc_graph_stop ends the capture and returns the recorded graph (NULL where the capture failed,
// with e set). The tables added while recording are dropped when the recording is not run.
static cudaGraph_t plc_graph_stop(plc_ctx *ctx, cudaError_t *e) {
    cudaGraph_t g = NULL;
    *e = cudaStreamEndCapture(ctx->stream, &g);
    ctx->recording = 0;
    if (*e != cudaSuccess) {
        if (g != NULL) cudaGraphDestroy(g);
        g = NULL;
        cudaGetLastError();
    }
    return g;
}

// plc_graph_drop forgets the tables copied by a recording that did not run: their bytes are
// free again, and a later call must copy them for itself.
static void plc_graph_drop(plc_ctx *ctx) {
    ctx->meta_used = ctx->rec_meta_used;
    ctx->meta_tables.resize(ctx->rec_meta_tables);
}

extern "C" void plc_graph_abort(plc_ctx *ctx) {
    if (ctx == NULL || !ctx->recording) return;
    cudaSetDevice(ctx->device);
    cudaError_t e;
    cudaGraph_t g = plc_graph_stop(ctx, &e);
    if (g != NULL) cudaGraphDestroy(g);
    plc_graph_drop(ctx);
}

// plc_graph_update updates exec to run g, and reports whether it could.
static bool plc_graph_update(cudaGraphExec_t exec, cudaGraph_t g) {
#if CUDART_VERSION >= 12000
    cudaGraphExecUpdateResultInfo info;
    cudaError_t e = cudaGraphExecUpdate(exec, g, &info);
#else
    cudaGraphNode_t bad = NULL;
    cudaGraphExecUpdateResult res;
    cudaError_t e = cudaGraphExecUpdate(exec, g, &bad, &res);
#endif
    if (e != cudaSuccess) {
        cudaGetLastError();  // a refused update is not an error of the stream
        return false;
    }
    return true;
}

extern "C" int plc_graph_end(plc_ctx *ctx) {
    PLC_ENTER(ctx);
    if (!ctx->recording) return plc_fail_arg(ctx, "graph: not recording");
    cudaError_t e;
    cudaGraph_t g = plc_graph_stop(ctx, &e);
    if (g == NULL) {
        plc_graph_drop(ctx);
        return plc_fail_cuda(ctx, "graph: recording the operations", e);
    }
    // The kept graph of the same kernels is updated to this recording's arguments; failing
    // that, a new one is instantiated (in place of the least recently used when there are
    // PLC_GRAPHS).
    const uint64_t sig = plc_graph_sig(ctx, g);
    plc_graph_exec *x = NULL;
    for (plc_graph_exec &k : ctx->execs)
        if (k.sig == sig) x = &k;
    bool updated = false;
    if (x != NULL) {
        updated = plc_graph_update(x->exec, g);
        if (!updated) {
            cudaGraphExecDestroy(x->exec);
            *x = ctx->execs.back();
            ctx->execs.pop_back();
            x = NULL;
        }
    }
    if (x == NULL) {
        cudaGraphExec_t exec = NULL;
        e = cudaGraphInstantiateWithFlags(&exec, g, 0);
        if (e != cudaSuccess) {
            cudaGraphDestroy(g);
            cudaGetLastError();
            plc_graph_drop(ctx);
            return plc_fail_cuda(ctx, "graph: instantiating", e);
        }
        if (ctx->execs.size() >= PLC_GRAPHS) {
            size_t lru = 0;
            for (size_t i = 1; i < ctx->execs.size(); i++)
                if (ctx->execs[i].used < ctx->execs[lru].used) lru = i;
            cudaGraphExecDestroy(ctx->execs[lru].exec);
            ctx->execs[lru] = ctx->execs.back();
            ctx->execs.pop_back();
        }
        try {
            ctx->execs.push_back(plc_graph_exec{exec, sig, 0});
        } catch (...) {
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(g);
            plc_graph_drop(ctx);
            snprintf(ctx->err, sizeof ctx->err, "graph: out of host memory");
            return PLC_ERR_NOMEM;
        }
        x = &ctx->execs.back();
        ctx->graph_inits++;
    }
    cudaGraphDestroy(g);
    x->used = ++ctx->graph_clock;
    e = cudaGraphLaunch(x->exec, ctx->stream);
    if (e != cudaSuccess) {
        plc_graph_free(ctx);
        plc_graph_drop(ctx);
        return plc_fail_cuda(ctx, "graph: launching", e);
    }
    if (updated) ctx->graph_updates++;
    ctx->graph_runs++;
    return PLC_OK;
}

extern "C" int plc_graph_stats(plc_ctx *ctx, int64_t *runs, int64_t *updates, int64_t *instantiations) {
    if (ctx == NULL || runs == NULL || updates == NULL || instantiations == NULL) return PLC_ERR_ARG;
    *runs = ctx->graph_runs;
    *updates = ctx->graph_updates;
    *instantiations = ctx->graph_inits;
    return PLC_OK;
}
