package quant

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/parleyhq/parley/runtime/tensor"
)

func rowSize(t testing.TB, dt tensor.DType, n int) int {
	sz, err := dt.RowSize(int64(n))
	if err != nil {
		t.Fatal(err)
	}
	return int(sz)
}

// Dequantize must agree with the float64 reference decoder. The implementation computes in
// float32 with at most two roundings per product term (d*sc, then *q) and one for the offset
// subtraction, so each element is within 4 float32 ulps (2^-22 relative) of the sum of the
// magnitudes of its parts.
func TestDequantizeMatchesReference(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for _, dt := range allTypes {
		for _, nb := range []int{1, 3, 7} {
			n := nb * dt.BlockSize()
			if !dt.Quantized() {
				n = nb * 37
			}
			src := randBlocks(r, dt, n/dt.BlockSize())
			got := make([]float32, n)
			if err := Dequantize(dt, src, got); err != nil {
				t.Fatalf("%v: %v", dt, err)
			}
			sc, off := refDecode(dt, src, n)
			for i := range got {
				want := sc[i] + off[i]
				tol := math.Ldexp(math.Abs(sc[i])+math.Abs(off[i]), -22)
				if math.Abs(float64(got[i])-want) > tol {
					t.Fatalf("%v n=%d: element %d = %g, want %g (tol %g)", dt, n, i, got[i], want, tol)
				}
			}
		}
	}
}

// Round trip through each format on seeded Gaussian data. Bounds, per block of the format:
//   - F16: 2^-11 relative (round to nearest); BF16: 2^-8 relative; F32 exact.
//   - Q8_0/Q8_1: d/2 from rounding plus 127*|fp16(d)-d| ≤ 127*d*2^-11 from storing d as f16.
//   - Q4_0/Q5_0: the top level saturates (x/d = +8 or +16 maps to 7 or 15), so 1*d, plus the
//     f16 error of d times the largest level (8 or 16).
//   - Q4_1/Q5_1: d/2 plus the f16 error of d times the top level, plus the f16 error of m.
//   - Q8_K: d/2 (d is stored as f32).
//   - Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS: no closed-form per-element bound (scales are
//     searched or fitted); their RMS error relative to the data RMS is bounded by what the
//     formats reach on Gaussian data with a margin (measured: Q2_K ≈0.356, Q3_K ≈0.201,
//     Q4_K ≈0.088, Q5_K ≈0.044, Q6_K ≈0.020, IQ4_NL ≈0.100, IQ4_XS ≈0.104, see the table
//     below). For comparison, the best possible 4-, 8- and 16-level quantisers of a Gaussian
//     reach 0.34, 0.19 and 0.097.
func TestQuantizeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	rmsBound := map[tensor.DType]float64{
		tensor.Q2_K: 0.40, tensor.Q3_K: 0.23, tensor.Q4_K: 0.11, tensor.Q5_K: 0.055, tensor.Q6_K: 0.032,
		tensor.IQ4_NL: 0.12, tensor.IQ4_XS: 0.12,
	}
	for _, dt := range allTypes {
		bs := dt.BlockSize()
		if bs == 1 {
			bs = 32
		}
		n := 16 * bs
		x := randFloats(r, n, 0.7)
		q := make([]byte, rowSize(t, dt, n))
		if err := Quantize(dt, x, q); err != nil {
			t.Fatal(err)
		}
		y := make([]float32, n)
		if err := Dequantize(dt, q, y); err != nil {
			t.Fatal(err)
		}
		var se, sx float64
		for b := 0; b < n/bs; b++ {
			xb, yb := x[b*bs:(b+1)*bs], y[b*bs:(b+1)*bs]
			var amax, mn, mx float64 = 0, math.Inf(1), math.Inf(-1)
			for _, v := range xb {
				amax = math.Max(amax, math.Abs(float64(v)))
				mn = math.Min(mn, float64(v))
				mx = math.Max(mx, float64(v))
			}
			const h = 1.0 / 2048 // f16 relative rounding
			for i := range xb {
				xv, yv := float64(xb[i]), float64(yb[i])
				err := math.Abs(xv - yv)
				se += err * err
				sx += xv * xv
				var bound float64
				switch dt {
				case tensor.F32:
					bound = 0
				case tensor.F16:
					bound = math.Abs(xv) * h
				case tensor.BF16:
					bound = math.Abs(xv) / 256
				case tensor.Q8_0, tensor.Q8_1:
					d := amax / 127
					bound = d/2 + 127*d*h
				case tensor.Q4_0:
					d := amax / 8
					bound = d + 8*d*h
				case tensor.Q5_0:
					d := amax / 16
					bound = d + 16*d*h
				case tensor.Q4_1:
					d := (mx - mn) / 15
					bound = d/2 + 15*d*h + math.Abs(mn)*h
				case tensor.Q5_1:
					d := (mx - mn) / 31
					bound = d/2 + 31*d*h + math.Abs(mn)*h
				case tensor.Q8_K:
					bound = amax / 127 / 2
				default:
					bound = math.Inf(1)
				}
				bound = bound*(1+1e-5) + 1e-30 // float32 arithmetic on the way
				if err > bound {
					t.Fatalf("%v block %d element %d: %g -> %g, error %g > %g", dt, b, i, xv, yv, err, bound)
				}
			}
		}
		rel := math.Sqrt(se / sx)
		t.Logf("%-5v relative RMS error %.4f", dt, rel)
		if b, ok := rmsBound[dt]; ok && rel > b {
			t.Errorf("%v: relative RMS error %.4f > %.4f", dt, rel, b)
		}
	}
}

