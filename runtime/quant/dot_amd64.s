//go:build amd64 && !noasm

#include "textflag.h"

// The four-row kernels' frame: DOT4START loads the weight rows' base (BX), stride (R11) and
// count (R12), the output (R13) and int16 ones (Y15); DOT4ROW points SI at the weight row, DI,
// R8, R9, R10 at the four activation rows, CX at the block count, and clears the accumulators
// (Y0/Y1 for the first activation row's even and odd blocks, Y2/Y3, Y4/Y5, Y6/Y7 for the
// others); DOT4STORE stores the four sums ds bytes apart and moves to the next weight row.
#define DOT4START \
	MOVQ     w+0(FP), BX      \
	MOVQ     wRow+8(FP), R11  \
	MOVQ     rows+16(FP), R12 \
	MOVQ     dst+48(FP), R13  \
	VPCMPEQW Y15, Y15, Y15    \
	VPSRLW   $15, Y15, Y15

#define DOT4ROW \
	MOVQ   BX, SI            \
	MOVQ   x+24(FP), DI      \
	MOVQ   xs+32(FP), DX     \
	LEAQ   (DI)(DX*1), R8    \
	LEAQ   (R8)(DX*1), R9    \
	LEAQ   (R9)(DX*1), R10   \
	MOVQ   nb+40(FP), CX     \
	VXORPS Y0, Y0, Y0        \
	VXORPS Y1, Y1, Y1        \
	VXORPS Y2, Y2, Y2        \
	VXORPS Y3, Y3, Y3        \
	VXORPS Y4, Y4, Y4        \
	VXORPS Y5, Y5, Y5        \
	VXORPS Y6, Y6, Y6        \
	VXORPS Y7, Y7, Y7

#define DOT4STORE \
	MOVQ   ds+56(FP), AX     \
	VADDPS Y1, Y0, Y0        \
	HSUM8(Y0, X0, X8)        \
	MOVSS  X0, (R13)         \
	VADDPS Y3, Y2, Y2        \
	HSUM8(Y2, X2, X8)        \
	MOVSS  X2, (R13)(AX*1)   \
	LEAQ   (R13)(AX*2), DI   \
	VADDPS Y5, Y4, Y4        \
	HSUM8(Y4, X4, X8)        \
	MOVSS  X4, (DI)          \
	VADDPS Y7, Y6, Y6        \
	HSUM8(Y6, X6, X8)        \
	MOVSS  X6, (DI)(AX*1)    \
	ADDQ   R11, BX           \
	ADDQ   $4, R13           \
	DECQ   R12

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

// HSUM8 leaves the sum of the 8 floats of Y in the low float of X (X is Y's low half).
#define HSUM8(Y, X, T) \
	VEXTRACTF128 $1, Y, T \
	VADDPS       T, X, X  \
	VMOVHLPS     X, X, T  \
	VADDPS       T, X, X  \
	VMOVSHDUP    X, T     \
	VADDSS       T, X, X

// func dotF32Asm(w, x *byte, n int) float32
// n: a positive multiple of 32. Four accumulators of 8 lanes.
TEXT ·dotF32Asm(SB), NOSPLIT, $0-28
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $5, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

f32loop:
	VMOVUPS     0(SI), Y4
	VMOVUPS     32(SI), Y5
	VMOVUPS     64(SI), Y6
	VMOVUPS     96(SI), Y7
	VFMADD231PS 0(DI), Y4, Y0
	VFMADD231PS 32(DI), Y5, Y1
	VFMADD231PS 64(DI), Y6, Y2
	VFMADD231PS 96(DI), Y7, Y3
	ADDQ        $128, SI
	ADDQ        $128, DI
	DECQ        CX
	JNZ         f32loop

	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	HSUM8(Y0, X0, X1)
	VZEROUPPER
	MOVSS  X0, ret+24(FP)
	RET

// func dotF16Asm(w, x *byte, n int) float32
// n: a positive multiple of 32. Halves widened with VCVTPH2PS, four accumulators.
TEXT ·dotF16Asm(SB), NOSPLIT, $0-28
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $5, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

