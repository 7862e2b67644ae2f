//go:build cgo && !nocgo

package cpu

/*
#include "parley.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// The operations of streaming codecs and flow-matching heads (Pocket TTS).

// Mul: dst[i,:] = a[i,:] * b[i,:] (bRows == n) or b[0,:] (bRows == 1) elementwise; [n, d]. dst
// may be a, and b when bRows == n; it must not otherwise overlap them.
func (c *Context) Mul(dst, a, b []float32, n, d, bRows int) error {
	const op = "mul"
	if n < 0 || d < 0 || (bRows != 1 && bRows != n) {
		return fmt.Errorf("cpu: %s: bad shape n=%d d=%d b rows=%d", op, n, d, bRows)
	}
	if err := need(op, "a", len(a), mul(n, d)); err != nil {
		return err
	}
	if err := need(op, "dst", len(dst), mul(n, d)); err != nil {
		return err
	}
	if err := need(op, "b", len(b), mul(bRows, d)); err != nil {
		return err
	}
	if n == 0 || d == 0 {
		return nil
	}
	dp, dn := unsafe.Pointer(&dst[0]), n*d*4
	if dp != unsafe.Pointer(&a[0]) && overlap(dp, dn, unsafe.Pointer(&a[0]), n*d*4) {
		return fmt.Errorf("cpu: %s: dst overlaps a without being a", op)
	}
	if (bRows != n || dp != unsafe.Pointer(&b[0])) && overlap(dp, dn, unsafe.Pointer(&b[0]), bRows*d*4) {
		return fmt.Errorf("cpu: %s: dst overlaps b without being b", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if st := C.pl_mul(c.c, f32p(dst), f32p(a), f32p(b), C.int64_t(n), C.int64_t(d), C.int64_t(bRows)); st != C.PL_OK {
		return statusErr(op, st)
	}
	return nil
}
