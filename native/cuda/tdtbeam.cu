// tdtbeam.cu: a transducer beam search kept on the device (plc_tdtb_*), round for round the
// search of Go's decode.TDTBeamSearch (runtime/decode/tdtbeam.go) with its tie-breaking, for
// every stream of a step at once: one block a stream scores the joint rows of the hypotheses at
// its lowest frame, takes each one's best (token, duration) pairs, merges the candidates in the
// same state, keeps the best and writes the new hypothesis table with a map of the rows whose
// prediction states the new rows continue (plc_tdtb_gather copies them). The state layout is in
// parley_cuda.h.
#include <limits.h>
#include <math.h>

#include "internal.cuh"
#include "tdt.cuh"

#define PLC_TDTB_THREADS 128
#define PLC_TDTB_MAXC (PLC_TDTB_MAX_WIDTH + PLC_TDTB_MAX_WIDTH * PLC_TDTB_MAX_WIDTH)

// plc_tdtb_view is the state of n streams of width w split into its arrays.
struct plc_tdtb_view {
    double *score;
    uint64_t *hash;
    int32_t *hyp, *str, *nodes;
    int64_t rows, n;
};

__host__ __device__ static inline plc_tdtb_view plc_tdtb_at(void *st, int64_t n, int w) {
    plc_tdtb_view v;
    v.rows = n * w;
    v.n = n;
    char *p = (char *)st;
    v.score = (double *)p;
    v.hash = (uint64_t *)(p + 8 * v.rows);
    v.hyp = (int32_t *)(p + 16 * v.rows);
    v.str = v.hyp + (int64_t)PLC_TDTB_HFIELDS * v.rows;
    v.nodes = v.str + (int64_t)PLC_TDTB_SFIELDS * n;
    return v;
}

#define PLC_TDTB_H(v, f, r) ((v).hyp[(int64_t)(f) * (v).rows + (r)])
#define PLC_TDTB_S(v, f, s) ((v).str[(int64_t)(f) * (v).n + (s)])

// plc_tdtb_child is the hash of a sequence of hash h followed by tok.
__device__ __forceinline__ uint64_t plc_tdtb_child(uint64_t h, int32_t tok) {
    return (h ^ (uint64_t)(uint32_t)(tok + 1)) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL;
}

// plc_tdtb_chain_eq reports whether the token chains ending at nodes a and b (-1: empty), of the
// same length, hold the same tokens.
__device__ static bool plc_tdtb_chain_eq(const int32_t *nd, int32_t a, int32_t b) {
    while (a != b) {
        if (a < 0 || b < 0) return false;
        if (nd[(int64_t)a * PLC_TDTB_NODE_WORDS] != nd[(int64_t)b * PLC_TDTB_NODE_WORDS]) return false;
        a = nd[(int64_t)a * PLC_TDTB_NODE_WORDS + 3];
        b = nd[(int64_t)b * PLC_TDTB_NODE_WORDS + 3];
    }
    return true;
}

// plc_tdtb_lae is log(e^a + e^b), as decode's logAddExp.
__device__ __forceinline__ double plc_tdtb_lae(double a, double b) {
    if (a < b) {
        const double t = a;
        a = b;
        b = t;
    }
    if (isinf(b) && b < 0) return a;
    return a + log1p(exp(b - a));
}

// Block reductions over a row of x[0..n): the maximum (and whether a NaN is there), the sum of
// exp(x - m) in double, the best element after (pv, pi) in the order value descending, index
// ascending (pi < 0: the first).
__device__ static float plc_tdtb_max(const float *x, int n, bool *nan, float *sv, int *si) {
    int bad;
    const float r = plc_tdt_block_max(x, n, &bad, sv, si);
    *nan = *nan || bad != 0;
    return r;
}

