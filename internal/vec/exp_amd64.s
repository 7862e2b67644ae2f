//go:build amd64 && !noasm

#include "textflag.h"

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

// func expSumAVX2(x *float32, n int, m float32, store bool) float64
// Returns the sum of exp(x[i] - m) for i < n, n a multiple of 8, in float64, and with store
// sets x[i] to exp(x[i] - m). x[i] - m must be at most 0 (m is the maximum). exp is computed as expf is: 2^k·e^r
// with k = round(x·log2(e)), r = x - k·ln(2), e^r by its Taylor polynomial of degree 7.
TEXT ·expSumAVX2(SB), NOSPLIT, $0-32
	MOVQ         x+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS m+16(FP), Y15
	MOVBLZX      store+20(FP), R8
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
	TESTQ        R8, R8
	JZ           expnostore
	VMOVUPS      Y3, (DI)(AX*4)

expnostore:
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
