package gguf

import "github.com/parleyhq/parley/runtime/tensor"

// FileType is llama.cpp's general.file_type (enum llama_ftype) for a file whose weights are
// mostly of type dt, as its converter and quantiser write it; 0 (all F32) for a type it has no
// value for.
func FileType(dt tensor.DType) uint32 {
	switch dt {
	case tensor.F32:
		return 0
	case tensor.F16:
		return 1
	case tensor.Q4_0:
		return 2
	case tensor.Q4_1:
		return 3
	case tensor.Q8_0:
		return 7
	case tensor.Q5_0:
		return 8
	case tensor.Q5_1:
		return 9
	case tensor.Q2_K:
		return 10
	case tensor.Q3_K:
		return 12 // Q3_K_M
	case tensor.Q4_K:
		return 15 // Q4_K_M
	case tensor.Q5_K:
		return 17 // Q5_K_M
	case tensor.Q6_K:
		return 18
	case tensor.IQ4_NL:
		return 25
	case tensor.IQ4_XS:
		return 30
	case tensor.BF16:
		return 32
	}
	return 0
}
