//go:build amd64 && !noasm

#include "textflag.h"

// func dotsAVX2(dst *float32, q *float32, k *float32, hd int, stride int, n int)
// dst[i] = sum over d < hd of q[d]·k[i·stride + d], for i < n; hd a multiple of 16, stride in
// elements. Two 8-lane FMA accumulators a row, added, then the lanes.
TEXT ·dotsAVX2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ k+16(FP), DX
	MOVQ hd+24(FP), CX
	MOVQ stride+32(FP), R8
	MOVQ n+40(FP), R9
	SHLQ $2, R8
	XORQ R10, R10

rowloop:
	CMPQ   R10, R9
	JGE    rowsdone
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	XORQ   AX, AX

dimloop:
	CMPQ        AX, CX
	JGE         dimsdone
	VMOVUPS     (SI)(AX*4), Y2
	VMOVUPS     32(SI)(AX*4), Y3
	VFMADD231PS (DX)(AX*4), Y2, Y0
	VFMADD231PS 32(DX)(AX*4), Y3, Y1
	ADDQ        $16, AX
	JMP         dimloop

dimsdone:
	VADDPS       Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VHADDPS      X0, X0, X0
	VHADDPS      X0, X0, X0
	VMOVSS       X0, (DI)(R10*4)
	ADDQ         R8, DX
	INCQ         R10
	JMP          rowloop

rowsdone:
	VZEROUPPER
	RET
