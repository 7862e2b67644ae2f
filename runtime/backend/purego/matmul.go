package purego

import (
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Work sizes below which an operation runs on the calling goroutine alone: waking workers
// costs a few microseconds.
const (
	minParallelMACs  = 1 << 15 // multiply-adds of a MatMul
	minParallelElems = 1 << 16 // elements converted or copied
)

// xTile is the number of activation rows dotted with each weight row while it is in L1 cache.
const xTile = 4

// matmulJob computes dst [n, m] = x [n, k] · w [m, k]ᵀ by tiles of w's rows.
type matmulJob struct {
	dot func(n int, w, x []byte) float32
	// dot4, where the type has it, takes four activation rows through a tile of weight rows in
	// one pass over each weight row
	dot4 func(n int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) bool
	k    int
	w    []byte // [m, wRow]
	wRow int
	x    []byte // [n, xRow], converted activations
	xRow int
	dst  []float32 // [n, m]
	n, m int
	tile int // rows of w per unit
}

func (j *matmulJob) unit(_, t int) {
	r0 := t * j.tile
	r1 := min(r0+j.tile, j.m)
	if j.n == 1 {
		x, dst := j.x[:j.xRow], j.dst[:j.m]
		for r := r0; r < r1; r++ {
			dst[r] = j.dot(j.k, j.w[r*j.wRow:(r+1)*j.wRow], x)
		}
		return
	}
	for i0 := 0; i0 < j.n; i0 += xTile {
		i1 := min(i0+xTile, j.n)
		// Lengths were checked by MatMul, so dot4 cannot refuse them.
		if j.dot4 != nil && i1-i0 == 4 &&
			j.dot4(j.k, j.w[r0*j.wRow:r1*j.wRow], j.wRow, r1-r0, j.x[i0*j.xRow:i1*j.xRow], j.xRow, j.dst[i0*j.m+r0:], j.m) {
			continue
		}
		for r := r0; r < r1; r++ {
			wr := j.w[r*j.wRow : (r+1)*j.wRow]
			for i := i0; i < i1; i++ {
				j.dst[i*j.m+r] = j.dot(j.k, wr, j.x[i*j.xRow:(i+1)*j.xRow])
			}
		}
	}
}

// convertJob converts rows of F32 activations to a dot-product type, by chunks of rows.
type convertJob struct {
	dt    tensor.DType
	src   []float32 // [n, cols]
	cols  int
	dst   []byte // [n, dRow]
	dRow  int
	n     int
	chunk int
}

func (j *convertJob) unit(_, c int) {
	for r := c * j.chunk; r < min((c+1)*j.chunk, j.n); r++ {
		// Lengths were checked by the caller; Quantize cannot fail here.
		_ = quant.Quantize(j.dt, j.src[r*j.cols:(r+1)*j.cols], j.dst[r*j.dRow:(r+1)*j.dRow])
	}
}

// convert converts n rows of cols activations in src to dt rows of dRow bytes in dst.
func (be *Backend) convert(dt tensor.DType, src []float32, cols int, dst []byte, dRow, n int) {
	cv := &be.cv
	cv.dt, cv.src, cv.cols, cv.dst, cv.dRow, cv.n = dt, src, cols, dst, dRow, n
	cv.chunk = max(1, minParallelElems/(4*cols))
	if n*cols < minParallelElems {
		cv.chunk = n
	}
	be.pool.do(cv, (n+cv.chunk-1)/cv.chunk)
	cv.src, cv.dst = nil, nil
}

// MatMul: dst [n, m] = x [n, k] · w [m, k]ᵀ, each row of x converted to w's dot-product type.
func (be *Backend) MatMul(dst, x, w backend.Tensor) error {
	const op = "matmul"
	be.mu.Lock()
	defer be.mu.Unlock()
	d, xt, wt, err := be.ops.MatMul(dst, x, w)
	if err != nil {
		return err
	}
	if wt.data == nil && wt.rows > 0 {
		return fmt.Errorf("purego: %s: %v weights made by Alloc on a big-endian platform: %w", op, wt, backend.ErrUnsupported)
	}
	if wt.kernErr != nil {
		return fmt.Errorf("purego: %s: %v weights: %v: %w", op, wt.dt, wt.kernErr, backend.ErrUnsupported)
	}
	n, m, k := xt.rows, wt.rows, wt.cols
	if n == 0 || m == 0 {
		return nil
	}
	if k == 0 {
		clear(d.f32)
		return nil
	}

	// Activations: F32 weights read x in place unless dst overlaps it; everything else reads a
	// converted copy.
	var xb []byte
	xRow := wt.vecRow
	if wt.kern.VecType == tensor.F32 && xt.data != nil {
		xb = xt.data
	} else {
		xb = be.xq[:min(len(be.xq), n*xRow)]
		if !same(be.xqFrom, xt.f32) || be.xqType != wt.kern.VecType {
			be.xq = grow(be.xq, n*xRow)
			xb = be.xq
			be.convert(wt.kern.VecType, xt.f32, k, xb, xRow, n)
			be.xqFrom, be.xqType = xt.f32, wt.kern.VecType
		}
	}
	if overlap(be.xqFrom, d.f32) {
		be.xqFrom = nil
	}

	j := &be.mm
	j.dot, j.k, j.w, j.wRow, j.x, j.xRow, j.dst, j.n, j.m = wt.kern.Dot, k, wt.data, wt.rowBytes, xb, xRow, d.f32, n, m
	j.dot4 = wt.kern.Dot4
	// Tiles: enough of them for the workers to balance (4 per thread), none so large that a
	// tile's weights fall out of L2 (256 KiB) while the activation rows pass over them.
	threads := be.pool.threads
	j.tile = max(1, min((m+4*threads-1)/(4*threads), (256<<10)/max(1, wt.rowBytes)))
	if n*m*k < minParallelMACs {
		j.tile = m
	}
	be.pool.do(j, (m+j.tile-1)/j.tile)
	j.dot, j.dot4, j.w, j.x, j.dst = nil, nil, nil, nil, nil
	return nil
}

// getRowsJob dequantises rows of a table, by chunks of ids.
type getRowsJob struct {
	dt    tensor.DType
	table []byte // [rows, rowB]
	rowB  int
	ids   []int32
	dst   []float32 // [len(ids), cols]
	cols  int
	chunk int
}

func (j *getRowsJob) unit(_, c int) {
	for i := c * j.chunk; i < min((c+1)*j.chunk, len(j.ids)); i++ {
		id := int(j.ids[i])
		// Ids and lengths were checked by the caller; Dequantize cannot fail here.
		_ = quant.Dequantize(j.dt, j.table[id*j.rowB:(id+1)*j.rowB], j.dst[i*j.cols:(i+1)*j.cols])
	}
}

// GetRows: dst[i,:] = float32(table[ids[i],:]).
func (be *Backend) GetRows(dst, table backend.Tensor, ids []int32) error {
	const op = "get rows"
	be.mu.Lock()
	defer be.mu.Unlock()
	d, t, err := be.ops.GetRows(dst, table, ids)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	if t.dt == tensor.F32 {
		// Exact copies; also the path for activation tables on big-endian platforms.
		for i, id := range ids {
			copy(d.f32[i*t.cols:(i+1)*t.cols], t.f32[int(id)*t.cols:int(id+1)*t.cols])
		}
		return nil
	}
	if t.data == nil {
		return fmt.Errorf("purego: %s: %v table without bytes: %w", op, t, backend.ErrUnsupported)
	}
	if len(ids) == 0 {
		return nil
	}
	if err := quant.Dequantize(t.dt, t.data[int(ids[0])*t.rowBytes:int(ids[0]+1)*t.rowBytes], d.f32[:t.cols]); err != nil {
		return fmt.Errorf("purego: %s: %v: %w", op, err, backend.ErrUnsupported)
	}
	j := &be.gr
	j.dt, j.table, j.rowB, j.ids, j.dst, j.cols = t.dt, t.data, t.rowBytes, ids, d.f32, t.cols
	j.chunk = max(1, minParallelElems/max(1, t.cols))
	be.pool.do(j, (len(ids)+j.chunk-1)/j.chunk)
	j.table, j.ids, j.dst = nil, nil, nil
	return nil
}
