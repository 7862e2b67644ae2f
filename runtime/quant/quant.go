// Package quant owns Parley's element formats at the byte level: conversion between float32 and
// every supported ggml block format (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS), and the per-format dot-product kernels that CPU
// matrix-vector products use.
//
// Block layouts are bit-compatible with ggml's (ggml-common.h), and Quantize rounds exactly as
// ggml's reference quantizers (quantize_row_*_ref) do with every float operation rounded on its
// own. A ggml built with fused multiply-add contraction (the default with -march=native on FMA
// machines) may pick a different scale for a few Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS blocks,
// as its fit of the best scale then compares slightly different error sums; the other formats
// do not search and agree either way.
//
// Dot kernels use AVX2, FMA and F16C assembly on amd64 CPUs that have them (checked once at
// start-up; build tag noasm forces the Go kernels), and portable Go elsewhere. Everything here
// is safe for concurrent use.
package quant

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/tensor"
)

// rowBytes returns dt.RowSize(n) as an int, or an error naming op.
func rowBytes(op string, dt tensor.DType, n int) (int, error) {
	sz, err := dt.RowSize(int64(n))
	if err != nil {
		return 0, fmt.Errorf("quant: %s: %w", op, err)
	}
	if sz > math.MaxInt {
		return 0, fmt.Errorf("quant: %s: %v row of %d elements does not fit in memory", op, dt, n)
	}
	return int(sz), nil
}

// Dequantize converts len(dst) elements stored as dt in src (exactly dt.RowSize(len(dst)) bytes)
// to float32. Supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K, Q8_K, IQ4_NL, IQ4_XS.
func Dequantize(dt tensor.DType, src []byte, dst []float32) error {
	f, ok := dequantizers[dt]
	if !ok {
		return fmt.Errorf("quant: dequantize: unsupported dtype %v", dt)
	}
	want, err := rowBytes("dequantize", dt, len(dst))
	if err != nil {
		return err
	}
	if len(src) != want {
		return fmt.Errorf("quant: dequantize %v: %d elements need %d bytes, got %d", dt, len(dst), want, len(src))
	}
	f(src, dst)
	return nil
}

// Quantize converts src to dt into dst (exactly dt.RowSize(len(src)) bytes), rounding exactly as
// llama.cpp's quantize_row_*_ref does (F16 and BF16 round to nearest even). Non-finite inputs
// do not fail; what they quantise to is unspecified.
func Quantize(dt tensor.DType, src []float32, dst []byte) error {
	f, ok := quantizers[dt]
	if !ok {
		return fmt.Errorf("quant: quantize: unsupported dtype %v", dt)
	}
	want, err := rowBytes("quantize", dt, len(src))
	if err != nil {
		return err
	}
	if len(dst) != want {
		return fmt.Errorf("quant: quantize %v: %d elements need %d bytes, got %d", dt, len(src), want, len(dst))
	}
	f(src, dst)
	return nil
}

// QuantizeRows converts src, rows of cols values each, to dt row by row (as Quantize does) and
// returns the rows' bytes, dt.RowSize(cols) each.
func QuantizeRows(dt tensor.DType, src []float32, cols int) ([]byte, error) {
	if cols <= 0 || len(src)%cols != 0 {
		return nil, fmt.Errorf("quant: quantize %v: %d elements are not rows of %d", dt, len(src), cols)
	}
	rs, err := dt.RowSize(int64(cols))
	if err != nil {
		return nil, err
	}
	rows := len(src) / cols
	data := make([]byte, int(rs)*rows)
	for r := range rows {
		if err := Quantize(dt, src[r*cols:(r+1)*cols], data[r*int(rs):(r+1)*int(rs)]); err != nil {
			return nil, err
		}
	}
	return data, nil
}

// VecDotType is the type activations are converted to before a dot product with weights of dt,
// as in llama.cpp's CPU backend: F32->F32, F16->F16, BF16->BF16, Q4_0/Q5_0/Q8_0/IQ4_NL->Q8_0,
// Q4_1/Q5_1->Q8_1, Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_XS->Q8_K.
func VecDotType(dt tensor.DType) (tensor.DType, error) {
	switch dt {
	case tensor.F32, tensor.F16, tensor.BF16:
		return dt, nil
	case tensor.Q4_0, tensor.Q5_0, tensor.Q8_0, tensor.IQ4_NL:
		return tensor.Q8_0, nil
	case tensor.Q4_1, tensor.Q5_1:
		return tensor.Q8_1, nil
	case tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K, tensor.IQ4_XS:
		return tensor.Q8_K, nil
	}
	return 0, fmt.Errorf("quant: no dot product for dtype %v", dt)
}