f16loop:
	VCVTPH2PS   0(SI), Y4
	VCVTPH2PS   16(SI), Y5
	VCVTPH2PS   32(SI), Y6
	VCVTPH2PS   48(SI), Y7
	VCVTPH2PS   0(DI), Y8
	VCVTPH2PS   16(DI), Y9
	VCVTPH2PS   32(DI), Y10
	VCVTPH2PS   48(DI), Y11
	VFMADD231PS Y8, Y4, Y0
	VFMADD231PS Y9, Y5, Y1
	VFMADD231PS Y10, Y6, Y2
	VFMADD231PS Y11, Y7, Y3
	ADDQ        $64, SI
	ADDQ        $64, DI
	DECQ        CX
	JNZ         f16loop

	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	HSUM8(Y0, X0, X1)
	VZEROUPPER
	MOVSS  X0, ret+24(FP)
	RET

// func dotBF16Asm(w, x *byte, n int) float32
// n: a positive multiple of 32. bfloat16 widened by zero-extending to 32 bits and shifting.
TEXT ·dotBF16Asm(SB), NOSPLIT, $0-28
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $5, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

bf16loop:
	VPMOVZXWD   0(SI), Y4
	VPMOVZXWD   16(SI), Y5
	VPMOVZXWD   32(SI), Y6
	VPMOVZXWD   48(SI), Y7
	VPMOVZXWD   0(DI), Y8
	VPMOVZXWD   16(DI), Y9
	VPMOVZXWD   32(DI), Y10
	VPMOVZXWD   48(DI), Y11
	VPSLLD      $16, Y4, Y4
	VPSLLD      $16, Y5, Y5
	VPSLLD      $16, Y6, Y6
	VPSLLD      $16, Y7, Y7
	VPSLLD      $16, Y8, Y8
	VPSLLD      $16, Y9, Y9
	VPSLLD      $16, Y10, Y10
	VPSLLD      $16, Y11, Y11
	VFMADD231PS Y8, Y4, Y0
	VFMADD231PS Y9, Y5, Y1
	VFMADD231PS Y10, Y6, Y2
	VFMADD231PS Y11, Y7, Y3
	ADDQ        $64, SI
	ADDQ        $64, DI
	DECQ        CX
	JNZ         bf16loop

	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	HSUM8(Y0, X0, X1)
	VZEROUPPER
	MOVSS  X0, ret+24(FP)
	RET

// SCALE2(wofs, xofs, Yd): Yd = broadcast(f16(w.d) * f16(x.d)) for the blocks at SI and DI.
#define SCALE2(WOFS, XOFS, YD, XD, XT) \
	MOVWLZX    WOFS(SI), AX        \
	VMOVD      AX, XD              \
	VPINSRW    $1, XOFS(DI), XD, XD \
	VCVTPH2PS  XD, XD              \
	VMOVSHDUP  XD, XT              \
	VMULSS     XT, XD, XD          \
	VBROADCASTSS XD, YD

// I8DOT(Yw, Yx, Yt): Yw = 8 int32 partial sums of Yw[i]*Yx[i] over 32 signed bytes, using
// |w| * (x * sign(w)) (exact while x is never -128 where w is negative). Y15 holds int16 ones.
#define I8DOT(YW, YX, YT) \
	VPSIGNB    YW, YX, YT \
	VPABSB     YW, YW     \
	VPMADDUBSW YT, YW, YW \
	VPMADDWD   Y15, YW, YW

// func dotQ8_0Asm(w, x *byte, nb int) float32
// Blocks of 34 bytes: f16 d, 32 int8. Two blocks per iteration into two accumulators.
TEXT ·dotQ8_0Asm(SB), NOSPLIT, $0-28
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ nb+16(FP), CX
	VXORPS   Y0, Y0, Y0
	VXORPS   Y1, Y1, Y1
	VPCMPEQW Y15, Y15, Y15
	VPSRLW   $15, Y15, Y15

q80pair:
	CMPQ CX, $2
	JB   q80one
	SCALE2(0, 0, Y2, X2, X3)
	SCALE2(34, 34, Y3, X3, X4)
	VMOVDQU     2(SI), Y4
	VMOVDQU     2(DI), Y5
	VMOVDQU     36(SI), Y6
	VMOVDQU     36(DI), Y7
	I8DOT(Y4, Y5, Y8)
	I8DOT(Y6, Y7, Y9)
	VCVTDQ2PS   Y4, Y4
	VCVTDQ2PS   Y6, Y6
	VFMADD231PS Y4, Y2, Y0
	VFMADD231PS Y6, Y3, Y1
	ADDQ        $68, SI
	ADDQ        $68, DI
	SUBQ        $2, CX
	JMP         q80pair