__device__ static double plc_tdtb_sumexp(const float *x, int n, float m, double *sd) {
    double s = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += (double)expf(x[j] - m);
    sd[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) sd[threadIdx.x] += sd[threadIdx.x + k];
        __syncthreads();
    }
    const double r = sd[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ bool plc_tdtb_before(float v, int i, float bv, int bi) {
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

__device__ static int plc_tdtb_next(const float *x, int n, float pv, int pi, float *sv, int *si) {
    float bv = 0.f;
    int bi = -1;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float v = x[j];
        if (pi >= 0 && !(v < pv || (v == pv && j > pi))) continue;
        if (plc_tdtb_before(v, j, bv, bi)) bv = v, bi = j;
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k && plc_tdtb_before(sv[threadIdx.x + k], si[threadIdx.x + k], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + k];
            si[threadIdx.x] = si[threadIdx.x + k];
        }
        __syncthreads();
    }
    const int r = si[0];
    __syncthreads();
    return r;
}

// A hypothesis as the round reads or writes it.
struct plc_tdtb_hyp {
    double score;
    uint64_t hash;
    int32_t frame, run, node, ntok, pred, tok, parent;
};

// The round's shared memory.
struct plc_tdtb_smem {
    plc_tdtb_hyp old[PLC_TDTB_MAX_WIDTH], nw[PLC_TDTB_MAX_WIDTH];
    int ex[PLC_TDTB_MAX_WIDTH];  // expanded hypotheses, in beam order
    float mtok[PLC_TDTB_MAX_WIDTH];
    double sumtok[PLC_TDTB_MAX_WIDTH], lseall[PLC_TDTB_MAX_WIDTH];
    float toplogit[PLC_TDTB_MAX_WIDTH];
    int toptok[PLC_TDTB_MAX_WIDTH];
    int dord[PLC_TDT_MAX_DURATIONS];
    double pl[PLC_TDTB_MAX_WIDTH * PLC_TDTB_MAX_WIDTH];  // [expanded][pair] best first
    int ptok[PLC_TDTB_MAX_WIDTH * PLC_TDTB_MAX_WIDTH], pdur[PLC_TDTB_MAX_WIDTH * PLC_TDTB_MAX_WIDTH];
    int npair[PLC_TDTB_MAX_WIDTH];
    // candidates: waiting hypotheses, then each expansion's pairs
    double cs[PLC_TDTB_MAXC];
    uint64_t ch[PLC_TDTB_MAXC];
    int csrc[PLC_TDTB_MAXC], cpair[PLC_TDTB_MAXC], cframe[PLC_TDTB_MAXC], crun[PLC_TDTB_MAXC], clen[PLC_TDTB_MAXC],
        ctok[PLC_TDTB_MAXC], crep[PLC_TDTB_MAXC], ccont[PLC_TDTB_MAXC];
    int best[PLC_TDTB_MAX_WIDTH];
    int nh, nex, nc, nbest, t, bad;
    float sv[PLC_TDTB_THREADS];
    int si[PLC_TDTB_THREADS];
    double sd[PLC_TDTB_THREADS];
};

// plc_tdtb_same reports whether candidates i and j are in the same state: the same frame, run
// and token sequence (the sequence of candidate c is its hypothesis's chain, followed by ctok[c]
// when that is a token).
__device__ static bool plc_tdtb_same(const plc_tdtb_smem &m, const int32_t *nd, int i, int j) {
    if (m.cframe[i] != m.cframe[j] || m.crun[i] != m.crun[j] || m.clen[i] != m.clen[j] || m.ch[i] != m.ch[j]) return false;
    int32_t a = m.old[m.csrc[i]].node, b = m.old[m.csrc[j]].node;
    int ta = m.ctok[i], tb = m.ctok[j];
    if (ta >= 0 && tb >= 0) return ta == tb && plc_tdtb_chain_eq(nd, a, b);
    if (ta < 0 && tb < 0) return plc_tdtb_chain_eq(nd, a, b);
    if (ta >= 0) {  // make b's the sequence with the appended token
        int32_t x = a;
        a = b, b = x;
        tb = ta;
    }
    if (a < 0 || nd[(int64_t)a * PLC_TDTB_NODE_WORDS] != tb) return false;
    return plc_tdtb_chain_eq(nd, nd[(int64_t)a * PLC_TDTB_NODE_WORDS + 3], b);
}