// hand-checked blocks, derived by following the reference algorithms by hand.
func TestQuantizeKnownBlocks(t *testing.T) {
	type tc struct {
		name string
		dt   tensor.DType
		x    []float32
		want []byte
	}
	var cases []tc

	// Q8_0: amax 127 gives d = 1 exactly (f16 0x3c00) and id = 1, so q = roundf(x): halves
	// round away from zero (2.5 -> 3, -2.5 -> -3, 0.5 -> 1), unlike round-to-even.
	{
		x := make([]float32, 32)
		copy(x, []float32{127, 2.5, -2.5, 0.5, -0.5, 1.49, -126.6, 0})
		for j := 8; j < 32; j++ {
			x[j] = float32(j - 20)
		}
		want := []byte{0x00, 0x3c, 127, 3, 0xfd, 1, 0xff, 1, byte(0x81), 0}
		for j := 8; j < 32; j++ {
			want = append(want, byte(int8(j-20)))
		}
		cases = append(cases, tc{"q8_0 ties", tensor.Q8_0, x, want})
		// Q8_1: the same quants; s = f16(d*sum(q)). sum = 127+3-3+1-1+1-127+0 + sum(-12..11) = 1-12 = -11.
		w1 := append([]byte{0x00, 0x3c}, 0, 0)
		binary.LittleEndian.PutUint16(w1[2:], 0xc980) // -11 = -1.375*2^3: 0x8000|(18<<10)|0x180
		cases = append(cases, tc{"q8_1 ties", tensor.Q8_1, x, append(w1, want[2:]...)})
	}

	// Q4_0: the largest magnitude is -8, so d = -8/-8 = 1 and q = min(15, trunc(x + 8.5)):
	// 7.9 -> 16 -> 15, -8 -> 0, 0.5 -> 9 (half rounds up), -0.5 -> 8, 1.49 -> 9.
	{
		x := []float32{-8, 7.9, 0.5, -0.5, 1.49, 3, -3, 7, 0, 0, 0, 0, 0, 0, 0, 0,
			-7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7.5, 7.5}
		lo := []byte{0, 15, 9, 8, 9, 11, 5, 15, 8, 8, 8, 8, 8, 8, 8, 8}
		hi := []byte{1, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 15}
		want := []byte{0x00, 0x3c}
		for j := range 16 {
			want = append(want, lo[j]|hi[j]<<4)
		}
		cases = append(cases, tc{"q4_0", tensor.Q4_0, x, want})
	}

	// Q4_1: min -1, max 14: d = 15/15 = 1, m = -1 (f16 0xbc00), q = min(15, trunc(x+1+0.5)).
	{
		x := make([]float32, 32)
		want := []byte{0x00, 0x3c, 0x00, 0xbc}
		for j := range 32 {
			x[j] = float32(j%16) - 1
			if j >= 16 && j < 31 {
				x[j] += 0.25 // still rounds down; x[31] stays the maximum 14
			}
		}
		for j := range 16 {
			want = append(want, byte(j)|byte(j)<<4)
		}
		cases = append(cases, tc{"q4_1", tensor.Q4_1, x, want})
	}

	// Q5_0: largest magnitude -16: d = 1, q = min(31, trunc(x + 16.5)) = x + 16 for integer x;
	// elements j hold x = j - 16 (q = j), so qh = bit j set for j >= 16: 0xffff0000.
	{
		x := make([]float32, 32)
		for j := range 32 {
			x[j] = float32(j - 16)
		}
		want := []byte{0x00, 0x3c, 0x00, 0x00, 0xff, 0xff}
		for j := range 16 {
			want = append(want, byte(j)|byte(j)<<4) // q=j and q=j+16 share the low nibble j
		}
		cases = append(cases, tc{"q5_0", tensor.Q5_0, x, want})
	}

	// Q5_1: min 0, max 31: d = 1, m = 0, q = trunc(x + 0.5); x = 31 - j so q = 31 - j.
	{
		x := make([]float32, 32)
		for j := range 32 {
			x[j] = float32(31 - j)
		}
		want := []byte{0x00, 0x3c, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00} // q >= 16 for j < 16
		for j := range 16 {
			want = append(want, byte(15-j)|byte(15-j)<<4) // 31-j and 15-j share the low nibble
		}
		cases = append(cases, tc{"q5_1", tensor.Q5_1, x, want})
	}

	// Q8_K: max = 127 at x[0]: iscale = -127/127 = -1, d = 1/iscale = -1 (the sign follows
	// -max), q = nearest_int(-x) with ties to even: 2.5 -> -2, 3.5 -> -4, -0.5 -> 0.
	{
		x := make([]float32, 256)
		copy(x, []float32{127, 2.5, 3.5, -0.5, -126.5})
		want := make([]byte, 292)
		binary.LittleEndian.PutUint32(want, math.Float32bits(-1))
		q := []int8{-127, -2, -4, 0, 126}
		for j, v := range q {
			want[4+j] = byte(v)
		}
		binary.LittleEndian.PutUint16(want[260:], 0xfff9) // bsums[0] = -127-2-4+0+126 = -7
		cases = append(cases, tc{"q8_k ties", tensor.Q8_K, x, want})
	}

	// Q6_K: every 16-group holds integers in [-32, 31] including -32. make_qx_quants starts at
	// iscale = -32/-32 = 1, an exact fit (scale 1); no other trial scale can beat an exact
	// fit. So max_scale = 1, iscale = -128, d = f16(-1/128) = 0xa000, every scale byte is
	// nearest_int(-128) = -128 (0x80), d*scale = 1 and the levels are x+32.
	{
		x := make([]float32, 256)
		for g := range 16 {
			for l := range 16 {
				v := (l*5+g)%64 - 32
				if l == 0 {
					v = -32
				}
				x[16*g+l] = float32(v)
			}
		}
		want := make([]byte, 210)
		for e := range 256 {
			L := byte(int(x[e]) + 32)
			h, rr := e/128, e%128
			qt, l := rr/32, rr%32
			want[64*h+l+32*(qt&1)] |= (L & 15) << (4 * (qt >> 1))
			want[128+32*h+l] |= (L >> 4) << (2 * qt)
		}
		for g := range 16 {
			want[192+g] = 0x80
		}
		want[208], want[209] = 0x00, 0xa0
		cases = append(cases, tc{"q6_k exact", tensor.Q6_K, x, want})
	}

	// Q4_K / Q5_K: sub-block j holds s_j*(p-3) for levels p covering 0..nmax, s_j = 1 (even j)
	// or 0.5 (odd j). make_qkx2_quants fits exactly: scale s_j, min 3*s_j, zero error.
	// max_scale 1 -> d = f16(1/63) = 0x2410; max_min 3 -> dmin = f16(3/63) = 0x2a18.
	// Scales quantise to 63 (even) and nearest_int(31.5) = 32 (odd), mins the same. Packed:
	// bytes 0-3 = ls | (ls_{j+4}>>4)<<6 -> 0xff, 0xa0, ...; bytes 4-7 likewise for the mins;
	// bytes 8-11 = low nibbles of scale and min of sub-blocks 4-7: 0xff, 0x00, 0xff, 0x00.
	// Final levels: (x + dmin*m)/(d*sc) stays within 0.5 of p, so the quants are p.
	for _, k := range []struct {
		dt   tensor.DType
		nmax int
	}{{tensor.Q4_K, 15}, {tensor.Q5_K, 31}} {
		x := make([]float32, 256)
		p := make([]int, 256)
		for j := range 8 {
			s := float32(1)
			if j%2 == 1 {
				s = 0.5
			}
			for l := range 32 {
				p[32*j+l] = (7*l + j) % (k.nmax + 1)
				x[32*j+l] = s * float32(p[32*j+l]-3)
			}
		}
		want := make([]byte, k.dt.TypeSize())
		copy(want, []byte{0x10, 0x24, 0x18, 0x2a, 0xff, 0xa0, 0xff, 0xa0, 0xff, 0xa0, 0xff, 0xa0, 0xff, 0x00, 0xff, 0x00})
		qs := want[16:]
		if k.dt == tensor.Q5_K {
			qs = want[48:]
			for e := range 256 {
				want[16+e%32] |= byte(p[e]>>4) << (e / 32)
			}
		}
		for e := range 256 {
			qs[32*(e/64)+e%32] |= byte(p[e]&15) << (4 * (e % 64 / 32))
		}
		cases = append(cases, tc{k.dt.String() + " exact", k.dt, x, want})
	}

	// IQ4_NL: element j is s*kv[p_j] with s = 0.5 and codes p_j = (5j+3)%16, among them code 0
	// (level -127, the largest magnitude). The first scale max/-127 = s is exact, every x/s is
	// a level, and the least-squares scale is s again (s a power of two, so the weighted sums
	// differ by exactly the factor s): d = f16(0.5) = 0x3800 and the codes are p.
	// IQ4_XS: the same with s = 1 in even and 0.5 in odd sub-blocks (codes (5j+ib)%16): the
	// search finds each exact fit, max_scale = 1, so d = -1/32 (f16 0xa800), l = -32 (ls 0) for
	// s = 1 and -16 (ls 16) for s = 0.5: scales_l all 0, scales_h 0x4444 (the high bit of ls in
	// the odd sub-blocks), d*l = s, and the codes p again.
	{
		x := make([]float32, 32)
		want := []byte{0x00, 0x38}
		p := make([]byte, 32)
		for j := range 32 {
			p[j] = byte((5*j + 3) % 16)
			x[j] = 0.5 * float32(kvaluesIQ4NL[p[j]])
		}
		for j := range 16 {
			want = append(want, p[j]|p[j+16]<<4)
		}
		cases = append(cases, tc{"iq4_nl exact", tensor.IQ4_NL, x, want})

		x = make([]float32, 256)
		want = []byte{0x00, 0xa8, 0x44, 0x44, 0, 0, 0, 0}
		for ib := range 8 {
			s := float32(1)
			if ib%2 == 1 {
				s = 0.5
			}
			for j := range 32 {
				p[j] = byte((5*j + ib) % 16)
				x[32*ib+j] = s * float32(kvaluesIQ4NL[p[j]])
			}
			for j := range 16 {
				want = append(want, p[j]|p[j+16]<<4)
			}
		}
		cases = append(cases, tc{"iq4_xs exact", tensor.IQ4_XS, x, want})
	}

	for _, c := range cases {
		got := make([]byte, len(c.want))
		if err := Quantize(c.dt, c.x, got); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(got, c.want) {
			t.Errorf("%s:\n got %x\nwant %x", c.name, got, c.want)
		}
	}
}