q80one:
	TESTQ CX, CX
	JZ    q80done
	SCALE2(0, 0, Y2, X2, X3)
	VMOVDQU     2(SI), Y4
	VMOVDQU     2(DI), Y5
	I8DOT(Y4, Y5, Y8)
	VCVTDQ2PS   Y4, Y4
	VFMADD231PS Y4, Y2, Y0

q80done:
	VADDPS Y1, Y0, Y0
	HSUM8(Y0, X0, X1)
	VZEROUPPER
	MOVSS  X0, ret+24(FP)
	RET

// Q4NIB(ofs, Yq, Xq, Xt): Yq = the 32 quants q-8 of the Q4_0 block at SI (16 bytes at ofs):
// low nibbles (elements 0-15) in the low lane, high nibbles (16-31) in the high lane.
// Y14: bytes 0x0f, Y13: bytes 8.
#define Q4NIB(OFS, YQ, XQ, XT, YT) \
	VMOVDQU     OFS(SI), XQ  \
	VPSRLW      $4, XQ, XT   \
	VINSERTI128 $1, XT, YQ, YQ \
	VPAND       Y14, YQ, YQ  \
	VPSUBB      Y13, YQ, YQ

// func dotQ4_0Asm(w, x *byte, nb int) float32
// Weight blocks of 18 bytes (f16 d, 16 nibble bytes), activation Q8_0 blocks of 34.
TEXT ·dotQ4_0Asm(SB), NOSPLIT, $0-28
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ nb+16(FP), CX
	VXORPS       Y0, Y0, Y0
	VXORPS       Y1, Y1, Y1
	VPCMPEQW     Y15, Y15, Y15
	VPSRLW       $15, Y15, Y15
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
	MOVL         $0x08080808, AX
	VMOVD        AX, X13
	VPBROADCASTD X13, Y13

q40pair:
	CMPQ CX, $2
	JB   q40one
	SCALE2(0, 0, Y2, X2, X3)
	SCALE2(18, 34, Y3, X3, X4)
	Q4NIB(2, Y4, X4, X8, Y8)
	Q4NIB(20, Y6, X6, X9, Y9)
	VMOVDQU     2(DI), Y5
	VMOVDQU     36(DI), Y7
	I8DOT(Y4, Y5, Y8)
	I8DOT(Y6, Y7, Y9)
	VCVTDQ2PS   Y4, Y4
	VCVTDQ2PS   Y6, Y6
	VFMADD231PS Y4, Y2, Y0
	VFMADD231PS Y6, Y3, Y1
	ADDQ        $36, SI
	ADDQ        $68, DI
	SUBQ        $2, CX
	JMP         q40pair

q40one:
	TESTQ CX, CX
	JZ    q40done
	SCALE2(0, 0, Y2, X2, X3)
	Q4NIB(2, Y4, X4, X8, Y8)
	VMOVDQU     2(DI), Y5
	I8DOT(Y4, Y5, Y8)
	VCVTDQ2PS   Y4, Y4
	VFMADD231PS Y4, Y2, Y0

q40done:
	VADDPS Y1, Y0, Y0
	HSUM8(Y0, X0, X1)
	VZEROUPPER
	MOVSS  X0, ret+24(FP)
	RET

// KSUBTAIL(q8ofs): for a 64-element chunk of a Q4_K/Q5_K super-block with unsigned quants of
// sub-block 2j in Y4 and 2j+1 in Y5 (32 bytes each) and 64 int8 activations at DI+q8ofs,
// adds scale*(q·y) pairs into Y15 (8 int32). Y9: the 8 int16 scales in both lanes; Y10:
// shuffle selecting the next scale's two bytes, advanced by Y11.
#define KSUBTAIL(Q8OFS) \
	VPMADDUBSW Q8OFS(DI), Y4, Y4 \
	VPMADDUBSW Q8OFS+32(DI), Y5, Y5 \
	VPSHUFB    Y10, Y9, Y6       \
	VPADDW     Y11, Y10, Y10     \
	VPSHUFB    Y10, Y9, Y7       \
	VPADDW     Y11, Y10, Y10     \
	VPMADDWD   Y6, Y4, Y4        \
	VPMADDWD   Y7, Y5, Y5        \
	VPADDD     Y4, Y15, Y15      \
	VPADDD     Y5, Y15, Y15