// One block a stream.
__global__ void __launch_bounds__(PLC_TDTB_THREADS)
    plc_tdtb_round_k(const float *logits, int64_t width, plc_tdtb_cfg cfg, void *st, int64_t n) {
    __shared__ plc_tdtb_smem m;
    const int64_t s = blockIdx.x;
    const int w = cfg.width;
    plc_tdtb_view v = plc_tdtb_at(st, n, w);
    if (PLC_TDTB_S(v, PLC_TDTB_SDONE, s)) return;
    int32_t *nd = v.nodes + s * (int64_t)cfg.cap * PLC_TDTB_NODE_WORDS;
    const int32_t blank = cfg.n_tok - 1;
    const int64_t base = s * w;
    const int end = PLC_TDTB_S(v, PLC_TDTB_SEND, s);
    const int ws = PLC_TDTB_S(v, PLC_TDTB_SWIDTH, s);  // the stream's width; pair arrays keep the stride w
    if (threadIdx.x == 0) {
        m.nh = PLC_TDTB_S(v, PLC_TDTB_SNHYP, s);
        int t = INT_MAX;
        for (int j = 0; j < m.nh; j++) {
            plc_tdtb_hyp &h = m.old[j];
            const int64_t r = base + j;
            h.score = v.score[r];
            h.hash = v.hash[r];
            h.frame = PLC_TDTB_H(v, PLC_TDTB_HFRAME, r);
            h.run = PLC_TDTB_H(v, PLC_TDTB_HRUN, r);
            h.node = PLC_TDTB_H(v, PLC_TDTB_HNODE, r);
            h.ntok = PLC_TDTB_H(v, PLC_TDTB_HNTOK, r);
            h.tok = PLC_TDTB_H(v, PLC_TDTB_HTOK, r);
            if (h.frame < t) t = h.frame;
        }
        m.nex = 0;
        for (int j = 0; j < m.nh; j++)
            if (m.old[j].frame == t) m.ex[m.nex++] = j;
        m.t = t;
        m.bad = 0;
    }
    __syncthreads();
    const int kk = cfg.n_tok < ws ? cfg.n_tok : ws;
    const int dk = cfg.n_dur > 0 ? (cfg.n_dur < ws ? cfg.n_dur : ws) : 1;
    const int nex = m.nex;
    for (int e = 0; e < nex; e++) {
        const float *row = logits + (base + m.ex[e]) * width;
        bool nan = false;
        const float mt = plc_tdtb_max(row, cfg.n_tok, &nan, m.sv, m.si);
        float md = 0.f;
        if (cfg.n_dur > 0) md = plc_tdtb_max(row + cfg.n_tok, cfg.n_dur, &nan, m.sv, m.si);
        if (nan || isinf(mt) || (cfg.n_dur > 0 && isinf(md))) {
            if (threadIdx.x == 0) m.bad = 1;
            break;
        }
        const float ma = cfg.n_dur > 0 && md > mt ? md : mt;
        const double sumTok = plc_tdtb_sumexp(row, cfg.n_tok, mt, m.sd);
        const double sumDur = cfg.n_dur > 0 ? plc_tdtb_sumexp(row + cfg.n_tok, cfg.n_dur, md, m.sd) : 1.0;
        const double sumAll = plc_tdtb_sumexp(row, (int)width, ma, m.sd);
        float pv = 0.f;
        int pi = -1;
        for (int a = 0; a < kk; a++) {
            pi = plc_tdtb_next(row, cfg.n_tok, pv, pi, m.sv, m.si);
            pv = row[pi];
            if (threadIdx.x == 0) m.toptok[a] = pi, m.toplogit[a] = pv;
        }
        if (threadIdx.x == 0) {
            m.mtok[e] = mt;
            m.sumtok[e] = sumTok;
            m.lseall[e] = (double)ma + log(sumAll);
            const double lseTok = (double)mt + log(sumTok);
            const double lseDur = cfg.n_dur > 0 ? (double)md + log(sumDur) : 0.0;
            // durations best first, ties to the lower index
            for (int i = 0; i < cfg.n_dur; i++) {
                const float x = row[cfg.n_tok + i];
                int p = i;
                while (p > 0 && row[cfg.n_tok + m.dord[p - 1]] < x) {
                    m.dord[p] = m.dord[p - 1];
                    p--;
                }
                m.dord[p] = i;
            }
            if (cfg.n_dur == 0) m.dord[0] = 0;
            // the w best pairs of the grid, best first, ties in grid order (decode's scoreRow)
            double *pl = m.pl + e * w;
            int *pt = m.ptok + e * w, *pd = m.pdur + e * w;
            int np = 0;
            for (int a = 0; a < kk; a++) {
                const double tl = (double)m.toplogit[a] - lseTok;
                if (isinf(tl) && tl < 0) break;
                bool stop = false;
                for (int b = 0; b < dk; b++) {
                    double lp = tl;
                    if (cfg.n_dur > 0) lp += (double)row[cfg.n_tok + m.dord[b]] - lseDur;
                    if (np == ws && !(lp > pl[ws - 1])) {
                        if (b == 0) stop = true;
                        break;
                    }
                    if (isinf(lp) && lp < 0) break;
                    int p = np;
                    if (p < ws) np++;
                    else p = ws - 1;
                    while (p > 0 && pl[p - 1] < lp) {
                        pl[p] = pl[p - 1], pt[p] = pt[p - 1], pd[p] = pd[p - 1];
                        p--;
                    }
                    pl[p] = lp, pt[p] = m.toptok[a], pd[p] = m.dord[b];
                }
                if (stop) break;
            }
            m.npair[e] = np;
        }
        __syncthreads();
    }
    __syncthreads();
    if (m.bad) {
        if (threadIdx.x == 0) {
            PLC_TDTB_S(v, PLC_TDTB_SBAD, s) = 1;
            PLC_TDTB_S(v, PLC_TDTB_SDONE, s) = 1;
            for (int j = 0; j < w; j++) PLC_TDTB_H(v, PLC_TDTB_HPRED, base + j) = 0;
        }
        return;
    }
    // The candidates.
    if (threadIdx.x == 0) {
        const int t = m.t;
        int c = 0;
        for (int j = 0; j < m.nh; j++) {
            const plc_tdtb_hyp &h = m.old[j];
            if (h.frame == t) continue;
            m.cs[c] = h.score, m.ch[c] = h.hash, m.csrc[c] = j, m.cpair[c] = -1;
            m.cframe[c] = h.frame, m.crun[c] = h.run, m.clen[c] = h.ntok, m.ctok[c] = -1;
            c++;
        }
        for (int e = 0; e < nex; e++) {
            const int j = m.ex[e];
            const plc_tdtb_hyp &h = m.old[j];
            for (int p = 0; p < m.npair[e]; p++) {
                const int q = e * w + p;
                const int tok = m.ptok[q];
                const int dur = cfg.n_dur > 0 ? cfg.durations[m.pdur[q]] : 0;
                int frame, run;
                if (tok == blank) frame = t + (dur > 1 ? dur : 1), run = 0;
                else if (dur > 0) frame = t + dur, run = 0;
                else if (h.run + 1 >= cfg.max_symbols) frame = t + 1, run = 0;
                else frame = t, run = h.run + 1;
                m.cs[c] = h.score + m.pl[q], m.csrc[c] = j, m.cpair[c] = q, m.cframe[c] = frame, m.crun[c] = run;
                if (tok == blank) m.ch[c] = h.hash, m.clen[c] = h.ntok, m.ctok[c] = -1;
                else m.ch[c] = plc_tdtb_child(h.hash, tok), m.clen[c] = h.ntok + 1, m.ctok[c] = tok;
                c++;
            }
        }
        m.nc = c;
    }
    __syncthreads();
    // Each candidate's first candidate in the same state.
    for (int i = threadIdx.x; i < m.nc; i += blockDim.x) {
        int r = i;
        for (int j = 0; j < i; j++)
            if (plc_tdtb_same(m, nd, j, i)) {
                r = j;
                break;
            }
        m.crep[i] = r;
        m.ccont[i] = i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // Merged in candidate order into the first (decode's merge): the score by the rule, the
        // rest from the better one, ties to the first.
        for (int i = 0; i < m.nc; i++) {
            const int r = m.crep[i];
            if (r == i) continue;
            const double a = m.cs[r], b = m.cs[i];
            const double sc = cfg.lse ? plc_tdtb_lae(a, b) : (b > a ? b : a);
            if (b > a) m.ccont[r] = i;
            m.cs[r] = sc;
        }
        m.nbest = 0;
    }
    __syncthreads();
    // The w best live candidates: score descending, then candidate order.
    for (int i = threadIdx.x; i < m.nc; i += blockDim.x) {
        if (m.crep[i] != i) continue;
        int rank = 0;
        for (int j = 0; j < m.nc; j++)
            if (m.crep[j] == j && (m.cs[j] > m.cs[i] || (m.cs[j] == m.cs[i] && j < i))) rank++;
        if (rank < ws) m.best[rank] = i;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    int live = 0;
    for (int i = 0; i < m.nc; i++) live += m.crep[i] == i;
    const int nb = live < ws ? live : ws;
    const int t = m.t;
    int nodes = PLC_TDTB_S(v, PLC_TDTB_SNODES, s);
    int full = 0;
    int lo = INT_MAX;
    for (int r = 0; r < nb; r++) {
        const int c = m.best[r], cc = m.ccont[c];
        const plc_tdtb_hyp &h = m.old[m.csrc[cc]];
        plc_tdtb_hyp &o = m.nw[r];
        o = h;
        o.score = m.cs[c];
        o.pred = 0;
        o.parent = (int32_t)(base + m.csrc[cc]);
        if (m.cpair[cc] >= 0) {
            const int q = m.cpair[cc], e = q / w;
            o.frame = m.cframe[cc], o.run = m.crun[cc];
            const int tok = m.ptok[q];
            if (tok != blank) {
                if (nodes >= cfg.cap) {
                    full = 1;
                } else {
                    const float *row = logits + (base + m.ex[e]) * width;
                    int32_t *x = nd + (int64_t)nodes * PLC_TDTB_NODE_WORDS;
                    x[0] = tok, x[1] = t, x[2] = m.pdur[q], x[3] = h.node;
                    ((float *)x)[4] = (float)((double)expf(row[tok] - m.mtok[e]) / m.sumtok[e]);
                    ((float *)x)[5] = (float)((double)row[tok] - m.lseall[e]);
                    o.node = nodes++;
                }
                o.ntok = h.ntok + 1;
                o.hash = plc_tdtb_child(h.hash, tok);
                o.pred = 1, o.tok = tok;
            }
        }
        if (o.frame < lo) lo = o.frame;
    }
    int nh = nb;
    PLC_TDTB_S(v, PLC_TDTB_SNODES, s) = nodes;
    PLC_TDTB_S(v, PLC_TDTB_SROUNDS, s) += 1;
    bool done = false;
    if (full) {
        PLC_TDTB_S(v, PLC_TDTB_SBAD, s) = 2;
        done = true;
    } else if (lo >= end) {
        // Finished: hypotheses of the same tokens merged whatever frame they reached, then
        // sorted best first, stably (decode's finish).
        int k = 0;
        for (int i = 0; i < nb; i++) {
            plc_tdtb_hyp h = m.nw[i];
            h.frame = end, h.run = 0;
            bool merged = false;
            for (int j = 0; j < k; j++) {
                plc_tdtb_hyp &o = m.nw[j];
                if (o.ntok != h.ntok || o.hash != h.hash || !plc_tdtb_chain_eq(nd, o.node, h.node)) continue;
                const double sc = cfg.lse ? plc_tdtb_lae(o.score, h.score) : (h.score > o.score ? h.score : o.score);
                if (h.score > o.score) o = h;
                o.score = sc;
                merged = true;
                break;
            }
            if (!merged) m.nw[k++] = h;
        }
        for (int i = 1; i < k; i++)
            for (int j = i; j > 0 && m.nw[j - 1].score < m.nw[j].score; j--) {
                const plc_tdtb_hyp x = m.nw[j - 1];
                m.nw[j - 1] = m.nw[j];
                m.nw[j] = x;
            }
        nh = k;
        done = true;
    }
    for (int j = 0; j < w; j++) {
        const int64_t r = base + j;
        if (j >= nh) {
            PLC_TDTB_H(v, PLC_TDTB_HPRED, r) = 0;
            PLC_TDTB_H(v, PLC_TDTB_HPARENT, r) = (int32_t)r;
            PLC_TDTB_H(v, PLC_TDTB_HIDX, r) = 0;
            continue;
        }
        const plc_tdtb_hyp &h = m.nw[j];
        v.score[r] = h.score;
        v.hash[r] = h.hash;
        PLC_TDTB_H(v, PLC_TDTB_HFRAME, r) = h.frame;
        PLC_TDTB_H(v, PLC_TDTB_HRUN, r) = h.run;
        PLC_TDTB_H(v, PLC_TDTB_HNODE, r) = h.node;
        PLC_TDTB_H(v, PLC_TDTB_HNTOK, r) = h.ntok;
        PLC_TDTB_H(v, PLC_TDTB_HPRED, r) = done ? 0 : h.pred;
        PLC_TDTB_H(v, PLC_TDTB_HTOK, r) = h.tok;
        PLC_TDTB_H(v, PLC_TDTB_HPARENT, r) = h.parent;
        PLC_TDTB_H(v, PLC_TDTB_HIDX, r) = h.frame < end ? h.frame : (end > 0 ? end - 1 : 0);
    }
    PLC_TDTB_S(v, PLC_TDTB_SNHYP, s) = nh;
    if (done) PLC_TDTB_S(v, PLC_TDTB_SDONE, s) = 1;
}

static int plc_tdtb_check(plc_ctx *ctx, const char *op, int64_t n, const plc_tdtb_cfg *cfg) {
    if (cfg == NULL || n < 0 || n > 65535 || cfg->width < 1 || cfg->width > PLC_TDTB_MAX_WIDTH || n * cfg->width > 65535 ||
        cfg->n_tok < 1 || cfg->n_dur < 0 || cfg->n_dur > PLC_TDT_MAX_DURATIONS || cfg->max_symbols < 1 || cfg->cap < 1)
        return plc_fail_arg(ctx, op);
    for (int j = 0; j < cfg->n_dur; j++)
        if (cfg->durations[j] < 0) return plc_fail_arg(ctx, op);
    return PLC_OK;
}

extern "C" int plc_tdtb_round(plc_ctx *ctx, const float *logits, int64_t n, int64_t width, const plc_tdtb_cfg *cfg, void *st) {
    if (ctx == NULL) return PLC_ERR_ARG;
    int c = plc_tdtb_check(ctx, "tdt beam round: bad shape", n, cfg);
    if (c != PLC_OK) return c;
    if (width != (int64_t)cfg->n_tok + cfg->n_dur) return plc_fail_arg(ctx, "tdt beam round: bad width");
    if (n == 0) return PLC_OK;
    if (logits == NULL || st == NULL) return plc_fail_arg(ctx, "tdt beam round: null pointer");
    PLC_ENTER(ctx);
    plc_tdtb_round_k<<<(unsigned)n, PLC_TDTB_THREADS, 0, ctx->stream>>>(logits, width, *cfg, st, n);
    return plc_launched(ctx, "tdt beam round");
}

__global__ void plc_tdtb_start_k(void *st, int64_t n, int w, int64_t s, int32_t end, int32_t width, int32_t blank) {
    plc_tdtb_view v = plc_tdtb_at(st, n, w);
    for (int j = 0; j < w; j++) {
        const int64_t r = s * w + j;
        v.score[r] = 0;
        v.hash[r] = 0;
        PLC_TDTB_H(v, PLC_TDTB_HFRAME, r) = 0;
        PLC_TDTB_H(v, PLC_TDTB_HRUN, r) = 0;
        PLC_TDTB_H(v, PLC_TDTB_HNODE, r) = -1;
        PLC_TDTB_H(v, PLC_TDTB_HNTOK, r) = 0;
        PLC_TDTB_H(v, PLC_TDTB_HPRED, r) = j == 0 && end > 0;
        PLC_TDTB_H(v, PLC_TDTB_HTOK, r) = blank;
        PLC_TDTB_H(v, PLC_TDTB_HIDX, r) = 0;
        PLC_TDTB_H(v, PLC_TDTB_HPARENT, r) = (int32_t)r;
    }
    PLC_TDTB_S(v, PLC_TDTB_SEND, s) = end;
    PLC_TDTB_S(v, PLC_TDTB_SDONE, s) = end <= 0;
    PLC_TDTB_S(v, PLC_TDTB_SBAD, s) = 0;
    PLC_TDTB_S(v, PLC_TDTB_SNHYP, s) = 1;
    PLC_TDTB_S(v, PLC_TDTB_SNODES, s) = 0;
    PLC_TDTB_S(v, PLC_TDTB_SROUNDS, s) = 0;
    PLC_TDTB_S(v, PLC_TDTB_SWIDTH, s) = width;
}

extern "C" int plc_tdtb_start(plc_ctx *ctx, void *st, int64_t n, const plc_tdtb_cfg *cfg, int64_t s, int32_t end, int32_t width,
                              int32_t blank) {
    if (ctx == NULL) return PLC_ERR_ARG;
    int c = plc_tdtb_check(ctx, "tdt beam start: bad shape", n, cfg);
    if (c != PLC_OK) return c;
    if (st == NULL || s < 0 || s >= n || end < 0 || blank < 0 || width < 1 || width > cfg->width)
        return plc_fail_arg(ctx, "tdt beam start: bad stream");
    PLC_ENTER(ctx);
    plc_tdtb_start_k<<<1, 1, 0, ctx->stream>>>(st, n, cfg->width, s, end, width, blank);
    return plc_launched(ctx, "tdt beam start");
}

__global__ void plc_tdtb_gather_k(float *dst, const float *src, int64_t cols, const int32_t *parent) {
    const int64_t i = blockIdx.x;
    const float *from = src + (int64_t)parent[i] * cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dst[i * cols + j] = from[j];
}

extern "C" int plc_tdtb_gather(plc_ctx *ctx, float *dst, const float *src, int64_t cols, const void *st, int64_t n, int32_t w) {
    if (ctx == NULL) return PLC_ERR_ARG;
    if (n < 0 || w < 1 || w > PLC_TDTB_MAX_WIDTH || n * w > 65535 || cols < 0) return plc_fail_arg(ctx, "tdt beam gather: bad shape");
    if (n == 0 || cols == 0) return PLC_OK;
    if (dst == NULL || src == NULL || st == NULL) return plc_fail_arg(ctx, "tdt beam gather: null pointer");
    PLC_ENTER(ctx);
    plc_tdtb_view v = plc_tdtb_at((void *)st, n, w);
    const int32_t *parent = v.hyp + (int64_t)PLC_TDTB_HPARENT * v.rows;
    plc_tdtb_gather_k<<<(unsigned)(n * w), 128, 0, ctx->stream>>>(dst, src, cols, parent);
    return plc_launched(ctx, "tdt beam gather");
}
