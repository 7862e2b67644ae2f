package cpu

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// isas returns the instruction-set levels this processor can run, lowest first, and restores
// the best one when t ends.
func isas(t *testing.T) []ISA {
	t.Helper()
	if !Available() {
		t.Skip(ErrNotBuilt)
	}
	best := BestISA()
	t.Cleanup(func() { SetISA(best) })
	var l []ISA
	for i := ISAScalar; i <= best; i++ {
		l = append(l, i)
	}
	return l
}

// rows returns n test rows of k values: normal values at varied scales, a zero block, blocks
// of exact halves (ties of the rounding), and huge and tiny magnitudes.
func rows(r *rand.Rand, n, k int) [][]float32 {
	out := make([][]float32, n)
	for i := range out {
		v := make([]float32, k)
		for j := range v {
			scale := math.Exp2(float64(r.IntN(20) - 10))
			v[j] = float32(r.NormFloat64() * scale)
		}
		switch i % 4 {
		case 1: // a zero block
			for j := 0; j < 32 && j < k; j++ {
				v[j] = 0
			}
		case 2: // amax 127: multiplier 1, codes are the values, halves are ties
			for j := 0; j < k; j++ {
				v[j] = float32(r.IntN(254)-127) + 0.5
			}
			for j := 0; j < k; j += 32 {
				v[j] = 127
			}
		case 3: // magnitudes near the ends of float32 and F16
			for j := range v {
				v[j] *= 1e-30
				if j%64 == 7 {
					v[j] = 3e38
				}
			}
		}
		out[i] = v
	}
	return out
}

// q8x86 is ggml's AVX quantize_row_q8_0 / q8_1 for one 32-block: d = amax/127 stored as F16,
// codes x*(127/amax) rounded half to even, and for Q8_1 s = F16(d*sum).
func q8x86(x []float32) (d uint16, q [32]int8, s uint16) {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	df := amax / 127
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	sum := 0
	for j, v := range x {
		c := int(math.RoundToEven(float64(float32(v * id))))
		q[j] = int8(c)
		sum += c
	}
	return quant.F32ToF16(df), q, quant.F32ToF16(df * float32(sum))
}

func TestQuantizeRowQ8_0Q8_1MatchGGMLx86(t *testing.T) {
	for _, isa := range isas(t) {
		if err := SetISA(isa); err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(1, 2))
		for _, k := range []int{32, 96, 512} {
			for ri, x := range rows(r, 12, k) {
				for _, dt := range []tensor.DType{tensor.Q8_0, tensor.Q8_1} {
					sz, _ := dt.RowSize(int64(k))
					got := make([]byte, sz)
					if err := QuantizeRow(dt, x, got); err != nil {
						t.Fatal(err)
					}
					ts, qoff := dt.TypeSize(), 2
					if dt == tensor.Q8_1 {
						qoff = 4
					}
					for b := 0; b < k/32; b++ {
						d, q, s := q8x86(x[b*32 : b*32+32])
						blk := got[b*ts : (b+1)*ts]
						if gd := uint16(blk[0]) | uint16(blk[1])<<8; gd != d {
							t.Fatalf("%v %v k=%d row %d block %d: d = %#04x, want %#04x", isa, dt, k, ri, b, gd, d)
						}
						if dt == tensor.Q8_1 {
							if gs := uint16(blk[2]) | uint16(blk[3])<<8; gs != s {
								t.Fatalf("%v Q8_1 k=%d row %d block %d: s = %#04x, want %#04x", isa, k, ri, b, gs, s)
							}
						}
						for j := 0; j < 32; j++ {
							if c := int8(blk[qoff+j]); c != q[j] {
								t.Fatalf("%v %v k=%d row %d block %d: code %d = %d, want %d (x = %v)", isa, dt, k, ri, b, j, c, q[j], x[b*32+j])
							}
						}
					}
				}
			}
		}
	}
}

