package quant

import (
	"encoding/binary"
	"math"
	"math/bits"
)

// Each exported kernel checks its arguments once per row and hands a block count to the
// implementation chosen at init (pure Go, or assembly where the CPU allows). A kernel called
// with n not a whole number of blocks, or with w or x shorter than n elements need, returns
// NaN. Bytes past those needed are not read.

var nan32 = float32(math.NaN())

// rowBlocks returns n/bs if n is a non-negative multiple of bs and w, x hold nb blocks of
// wsz and xsz bytes.
func rowBlocks(n, bs, wsz, xsz int, w, x []byte) (int, bool) {
	if n < 0 || n%bs != 0 {
		return 0, false
	}
	nb := n / bs
	if nb > len(w)/wsz || nb > len(x)/xsz {
		return 0, false
	}
	return nb, true
}

// Implementations: element count (F32/F16/BF16) or block count (others), checked inputs.
var (
	dotF32Impl    = dotF32Go
	dotF16Impl    = dotF16Go
	dotQ8_0Impl   = dotQ8_0Go
	dotQ4_0Impl   = dotQ4_0Go
	dotQ4_KImpl   = dotQ4_KGo
	dotQ6_KImpl   = dotQ6_KGo
	dotBF16Impl   = dotBF16Go
	dotQ4_1Impl   = dotQ4_1Go
	dotQ5_0Impl   = dotQ5_0Go
	dotQ5_1Impl   = dotQ5_1Go
	dotQ5_KImpl   = dotQ5_KGo
	dotQ2_KImpl   = dotQ2_KGo
	dotQ3_KImpl   = dotQ3_KGo
	dotIQ4_NLImpl = dotIQ4_NLGo
	dotIQ4_XSImpl = dotIQ4_XSGo

	dot4Q8_0Impl = dot4Q8_0Go
	dot4Q4_0Impl = dot4Q4_0Go
)

// dot4Args checks Kernel.Dot4's arguments for weight blocks of wsz bytes and Q8_0 activation
// blocks (34 bytes) and returns the block count; run is false when there is nothing to compute
// (no blocks: the outputs are set to 0 here) or the arguments do not fit (ok false).
func dot4Args(n, wsz int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) (nb int, run, ok bool) {
	nb = n / 32
	switch {
	case n < 0 || n%32 != 0 || rows < 0 || wRow < nb*wsz || xRow < nb*34 || ldd < rows:
		return 0, false, false
	case ldd > len(dst) || 3*ldd > len(dst)-rows:
		return 0, false, false
	case rows == 0:
		return 0, false, true
	case nb == 0:
		for i := range 4 {
			clear(dst[i*ldd : i*ldd+rows])
		}
		return 0, false, true
	case len(w) < nb*wsz || (rows > 1 && (wRow > len(w) || rows-1 > (len(w)-nb*wsz)/wRow)),
		xRow > len(x) || 3*xRow > len(x)-nb*34:
		return 0, false, false
	}
	return nb, true, true
}

// dot4Q8_0 is Kernel.Dot4 for Q8_0 weights.
func dot4Q8_0(n int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) bool {
	nb, run, ok := dot4Args(n, 34, w, wRow, rows, x, xRow, dst, ldd)
	if run {
		dot4Q8_0Impl(nb, w, wRow, rows, x, xRow, dst, ldd)
	}
	return ok
}

// dot4Q4_0 is Kernel.Dot4 for Q4_0 weights.
func dot4Q4_0(n int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) bool {
	nb, run, ok := dot4Args(n, 18, w, wRow, rows, x, xRow, dst, ldd)
	if run {
		dot4Q4_0Impl(nb, w, wRow, rows, x, xRow, dst, ldd)
	}
	return ok
}

func dot4Q8_0Go(nb int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) {
	dot4Go(dotQ8_0Impl, nb, w, wRow, rows, x, xRow, dst, ldd)
}

func dot4Q4_0Go(nb int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) {
	dot4Go(dotQ4_0Impl, nb, w, wRow, rows, x, xRow, dst, ldd)
}

func dot4Go(dot func(nb int, w, x []byte) float32, nb int, w []byte, wRow, rows int, x []byte, xRow int, dst []float32, ldd int) {
	for r := range rows {
		wr := w[r*wRow:]
		for i := range 4 {
			dst[i*ldd+r] = dot(nb, wr, x[i*xRow:])
		}
	}
}

