//go:build amd64 && !noasm

#include "textflag.h"

DATA maxc<>+0(SB)/4, $0xff800000 // -Inf
GLOBL maxc<>(SB), RODATA|NOPTR, $4

// func maxAVX(x *float32, n int) (m float32, nan bool)
// The largest of x[0..n), n a multiple of 32, ignoring NaNs, and whether there is one: four
// running maxima of eight lanes, and the unordered comparisons of every vector with itself ORed.
TEXT ·maxAVX(SB), NOSPLIT, $0-21
	MOVQ         x+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS maxc<>+0(SB), Y0
	VMOVAPS      Y0, Y1
	VMOVAPS      Y0, Y2
	VMOVAPS      Y0, Y3
	VXORPS       Y8, Y8, Y8
	XORQ         AX, AX

maxloop:
	CMPQ    AX, CX
	JGE     maxdone
	VMOVUPS (DI)(AX*4), Y4
	VMOVUPS 32(DI)(AX*4), Y5
	VMOVUPS 64(DI)(AX*4), Y6
	VMOVUPS 96(DI)(AX*4), Y7
	VCMPPS  $3, Y4, Y4, Y9
	VCMPPS  $3, Y5, Y5, Y10
	VORPS   Y9, Y10, Y9
	VCMPPS  $3, Y6, Y6, Y10
	VORPS   Y9, Y10, Y9
	VCMPPS  $3, Y7, Y7, Y10
	VORPS   Y9, Y10, Y9
	VORPS   Y9, Y8, Y8
	VMAXPS  Y0, Y4, Y0 // a NaN element leaves the running maximum as it was
	VMAXPS  Y1, Y5, Y1
	VMAXPS  Y2, Y6, Y2
	VMAXPS  Y3, Y7, Y3
	ADDQ    $32, AX
	JMP     maxloop

maxdone:
	VMAXPS       Y1, Y0, Y0
	VMAXPS       Y3, Y2, Y2
	VMAXPS       Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0x4e, X0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0xb1, X0, X1
	VMAXPS       X1, X0, X0
	VMOVSS       X0, m+16(FP)
	VPTEST       Y8, Y8
	SETNE        nan+20(FP)
	VZEROUPPER
	RET

// func indexAVX(x *float32, n int, v float32) int
// The first i < n (n a multiple of 8) with x[i] == v, or -1.
TEXT ·indexAVX(SB), NOSPLIT, $0-32
	MOVQ         x+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS v+16(FP), Y0
	XORQ         AX, AX

idxloop:
	CMPQ      AX, CX
	JGE       idxnone
	VCMPPS    $0, (DI)(AX*4), Y0, Y1
	VMOVMSKPS Y1, DX
	TESTL     DX, DX
	JNE       idxfound
	ADDQ      $8, AX
	JMP       idxloop

idxfound:
	BSFL DX, DX
	ADDQ DX, AX
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET

idxnone:
	MOVQ $-1, ret+24(FP)
	VZEROUPPER
	RET