// Q4KSUB(q4ofs, q8ofs): 32 bytes of nibbles at SI+q4ofs (low: sub-block 2j, high: 2j+1).
// Y14: bytes 0x0f.
#define Q4KSUB(Q4OFS, Q8OFS) \
	VMOVDQU    Q4OFS(SI), Y4     \
	VPSRLW     $4, Y4, Y5        \
	VPAND      Y14, Y4, Y4       \
	VPAND      Y14, Y5, Y5       \
	KSUBTAIL(Q8OFS)

// Q5KSUB(q4ofs, q8ofs, s0, s1): Q4KSUB plus the fifth bits: bit s0 (s1) of each of the 32
// qh bytes in Y13 for sub-block 2j (2j+1). Y2: bytes 0x01.
#define Q5KSUB(Q4OFS, Q8OFS, S0, S1) \
	VMOVDQU    Q4OFS(SI), Y4     \
	VPSRLW     $4, Y4, Y5        \
	VPAND      Y14, Y4, Y4       \
	VPAND      Y14, Y5, Y5       \
	VPSRLW     $S0, Y13, Y6      \
	VPSRLW     $S1, Y13, Y7      \
	VPAND      Y2, Y6, Y6        \
	VPAND      Y2, Y7, Y7        \
	VPSLLW     $4, Y6, Y6        \
	VPSLLW     $4, Y7, Y7        \
	VPOR       Y6, Y4, Y4        \
	VPOR       Y7, Y5, Y5        \
	KSUBTAIL(Q8OFS)

// KHEADER: for the Q4_K/Q5_K super-block at SI and the Q8_K block at DI, sets Y8 = d*dx
// in all lanes, Y9 = the 8 int16 sub-block scales in both lanes, and adds dmin*dx * sum_j
// m_j*(activation sum of sub-block j) into X1 (4 lanes). Clobbers AX, BX, DX, R8-R10, Y3-Y7.
#define KHEADER \
	VMOVD        0(SI), X4           \
	VCVTPH2PS    X4, X4              \
	VBROADCASTSS 0(DI), X5           \
	VMULPS       X5, X4, X4          \
	VBROADCASTSS X4, Y8              \
	VMOVSHDUP    X4, X7              \
	VBROADCASTSS X7, X7              \
	MOVL 4(SI), AX                   \
	MOVL 8(SI), BX                   \
	MOVL 12(SI), DX                  \
	MOVL AX, R8                      \
	ANDL $0x3f3f3f3f, R8             \
	MOVL BX, R9                      \
	ANDL $0x3f3f3f3f, R9             \
	MOVL DX, R10                     \
	ANDL $0x0f0f0f0f, R10            \
	SHRL $6, AX                      \
	ANDL $0x03030303, AX             \
	SHLL $4, AX                      \
	ORL  AX, R10                     \
	SHRL $4, DX                      \
	ANDL $0x0f0f0f0f, DX             \
	SHRL $6, BX                      \
	ANDL $0x03030303, BX             \
	SHLL $4, BX                      \
	ORL  BX, DX                      \
	VMOVD   R8, X3                   \
	VPINSRD $1, R10, X3, X3          \
	VPINSRD $2, R9, X3, X3           \
	VPINSRD $3, DX, X3, X3           \
	VPMOVZXBW X3, Y3                 \
	VMOVDQU      260(DI), Y4         \
	VEXTRACTI128 $1, Y4, X5          \
	VPHADDW      X5, X4, X4          \
	VEXTRACTI128 $1, Y3, X5          \
	VPMADDWD     X4, X5, X5          \
	VCVTDQ2PS    X5, X5              \
	VFMADD231PS  X5, X7, X1          \
	VPERMQ       $0x44, Y3, Y9

// func dotQ4_KAsm(w, x *byte, nb int) float32
// Weight super-blocks of 144 bytes (f16 d, f16 dmin, 12 packed 6-bit scales/mins, 128 nibble
// bytes), Q8_K activation blocks of 292 (f32 d, 256 int8, 16 int16 group sums).
// Sum = d*dx*sum_j sc_j*(q·y)_j - dmin*dx*sum_j m_j*(y sum)_j, the second through the group sums.
TEXT ·dotQ4_KAsm(SB), NOSPLIT, $0-28
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ nb+16(FP), CX
	VXORPS       Y0, Y0, Y0 // d terms
	VXORPS       X1, X1, X1 // dmin terms (4 lanes)
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
	MOVL         $0x01000100, AX
	VMOVD        AX, X12
	VPBROADCASTD X12, Y12   // shuffle picking int16 lane 0
	MOVL         $0x02020202, AX
	VMOVD        AX, X11
	VPBROADCASTD X11, Y11   // advance to the next int16 lane