func dotF32(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, 1, 4, 4, w, x)
	if !ok {
		return nan32
	}
	return dotF32Impl(nb, w, x)
}

func dotF16(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, 1, 2, 2, w, x)
	if !ok {
		return nan32
	}
	return dotF16Impl(nb, w, x)
}

func dotBF16(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, 1, 2, 2, w, x)
	if !ok {
		return nan32
	}
	return dotBF16Impl(nb, w, x)
}

func dotQ4_0(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, q4_0Bytes, q8_0Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ4_0Impl(nb, w, x)
}

func dotQ4_1(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, q4_1Bytes, q8_1Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ4_1Impl(nb, w, x)
}

func dotQ5_0(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, q5_0Bytes, q8_0Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ5_0Impl(nb, w, x)
}

func dotQ5_1(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, q5_1Bytes, q8_1Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ5_1Impl(nb, w, x)
}

func dotQ8_0(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, q8_0Bytes, q8_0Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ8_0Impl(nb, w, x)
}

func dotQ2_K(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qkK, q2_KBytes, q8_KBytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ2_KImpl(nb, w, x)
}

func dotQ3_K(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qkK, q3_KBytes, q8_KBytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ3_KImpl(nb, w, x)
}

func dotIQ4_NL(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qk, iq4_NLBytes, q8_0Bytes, w, x)
	if !ok {
		return nan32
	}
	return dotIQ4_NLImpl(nb, w, x)
}

func dotIQ4_XS(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qkK, iq4_XSBytes, q8_KBytes, w, x)
	if !ok {
		return nan32
	}
	return dotIQ4_XSImpl(nb, w, x)
}

func dotQ4_K(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qkK, q4_KBytes, q8_KBytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ4_KImpl(nb, w, x)
}

func dotQ5_K(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qkK, q5_KBytes, q8_KBytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ5_KImpl(nb, w, x)
}

func dotQ6_K(n int, w, x []byte) float32 {
	nb, ok := rowBlocks(n, qkK, q6_KBytes, q8_KBytes, w, x)
	if !ok {
		return nan32
	}
	return dotQ6_KImpl(nb, w, x)
}

// i8 reinterprets a byte as a signed 8-bit integer widened to int32.
func i8(b byte) int32 { return int32(int8(b)) }

// Byte-lane helpers on 8 quants packed little-endian in a uint64.
const (
	lanes01 = 0x0101010101010101
	lanes03 = 0x0303030303030303
	lanes0f = 0x0f0f0f0f0f0f0f0f
	lanes80 = 0x8080808080808080
	lanes16 = 0x00ff00ff00ff00ff // low byte of each 16-bit lane
	sum16   = 0x0001000100010001 // multiplier summing the four 16-bit lanes into the top one
)

func le64(b []byte) uint64     { return binary.LittleEndian.Uint64(b) }
func f32at(b []byte) float32   { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }
func bsumAt(b []byte) int32    { return int32(int16(binary.LittleEndian.Uint16(b))) }
func put64(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }

// bit16 maps 8 bits to 8 byte lanes holding 0x10 where the bit is set: the fifth quant bit.
var bit16 = func() (t [256]uint64) {
	for i := range t {
		for k := 0; k < 8; k++ {
			if i>>k&1 != 0 {
				t[i] |= 0x10 << (8 * k)
			}
		}
	}
	return t
}()

// Integer dots of unsigned quants below 64 (packed 8 to a word) with signed 8-bit activations,
// four products per 64-bit multiply: with weights a_0..a_3 in the 16-bit lanes of A and
// activations b_3..b_0 (reversed) in the lanes of B, bits 48-63 of A*B hold sum a_i*b_i, and
// the lower lanes cannot carry into them. Activations are biased to b+128 (0..255) to be
// unsigned, so a lane sum is at most 4*63*255 = 64260 < 2^16; the bias is removed at the end
// through sum a_i.

// lanesDot adds to acc the dot of the 8 quants in w with the 8 activations in y (little-endian
// bytes), and to ws the lane sums of w and to ys those of the biased activations.
func lanesDot(w, y uint64, acc, ws, ys *uint64) {
	yr := bits.ReverseBytes64(y ^ lanes80) // lanes (low bytes): y7 y5 y3 y1; high bytes: y6 y4 y2 y0
	we, wo := w&lanes16, w>>8&lanes16      // lanes: w0 w2 w4 w6; w1 w3 w5 w7
	ye, yo := yr>>8&lanes16, yr&lanes16
	*acc += (we*ye)>>48 + (wo*yo)>>48
	*ws += we + wo
	*ys += ye + yo
}