// TestQuantizeRowQ8_0NearReference compares with runtime/quant's port of ggml's reference
// quantizer (1/d and round-half-away): scales agree and codes differ by at most one, only at
// the rare values where the two roundings disagree.
func TestQuantizeRowQ8_0NearReference(t *testing.T) {
	isas(t)
	r := rand.New(rand.NewPCG(3, 4))
	const k = 4096
	x := make([]float32, k)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	sz, _ := tensor.Q8_0.RowSize(k)
	got, ref := make([]byte, sz), make([]byte, sz)
	if err := QuantizeRow(tensor.Q8_0, x, got); err != nil {
		t.Fatal(err)
	}
	if err := quant.Quantize(tensor.Q8_0, x, ref); err != nil {
		t.Fatal(err)
	}
	diff := 0
	for b := 0; b < k/32; b++ {
		o := b * 34
		if got[o] != ref[o] || got[o+1] != ref[o+1] {
			t.Fatalf("block %d: scale differs from the reference", b)
		}
		for j := 2; j < 34; j++ {
			if d := int(int8(got[o+j])) - int(int8(ref[o+j])); d != 0 {
				if d < -1 || d > 1 {
					t.Fatalf("block %d code %d: %d vs reference %d", b, j-2, int8(got[o+j]), int8(ref[o+j]))
				}
				diff++
			}
		}
	}
	if diff > k/1000 {
		t.Fatalf("%d of %d codes differ from the reference quantizer", diff, k)
	}
}

