package purego

import (
	"github.com/parleyhq/parley/runtime/backend"
)

// The operations of streaming codecs and flow-matching heads: Mul and Reshape.

// Mul: dst[i,:] = a[i,:] * b[i,:], or * b[0,:] when b has one row.
func (be *Backend) Mul(dst, a, b backend.Tensor) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, at, bt, err := be.ops.Mul(dst, a, b)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	rowPair(d, at, bt, func(dr, ar, br []float32) {
		for e := range dr {
			dr[e] = ar[e] * br[e]
		}
	})
	return nil
}

// Reshape returns x's elements as a [rows, cols] tensor sharing its memory.
func (be *Backend) Reshape(x backend.Tensor, rows, cols int) (backend.Tensor, error) {
	be.mu.Lock()
	defer be.mu.Unlock()
	t, err := be.ops.Reshape(x, rows, cols)
	if err != nil {
		return nil, err
	}
	v := &Tensor{be: be, dt: t.dt, rows: rows, cols: cols, rowBytes: 4 * cols, readOnly: t.readOnly, root: t,
		data: t.data, f32: t.f32}
	if t.root != nil {
		v.root = t.root
	}
	v.setKernel()
	v.reside()
	return v, nil
}