// Kernel is the dot product of one weight row with one converted activation row.
type Kernel struct {
	DType, VecType tensor.DType
	// Dot returns sum_i w[i]*x[i] over n elements; w holds dt.RowSize(n) bytes of DType,
	// x holds VecType.RowSize(n) bytes of VecType. n is a multiple of the block size.
	//
	// Within a block the products are summed exactly in integers (quantized types) and each
	// block is scaled and accumulated in float32, so results may differ from a float64 sum by
	// float32 rounding of the block sums. Only the first RowSize(n) bytes of w and x are read;
	// if n is negative or not a multiple of the block size, or w or x is shorter than that,
	// Dot returns NaN. Activation quants of -128 (which Quantize never writes: it uses
	// [-127, 127]) are not supported by the AVX2 kernels.
	Dot func(n int, w, x []byte) float32
	// Dot4, where not nil, sets dst[i*ldd+r] = Dot(n, w[r*wRow:], x[i*xRow:]) for the rows
	// weight rows r (wRow bytes apart) and four activation rows i (xRow bytes apart), each the
	// same float32 as Dot gives, in one pass over each weight row. It reports false, and writes
	// nothing, when the arguments do not fit: n not whole blocks, rows that overlap, or slices
	// too short. Only the bytes the rows need are read.
	Dot4 func(n int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) bool
}

// KernelFor returns the dot-product kernel for weights of type dt.
func KernelFor(dt tensor.DType) (Kernel, error) {
	vt, err := VecDotType(dt)
	if err != nil {
		return Kernel{}, err
	}
	f, ok := dots[dt]
	if !ok {
		return Kernel{}, fmt.Errorf("quant: no dot product for dtype %v", dt)
	}
	return Kernel{DType: dt, VecType: vt, Dot: f, Dot4: dots4[dt]}, nil
}

// dequantizers and quantizers take inputs whose lengths the exported functions have checked.
var (
	dequantizers = map[tensor.DType]func(src []byte, dst []float32){
		tensor.F32: dequantF32, tensor.F16: dequantF16, tensor.BF16: dequantBF16,
		tensor.Q4_0: dequantQ4_0, tensor.Q4_1: dequantQ4_1,
		tensor.Q5_0: dequantQ5_0, tensor.Q5_1: dequantQ5_1,
		tensor.Q8_0: dequantQ8_0, tensor.Q8_1: dequantQ8_1,
		tensor.Q2_K: dequantQ2_K, tensor.Q3_K: dequantQ3_K,
		tensor.Q4_K: dequantQ4_K, tensor.Q5_K: dequantQ5_K,
		tensor.Q6_K: dequantQ6_K, tensor.Q8_K: dequantQ8_K,
		tensor.IQ4_NL: dequantIQ4_NL, tensor.IQ4_XS: dequantIQ4_XS,
	}
	quantizers = map[tensor.DType]func(src []float32, dst []byte){
		tensor.F32: quantF32, tensor.F16: quantF16, tensor.BF16: quantBF16,
		tensor.Q4_0: quantQ4_0, tensor.Q4_1: quantQ4_1,
		tensor.Q5_0: quantQ5_0, tensor.Q5_1: quantQ5_1,
		tensor.Q8_0: quantQ8_0, tensor.Q8_1: quantQ8_1,
		tensor.Q2_K: quantQ2_K, tensor.Q3_K: quantQ3_K,
		tensor.Q4_K: quantQ4_K, tensor.Q5_K: quantQ5_K,
		tensor.Q6_K: quantQ6_K, tensor.Q8_K: quantQ8_K,
		tensor.IQ4_NL: quantIQ4_NL, tensor.IQ4_XS: quantIQ4_XS,
	}
	dots4 = map[tensor.DType]func(n int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) bool{
		tensor.Q8_0: dot4Q8_0, tensor.Q4_0: dot4Q4_0,
	}
	dots = map[tensor.DType]func(n int, w, x []byte) float32{
		tensor.F32: dotF32, tensor.F16: dotF16, tensor.BF16: dotBF16,
		tensor.Q4_0: dotQ4_0, tensor.Q4_1: dotQ4_1,
		tensor.Q5_0: dotQ5_0, tensor.Q5_1: dotQ5_1,
		tensor.Q8_0: dotQ8_0,
		tensor.Q2_K: dotQ2_K, tensor.Q3_K: dotQ3_K,
		tensor.Q4_K: dotQ4_K, tensor.Q5_K: dotQ5_K, tensor.Q6_K: dotQ6_K,
		tensor.IQ4_NL: dotIQ4_NL, tensor.IQ4_XS: dotIQ4_XS,
	}
)
