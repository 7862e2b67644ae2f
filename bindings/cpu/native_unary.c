//go:build cgo && !nocgo

/* The native source, compiled as part of this package (cgo compiles only files here). */
#include "../../native/cpu/unary.c"
