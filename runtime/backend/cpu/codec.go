package cpu

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
	return b.ctx.Mul(d.f32, at.f32, bb.f32, at.rows, at.cols, bb.rows)
}

// Reshape returns t's elements as a [rows, cols] tensor sharing its memory. Closing it does not
// free t; t must outlive it.
func (b *Backend) Reshape(t backend.Tensor, rows, cols int) (backend.Tensor, error) {
	p, err := b.ops.Reshape(t, rows, cols)
	if err != nil {
		return nil, err
	}
	v := &Tensor{b: b, dt: p.dt, rows: rows, cols: cols, root: p.root, readOnly: p.readOnly, data: p.data, f32: p.f32}
	v.reside(p.root)
	return v, nil
}