// Outputs are written exactly: bytes and floats just past the destination stay untouched.
func TestGuardBytes(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for _, dt := range allTypes {
		n := 3 * dt.BlockSize()
		sz := rowSize(t, dt, n)
		buf := bytes.Repeat([]byte{0xa5}, sz+64)
		if err := Quantize(dt, randFloats(r, n, 1), buf[:sz]); err != nil {
			t.Fatal(err)
		}
		for i := sz; i < len(buf); i++ {
			if buf[i] != 0xa5 {
				t.Fatalf("%v: Quantize wrote byte %d past the %d-byte row", dt, i, sz)
			}
		}
		fl := make([]float32, n+16)
		for i := range fl {
			fl[i] = 12345
		}
		if err := Dequantize(dt, buf[:sz], fl[:n]); err != nil {
			t.Fatal(err)
		}
		for i := n; i < len(fl); i++ {
			if fl[i] != 12345 {
				t.Fatalf("%v: Dequantize wrote element %d past %d", dt, i, n)
			}
		}
	}
}

func TestWrongLengths(t *testing.T) {
	for _, dt := range allTypes {
		bs := dt.BlockSize()
		n := 2 * bs
		sz := rowSize(t, dt, n)
		f := make([]float32, n)
		for _, c := range []struct {
			nf, nb int
		}{{n, sz - 1}, {n, sz + 1}, {n, 0}, {n + 1, sz}, {n - 1, sz}} {
			if c.nf%bs == 0 && c.nb == rowSize(t, dt, c.nf) {
				continue
			}
			if err := Dequantize(dt, make([]byte, c.nb), make([]float32, c.nf)); err == nil {
				t.Errorf("%v: Dequantize %d bytes into %d elements: no error", dt, c.nb, c.nf)
			}
			if err := Quantize(dt, make([]float32, c.nf), make([]byte, c.nb)); err == nil {
				t.Errorf("%v: Quantize %d elements into %d bytes: no error", dt, c.nf, c.nb)
			}
		}
		if err := Quantize(dt, f, make([]byte, sz)); err != nil {
			t.Errorf("%v: %v", dt, err)
		}
		if err := Dequantize(dt, nil, nil); err != nil {
			t.Errorf("%v: empty row: %v", dt, err)
		}
	}
	for _, dt := range []tensor.DType{tensor.TQ2_0, tensor.IQ2_XXS, tensor.I8, tensor.F64, tensor.DType(99)} {
		if err := Dequantize(dt, make([]byte, 1024), make([]float32, 256)); err == nil {
			t.Errorf("%v: Dequantize: no error", dt)
		}
		if err := Quantize(dt, make([]float32, 256), make([]byte, 1024)); err == nil {
			t.Errorf("%v: Quantize: no error", dt)
		}
		if _, err := VecDotType(dt); err == nil {
			t.Errorf("%v: VecDotType: no error", dt)
		}
		if _, err := KernelFor(dt); err == nil {
			t.Errorf("%v: KernelFor: no error", dt)
		}
	}
	for _, dt := range []tensor.DType{tensor.Q8_1, tensor.Q8_K} {
		if _, err := KernelFor(dt); err == nil {
			t.Errorf("%v has no dot kernel as weights, want an error", dt)
		}
	}
}

