package purego

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The element-wise and row-wise operations of encoder-decoder models: Copy, LayerNorm and
// Im2Col1D. Each splits its rows among the workers in chunks of about minParallelElems elements.

// rowOp names the operation a rowJob runs.
type rowOp int

const (
	opCopy rowOp = iota
	opLayerNorm
	opIm2Col
)

// rowJob runs one of the row operations over rows [c*chunk, (c+1)*chunk) of unit c.
type rowJob struct {
	op    rowOp
	rows  int
	cols  int // elements a row of dst
	chunk int

	// Copy: one of the four source/destination pairs, element-wise.
	srcDT, dstDT tensor.DType
	src32, dst32 []float32 // [rows, cols] F32 operands
	src16, dst16 []byte    // [rows, 2*cols] F16 operands

	// LayerNorm: x and dst [rows, cols], w and b [cols].
	x, w, b []float32
	eps     float64

	// Im2Col1D: x [T, C], dst [rows, C*K] (cols = C*K).
	t, c, k, stride, pad int
}

func (j *rowJob) unit(_, u int) {
	r0 := u * j.chunk
	r1 := min(r0+j.chunk, j.rows)
	n := j.cols
	switch j.op {
	case opCopy:
		j.copyRows(r0, r1)
	case opLayerNorm:
		for r := r0; r < r1; r++ {
			layerNormRow(j.dst32[r*n:(r+1)*n], j.x[r*n:(r+1)*n], j.w[:n], j.b[:n], j.eps)
		}
	case opIm2Col:
		for r := r0; r < r1; r++ {
			j.im2colRow(r)
		}
	}
}

// copyRows converts rows [r0, r1) of the source into the destination.
func (j *rowJob) copyRows(r0, r1 int) {
	n := j.cols
	switch {
	case j.srcDT == tensor.F32 && j.dstDT == tensor.F32:
		copy(j.dst32[r0*n:r1*n], j.src32[r0*n:r1*n])
	case j.srcDT == tensor.F16 && j.dstDT == tensor.F16:
		copy(j.dst16[2*r0*n:2*r1*n], j.src16[2*r0*n:2*r1*n])
	case j.srcDT == tensor.F32:
		// Lengths were checked by the caller; Quantize cannot fail here.
		_ = quant.Quantize(tensor.F16, j.src32[r0*n:r1*n], j.dst16[2*r0*n:2*r1*n])
	default:
		_ = quant.Dequantize(tensor.F16, j.src16[2*r0*n:2*r1*n], j.dst32[r0*n:r1*n])
	}
}

// layerNormRow sets y = (x - mean(x)) / sqrt(var(x) + eps) * w + b, with the mean and the
// (biased) variance taken in float64 in two passes, and each output computed in float64 and
// rounded once. y may be x.
func layerNormRow(y, x, w, b []float32, eps float64) {
	n := len(x)
	y, w, b = y[:n], w[:n], b[:n]
	var s0, s1 float64
	e := 0
	for ; e+2 <= n; e += 2 {
		s0 += float64(x[e])
		s1 += float64(x[e+1])
	}
	if e < n {
		s0 += float64(x[e])
	}
	mean := (s0 + s1) / float64(n)
	s0, s1 = 0, 0
	for e = 0; e+2 <= n; e += 2 {
		d0, d1 := float64(x[e])-mean, float64(x[e+1])-mean
		s0 += d0 * d0
		s1 += d1 * d1
	}
	if e < n {
		d0 := float64(x[e]) - mean
		s0 += d0 * d0
	}
	rstd := 1 / math.Sqrt((s0+s1)/float64(n)+eps)
	for i, v := range x {
		y[i] = float32((float64(v)-mean)*rstd*float64(w[i]) + float64(b[i]))
	}
}

// im2colRow fills output row t: dst[t, c*K+k] = x[t*stride+k-pad, c], zero outside x.
func (j *rowJob) im2colRow(t int) {
	C, K := j.c, j.k
	out := j.dst32[t*j.cols : (t+1)*j.cols]
	for k := 0; k < K; k++ {
		r := t*j.stride + k - j.pad
		if r < 0 || r >= j.t {
			for c := 0; c < C; c++ {
				out[c*K+k] = 0
			}
			continue
		}
		src := j.x[r*C : (r+1)*C]
		for c, v := range src {
			out[c*K+k] = v
		}
	}
}

// runRows runs j over rows rows of cols elements, on the caller alone when they are few.
func (be *Backend) runRows(j *rowJob, rows, cols int) {
	j.rows, j.cols = rows, cols
	if rows == 0 {
		return
	}
	j.chunk = max(1, minParallelElems/max(1, cols))
	if rows*cols < minParallelElems {
		j.chunk = rows
	}
	be.pool.do(j, (rows+j.chunk-1)/j.chunk)
	*j = rowJob{}
}

// Copy converts src into dst: F32 to F16 (round to nearest even), F16 to F32, or a copy
// between tensors of one type.
func (be *Backend) Copy(dst, src backend.Tensor) error {
	const op = "copy"
	be.mu.Lock()
	defer be.mu.Unlock()
	d, s, err := be.ops.Copy(dst, src)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	if s.rows*s.cols > 0 && ((s.dt == tensor.F16 && s.data == nil) || (d.dt == tensor.F16 && d.data == nil)) {
		return fmt.Errorf("purego: %s: %v into %v without bytes: %w", op, s, d, backend.ErrUnsupported)
	}
	if s.dt == d.dt {
		if s.dt == tensor.F32 {
			copy(d.f32, s.f32)
		} else {
			copy(d.data, s.data)
		}
		return nil
	}
	j := &be.rows
	j.op, j.srcDT, j.dstDT = opCopy, s.dt, d.dt
	j.src32, j.dst32, j.src16, j.dst16 = s.f32, d.f32, s.data, d.data
	be.runRows(j, s.rows, s.cols)
	return nil
}

// LayerNorm: dst[i,:] = (x[i,:] - mean) / sqrt(var + eps) * w[0,:] + b[0,:], with the mean and
// biased variance of each row taken in float64.
func (be *Backend) LayerNorm(dst, x, w, b backend.Tensor, eps float32) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, xt, wt, bt, err := be.ops.LayerNorm(dst, x, w, b, eps)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	if xt.cols == 0 {
		return nil
	}
	j := &be.rows
	j.op, j.dst32, j.x, j.w, j.b, j.eps = opLayerNorm, d.f32, xt.f32, wt.f32, bt.f32, float64(eps)
	be.runRows(j, xt.rows, xt.cols)
	return nil
}

// Im2Col1D: dst[t, c*K+k] = x[t*stride+k-pad, c] (0 outside x) for x [T, C], dst [Tout, C*K].
func (be *Backend) Im2Col1D(dst, x backend.Tensor, kernel, stride, pad int) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, xt, tOut, err := be.ops.Im2Col1D(dst, x, kernel, stride, pad)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	j := &be.rows
	j.op, j.dst32, j.x = opIm2Col, d.f32, xt.f32
	j.t, j.c, j.k, j.stride, j.pad = xt.rows, xt.cols, kernel, stride, pad
	be.runRows(j, tOut, d.cols)
	return nil
}
