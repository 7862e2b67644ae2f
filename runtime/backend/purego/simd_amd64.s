//go:build amd64 && !noasm

#include "textflag.h"

// func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL leaf+0(FP), AX
	MOVL sub+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func xgetbv0() (eax, edx uint32)
TEXT ·xgetbv0(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET

// func axpy4F16AVX2(y *float32, f *[4]float32, x0, x1, x2, x3 *uint16, n int)
// y[i] += f[0]*x0[i] + f[1]*x1[i] + f[2]*x2[i] + f[3]*x3[i] for i < n, n a multiple of 8.
TEXT ·axpy4F16AVX2(SB), NOSPLIT, $0-56
	MOVQ y+0(FP), DI
	MOVQ f+8(FP), SI
	MOVQ x0+16(FP), R8
	MOVQ x1+24(FP), R9
	MOVQ x2+32(FP), R10
	MOVQ x3+40(FP), R11
	MOVQ n+48(FP), CX
	VBROADCASTSS 0(SI), Y0
	VBROADCASTSS 4(SI), Y1
	VBROADCASTSS 8(SI), Y2
	VBROADCASTSS 12(SI), Y3
	XORQ AX, AX

f16loop:
	CMPQ AX, CX
	JGE  f16done
	VMOVUPS     (DI)(AX*4), Y4
	VCVTPH2PS   (R8)(AX*2), Y5
	VCVTPH2PS   (R9)(AX*2), Y6
	VCVTPH2PS   (R10)(AX*2), Y7
	VCVTPH2PS   (R11)(AX*2), Y8
	VFMADD231PS Y0, Y5, Y4
	VMULPS      Y1, Y6, Y6
	VFMADD231PS Y2, Y7, Y6
	VFMADD231PS Y3, Y8, Y4
	VADDPS      Y6, Y4, Y4
	VMOVUPS     Y4, (DI)(AX*4)
	ADDQ        $8, AX
	JMP         f16loop

f16done:
	VZEROUPPER
	RET

// func axpy4F32AVX2(y *float32, f *[4]float32, x0, x1, x2, x3 *float32, n int)
// y[i] += f[0]*x0[i] + f[1]*x1[i] + f[2]*x2[i] + f[3]*x3[i] for i < n, n a multiple of 8.
TEXT ·axpy4F32AVX2(SB), NOSPLIT, $0-56
	MOVQ y+0(FP), DI
	MOVQ f+8(FP), SI
	MOVQ x0+16(FP), R8
	MOVQ x1+24(FP), R9
	MOVQ x2+32(FP), R10
	MOVQ x3+40(FP), R11
	MOVQ n+48(FP), CX
	VBROADCASTSS 0(SI), Y0
	VBROADCASTSS 4(SI), Y1
	VBROADCASTSS 8(SI), Y2
	VBROADCASTSS 12(SI), Y3
	XORQ AX, AX

f32loop:
	CMPQ AX, CX
	JGE  f32done
	VMOVUPS     (DI)(AX*4), Y4
	VMULPS      (R9)(AX*4), Y1, Y6
	VFMADD231PS (R8)(AX*4), Y0, Y4
	VFMADD231PS (R10)(AX*4), Y2, Y6
	VFMADD231PS (R11)(AX*4), Y3, Y4
	VADDPS      Y6, Y4, Y4
	VMOVUPS     Y4, (DI)(AX*4)
	ADDQ        $8, AX
	JMP         f32loop

f32done:
	VZEROUPPER
	RET

// func scaleRoundF16AVX2(dst, src *float32, f float32, n int)
// dst[i] = float32(F16(src[i]*f)) for i < n, n a multiple of 8, rounding to nearest even.
TEXT ·scaleRoundF16AVX2(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	VBROADCASTSS f+16(FP), Y0
	MOVQ         n+24(FP), CX
	XORQ         AX, AX

r16loop:
	CMPQ      AX, CX
	JGE       r16done
	VMULPS    (SI)(AX*4), Y0, Y1
	VCVTPS2PH $0, Y1, X1
	VCVTPH2PS X1, Y1
	VMOVUPS   Y1, (DI)(AX*4)
	ADDQ      $8, AX
	JMP       r16loop

r16done:
	VZEROUPPER
	RET

// func dot4F16AVX2(q *float32, k0, k1, k2, k3 *uint16, n int, out *[4]float32)
// out[r] = Σ_i q[i]*kr[i] for i < n, n a multiple of 8.
TEXT ·dot4F16AVX2(SB), NOSPLIT, $0-56
	MOVQ q+0(FP), SI
	MOVQ k0+8(FP), R8
	MOVQ k1+16(FP), R9
	MOVQ k2+24(FP), R10
	MOVQ k3+32(FP), R11
	MOVQ n+40(FP), CX
	MOVQ out+48(FP), DI
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ   AX, AX

d16loop:
	CMPQ AX, CX
	JGE  d16done
	VMOVUPS     (SI)(AX*4), Y4
	VCVTPH2PS   (R8)(AX*2), Y5
	VCVTPH2PS   (R9)(AX*2), Y6
	VCVTPH2PS   (R10)(AX*2), Y7
	VCVTPH2PS   (R11)(AX*2), Y8
	VFMADD231PS Y4, Y5, Y0
	VFMADD231PS Y4, Y6, Y1
	VFMADD231PS Y4, Y7, Y2
	VFMADD231PS Y4, Y8, Y3
	ADDQ        $8, AX
	JMP         d16loop

d16done:
	JMP hsum4<>(SB)

// func dot4F32AVX2(q *float32, k0, k1, k2, k3 *float32, n int, out *[4]float32)
// out[r] = Σ_i q[i]*kr[i] for i < n, n a multiple of 8.
TEXT ·dot4F32AVX2(SB), NOSPLIT, $0-56
	MOVQ q+0(FP), SI
	MOVQ k0+8(FP), R8
	MOVQ k1+16(FP), R9
	MOVQ k2+24(FP), R10
	MOVQ k3+32(FP), R11
	MOVQ n+40(FP), CX
	MOVQ out+48(FP), DI
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ   AX, AX

d32loop:
	CMPQ AX, CX
	JGE  d32done
	VMOVUPS     (SI)(AX*4), Y4
	VFMADD231PS (R8)(AX*4), Y4, Y0
	VFMADD231PS (R9)(AX*4), Y4, Y1
	VFMADD231PS (R10)(AX*4), Y4, Y2
	VFMADD231PS (R11)(AX*4), Y4, Y3
	ADDQ        $8, AX
	JMP         d32loop

d32done:
	JMP hsum4<>(SB)

// hsum4 stores the horizontal sums of Y0..Y3 at DI[0..3] and returns.
TEXT hsum4<>(SB), NOSPLIT|NOFRAME, $0
	VHADDPS       Y1, Y0, Y0
	VHADDPS       Y3, Y2, Y2
	VHADDPS       Y2, Y0, Y0
	VEXTRACTF128  $1, Y0, X1
	VADDPS        X1, X0, X0
	VMOVUPS       X0, (DI)
	VZEROUPPER
	RET

// Constants of expSumAVX2, as float32 bits: log2(e); ln(2) in two parts; 1/7! .. 1/2!; 1; the
// argument below which exp is taken as 0; and the exponent bias 127 (an integer).
DATA expc<>+0(SB)/4, $0x3fb8aa3b
DATA expc<>+4(SB)/4, $0x3f318000
DATA expc<>+8(SB)/4, $0xb95e8083
DATA expc<>+12(SB)/4, $0x39500d01
DATA expc<>+16(SB)/4, $0x3ab60b61
DATA expc<>+20(SB)/4, $0x3c088889
DATA expc<>+24(SB)/4, $0x3d2aaaab
DATA expc<>+28(SB)/4, $0x3e2aaaab
DATA expc<>+32(SB)/4, $0x3f000000
DATA expc<>+36(SB)/4, $0x3f800000
DATA expc<>+40(SB)/4, $0xc2aeac4f
DATA expc<>+44(SB)/4, $127
GLOBL expc<>(SB), RODATA|NOPTR, $48

// func expSumAVX2(x *float32, n int, m float32) float64
// x[i] = exp(x[i] - m) for i < n, n a multiple of 8, and returns the sum of the new x[i] in
// float64. x[i] - m must be at most 0 (m is the maximum). exp is computed as expf is: 2^k·e^r
// with k = round(x·log2(e)), r = x - k·ln(2), e^r by its Taylor polynomial of degree 7.
TEXT ·expSumAVX2(SB), NOSPLIT, $0-32
	MOVQ         x+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS m+16(FP), Y15
	VBROADCASTSS expc<>+0(SB), Y14
	VBROADCASTSS expc<>+4(SB), Y13
	VBROADCASTSS expc<>+8(SB), Y12
	VBROADCASTSS expc<>+40(SB), Y11
	VBROADCASTSS expc<>+36(SB), Y10
	VPBROADCASTD expc<>+44(SB), Y9
	VXORPD       Y8, Y8, Y8
	VXORPD       Y7, Y7, Y7
	XORQ         AX, AX

exploop:
	CMPQ         AX, CX
	JGE          expdone
	VMOVUPS      (DI)(AX*4), Y0
	VSUBPS       Y15, Y0, Y0      // x
	VCMPPS       $1, Y11, Y0, Y5  // x < threshold: exp is 0
	VMULPS       Y14, Y0, Y1
	VROUNDPS     $0, Y1, Y1       // k
	VFNMADD231PS Y13, Y1, Y0
	VFNMADD231PS Y12, Y1, Y0      // r = x - k·ln2
	VBROADCASTSS expc<>+12(SB), Y3
	VBROADCASTSS expc<>+16(SB), Y4
	VFMADD213PS  Y4, Y0, Y3
	VBROADCASTSS expc<>+20(SB), Y4
	VFMADD213PS  Y4, Y0, Y3
	VBROADCASTSS expc<>+24(SB), Y4
	VFMADD213PS  Y4, Y0, Y3
	VBROADCASTSS expc<>+28(SB), Y4
	VFMADD213PS  Y4, Y0, Y3
	VBROADCASTSS expc<>+32(SB), Y4
	VFMADD213PS  Y4, Y0, Y3
	VFMADD213PS  Y10, Y0, Y3
	VFMADD213PS  Y10, Y0, Y3      // e^r
	VCVTPS2DQ    Y1, Y1
	VPADDD       Y9, Y1, Y1
	VPSLLD       $23, Y1, Y1      // 2^k
	VMULPS       Y1, Y3, Y3
	VANDNPS      Y3, Y5, Y3
	VMOVUPS      Y3, (DI)(AX*4)
	VCVTPS2PD    X3, Y4
	VADDPD       Y4, Y8, Y8
	VEXTRACTF128 $1, Y3, X4
	VCVTPS2PD    X4, Y4
	VADDPD       Y4, Y7, Y7
	ADDQ         $8, AX
	JMP          exploop

expdone:
	VADDPD       Y7, Y8, Y8
	VEXTRACTF128 $1, Y8, X7
	VADDPD       X7, X8, X8
	VHADDPD      X8, X8, X8
	VMOVSD       X8, ret+24(FP)
	VZEROUPPER
	RET
