// A straight-line integer dot product of fixed-size byte arrays: every operand sits at a
// constant offset, which the compiler turns into one load per byte and no bounds checks. It
// is too large to inline, which is intended: one call per 32 elements keeps the caller's loop
// small enough to stay in registers.

package quant

// dot32 returns sum a[i]*b[i] over 32 signed bytes.
func dot32(a, b *[32]byte) int32 {
	s0 := i8(a[0])*i8(b[0]) + i8(a[1])*i8(b[1]) + i8(a[2])*i8(b[2]) + i8(a[3])*i8(b[3]) +
		i8(a[4])*i8(b[4]) + i8(a[5])*i8(b[5]) + i8(a[6])*i8(b[6]) + i8(a[7])*i8(b[7])
	s1 := i8(a[8])*i8(b[8]) + i8(a[9])*i8(b[9]) + i8(a[10])*i8(b[10]) + i8(a[11])*i8(b[11]) +
		i8(a[12])*i8(b[12]) + i8(a[13])*i8(b[13]) + i8(a[14])*i8(b[14]) + i8(a[15])*i8(b[15])
	s2 := i8(a[16])*i8(b[16]) + i8(a[17])*i8(b[17]) + i8(a[18])*i8(b[18]) + i8(a[19])*i8(b[19]) +
		i8(a[20])*i8(b[20]) + i8(a[21])*i8(b[21]) + i8(a[22])*i8(b[22]) + i8(a[23])*i8(b[23])
	s3 := i8(a[24])*i8(b[24]) + i8(a[25])*i8(b[25]) + i8(a[26])*i8(b[26]) + i8(a[27])*i8(b[27]) +
		i8(a[28])*i8(b[28]) + i8(a[29])*i8(b[29]) + i8(a[30])*i8(b[30]) + i8(a[31])*i8(b[31])
	return (s0 + s1) + (s2 + s3)
}
