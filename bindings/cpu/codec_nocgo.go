//go:build !cgo || nocgo

package cpu

// Mul multiplies rows elementwise.
func (c *Context) Mul(dst, a, b []float32, n, d, bRows int) error { return ErrNotBuilt }
