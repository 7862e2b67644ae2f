package quant

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/rand"
	"testing"

	"github.com/parleyhq/parley/runtime/tensor"
)

// ggmlQuantInput returns 64 super-blocks (16384 values) that exercise the Q2_K, Q3_K, IQ4_NL
// and IQ4_XS quantizers: seeded Gaussian rows with outliers at scales from 1e-3 to 1e3, and
// blocks that take their special paths (all zero, constant, all positive, all negative, small
// integers that fit exactly, values below ggml's all-zero threshold, zero and sparse
// sub-blocks).
func ggmlQuantInput() []float32 {
	r := rand.New(rand.NewSource(23))
	x := make([]float32, 0, 64*qkK)
	for b := 0; b < 48; b++ {
		x = append(x, randFloats(r, qkK, math.Pow(10, float64(b%7-3)))...)
	}
	blk := func(f func(i int) float32) {
		for i := 0; i < qkK; i++ {
			x = append(x, f(i))
		}
	}
	blk(func(int) float32 { return 0 })
	blk(func(int) float32 { return 0.5 })
	blk(func(int) float32 { return -3 })
	blk(func(int) float32 { return float32(math.Abs(r.NormFloat64()) + 1) })
	blk(func(int) float32 { return float32(-math.Abs(r.NormFloat64())) })
	blk(func(i int) float32 { return float32((i*7+i/16)%8 - 4) })
	blk(func(i int) float32 { return float32(((i*5+i/16)%4)*(1+i/16%3)) - 2 })
	blk(func(int) float32 { return float32(r.NormFloat64() * 1e-17) })
	blk(func(int) float32 { return float32(r.NormFloat64() * 1e-10) })
	blk(func(i int) float32 {
		if i/16%2 == 0 {
			return 0
		}
		return float32(r.NormFloat64())
	})
	blk(func(i int) float32 {
		if i%16 == i/16 {
			return float32(r.NormFloat64() * 10)
		}
		return 0
	})
	blk(func(i int) float32 {
		if i%16 == 3 {
			return -float32(1 + i/16)
		}
		return float32(r.NormFloat64() * 0.01)
	})
	blk(func(i int) float32 { return float32(math.Sin(float64(i)) * float64(1+i/16)) })
	blk(func(i int) float32 { return float32(i/16) - 7.5 })
	blk(func(i int) float32 { return float32(r.Intn(3)-1) * float32(1+i/64) })
	blk(func(i int) float32 { return float32(r.NormFloat64() * math.Pow(2, float64(i/16-8))) })
	return x
}

// ggmlDequantInput returns 64 random blocks of dt (see randBlocks).
func ggmlDequantInput(dt tensor.DType) []byte {
	return randBlocks(rand.New(rand.NewSource(int64(dt))), dt, 64)
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func floatBytes(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// Quantize and Dequantize give exactly ggml's bytes and float32 values for Q2_K, Q3_K, IQ4_NL
// and IQ4_XS. The hashes were taken offline from ggml's quantize_row_*_ref and dequantize_row_*
// (ggml-quants.c at llama.cpp commit c392e509, compiled by gcc with -O2 -ffp-contract=off so
// that no multiply-add is fused), run on the inputs above (for IQ4_NL 512 blocks, among them
// all-zero blocks and sub-blocks that follow non-zero ones) written as little-endian float32
// values and raw block bytes: SHA-256 of the blocks ggml wrote and of the float32 values
// (little-endian) it decoded.
func TestMatchGGML(t *testing.T) {
	for _, c := range []struct {
		dt         tensor.DType
		quant, deq string
	}{
		{tensor.Q2_K,
			"a3fbcc49304abe178b2cfffed3480e7b0f622af9d42ac3f3707cc509d9bf2323",
			"6e2ba66d0ee75a904f471ad8669b45ac0029aad99ad0cf4bf1d7b97f2ecaa13d"},
		{tensor.Q3_K,
			"f439d4c567f6ce9326782d5a35c06a1a93efe2816435b5360b6ad9d178e08221",
			"58a0df3626010785be5630a9accaf0081860c0651f3872c920a60addd4b2403a"},
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