q4kloop:
	KHEADER
	VMOVDQA Y12, Y10
	VPXOR   Y15, Y15, Y15
	Q4KSUB(16, 4)
	Q4KSUB(48, 68)
	Q4KSUB(80, 132)
	Q4KSUB(112, 196)
	VCVTDQ2PS   Y15, Y15
	VFMADD231PS Y15, Y8, Y0

	ADDQ $144, SI
	ADDQ $292, DI
	DECQ CX
	JNZ  q4kloop

	HSUM8(Y0, X0, X2)
	VMOVHLPS  X1, X1, X2
	VADDPS    X2, X1, X1
	VMOVSHDUP X1, X2
	VADDSS    X2, X1, X1
	VSUBSS    X1, X0, X0
	VZEROUPPER
	MOVSS     X0, ret+24(FP)
	RET

// func dotQ5_KAsm(w, x *byte, nb int) float32
// Weight super-blocks of 176 bytes (f16 d, f16 dmin, 12 packed scales/mins, qh[32],
// 128 nibble bytes), Q8_K activations; as dotQ4_KAsm with a fifth quant bit from qh.
TEXT ·dotQ5_KAsm(SB), NOSPLIT, $0-28
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ nb+16(FP), CX
	VXORPS       Y0, Y0, Y0
	VXORPS       X1, X1, X1
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
	MOVL         $0x01000100, AX
	VMOVD        AX, X12
	VPBROADCASTD X12, Y12
	MOVL         $0x02020202, AX
	VMOVD        AX, X11
	VPBROADCASTD X11, Y11
	MOVL         $0x01010101, AX
	VMOVD        AX, X2
	VPBROADCASTD X2, Y2

q5kloop:
	KHEADER
	VMOVDQU 16(SI), Y13              // qh
	VMOVDQA Y12, Y10
	VPXOR   Y15, Y15, Y15
	Q5KSUB(48, 4, 0, 1)
	Q5KSUB(80, 68, 2, 3)
	Q5KSUB(112, 132, 4, 5)
	Q5KSUB(144, 196, 6, 7)
	VCVTDQ2PS   Y15, Y15
	VFMADD231PS Y15, Y8, Y0

	ADDQ $176, SI
	ADDQ $292, DI
	DECQ CX
	JNZ  q5kloop

	HSUM8(Y0, X0, X2)
	VMOVHLPS  X1, X1, X2
	VADDPS    X2, X1, X1
	VMOVSHDUP X1, X2
	VADDSS    X2, X1, X1
	VSUBSS    X1, X0, X0
	VZEROUPPER
	MOVSS     X0, ret+24(FP)
	RET

// Q6KQUAD(qlofs, qhofs, q8ofs): one 128-element half of a Q6_K super-block. ql: 64 bytes at
// SI+qlofs, qh: 32 bytes at SI+qhofs, activations: 128 int8 at DI+q8ofs. Adds the scaled
// (unsigned q)·y sums into Y15. X2: the 16 int8 scales; X10: shuffle selecting the next pair
// of scales (8 bytes each), advanced by X11; Y14: bytes 0x0f; Y12: bytes 0x30.
#define Q6KGROUP(YQ, Q8OFS) \
	VPMADDUBSW Q8OFS(DI), YQ, YQ \
	VPSHUFB    X10, X2, X6       \
	VPADDB     X11, X10, X10     \
	VPMOVSXBW  X6, Y6            \
	VPMADDWD   Y6, YQ, YQ        \
	VPADDD     YQ, Y15, Y15