// Quantizers must not panic on non-finite or extreme input (the result is unspecified).
func TestQuantizeOddValues(t *testing.T) {
	vals := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.MaxFloat32,
		-math.MaxFloat32, math.SmallestNonzeroFloat32, 0, 1e-30, -1e30}
	for _, dt := range allTypes {
		n := dt.BlockSize()
		if n == 1 {
			n = 32
		}
		for _, v := range vals {
			for _, pattern := range []int{0, 1} {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(i%7) - 3
					if pattern == 0 || i == 5 {
						x[i] = v
					}
				}
				q := make([]byte, rowSize(t, dt, n))
				if err := Quantize(dt, x, q); err != nil {
					t.Fatal(err)
				}
				if err := Dequantize(dt, q, x); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// All-zero blocks give all-zero values.
	for _, dt := range allTypes {
		n := 256
		q := make([]byte, rowSize(t, dt, n))
		y := make([]float32, n)
		if err := Quantize(dt, make([]float32, n), q); err != nil {
			t.Fatal(err)
		}
		if err := Dequantize(dt, q, y); err != nil {
			t.Fatal(err)
		}
		for i, v := range y {
			if v != 0 {
				t.Fatalf("%v: zero row element %d dequantised to %g", dt, i, v)
			}
		}
	}
}

func TestVecDotType(t *testing.T) {
	want := map[tensor.DType]tensor.DType{
		tensor.F32: tensor.F32, tensor.F16: tensor.F16, tensor.BF16: tensor.BF16,
		tensor.Q4_0: tensor.Q8_0, tensor.Q5_0: tensor.Q8_0, tensor.Q8_0: tensor.Q8_0,
		tensor.Q4_1: tensor.Q8_1, tensor.Q5_1: tensor.Q8_1,
		tensor.Q2_K: tensor.Q8_K, tensor.Q3_K: tensor.Q8_K,
		tensor.Q4_K: tensor.Q8_K, tensor.Q5_K: tensor.Q8_K, tensor.Q6_K: tensor.Q8_K,
		tensor.IQ4_NL: tensor.Q8_0, tensor.IQ4_XS: tensor.Q8_K,
	}
	for dt, vt := range want {
		got, err := VecDotType(dt)
		if err != nil || got != vt {
			t.Errorf("VecDotType(%v) = %v, %v; want %v", dt, got, err, vt)
		}
		k, err := KernelFor(dt)
		if err != nil || k.DType != dt || k.VecType != vt || k.Dot == nil {
			t.Errorf("KernelFor(%v) = %+v, %v", dt, k, err)
		}
	}
}

func ExampleKernelFor() {
	w := make([]float32, 64)
	x := make([]float32, 64)
	for i := range w {
		w[i], x[i] = float32(i%8)/8, 1
	}
	k, _ := KernelFor(tensor.Q8_0)
	wq := make([]byte, 2*34)
	xq := make([]byte, 2*34)
	_ = Quantize(k.DType, w, wq)
	_ = Quantize(k.VecType, x, xq)
	fmt.Printf("%.2f\n", k.Dot(64, wq, xq))
	// Output: 28.00
}
