//go:build cuda && cgo && !nocgo

package cuda

import (
	"fmt"

	bcuda "github.com/parleyhq/parley/bindings/cuda"
	"github.com/parleyhq/parley/runtime/backend"
)

// Matrix products and the rows of weight tables.

// GetRows: dst[i,:] = float32(table[ids[i],:]); dst [len(ids), cols] F32.
func (b *Backend) GetRows(dst, table backend.Tensor, ids []int32) error {
	d, tb, err := b.ops.GetRows(dst, table, ids)
	if err != nil {
		return err
	}
	return b.ctx.GetRows(d.ref(), tb.ref(), tb.dt, tb.rows, tb.cols, ids)
}

// MatMul: dst[i,j] = sum_k x[i,k]*w[j,k]; x [n, k] F32, w [m, k], dst [n, m] F32.
func (b *Backend) MatMul(dst, x, w backend.Tensor) error {
	d, xt, wt, err := b.ops.MatMul(dst, x, w)
	if err != nil {
		return err
	}
	return b.ctx.MatMul(d.ref(), xt.ref(), xt.rows, xt.cols, wt.ref(), wt.dt, wt.rows)
}

var _ backend.MultiMatMuler = (*Backend)(nil)

// MatMuls computes dst[i] = x · w[i]ᵀ for every i (backend.MultiMatMuler), each bit for bit as
// MatMul does: one launch for a layer's query, key and value products (or gate and up) against
// a decode-sized x, where the matrices share a type.
func (b *Backend) MatMuls(dst []backend.Tensor, x backend.Tensor, w []backend.Tensor) error {
	n := len(w)
	if n == 0 || n > 4 || len(dst) != n {
		if len(dst) != n {
			return fmt.Errorf("cuda: matmuls: %d destinations for %d matrices", len(dst), n)
		}
		for i := range w {
			if err := b.MatMul(dst[i], x, w[i]); err != nil {
				return err
			}
		}
		return nil
	}
	// Every product is checked before any runs.
	var ds, ws [4]*Tensor
	xt, err := b.ops.MatMuls(dst, x, w, ds[:n], ws[:n])
	if err != nil {
		return err
	}
	same := true
	for i := range n {
		same = same && ws[i].dt == ws[0].dt
	}
	if !same {
		for i := range n {
			if err := b.ctx.MatMul(ds[i].ref(), xt.ref(), xt.rows, xt.cols, ws[i].ref(), ws[i].dt, ws[i].rows); err != nil {
				return err
			}
		}
		return nil
	}
	var dr, wr [4]bcuda.Ref
	var m [4]int
	for i := range n {
		dr[i], wr[i], m[i] = ds[i].ref(), ws[i].ref(), ws[i].rows
	}
	return b.ctx.MatMuls(dr[:n], xt.ref(), xt.rows, xt.cols, wr[:n], ws[0].dt, m[:n])
}