#define Q6KQUAD(QLOFS, QHOFS, Q8OFS) \
	VMOVDQU QLOFS(SI), Y4        \
	VMOVDQU QLOFS+32(SI), Y5     \
	VMOVDQU QHOFS(SI), Y7        \
	VPSLLW  $4, Y7, Y8           \
	VPAND   Y12, Y8, Y8          \
	VPAND   Y14, Y4, Y9          \
	VPOR    Y8, Y9, Y9           \
	Q6KGROUP(Y9, Q8OFS)          \
	VPSLLW  $2, Y7, Y8           \
	VPAND   Y12, Y8, Y8          \
	VPAND   Y14, Y5, Y9          \
	VPOR    Y8, Y9, Y9           \
	Q6KGROUP(Y9, Q8OFS+32)       \
	VPAND   Y12, Y7, Y8          \
	VPSRLW  $4, Y4, Y9           \
	VPAND   Y14, Y9, Y9          \
	VPOR    Y8, Y9, Y9           \
	Q6KGROUP(Y9, Q8OFS+64)       \
	VPSRLW  $2, Y7, Y8           \
	VPAND   Y12, Y8, Y8          \
	VPSRLW  $4, Y5, Y9           \
	VPAND   Y14, Y9, Y9          \
	VPOR    Y8, Y9, Y9           \
	Q6KGROUP(Y9, Q8OFS+96)

// func dotQ6_KAsm(w, x *byte, nb int) float32
// Weight super-blocks of 210 bytes (ql[128], qh[64], int8 scales[16], f16 d), Q8_K
// activations. Quants are used unsigned (0..63); the -32 offset is removed through the group
// sums: sum_g sc_g * 32 * ysum_g.
TEXT ·dotQ6_KAsm(SB), NOSPLIT, $0-28
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ nb+16(FP), CX
	VXORPS       Y0, Y0, Y0
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
	MOVL         $0x30303030, AX
	VMOVD        AX, X12
	VPBROADCASTD X12, Y12
	MOVL         $0x02020202, AX
	VMOVD        AX, X11
	VPBROADCASTD X11, X11
	MOVQ         $0x0101010101010101, AX
	VMOVQ        AX, X13
	VPSLLDQ      $8, X13, X13        // bytes 0 x8, 1 x8: selects scales 0 and 1