// dotLanes32 returns sum w_i*y_i and sum y_i over 32 elements: w0..w3 hold quants 0-7, 8-15,
// 16-23, 24-31 (each < 64), y the signed activations.
func dotLanes32(w0, w1, w2, w3 uint64, y *[32]byte) (dot, ysum int32) {
	var acc, ws, ys uint64
	lanesDot(w0, le64(y[0:]), &acc, &ws, &ys)
	lanesDot(w1, le64(y[8:]), &acc, &ws, &ys)
	lanesDot(w2, le64(y[16:]), &acc, &ws, &ys)
	lanesDot(w3, le64(y[24:]), &acc, &ws, &ys)
	// Lane sums are at most 8*63 (weights) and 8*255 (activations): no carries between lanes.
	return int32(acc) - 128*int32((ws*sum16)>>48), int32((ys*sum16)>>48) - 32*128
}

// dotLanes16 is dotLanes32 over 16 elements, without the activation sum.
func dotLanes16(w0, w1 uint64, y *[16]byte) int32 {
	var acc, ws, ys uint64
	lanesDot(w0, le64(y[0:]), &acc, &ws, &ys)
	lanesDot(w1, le64(y[8:]), &acc, &ws, &ys)
	return int32(acc) - 128*int32((ws*sum16)>>48)
}

// quants5 returns the 32 quants of a Q4/Q5 block as four words of 8 (elements 0-7, 8-15,
// 16-23, 24-31): low nibbles of p are elements 0-15, high nibbles 16-31, and bit j of qh adds
// 16 to element j.
func quants5(p *[16]byte, qh uint32) (w0, w1, w2, w3 uint64) {
	a, c := le64(p[0:]), le64(p[8:])
	return a&lanes0f | bit16[qh&0xff], c&lanes0f | bit16[qh>>8&0xff],
		a>>4&lanes0f | bit16[qh>>16&0xff], c>>4&lanes0f | bit16[qh>>24]
}

// Legacy formats: per block, an integer dot of 32 quants, then one float scale.

func dotQ8_0Go(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q8_0Bytes]byte)(w[b*q8_0Bytes:])
		xb := (*[q8_0Bytes]byte)(x[b*q8_0Bytes:])
		s := dot32((*[32]byte)(wb[2:]), (*[32]byte)(xb[2:]))
		sum += float32(s) * (f16at(wb[0:]) * f16at(xb[0:]))
	}
	return sum
}

func dotQ4_0Go(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q4_0Bytes]byte)(w[b*q4_0Bytes:])
		xb := (*[q8_0Bytes]byte)(x[b*q8_0Bytes:])
		w0, w1, w2, w3 := quants5((*[16]byte)(wb[2:]), 0)
		d, ys := dotLanes32(w0, w1, w2, w3, (*[32]byte)(xb[2:]))
		sum += float32(d-8*ys) * (f16at(wb[0:]) * f16at(xb[0:]))
	}
	return sum
}

func dotQ4_1Go(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q4_1Bytes]byte)(w[b*q4_1Bytes:])
		xb := (*[q8_1Bytes]byte)(x[b*q8_1Bytes:])
		w0, w1, w2, w3 := quants5((*[16]byte)(wb[4:]), 0)
		d, _ := dotLanes32(w0, w1, w2, w3, (*[32]byte)(xb[4:]))
		sum += float32(d)*(f16at(wb[0:])*f16at(xb[0:])) + f16at(wb[2:])*f16at(xb[2:])
	}
	return sum
}

func dotQ5_0Go(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q5_0Bytes]byte)(w[b*q5_0Bytes:])
		xb := (*[q8_0Bytes]byte)(x[b*q8_0Bytes:])
		w0, w1, w2, w3 := quants5((*[16]byte)(wb[6:]), binary.LittleEndian.Uint32(wb[2:]))
		d, ys := dotLanes32(w0, w1, w2, w3, (*[32]byte)(xb[2:]))
		sum += float32(d-16*ys) * (f16at(wb[0:]) * f16at(xb[0:]))
	}
	return sum
}