func TestQuantizeRowMatchesQuant(t *testing.T) {
	for _, isa := range isas(t) {
		if err := SetISA(isa); err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(5, 6))
		for _, dt := range []tensor.DType{tensor.Q8_K, tensor.F16, tensor.BF16} {
			for _, k := range []int{256, 768} {
				for ri, x := range rows(r, 8, k) {
					sz, _ := dt.RowSize(int64(k))
					got, want := make([]byte, sz), make([]byte, sz)
					if err := QuantizeRow(dt, x, got); err != nil {
						t.Fatal(err)
					}
					if err := quant.Quantize(dt, x, want); err != nil {
						t.Fatal(err)
					}
					for i := range got {
						if got[i] != want[i] {
							t.Fatalf("%v %v k=%d row %d: byte %d = %#02x, quant.Quantize %#02x", isa, dt, k, ri, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}

func TestDequantizeRowMatchesQuant(t *testing.T) {
	for _, isa := range isas(t) {
		if err := SetISA(isa); err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(7, 8))
		for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.BF16, tensor.Q4_0, tensor.Q4_1,
			tensor.Q5_0, tensor.Q5_1, tensor.Q8_0, tensor.Q8_1, tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K,
			tensor.Q6_K, tensor.Q8_K, tensor.IQ4_NL, tensor.IQ4_XS} {
			k := 512
			x := make([]float32, k)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			sz, _ := dt.RowSize(int64(k))
			data := make([]byte, sz)
			if err := quant.Quantize(dt, x, data); err != nil {
				t.Fatal(err)
			}
			got, want := make([]float32, k), make([]float32, k)
			if err := DequantizeRow(dt, data, got); err != nil {
				t.Fatal(err)
			}
			if err := quant.Dequantize(dt, data, want); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%v %v element %d = %v, quant.Dequantize %v", isa, dt, i, got[i], want[i])
				}
			}
		}
	}
}

// TestStoreKVMatchesQuant checks that StoreKV writes F16 and BF16 caches exactly as quant's
// conversions round (nearest even; NaN kept NaN and made quiet, overflow to infinity), at every
// instruction set: random values at varied scales with special ones spread over the vector
// bodies and tails of rows of 37 and 64 elements.
func TestStoreKVMatchesQuant(t *testing.T) {
	specials := []float32{
		float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(0xffc12345),
		float32(math.Inf(1)), float32(math.Inf(-1)), math.MaxFloat32, -math.MaxFloat32,
		// ties that round up to infinity in BF16 and in F16
		math.Float32frombits(0x7f7f8000), 65520,
		// ties of BF16 and of F16, to even down and up
		1 + 0x1p-8, 1 + 3*0x1p-8, -(1 + 0x1p-11), 1 + 3*0x1p-11,
		0x1p-130, -0x1p-149, 0x1p-20, float32(math.Copysign(0, -1)),
	}
	for _, isa := range isas(t) {
		if err := SetISA(isa); err != nil {
			t.Fatal(err)
		}
		c, err := NewContext(1)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(9, 10))
		for _, dt := range []tensor.DType{tensor.F16, tensor.BF16} {
			for _, width := range []int{37, 64} {
				const n, slots = 3, 5
				k, v := make([]float32, n*width), make([]float32, n*width)
				for i := range k {
					k[i] = float32(r.NormFloat64() * math.Exp2(float64(r.IntN(40)-20)))
					v[i] = -k[i]
				}
				for i, x := range specials {
					k[(i*7)%len(k)] = x
					v[(i*11+5)%len(v)] = x
				}
				kc, vc := make([]byte, slots*width*2), make([]byte, slots*width*2)
				slot := []int32{4, 0, 2}
				if err := c.StoreKV(kc, vc, dt, slots, width, k, v, n, slot); err != nil {
					t.Fatal(err)
				}
				for _, cv := range []struct {
					name  string
					cache []byte
					src   []float32
				}{{"k", kc, k}, {"v", vc, v}} {
					for i, s := range slot {
						for e := 0; e < width; e++ {
							x := cv.src[i*width+e]
							want := quant.F32ToF16(x)
							if dt == tensor.BF16 {
								want = quant.F32ToBF16(x)
							}
							o := (int(s)*width + e) * 2
							if got := uint16(cv.cache[o]) | uint16(cv.cache[o+1])<<8; got != want {
								t.Fatalf("%v %v width %d %s token %d element %d: %v stored as %#04x, want %#04x", isa, dt, width, cv.name, i, e, x, got, want)
							}
						}
					}
				}
			}
		}
		c.Close()
	}
}

// TestErrors checks that the binding refuses bad arguments before they reach C.
func TestErrors(t *testing.T) {
	if !Available() {
		t.Skip(ErrNotBuilt)
	}
	c, err := NewContext(2)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := make([]float32, 64)
	w := make([]byte, 4*34)
	cases := []struct {
		name string
		err  error
	}{
		{"MatMul short x", c.MatMul(f[:4], f[:31], 1, 32, w, tensor.Q8_0, 4)},
		{"MatMul short w", c.MatMul(f[:4], f[:32], 1, 32, w[:100], tensor.Q8_0, 4)},
		{"MatMul k not a block multiple", c.MatMul(f[:4], f[:33], 1, 33, w, tensor.Q8_0, 4)},
		{"MatMul unsupported type", c.MatMul(f[:4], f[:32], 1, 32, w[:4*17], tensor.MXFP4, 4)},
		{"MatMul dst overlaps x", c.MatMul(f[:4], f[:32], 1, 32, w, tensor.Q8_0, 4)},
		{"PackWeights short w", c.PackWeights(make([]byte, 16*34), w[:100], tensor.Q8_0, 4, 32)},
		{"PackWeights short dst", c.PackWeights(make([]byte, 16*34-1), w, tensor.Q8_0, 4, 32)},
		{"PackWeights k not a block multiple", c.PackWeights(make([]byte, 16*34), w, tensor.Q8_0, 4, 33)},
		{"PackWeights BF16", c.PackWeights(make([]byte, 16*64), make([]byte, 4*64), tensor.BF16, 4, 32)},
		{"PackWeights Q4_K row not a super-block multiple", c.PackWeights(make([]byte, 16*148), make([]byte, 4*144), tensor.Q4_K, 4, 128)},
		{"PackWeights dst overlaps w", c.PackWeights(w, w, tensor.Q8_0, 1, 32)},
		{"MatMulPacked short packed w", c.MatMulPacked(f[:4], f[32:64], 1, 32, make([]byte, 16*34-1), tensor.Q8_0, 4)},
		{"MatMulPacked short x", c.MatMulPacked(f[:4], f[32:63], 1, 32, make([]byte, 16*34), tensor.Q8_0, 4)},
		{"MatMulPacked F16", c.MatMulPacked(f[:4], f[32:64], 1, 32, make([]byte, 16*64), tensor.F16, 4)},
		{"MatMulPacked dst overlaps x", c.MatMulPacked(f[:4], f[:32], 1, 32, make([]byte, 16*34), tensor.Q8_0, 4)},
		{"GetRows id out of range", c.GetRows(f[:32], w, tensor.Q8_0, 4, 32, []int32{4})},
		{"GetRows negative id", c.GetRows(f[:32], w, tensor.Q8_0, 4, 32, []int32{-1})},
		{"AddRows bad b rows", c.AddRows(f[:8], f[:8], f[:8], 2, 4, 3)},
		{"RMSNorm negative eps", c.RMSNorm(f[:8], f[:8], f[:4], 2, 4, -1)},
		{"RMSNorm short w", c.RMSNorm(f[:8], f[:8], f[:3], 2, 4, 1e-5)},
		{"SwiGLU short up", c.GLU(f[:8], f[:8], f[:7], tensor.SiLU)},
		{"GLU unknown function", c.GLU(f[:8], f[:8], f[:8], tensor.Func(0))},
		{"GLU dst partly overlaps up", c.GLU(f[:8], f[16:24], f[4:12], tensor.Sigmoid)},
		{"Unary unknown function", c.Unary(f[:8], f[:8], tensor.Func(99))},
		{"Rope odd dims", c.Rope(f[:16], 2, 1, Rope{HeadDim: 8, Dims: 7, Base: 1e4, FreqScale: 1}, []int32{0, 1})},
		{"Rope negative position", c.Rope(f[:16], 1, 2, Rope{HeadDim: 8, Dims: 8, Base: 1e4, FreqScale: 1}, []int32{-1})},
		{"Rope NaN scale", c.Rope(f[:16], 1, 2, Rope{HeadDim: 8, Dims: 8, Base: 1e4, FreqScale: float32(math.NaN())}, []int32{0})},
		{"StoreKV slot out of range", c.StoreKV(make([]byte, 64), make([]byte, 64), tensor.F32, 4, 4, f[:4], f[:4], 1, []int32{4})},
		{"StoreKV short cache", c.StoreKV(make([]byte, 60), make([]byte, 64), tensor.F32, 4, 4, f[:4], f[:4], 1, []int32{0})},
		{"StoreKV Q8_0 cache", c.StoreKV(make([]byte, 64), make([]byte, 64), tensor.Q8_0, 4, 4, f[:4], f[:4], 1, []int32{0})},
		{"StoreKV short BF16 cache", c.StoreKV(make([]byte, 30), make([]byte, 32), tensor.BF16, 4, 4, f[:4], f[:4], 1, []int32{0})},
		{"Attention block out of range", c.Attention(f[:8], f[8:16], 1, make([]byte, 128), make([]byte, 128), tensor.F32, 4, 8, 2,
			Attn{NHead: 1, NKVHead: 1, HeadDim: 8, Scale: 1}, []Seq{{Count: 1, CtxLen: 1, NBlocks: 1}}, []int32{2})},
		{"Attention table too short", c.Attention(f[:8], f[8:16], 1, make([]byte, 128), make([]byte, 128), tensor.F32, 4, 8, 2,
			Attn{NHead: 1, NKVHead: 1, HeadDim: 8, Scale: 1}, []Seq{{Count: 1, CtxLen: 3, NBlocks: 1}}, []int32{0})},
		{"Attention dst overlaps q", c.Attention(f[:8], f[4:12], 1, make([]byte, 128), make([]byte, 128), tensor.F32, 4, 8, 2,
			Attn{NHead: 1, NKVHead: 1, HeadDim: 8, Scale: 1}, []Seq{{Count: 1, CtxLen: 1, NBlocks: 1}}, []int32{0})},
		{"Attention width mismatch", c.Attention(f[:8], f[8:16], 1, make([]byte, 128), make([]byte, 128), tensor.F32, 4, 8, 2,
			Attn{NHead: 1, NKVHead: 2, HeadDim: 8, Scale: 1}, []Seq{{Count: 1, CtxLen: 1, NBlocks: 1}}, []int32{0})},
		{"Convert Q8_0", c.Convert(w, tensor.Q8_0, w, tensor.F32, 4)},
		{"Convert BF16", c.Convert(w[:8], tensor.BF16, w[16:32], tensor.F32, 4)},
		{"Convert short dst", c.Convert(w[:7], tensor.F16, w, tensor.F32, 4)},
		{"Convert short src", c.Convert(w, tensor.F32, w[:7], tensor.F16, 4)},
		{"Convert overlapping types", c.Convert(w[:8], tensor.F16, w[4:20], tensor.F32, 4)},
		{"LayerNorm short b", c.LayerNorm(f[:8], f[:8], f[8:12], f[12:15], 2, 4, 1e-5)},
		{"LayerNorm NaN eps", c.LayerNorm(f[:8], f[:8], f[8:12], f[12:16], 2, 4, float32(math.NaN()))},
		{"LayerNorm dst overlaps w", c.LayerNorm(f[:8], f[16:24], f[4:8], f[12:16], 2, 4, 1e-5)},
		{"LayerNorm dst overlaps x", c.LayerNorm(f[:8], f[2:10], f[16:20], f[20:24], 2, 4, 1e-5)},
		{"GELU short x", c.Unary(f[:8], f[8:15], tensor.GELU)},
		{"GELU dst overlaps x", c.Unary(f[:8], f[4:12], tensor.GELU)},
		{"Im2Col1D stride 0", c.Im2Col1D(f[:12], f[16:24], 4, 2, 3, 0, 1)},
		{"Im2Col1D kernel past the padded signal", c.Im2Col1D(f[:12], f[16:24], 4, 2, 7, 1, 1)},
		{"Im2Col1D short dst", c.Im2Col1D(f[:23], f[32:40], 4, 2, 3, 1, 1)},
		{"Im2Col1D dst overlaps x", c.Im2Col1D(f[:24], f[20:28], 4, 2, 3, 1, 1)},
		{"FullAttention no keys", c.FullAttention(f[:8], f[8:16], 1, nil, nil, tensor.F32, 0, Attn{NHead: 1, NKVHead: 1, HeadDim: 8, Scale: 1})},
		{"FullAttention short v", c.FullAttention(f[:8], f[8:16], 1, make([]byte, 64), make([]byte, 60), tensor.F32, 2, Attn{NHead: 1, NKVHead: 1, HeadDim: 8, Scale: 1})},
		{"FullAttention dst overlaps q", c.FullAttention(f[:8], f[4:12], 1, make([]byte, 64), make([]byte, 64), tensor.F32, 2, Attn{NHead: 1, NKVHead: 1, HeadDim: 8, Scale: 1})},
		{"FullAttention heads do not group", c.FullAttention(f[:24], f[24:48], 1, make([]byte, 128), make([]byte, 128), tensor.F32, 2, Attn{NHead: 3, NKVHead: 2, HeadDim: 8, Scale: 1})},
		{"FullAttention Q8_0 keys", c.FullAttention(f[:8], f[8:16], 1, make([]byte, 64), make([]byte, 64), tensor.Q8_0, 2, Attn{NHead: 1, NKVHead: 1, HeadDim: 8, Scale: 1})},
		{"FullAttention BF16 keys", c.FullAttention(f[:8], f[8:16], 1, make([]byte, 32), make([]byte, 32), tensor.BF16, 2, Attn{NHead: 1, NKVHead: 1, HeadDim: 8, Scale: 1})},
	}
	for _, cs := range cases {
		if cs.err == nil {
			t.Errorf("%s: no error", cs.name)
		}
	}
	if err := c.MatMul(f[:4], f[:32], 1, 32, w[:4*17], tensor.MXFP4, 4); !errors.Is(err, tensor.ErrUnsupported) {
		t.Errorf("unsupported weight type: %v does not wrap ErrUnsupported", err)
	}
	// A shape error is not a missing kernel: callers fall back only for the latter.
	if err := c.MatMulPacked(f[:4], f[32:64], 1, 33, make([]byte, 16*34), tensor.Q8_0, 4); err == nil || errors.Is(err, tensor.ErrUnsupported) {
		t.Errorf("MatMulPacked k=33: %v, want a shape error", err)
	}
	// Where the interleaved kernels exist, a well-formed call works; below them it says so.
	wp := make([]byte, 16*34)
	err = c.PackWeights(wp, w, tensor.Q8_0, 4, 32)
	if _, ok := PackedSize(tensor.Q8_0, 4, 32); ok {
		if err != nil {
			t.Errorf("PackWeights: %v", err)
		}
		if err := c.MatMulPacked(f[:4], f[32:64], 1, 32, wp, tensor.Q8_0, 4); err != nil {
			t.Errorf("MatMulPacked: %v", err)
		}
	} else if !errors.Is(err, tensor.ErrUnsupported) {
		t.Errorf("PackWeights without the interleaved kernels: %v does not wrap ErrUnsupported", err)
	}
	c.Close()
	if err := c.GLU(f[:8], f[:8], f[:8], tensor.SiLU); err == nil {
		t.Error("SwiGLU on a closed context: no error")
	}
}

func TestBuffer(t *testing.T) {
	if !Available() {
		t.Skip(ErrNotBuilt)
	}
	b, err := Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Bytes()) != 100 || len(b.Float32s()) != 25 {
		t.Fatalf("Bytes %d, Float32s %d", len(b.Bytes()), len(b.Float32s()))
	}
	for i, v := range b.Bytes() {
		if v != 0 {
			t.Fatalf("byte %d of a new buffer is %d", i, v)
		}
	}
	b.Free()
	b.Free()
	if b.Bytes() != nil {
		t.Fatal("Bytes after Free")
	}
	if _, err := Alloc(-1); err == nil {
		t.Fatal("Alloc(-1): no error")
	}
	// a large buffer is a mapping: zero, writable, freed with it
	big, err := Alloc(3<<20 + 5)
	if err != nil {
		t.Fatal(err)
	}
	bb := big.Bytes()
	if len(bb) != 3<<20+5 || bb[0] != 0 || bb[len(bb)-1] != 0 || bb[1<<20] != 0 {
		t.Fatal("large buffer not zeroed")
	}
	bb[len(bb)-1] = 7
	big.Free()
}

