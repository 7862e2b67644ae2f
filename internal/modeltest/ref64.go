package modeltest

import (
	"testing"

	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Weights64 returns every tensor of f dequantized to float64, and its dtype, by name: the
// weights of a float64 reference forward pass.
func Weights64(t testing.TB, f *gguf.File) (map[string][]float64, map[string]tensor.DType) {
	t.Helper()
	ws, types := map[string][]float64{}, map[string]tensor.DType{}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		dst := make([]float32, ti.Elements())
		if err := quant.Dequantize(ti.DType, f.TensorData(ti), dst); err != nil {
			t.Fatalf("%s: %v", ti.Name, err)
		}
		w := make([]float64, len(dst))
		for j, x := range dst {
			w[j] = float64(x)
		}
		ws[ti.Name], types[ti.Name] = w, ti.DType
	}
	return ws, types
}

// RoundTrip converts x to the dot-product type of weights of type dt and back, as llama.cpp and
// Parley's backends convert the activations a matrix multiplies.
func RoundTrip(dt tensor.DType, x []float64) []float64 {
	vt, err := quant.VecDotType(dt)
	if err != nil || vt == tensor.F32 {
		return x
	}
	f := make([]float32, len(x))
	for i, v := range x {
		f[i] = float32(v)
	}
	rs, _ := vt.RowSize(int64(len(f)))
	buf := make([]byte, rs)
	if err := quant.Quantize(vt, f, buf); err != nil {
		panic(err)
	}
	if err := quant.Dequantize(vt, buf, f); err != nil {
		panic(err)
	}
	y := make([]float64, len(x))
	for i, v := range f {
		y[i] = float64(v)
	}
	return y
}