func dotQ5_1Go(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q5_1Bytes]byte)(w[b*q5_1Bytes:])
		xb := (*[q8_1Bytes]byte)(x[b*q8_1Bytes:])
		w0, w1, w2, w3 := quants5((*[16]byte)(wb[8:]), binary.LittleEndian.Uint32(wb[4:]))
		d, _ := dotLanes32(w0, w1, w2, w3, (*[32]byte)(xb[4:]))
		sum += float32(d)*(f16at(wb[0:])*f16at(xb[0:])) + f16at(wb[2:])*f16at(xb[2:])
	}
	return sum
}

// K formats: per super-block, integer dots per sub-block weighted by the integer sub-scales,
// mins through the Q8_K group sums, then one float scale (d) and one float min scale (dmin).

// unpackScalesK4 expands the 12 packed bytes of Q4_K/Q5_K into 8 scales and 8 mins.
func unpackScalesK4(p *[12]byte) (sc, m [8]int32) {
	for j := 0; j < 4; j++ {
		sc[j] = int32(p[j] & 63)
		m[j] = int32(p[j+4] & 63)
		sc[j+4] = int32(p[j+8]&0xf | (p[j]>>6)<<4)
		m[j+4] = int32(p[j+8]>>4 | (p[j+4]>>6)<<4)
	}
	return
}

// minTerm returns sum_j m[j] * (sum of activations of sub-block j), from the Q8_K group sums.
func minTerm(m *[8]int32, y *[q8_KBytes]byte) int32 {
	g := (*[32]byte)(y[260:])
	var s int32
	for j := 0; j < 8; j++ {
		s += m[j] * (bsumAt(g[4*j:]) + bsumAt(g[4*j+2:]))
	}
	return s
}

func dotQ4_KGo(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q4_KBytes]byte)(w[b*q4_KBytes:])
		xb := (*[q8_KBytes]byte)(x[b*q8_KBytes:])
		sc, m := unpackScalesK4((*[12]byte)(wb[4:]))
		var sq int32
		for c := 0; c < 4; c++ {
			p := (*[32]byte)(wb[16+32*c:])
			a0, a1, a2, a3 := le64(p[0:]), le64(p[8:]), le64(p[16:]), le64(p[24:])
			lo, _ := dotLanes32(a0&lanes0f, a1&lanes0f, a2&lanes0f, a3&lanes0f, (*[32]byte)(xb[4+64*c:]))
			hi, _ := dotLanes32(a0>>4&lanes0f, a1>>4&lanes0f, a2>>4&lanes0f, a3>>4&lanes0f, (*[32]byte)(xb[36+64*c:]))
			sq += sc[2*c]*lo + sc[2*c+1]*hi
		}
		dy := f32at(xb[0:])
		sum += f16at(wb[0:])*dy*float32(sq) - f16at(wb[2:])*dy*float32(minTerm(&m, xb))
	}
	return sum
}

func dotQ5_KGo(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q5_KBytes]byte)(w[b*q5_KBytes:])
		xb := (*[q8_KBytes]byte)(x[b*q8_KBytes:])
		sc, m := unpackScalesK4((*[12]byte)(wb[4:]))
		qh := (*[32]byte)(wb[16:])
		h0, h1, h2, h3 := le64(qh[0:]), le64(qh[8:]), le64(qh[16:]), le64(qh[24:])
		var sq int32
		for c := 0; c < 4; c++ {
			p := (*[32]byte)(wb[48+32*c:])
			a0, a1, a2, a3 := le64(p[0:]), le64(p[8:]), le64(p[16:]), le64(p[24:])
			s0, s1 := uint(2*c), uint(2*c+1) // the qh bit of sub-blocks 2c and 2c+1
			lo, _ := dotLanes32(a0&lanes0f|(h0>>s0&lanes01)<<4, a1&lanes0f|(h1>>s0&lanes01)<<4,
				a2&lanes0f|(h2>>s0&lanes01)<<4, a3&lanes0f|(h3>>s0&lanes01)<<4, (*[32]byte)(xb[4+64*c:]))
			hi, _ := dotLanes32(a0>>4&lanes0f|(h0>>s1&lanes01)<<4, a1>>4&lanes0f|(h1>>s1&lanes01)<<4,
				a2>>4&lanes0f|(h2>>s1&lanes01)<<4, a3>>4&lanes0f|(h3>>s1&lanes01)<<4, (*[32]byte)(xb[36+64*c:]))
			sq += sc[2*c]*lo + sc[2*c+1]*hi
		}
		dy := f32at(xb[0:])
		sum += f16at(wb[0:])*dy*float32(sq) - f16at(wb[2:])*dy*float32(minTerm(&m, xb))
	}
	return sum
}