q6kloop:
	MOVWLZX      208(SI), AX
	VMOVD        AX, X1
	VCVTPH2PS    X1, X1
	VMULSS       0(DI), X1, X1
	VBROADCASTSS X1, Y1              // d*dx

	VMOVDQU   192(SI), X2            // int8 scales
	VPMOVSXBW X2, Y3
	VPMADDWD  260(DI), Y3, Y3        // sc_g * ysum_g, pairwise
	VPSLLD    $5, Y3, Y3             // *32

	VMOVDQA X13, X10
	VPXOR   Y15, Y15, Y15
	Q6KQUAD(0, 128, 4)
	Q6KQUAD(64, 160, 132)
	VPSUBD      Y3, Y15, Y15
	VCVTDQ2PS   Y15, Y15
	VFMADD231PS Y15, Y1, Y0

	ADDQ $210, SI
	ADDQ $292, DI
	DECQ CX
	JNZ  q6kloop

	HSUM8(Y0, X0, X1)
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func f32ToF16Asm(dst *byte, src *float32, n int)
// n: a positive multiple of 8. VCVTPS2PH with immediate 0 rounds to nearest even whatever
// MXCSR says, and quiets NaNs keeping the top payload bits, as F32ToF16 does.
TEXT ·f32ToF16Asm(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX

cvtloop:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU   X1, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       cvtloop
	VZEROUPPER
	RET

// SCALE4(wofs, xofs): the scales dw·dx of the weight block at SI+wofs and the activation blocks
// at xofs of the four activation rows (DI, R8, R9, R10), formed in one multiply, to sc.
#define SCALE4(WOFS, XOFS) \
	MOVWLZX      XOFS(DI), AX          \
	VMOVD        AX, X8                \
	VPINSRW      $1, XOFS(R8), X8, X8  \
	VPINSRW      $2, XOFS(R9), X8, X8  \
	VPINSRW      $3, XOFS(R10), X8, X8 \
	VCVTPH2PS    X8, X8                \
	MOVWLZX      WOFS(SI), AX          \
	VMOVD        AX, X9                \
	VCVTPH2PS    X9, X9                \
	VBROADCASTSS X9, X9                \
	VMULPS       X8, X9, X8            \
	VMOVUPS      X8, sc-16(SP)

// XROW(xofs, XP, SC, A): with the block's signed quants in Y10 and their magnitudes in Y11,
// adds to A the scale at SC(SP) times the block sum against the activations at XP+xofs, as
// I8DOT and dotQ8_0Asm compute it.
#define XROW(XOFS, XP, SC, A) \
	VMOVDQU      XOFS+2(XP), Y12 \
	VPSIGNB      Y10, Y12, Y12   \
	VPMADDUBSW   Y12, Y11, Y12   \
	VPMADDWD     Y15, Y12, Y12   \
	VCVTDQ2PS    Y12, Y12        \
	VBROADCASTSS SC(SP), Y9      \
	VFMADD231PS  Y12, Y9, A

// Q84BLK(ofs, A0, A1, A2, A3): one Q8_0 weight block at SI+ofs against the blocks at the same
// offset of four activation rows (DI, R8, R9, R10), each row's scaled block sum added to its
// accumulator with the operations dotQ8_0Asm uses, so that every row's result is the one
// dotQ8_0Asm gives it.
#define Q84BLK(OFS, A0, A1, A2, A3) \
	SCALE4(OFS, OFS)              \
	VMOVDQU OFS+2(SI), Y10        \
	VPABSB  Y10, Y11              \
	XROW(OFS, DI, sc-16, A0)      \
	XROW(OFS, R8, sc-12, A1)      \
	XROW(OFS, R9, sc-8, A2)       \
	XROW(OFS, R10, sc-4, A3)

// func dot4Q8_0Asm(w *byte, wRow, rows int, x *byte, xs, nb int, dst *float32, ds int)
// For each of rows weight rows (wRow bytes apart from w) and each of four activation rows (xs
// bytes apart from x): dst[i·ds + r·4 bytes] = dotQ8_0Asm(w + r·wRow, x + i·xs, nb), with two
// accumulators a row (even and odd blocks) as dotQ8_0Asm has. nb > 0.
TEXT ·dot4Q8_0Asm(SB), NOSPLIT, $16-64
	DOT4START

q84row:
	TESTQ  R12, R12
	JZ     q84end
	DOT4ROW

q84pair:
	CMPQ CX, $2
	JB   q84one
	Q84BLK(0, Y0, Y2, Y4, Y6)
	Q84BLK(34, Y1, Y3, Y5, Y7)
	ADDQ $68, SI
	ADDQ $68, DI
	ADDQ $68, R8
	ADDQ $68, R9
	ADDQ $68, R10
	SUBQ $2, CX
	JMP  q84pair

q84one:
	TESTQ CX, CX
	JZ    q84sum
	Q84BLK(0, Y0, Y2, Y4, Y6)

q84sum:
	DOT4STORE
	JMP    q84row

q84end:
	VZEROUPPER
	RET

// Q44BLK(wofs, xofs, A0, A1, A2, A3): Q84BLK for a Q4_0 weight block at SI+wofs (f16 d, 16
// nibble bytes) against Q8_0 activation blocks at xofs, with the operations dotQ4_0Asm uses.
// Y14: bytes 0x0f, Y13: bytes 8.
#define Q44BLK(WOFS, XOFS, A0, A1, A2, A3) \
	SCALE4(WOFS, XOFS)                 \
	Q4NIB(WOFS+2, Y10, X10, X8, Y8)    \
	VPABSB Y10, Y11                    \
	XROW(XOFS, DI, sc-16, A0)          \
	XROW(XOFS, R8, sc-12, A1)          \
	XROW(XOFS, R9, sc-8, A2)           \
	XROW(XOFS, R10, sc-4, A3)

// func dot4Q4_0Asm(w *byte, wRow, rows int, x *byte, xs, nb int, dst *float32, ds int)
// dot4Q8_0Asm for Q4_0 weights: dst[i·ds + r·4 bytes] = dotQ4_0Asm(w + r·wRow, x + i·xs, nb).
TEXT ·dot4Q4_0Asm(SB), NOSPLIT, $16-64
	DOT4START
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
	MOVL         $0x08080808, AX
	VMOVD        AX, X13
	VPBROADCASTD X13, Y13

q44row:
	TESTQ  R12, R12
	JZ     q44end
	DOT4ROW

q44pair:
	CMPQ CX, $2
	JB   q44one
	Q44BLK(0, 0, Y0, Y2, Y4, Y6)
	Q44BLK(18, 34, Y1, Y3, Y5, Y7)
	ADDQ $36, SI
	ADDQ $68, DI
	ADDQ $68, R8
	ADDQ $68, R9
	ADDQ $68, R10
	SUBQ $2, CX
	JMP  q44pair

q44one:
	TESTQ CX, CX
	JZ    q44sum
	Q44BLK(0, 0, Y0, Y2, Y4, Y6)

q44sum:
	DOT4STORE
	JMP    q44row

q44end:
	VZEROUPPER
	RET
