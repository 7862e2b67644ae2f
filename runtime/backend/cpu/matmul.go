package cpu

import (
	"fmt"

	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
)

// Matrix products and the rows of weight tables.

// Repack rearranges a loaded quantised weight matrix (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS), sixteen rows at a time, into the interleaved layout of the AVX-512 VNNI
// and AVX2 kernels (native memory the tensor owns, about as large as the rows), through which
// MatMul then multiplies it: a block's whole integer dot product lands in
// one lane, so a product of a few rows costs about a third of the row layout's operations. It
// reports false, doing nothing, for other tensors (Q2_K, Q3_K, IQ4_NL and IQ4_XS with AVX-512
// among them, whose interleaved kernels are AVX2 only: MatMul multiplies their rows), views, or
// processors without those kernels.
// The loaded data stays in use for GetRows, views, and instruction-set levels lowered later.
// Where the memory for the new layout cannot be had, or PARLEY_CPU_REPACK=0 was set when the
// backend started, the tensor stays as loaded. Repack must not run while t is in use.
func (b *Backend) Repack(t backend.Tensor) (bool, error) {
	const op = "repack"
	ct, err := b.ops.Tensor(op, "t", t)
	if err != nil {
		return false, err
	}
	if ct.root != ct || !ct.readOnly || ct.packed != nil || ct.rows == 0 {
		return ct.packed != nil, nil
	}
	n, ok := cpu.PackedSize(ct.dt, ct.rows, ct.cols)
	if !ok {
		return false, nil
	}
	if b.noRepack {
		return false, nil
	}
	buf, err := b.alloc(op, n)
	if err != nil { // no room for a second layout: the rows serve, as without repacking
		return false, nil
	}
	if err := b.ctx.PackWeights(buf.Bytes(), ct.data, ct.dt, ct.rows, ct.cols); err != nil {
		b.free(buf)
		return false, err
	}
	ct.packed = buf
	return true, nil
}

// GetRows: dst[i,:] = float32(table[ids[i],:]); dst [len(ids), cols] F32.
func (b *Backend) GetRows(dst, table backend.Tensor, ids []int32) error {
	d, tb, err := b.ops.GetRows(dst, table, ids)
	if err != nil {
		return err
	}
	return b.ctx.GetRows(d.f32, tb.data, tb.dt, tb.rows, tb.cols, ids)
}

// MatMul: dst[i,j] = sum_k x[i,k]*w[j,k]; x [n, k] F32, w [m, k], dst [n, m] F32.
func (b *Backend) MatMul(dst, x, w backend.Tensor) error {
	d, xt, wt, err := b.ops.MatMul(dst, x, w)
	if err != nil {
		return err
	}
	return b.matMul(d, xt, wt)
}

// matMul multiplies checked operands.
func (b *Backend) matMul(d, xt, wt *Tensor) error {
	if xt.cols == 0 { // empty sums, which the kernels do not take
		clear(d.f32)
		return nil
	}
	if wt.packed != nil && cpu.PackedAvailable(wt.dt) { // else the ISA level was lowered: the rows serve
		return b.ctx.MatMulPacked(d.f32, xt.f32, xt.rows, xt.cols, wt.packed.Bytes(), wt.dt, wt.rows)
	}
	return b.ctx.MatMul(d.f32, xt.f32, xt.rows, xt.cols, wt.data, wt.dt, wt.rows)
}

// MatMuls computes dst[i] = x · w[i]ᵀ for every i (backend.MultiMatMuler): up to three packed
// matrices of one type in one native call, which converts x once and wakes the threads once;
// otherwise one MatMul each. Every result is bit for bit MatMul's.
func (b *Backend) MatMuls(dst []backend.Tensor, x backend.Tensor, w []backend.Tensor) error {
	n := len(w)
	if n < 2 || n > cpu.MaxPackedProducts || len(dst) != n {
		if len(dst) != n {
			return fmt.Errorf("cpu: matmul: %d destinations for %d matrices", len(dst), n)
		}
		for i := range w {
			if err := b.MatMul(dst[i], x, w[i]); err != nil {
				return err
			}
		}
		return nil
	}
	var ds, ws [cpu.MaxPackedProducts]*Tensor
	xt, err := b.ops.MatMuls(dst, x, w, ds[:n], ws[:n])
	if err != nil {
		return err
	}
	together := xt.cols > 0
	var ps [cpu.MaxPackedProducts]cpu.PackedProduct
	for i := range n {
		together = together && ws[i].packed != nil && ws[i].dt == ws[0].dt
		ps[i] = cpu.PackedProduct{Dst: ds[i].f32, M: ws[i].rows}
		if ws[i].packed != nil {
			ps[i].W = ws[i].packed.Bytes()
		}
	}
	if together && cpu.PackedAvailable(ws[0].dt) {
		return b.ctx.MatMulPackedN(xt.f32, xt.rows, xt.cols, ws[0].dt, ps[:n])
	}
	for i := range n {
		if err := b.matMul(ds[i], xt, ws[i]); err != nil {
			return err
		}
	}
	return nil
}
