package quant

import (
	"testing"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Quantize and Dequantize give exactly ggml's bytes and float32 values for IQ4_NL and IQ4_XS.
// The hashes were taken offline from ggml's quantize_row_iq4_nl_ref / quantize_row_iq4_xs_ref
// and dequantize_row_iq4_nl / dequantize_row_iq4_xs (ggml-quants.c at llama.cpp commit
// c392e509, compiled by gcc with -O2 -ffp-contract=off so that no multiply-add is fused), run
// on ggmlQuantInput (512 IQ4_NL blocks, 64 IQ4_XS super-blocks, among them all-zero blocks and
// sub-blocks that follow non-zero ones) and on ggmlDequantInput, written as little-endian
// float32 values and raw block bytes: SHA-256 of the blocks ggml wrote and of the float32
// values (little-endian) it decoded.
func TestIQ4MatchGGML(t *testing.T) {
	for _, c := range []struct {
		dt         tensor.DType
		quant, deq string
	}{
		{tensor.IQ4_NL,
			"2f4cfc3bb64bde9520b0123386e475e3f0e650857c8d7db50da8fe50207c1be4",
			"8500cf624e7449e0fd113f119179d737358ccb16245e69c59758fdff6c6cf0c3"},
		{tensor.IQ4_XS,
			"9ad5bf8ebc032184b19dc5ceae8b7c5dd75ceceb6cc3313862a1dd3bce6d3ef6",
			"90bda4e4b2ebb1717090403ce12b61b0657d3f4b9c1f33c613fdd5ba15122132"},
	} {
		x := ggmlQuantInput()
		q := make([]byte, rowSize(t, c.dt, len(x)))
		if err := Quantize(c.dt, x, q); err != nil {
			t.Fatal(err)
		}
		if got := sha256Hex(q); got != c.quant {
			t.Errorf("%v: Quantize output hashes to %s, ggml's to %s", c.dt, got, c.quant)
		}
		blocks := ggmlDequantInput(c.dt)
		y := make([]float32, len(blocks)/c.dt.TypeSize()*c.dt.BlockSize())
		if err := Dequantize(c.dt, blocks, y); err != nil {
			t.Fatal(err)
		}
		if got := sha256Hex(floatBytes(y)); got != c.deq {
			t.Errorf("%v: Dequantize output hashes to %s, ggml's to %s", c.dt, got, c.deq)
		}
	}
}
