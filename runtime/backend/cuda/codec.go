//go:build cuda && cgo && !nocgo

package cuda

import (
	"github.com/parleyhq/parley/runtime/backend"
)

// The operations of streaming codecs and flow-matching heads: Mul and Reshape.

// Mul: dst[i,:] = a[i,:] * b[i or 0,:] elementwise. dst may be a, and b when b has a's rows.
func (b *Backend) Mul(dst, a, bt backend.Tensor) error {
	d, at, bb, err := b.ops.Mul(dst, a, bt)
	if err != nil {
		return err
	}
	return b.ctx.Mul(d.ref(), at.ref(), bb.ref(), at.rows, at.cols, bb.rows)
}

// Reshape returns t's elements as a [rows, cols] tensor sharing its device memory. Closing it
// does not free t; t must outlive it.
func (b *Backend) Reshape(t backend.Tensor, rows, cols int) (backend.Tensor, error) {
	p, err := b.ops.Reshape(t, rows, cols)
	if err != nil {
		return nil, err
	}
	v := &Tensor{b: b, dt: p.dt, rows: rows, cols: cols, rowBytes: 4 * cols, buf: p.buf, off: p.off, root: p.root, readOnly: p.readOnly}
	v.reside()
	return v, nil
}
