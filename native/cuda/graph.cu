// graph.cu: recording a context's operations as a CUDA graph and running it (plc_graph_*).
//
// A decode step is a few hundred small kernels. Launched one by one, each costs the host a few
// microseconds and the device a gap between kernels; a graph is launched once. Every step is
// recorded afresh (stream capture), so its kernels' arguments (batch sizes, table addresses) are
// the step's own; the executable graph kept from the last step is then updated in place, which
// is much cheaper than instantiating it, and a new one is instantiated only where the update is
// refused (the step's kernels differ from the last step's).
#include <stdio.h>

#include "internal.cuh"

int plc_not_recording(plc_ctx *ctx, const char *what) {
    if (!ctx->recording) return PLC_OK;
    snprintf(ctx->err, sizeof ctx->err, "%s cannot be recorded in a graph", what);
    return PLC_ERR_ARG;
}

void plc_graph_free(plc_ctx *ctx) {
    if (ctx->exec != NULL) cudaGraphExecDestroy(ctx->exec);
    ctx->exec = NULL;
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

// plc_graph_update updates ctx->exec to run g, and reports whether it could.
static bool plc_graph_update(plc_ctx *ctx, cudaGraph_t g) {
#if CUDART_VERSION >= 12000
    cudaGraphExecUpdateResultInfo info;
    cudaError_t e = cudaGraphExecUpdate(ctx->exec, g, &info);
#else
    cudaGraphNode_t bad = NULL;
    cudaGraphExecUpdateResult res;
    cudaError_t e = cudaGraphExecUpdate(ctx->exec, g, &bad, &res);
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
    bool updated = false;
    if (ctx->exec != NULL) {
        updated = plc_graph_update(ctx, g);
        if (!updated) plc_graph_free(ctx);
    }
    if (ctx->exec == NULL) {
        e = cudaGraphInstantiateWithFlags(&ctx->exec, g, 0);
        if (e != cudaSuccess) {
            ctx->exec = NULL;
            cudaGraphDestroy(g);
            cudaGetLastError();
            plc_graph_drop(ctx);
            return plc_fail_cuda(ctx, "graph: instantiating", e);
        }
        ctx->graph_inits++;
    }
    cudaGraphDestroy(g);
    e = cudaGraphLaunch(ctx->exec, ctx->stream);
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