func dotQ6_KGo(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q6_KBytes]byte)(w[b*q6_KBytes:])
		xb := (*[q8_KBytes]byte)(x[b*q8_KBytes:])
		sc := (*[16]byte)(wb[192:])
		g := (*[32]byte)(xb[260:])
		var sq, soff int32
		for k := 0; k < 16; k++ {
			soff += i8(sc[k]) * bsumAt(g[2*k:])
		}
		for h := 0; h < 2; h++ {
			ql := (*[64]byte)(wb[64*h:])
			qh := (*[32]byte)(wb[128+32*h:])
			y := (*[128]byte)(xb[4+128*h:])
			s := (*[8]byte)(sc[8*h:])
			// Quarter r of this half holds elements 32r..32r+31: low 4 bits from ql (r&1 picks
			// the second 32 bytes, r>>1 the high nibble), high 2 bits from qh bits 2r, 2r+1.
			// Each 16-element group has its own scale.
			for k := 0; k < 32; k += 16 {
				a0, a1 := le64(ql[k:]), le64(ql[k+8:])
				c0, c1 := le64(ql[32+k:]), le64(ql[40+k:])
				e0, e1 := le64(qh[k:]), le64(qh[k+8:])
				g := k / 16
				sq += i8(s[g])*dotLanes16(a0&lanes0f|(e0&lanes03)<<4, a1&lanes0f|(e1&lanes03)<<4, (*[16]byte)(y[k:])) +
					i8(s[2+g])*dotLanes16(c0&lanes0f|(e0>>2&lanes03)<<4, c1&lanes0f|(e1>>2&lanes03)<<4, (*[16]byte)(y[32+k:])) +
					i8(s[4+g])*dotLanes16(a0>>4&lanes0f|(e0>>4&lanes03)<<4, a1>>4&lanes0f|(e1>>4&lanes03)<<4, (*[16]byte)(y[64+k:])) +
					i8(s[6+g])*dotLanes16(c0>>4&lanes0f|(e0>>6&lanes03)<<4, c1>>4&lanes0f|(e1>>6&lanes03)<<4, (*[16]byte)(y[96+k:]))
			}
		}
		sum += f16at(wb[208:]) * f32at(xb[0:]) * float32(sq-32*soff)
	}
	return sum
}

// dotQ2_KGo follows ggml's scalar ggml_vec_dot_q2_K_q8_K: per super-block, the integer dot of
// each 16-element sub-block weighted by its 4-bit scale, the minimum term from the Q8_K group
// sums weighted by the 4-bit mins, then d_y*d*isum - d_y*dmin*summs in float32.
func dotQ2_KGo(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q2_KBytes]byte)(w[b*q2_KBytes:])
		xb := (*[q8_KBytes]byte)(x[b*q8_KBytes:])
		sc := (*[16]byte)(wb[0:])
		g := (*[32]byte)(xb[260:])
		var isum, summs int32
		for j := 0; j < 16; j++ {
			summs += int32(sc[j]>>4) * bsumAt(g[2*j:])
		}
		for h := 0; h < 2; h++ {
			q := (*[32]byte)(wb[16+32*h:])
			a0, a1, a2, a3 := le64(q[0:]), le64(q[8:]), le64(q[16:]), le64(q[24:])
			y := (*[128]byte)(xb[4+128*h:])
			s := (*[8]byte)(sc[8*h:])
			// Quarter r of this half is bits 2r..2r+1 of the 32 bytes: its first 16 elements
			// come from bytes 0-15, the next 16 from bytes 16-31, each group with its own scale.
			for r := 0; r < 4; r++ {
				sh := uint(2 * r)
				lo := dotLanes16(a0>>sh&lanes03, a1>>sh&lanes03, (*[16]byte)(y[32*r:]))
				hi := dotLanes16(a2>>sh&lanes03, a3>>sh&lanes03, (*[16]byte)(y[32*r+16:]))
				isum += int32(s[2*r]&0xf)*lo + int32(s[2*r+1]&0xf)*hi
			}
		}
		dy := f32at(xb[0:])
		sum += f16at(wb[80:])*dy*float32(isum) - f16at(wb[82:])*dy*float32(summs)
	}
	return sum
}

