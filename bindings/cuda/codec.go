//go:build cuda && cgo && !nocgo

package cuda

/*
#include "parley_cuda.h"
*/
import "C"
import "unsafe"

// The operations of streaming codecs and flow-matching heads (Pocket TTS).

// Mul: dst[i,:] = a[i,:] * b[i % bRows,:] elementwise for [n, d] F32, bRows 1 or n. dst may be
// a, and b when bRows is n.
func (c *Context) Mul(dst, a, b Ref, n, d, bRows int) error {
	return c.rowPair("mul", dst, a, b, n, d, bRows, func(dp, ap, bp unsafe.Pointer) C.int {
		return C.plc_mul(c.c, fp(dp), fp(ap), fp(bp), C.int64_t(n), C.int64_t(d), C.int64_t(bRows))
	})
}