func TestSupports(t *testing.T) {
	if !Available() {
		t.Skip(ErrNotBuilt)
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.BF16, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0,
		tensor.Q5_1, tensor.Q8_0, tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K, tensor.IQ4_NL,
		tensor.IQ4_XS} {
		if !Supports(OpMatMul, dt) || !Supports(OpGetRows, dt) {
			t.Errorf("%v: matmul/get rows not supported", dt)
		}
	}
	for _, dt := range []tensor.DType{tensor.Q8_1, tensor.Q8_K, tensor.IQ2_XXS, tensor.MXFP4, tensor.DType(99)} {
		if Supports(OpMatMul, dt) {
			t.Errorf("%v: matmul claimed", dt)
		}
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.BF16} {
		if !Supports(OpKV, dt) {
			t.Errorf("%v: KV caches not supported", dt)
		}
	}
	for _, dt := range []tensor.DType{tensor.Q8_0, tensor.Q4_K, tensor.DType(99)} {
		if Supports(OpKV, dt) {
			t.Errorf("%v: KV caches claimed", dt)
		}
	}
	t.Logf("kernels: %v (best %v)", CurrentISA(), BestISA())
}

// TestRopeTableFollowsFactors: the context reuses its angle table while positions and
// parameters repeat; frequency factors are among those parameters, by value: new factors (or
// none) at the same positions give what a fresh context gives.
func TestRopeTableFollowsFactors(t *testing.T) {
	if !Available() {
		t.Skip(ErrNotBuilt)
	}
	pos := []int32{0, 5, 900}
	x := make([]float32, 3*2*16)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	ff := make([]float32, 8)
	for i := range ff {
		ff[i] = 1 + float32(i)
	}
	rope := func(c *Context, r Rope) []float32 {
		y := append([]float32(nil), x...)
		if err := c.Rope(y, 3, 2, r, pos); err != nil {
			t.Fatal(err)
		}
		return y
	}
	fresh := func(r Rope) []float32 {
		c, err := NewContext(1)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return rope(c, r)
	}
	c, err := NewContext(1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	plain := Rope{HeadDim: 16, Dims: 16, Base: 1e4, FreqScale: 1}
	scaled := plain
	scaled.Factors = ff
	other := plain
	other.Factors = append([]float32(nil), ff...)
	other.Factors[7] = 3
	for i, r := range []Rope{plain, scaled, other, scaled, plain} {
		got, want := rope(c, r), fresh(r)
		for j := range got {
			if got[j] != want[j] {
				t.Fatalf("call %d: element %d = %v, a fresh context gives %v", i, j, got[j], want[j])
			}
		}
	}
	if a, b := fresh(plain), fresh(scaled); a[3*16+2] == b[3*16+2] {
		t.Error("the factors changed nothing")
	}
	ff[0] = 0
	if err := c.Rope(append([]float32(nil), x...), 3, 2, scaled, pos); err == nil {
		t.Error("a frequency factor of 0 was accepted")
	}
}