// dotQ3_KGo follows ggml's scalar ggml_vec_dot_q3_K_q8_K: per super-block, the integer dot of
// each 16-element sub-block's 3-bit codes with the activations, less 4 times the group sum
// (the code offset), weighted by the signed 6-bit scale, then one float32 scale d_y*d. The
// integer sum stays below 2^23 in magnitude (16 groups of 16 times 32*4*127), so its float32
// conversion is exact.
func dotQ3_KGo(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[q3_KBytes]byte)(w[b*q3_KBytes:])
		xb := (*[q8_KBytes]byte)(x[b*q8_KBytes:])
		sc := unpackScalesK3((*[12]byte)(wb[96:]))
		hm := (*[32]byte)(wb[0:])
		e0, e1, e2, e3 := le64(hm[0:]), le64(hm[8:]), le64(hm[16:]), le64(hm[24:])
		g := (*[32]byte)(xb[260:])
		var isum int32
		for h := 0; h < 2; h++ {
			q := (*[32]byte)(wb[32+32*h:])
			a0, a1, a2, a3 := le64(q[0:]), le64(q[8:]), le64(q[16:]), le64(q[24:])
			y := (*[128]byte)(xb[4+128*h:])
			// Codes 0..7: the low two bits from qs, the third from bit 4h+r of hmask.
			for r := 0; r < 4; r++ {
				sh, hb := uint(2*r), uint(4*h+r)
				lo := dotLanes16(a0>>sh&lanes03|(e0>>hb&lanes01)<<2, a1>>sh&lanes03|(e1>>hb&lanes01)<<2,
					(*[16]byte)(y[32*r:]))
				hi := dotLanes16(a2>>sh&lanes03|(e2>>hb&lanes01)<<2, a3>>sh&lanes03|(e3>>hb&lanes01)<<2,
					(*[16]byte)(y[32*r+16:]))
				j := 8*h + 2*r
				isum += sc[j]*(lo-4*bsumAt(g[2*j:])) + sc[j+1]*(hi-4*bsumAt(g[2*j+2:]))
			}
		}
		sum += f16at(wb[108:]) * f32at(xb[0:]) * float32(isum)
	}
	return sum
}

// dotIQ4Group returns the integer dot of one group of 16 code bytes (32 levels) with 32 signed
// activations: at most 32*127*127 in magnitude. The levels are looked up into a 32-byte array
// first so that the products run as dot32's straight-line code.
func dotIQ4Group(qs *[16]byte, y *[32]byte) int32 {
	var v [32]byte
	for j, q := range qs {
		p := iq4Pairs[q]
		v[j], v[j+16] = byte(p), byte(p>>8)
	}
	return dot32(&v, y)
}

// dotIQ4_NLGo follows ggml's scalar ggml_vec_dot_iq4_nl_q8_0: per block, the integer dot of the
// 32 levels with the Q8_0 activations, then one float32 scale d*d_y, as for Q4_0.
func dotIQ4_NLGo(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[iq4_NLBytes]byte)(w[b*iq4_NLBytes:])
		xb := (*[q8_0Bytes]byte)(x[b*q8_0Bytes:])
		s := dotIQ4Group((*[16]byte)(wb[2:]), (*[32]byte)(xb[2:]))
		sum += float32(s) * (f16at(wb[0:]) * f16at(xb[0:]))
	}
	return sum
}

// dotIQ4_XSGo computes what ggml's ggml_vec_dot_iq4_xs_q8_K does in its AVX2 form: per
// super-block, the integer dot of each 32-element sub-block weighted by its signed scale
// ls-32, summed exactly (at most 8*32*32*127*127 < 2^28 in magnitude), then one float32 scale
// d*d_y. The sum can exceed 2^24, so its conversion to float32 may round once.
func dotIQ4_XSGo(nb int, w, x []byte) float32 {
	var sum float32
	for b := 0; b < nb; b++ {
		wb := (*[iq4_XSBytes]byte)(w[b*iq4_XSBytes:])
		xb := (*[q8_KBytes]byte)(x[b*q8_KBytes:])
		h, sl := le16(wb[2:]), (*[4]byte)(wb[4:])
		var isum int32
		for ib := 0; ib < 8; ib++ {
			s := dotIQ4Group((*[16]byte)(wb[8+16*ib:]), (*[32]byte)(xb[4+32*ib:]))
			isum += (scaleIQ4XS(ib, h, sl) - 32) * s
		}
		sum += f16at(wb[0:]) * f32at(xb[0:]) * float32(isum)
	}
	return sum
}
