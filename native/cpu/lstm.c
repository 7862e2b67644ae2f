/*
 * lstm.c: one step of LSTM cells after their gates' products (the prediction network of a
 * transducer). A step's rows are few and narrow: it runs on the calling thread.
 */
#include <math.h>

#include "internal.h"

static inline float lstm_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

int pl_lstm_cell(pl_ctx *ctx, float *h, float *c, const float *gates, int64_t n, int64_t p) {
    if (ctx == NULL || n < 0 || p < 0 || (p > 0 && n > INT64_MAX / 8 / p)) return PL_ERR_ARG;
    if (n == 0 || p == 0) return PL_OK;
    if (h == NULL || c == NULL || gates == NULL) return PL_ERR_ARG;
    for (int64_t r = 0; r < n; r++) {
        const float *g = gates + r * 4 * p;
        float *cr = c + r * p, *hr = h + r * p;
        for (int64_t k = 0; k < p; k++) {
            const float i = lstm_sigmoid(g[k]), f = lstm_sigmoid(g[p + k]), o = lstm_sigmoid(g[2 * p + k]);
            cr[k] = f * cr[k] + i * tanhf(g[3 * p + k]);
            hr[k] = o * tanhf(cr[k]);
        }
    }
    return PL_OK;
}
