//go:build cuda && cgo && !nocgo

package cuda

/*
#include "parley_cuda.h"
*/
import "C"

import "fmt"

// The operations of streaming codecs and flow-matching heads (Pocket TTS).

// Mul: dst[i,:] = a[i,:] * b[i % bRows,:] elementwise for [n, d] F32, bRows 1 or n. dst may be
// a, and b when bRows is n.
func (c *Context) Mul(dst, a, b Ref, n, d, bRows int) error {
	const op = "mul"
	if bRows != 1 && bRows != n {
		return fmt.Errorf("cuda: %s: b has %d rows, want 1 or %d", op, bRows, n)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(n, d, 4))
	if err != nil {
		return err
	}
	ap, err := a.at(c, op, "a", mul(n, d, 4))
	if err != nil {
		return err
	}
	bp, err := b.at(c, op, "b", mul(bRows, d, 4))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_mul(c.c, fp(dp), fp(ap), fp(bp), C.int64_t(n), C.int64_t(d), C.int64_t(bRows)))
}
