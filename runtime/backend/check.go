package backend

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Shape checks shared by the backends: each returns a description of what is wrong with the
// operands' types and shapes, or nil; backends add their name and check what only they know
// (ownership, liveness, writability, overlap).

func shapeErr(op, what string, t Tensor, rows, cols int) error {
	return fmt.Errorf("%s: %s is [%d, %d], want [%d, %d]", op, what, t.Rows(), t.Cols(), rows, cols)
}

// CheckCopy: dst and src of one shape, each F32 or F16.
func CheckCopy(dst, src Tensor) error {
	for _, t := range []Tensor{src, dst} {
		if t.DType() != tensor.F32 && t.DType() != tensor.F16 {
			return fmt.Errorf("copy: %v into %v: %w", src.DType(), dst.DType(), ErrUnsupported)
		}
	}
	if dst.Rows() != src.Rows() || dst.Cols() != src.Cols() {
		return shapeErr("copy", "dst", dst, src.Rows(), src.Cols())
	}
	return nil
}

// CheckLayerNorm: dst like x, w and b [1, cols of x].
func CheckLayerNorm(dst, x, w, b Tensor) error {
	const op = "layer norm"
	if dst.Rows() != x.Rows() || dst.Cols() != x.Cols() {
		return shapeErr(op, "dst", dst, x.Rows(), x.Cols())
	}
	if w.Rows() != 1 || w.Cols() != x.Cols() {
		return shapeErr(op, "w", w, 1, x.Cols())
	}
	if b.Rows() != 1 || b.Cols() != x.Cols() {
		return shapeErr(op, "b", b, 1, x.Cols())
	}
	return nil
}

// CheckSameShape: dst shaped like x (elementwise operations).
func CheckSameShape(op string, dst, x Tensor) error {
	if dst.Rows() != x.Rows() || dst.Cols() != x.Cols() {
		return shapeErr(op, "dst", dst, x.Rows(), x.Cols())
	}
	return nil
}

// Im2Col1DShape returns the output rows (t+2*pad-kernel)/stride+1 and columns c*kernel of a
// 1-D convolution of a signal [t, c], or what is wrong with the geometry.
func Im2Col1DShape(t, c, kernel, stride, pad int) (tOut, cols int, err error) {
	switch {
	case kernel <= 0 || stride <= 0 || pad < 0 || kernel > math.MaxInt32 || stride > math.MaxInt32 || pad > math.MaxInt32/2 || t > math.MaxInt32/2:
		return 0, 0, fmt.Errorf("im2col: kernel %d, stride %d, padding %d over %d steps", kernel, stride, pad, t)
	case t+2*pad < kernel:
		return 0, 0, fmt.Errorf("im2col: a signal of %d steps padded by %d is shorter than the kernel %d", t, pad, kernel)
	case c > 0 && kernel > math.MaxInt32/c:
		return 0, 0, fmt.Errorf("im2col: %d channels of kernel %d is too large", c, kernel)
	}
	return (t+2*pad-kernel)/stride + 1, c * kernel, nil
}

// CheckIm2Col1D validates the convolution's geometry and dst's shape and returns the number of
// output steps.
func CheckIm2Col1D(dst, x Tensor, kernel, stride, pad int) (int, error) {
	tOut, cols, err := Im2Col1DShape(x.Rows(), x.Cols(), kernel, stride, pad)
	if err != nil {
		return 0, err
	}
	if dst.Rows() != tOut || dst.Cols() != cols {
		return 0, shapeErr("im2col", "dst", dst, tOut, cols)
	}
	return tOut, nil
}

// CheckFullAttention: heads that divide, q [n, NHead*HeadDim], k and v of one float type and
// shape [m, NKVHead*HeadDim] with m >= 1 when n >= 1. (dst must be shaped like q.)
func CheckFullAttention(q, k, v Tensor, a Attn) error {
	const op = "full attention"
	if a.NHead <= 0 || a.NKVHead <= 0 || a.HeadDim <= 0 || a.NHead%a.NKVHead != 0 || a.NHead > math.MaxInt32/a.HeadDim {
		return fmt.Errorf("%s: %d query heads over %d kv heads of %d", op, a.NHead, a.NKVHead, a.HeadDim)
	}
	if k.DType() != v.DType() || (k.DType() != tensor.F32 && k.DType() != tensor.F16) {
		return fmt.Errorf("%s: k is %v and v is %v, want both F32 or both F16", op, k.DType(), v.DType())
	}
	if s := float64(a.Scale); math.IsNaN(s) || math.IsInf(s, 0) {
		return fmt.Errorf("%s: scale %v", op, a.Scale)
	}
	qw, kw := a.NHead*a.HeadDim, a.NKVHead*a.HeadDim
	if q.Cols() != qw {
		return fmt.Errorf("%s: q has %d columns, not %d heads of %d", op, q.Cols(), a.NHead, a.HeadDim)
	}
	if (q.Rows() > 0 && k.Rows() < 1) || k.Cols() != kw {
		return shapeErr(op, "k", k, max(k.Rows(), 1), kw)
	}
	if v.Rows() != k.Rows() || v.Cols() != kw {
		return shapeErr(op, "v", v, k.Rows(), kw)
	}
	return nil
}
