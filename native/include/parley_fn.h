/*
 * parley_fn.h: the elementwise functions of the unary and gated operations, of the CPU kernels
 * (pl_unary, pl_glu) and of the CUDA ones (plc_unary, plc_glu), shared by both headers. The values
 * are Go's tensor.Func, which the bindings pass through as they are; a kernel given a value it
 * does not know returns PL_ERR_UNSUPPORTED (PLC_ERR_UNSUPPORTED).
 */
#ifndef PARLEY_FN_H
#define PARLEY_FN_H

#define PL_FN_RELU 1     /* max(x, 0) */
#define PL_FN_SILU 2     /* x*sigmoid(x) = x/(1+exp(-x)) */
#define PL_FN_SIGMOID 3  /* 1/(1+exp(-x)) */
#define PL_FN_TANH 4     /* tanh(x) */
#define PL_FN_GELU 5     /* 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))), the tanh form */
#define PL_FN_GELU_ERF 6 /* 0.5*x*(1+erf(x/sqrt(2))) = 0.5*x*erfc(-x/sqrt(2)), the exact form */
#define PL_FN_ELU 7      /* x for x > 0, exp(x)-1 otherwise (alpha 1) */
#define PL_FN_EXP 8      /* exp(x) */

#endif
