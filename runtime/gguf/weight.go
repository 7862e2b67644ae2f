package gguf

import (
	"fmt"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Weight returns the tensor name after checking that it is a matrix of rows rows of cols
// elements ([cols rows] in ggml order) or, with vector, a vector of cols F32 elements (norm
// weights and biases, as llama.cpp writes them), of a dtype Parley computes with. Its errors
// name the tensor, not the file.
func (f *File) Weight(name string, rows, cols int, vector bool) (*TensorInfo, error) {
	ti, ok := f.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("model lacks tensor %s", name)
	}
	if !ti.DType.Supported() {
		return nil, fmt.Errorf("tensor %s has dtype %v, which Parley cannot compute with", name, ti.DType)
	}
	var shapeOK bool
	want := fmt.Sprintf("[%d %d]", cols, rows)
	if vector {
		shapeOK = len(ti.Shape) == 1 && ti.Shape[0] == int64(cols)
		want = fmt.Sprintf("[%d]", cols)
	} else {
		shapeOK = len(ti.Shape) == 2 && ti.Shape[0] == int64(cols) && ti.Shape[1] == int64(rows)
	}
	if !shapeOK {
		return nil, fmt.Errorf("tensor %s has shape %v, want %s", name, ti.Shape, want)
	}
	if vector && ti.DType != tensor.F32 {
		return nil, fmt.Errorf("tensor %s has dtype %v, want F32", name, ti.DType)
	}
	return ti, nil
}
