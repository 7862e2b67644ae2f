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

// Constants of the exponential in geluAVX2 (internal/vec's expSumAVX2 has the same), as float32 bits: log2(e); ln(2) in two parts; 1/7! .. 1/2!; 1; the
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

// The kernels of FullAttention's blocked path: two query rows against keys and values whose
// rows lie kstride (vstride) elements apart.

// func scores2F32AVX2(q0, q1, k *float32, kstride, nk, hd int, scale float32, s0, s1 *float32)
// s0[j] = scale·Σ_{d<hd} q0[d]·k[j·kstride+d] and s1[j] likewise with q1, for j < nk; nk a
// multiple of 4, hd a multiple of 8. Four keys at a time: eight sums in Y0..Y7.
TEXT ·scores2F32AVX2(SB), NOSPLIT, $0-72
	MOVQ         q0+0(FP), SI
	MOVQ         q1+8(FP), DX
	MOVQ         k+16(FP), R8
	MOVQ         kstride+24(FP), R9
	SHLQ         $2, R9
	MOVQ         nk+32(FP), CX
	MOVQ         hd+40(FP), BX
	VBROADCASTSS scale+48(FP), Y11
	MOVQ         s0+56(FP), DI
	MOVQ         s1+64(FP), R10
	XORQ         AX, AX

s32key:
	CMPQ   AX, CX
	JGE    s32done
	LEAQ   (R8)(R9*1), R12
	LEAQ   (R12)(R9*1), R13
	LEAQ   (R13)(R9*1), R14
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ   R11, R11

s32d:
	CMPQ        R11, BX
	JGE         s32sum
	VMOVUPS     (SI)(R11*4), Y8
	VMOVUPS     (DX)(R11*4), Y9
	VMOVUPS     (R8)(R11*4), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VMOVUPS     (R12)(R11*4), Y10
	VFMADD231PS Y10, Y8, Y1
	VFMADD231PS Y10, Y9, Y5
	VMOVUPS     (R13)(R11*4), Y10
	VFMADD231PS Y10, Y8, Y2
	VFMADD231PS Y10, Y9, Y6
	VMOVUPS     (R14)(R11*4), Y10
	VFMADD231PS Y10, Y8, Y3
	VFMADD231PS Y10, Y9, Y7
	ADDQ        $8, R11
	JMP         s32d

s32sum:
	VHADDPS      Y1, Y0, Y0
	VHADDPS      Y3, Y2, Y2
	VHADDPS      Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VMULPS       X11, X0, X0
	VMOVUPS      X0, (DI)(AX*4)
	VHADDPS      Y5, Y4, Y4
	VHADDPS      Y7, Y6, Y6
	VHADDPS      Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS       X5, X4, X4
	VMULPS       X11, X4, X4
	VMOVUPS      X4, (R10)(AX*4)
	LEAQ         (R14)(R9*1), R8
	ADDQ         $4, AX
	JMP          s32key

s32done:
	VZEROUPPER
	RET

// func scores2F16AVX2(q0, q1 *float32, k *uint16, kstride, nk, hd int, scale float32, s0, s1 *float32)
// scores2F32AVX2 for keys of F16 bits.
TEXT ·scores2F16AVX2(SB), NOSPLIT, $0-72
	MOVQ         q0+0(FP), SI
	MOVQ         q1+8(FP), DX
	MOVQ         k+16(FP), R8
	MOVQ         kstride+24(FP), R9
	SHLQ         $1, R9
	MOVQ         nk+32(FP), CX
	MOVQ         hd+40(FP), BX
	VBROADCASTSS scale+48(FP), Y11
	MOVQ         s0+56(FP), DI
	MOVQ         s1+64(FP), R10
	XORQ         AX, AX

s16key:
	CMPQ   AX, CX
	JGE    s16done
	LEAQ   (R8)(R9*1), R12
	LEAQ   (R12)(R9*1), R13
	LEAQ   (R13)(R9*1), R14
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ   R11, R11

s16d:
	CMPQ        R11, BX
	JGE         s16sum
	VMOVUPS     (SI)(R11*4), Y8
	VMOVUPS     (DX)(R11*4), Y9
	VCVTPH2PS   (R8)(R11*2), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VCVTPH2PS   (R12)(R11*2), Y10
	VFMADD231PS Y10, Y8, Y1
	VFMADD231PS Y10, Y9, Y5
	VCVTPH2PS   (R13)(R11*2), Y10
	VFMADD231PS Y10, Y8, Y2
	VFMADD231PS Y10, Y9, Y6
	VCVTPH2PS   (R14)(R11*2), Y10
	VFMADD231PS Y10, Y8, Y3
	VFMADD231PS Y10, Y9, Y7
	ADDQ        $8, R11
	JMP         s16d

s16sum:
	VHADDPS      Y1, Y0, Y0
	VHADDPS      Y3, Y2, Y2
	VHADDPS      Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VMULPS       X11, X0, X0
	VMOVUPS      X0, (DI)(AX*4)
	VHADDPS      Y5, Y4, Y4
	VHADDPS      Y7, Y6, Y6
	VHADDPS      Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS       X5, X4, X4
	VMULPS       X11, X4, X4
	VMOVUPS      X4, (R10)(AX*4)
	LEAQ         (R14)(R9*1), R8
	ADDQ         $4, AX
	JMP          s16key

s16done:
	VZEROUPPER
	RET

// func pv2F32AVX2(o0, o1, p0, p1, v *float32, vstride, nk int)
// o0[d] += Σ_{j<nk} p0[j]·v[j·vstride+d] and o1[d] likewise with p1, for d < 32: the 32
// elements of each output in Y0..Y3 and Y4..Y7 across all nk values.
TEXT ·pv2F32AVX2(SB), NOSPLIT, $0-56
	MOVQ    o0+0(FP), DI
	MOVQ    o1+8(FP), DX
	MOVQ    p0+16(FP), SI
	MOVQ    p1+24(FP), R8
	MOVQ    v+32(FP), R9
	MOVQ    vstride+40(FP), R10
	SHLQ    $2, R10
	MOVQ    nk+48(FP), CX
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VMOVUPS 0(DX), Y4
	VMOVUPS 32(DX), Y5
	VMOVUPS 64(DX), Y6
	VMOVUPS 96(DX), Y7
	XORQ    AX, AX

p32loop:
	CMPQ         AX, CX
	JGE          p32done
	VBROADCASTSS (SI)(AX*4), Y8
	VBROADCASTSS (R8)(AX*4), Y9
	VMOVUPS      0(R9), Y10
	VFMADD231PS  Y10, Y8, Y0
	VFMADD231PS  Y10, Y9, Y4
	VMOVUPS      32(R9), Y11
	VFMADD231PS  Y11, Y8, Y1
	VFMADD231PS  Y11, Y9, Y5
	VMOVUPS      64(R9), Y12
	VFMADD231PS  Y12, Y8, Y2
	VFMADD231PS  Y12, Y9, Y6
	VMOVUPS      96(R9), Y13
	VFMADD231PS  Y13, Y8, Y3
	VFMADD231PS  Y13, Y9, Y7
	ADDQ         R10, R9
	INCQ         AX
	JMP          p32loop

p32done:
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y4, 0(DX)
	VMOVUPS Y5, 32(DX)
	VMOVUPS Y6, 64(DX)
	VMOVUPS Y7, 96(DX)
	VZEROUPPER
	RET

// func pv2F16AVX2(o0, o1, p0, p1 *float32, v *uint16, vstride, nk int)
// pv2F32AVX2 for values of F16 bits.
TEXT ·pv2F16AVX2(SB), NOSPLIT, $0-56
	MOVQ    o0+0(FP), DI
	MOVQ    o1+8(FP), DX
	MOVQ    p0+16(FP), SI
	MOVQ    p1+24(FP), R8
	MOVQ    v+32(FP), R9
	MOVQ    vstride+40(FP), R10
	SHLQ    $1, R10
	MOVQ    nk+48(FP), CX
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VMOVUPS 0(DX), Y4
	VMOVUPS 32(DX), Y5
	VMOVUPS 64(DX), Y6
	VMOVUPS 96(DX), Y7
	XORQ    AX, AX

p16loop:
	CMPQ         AX, CX
	JGE          p16done
	VBROADCASTSS (SI)(AX*4), Y8
	VBROADCASTSS (R8)(AX*4), Y9
	VCVTPH2PS    0(R9), Y10
	VFMADD231PS  Y10, Y8, Y0
	VFMADD231PS  Y10, Y9, Y4
	VCVTPH2PS    16(R9), Y11
	VFMADD231PS  Y11, Y8, Y1
	VFMADD231PS  Y11, Y9, Y5
	VCVTPH2PS    32(R9), Y12
	VFMADD231PS  Y12, Y8, Y2
	VFMADD231PS  Y12, Y9, Y6
	VCVTPH2PS    48(R9), Y13
	VFMADD231PS  Y13, Y8, Y3
	VFMADD231PS  Y13, Y9, Y7
	ADDQ         R10, R9
	INCQ         AX
	JMP          p16loop

p16done:
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y4, 0(DX)
	VMOVUPS Y5, 32(DX)
	VMOVUPS Y6, 64(DX)
	VMOVUPS Y7, 96(DX)
	VZEROUPPER
	RET

// Constants of geluAVX2, as float32 bits: the cubic coefficient 0.044715, -2·sqrt(2/π), the
// argument above which exp is taken as +Inf (88, below where 2^k leaves float32's exponents)
// and +Inf.
DATA geluc<>+0(SB)/4, $0x3d372713
DATA geluc<>+4(SB)/4, $0xbfcc422a
DATA geluc<>+8(SB)/4, $0x42b00000
DATA geluc<>+12(SB)/4, $0x7f800000
GLOBL geluc<>(SB), RODATA|NOPTR, $16

// func geluAVX2(y, x *float32, n int)
// y[i] = x/(1 + exp(z)), z = -2·sqrt(2/π)·(x + 0.044715·x³), x = x[i], for i < n, n a multiple
// of 8: the tanh form of GELU. exp as in expSumAVX2, 0 below its threshold and +Inf above 88.
TEXT ·geluAVX2(SB), NOSPLIT, $0-24
	MOVQ         y+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS expc<>+0(SB), Y14
	VBROADCASTSS expc<>+4(SB), Y13
	VBROADCASTSS expc<>+8(SB), Y12
	VBROADCASTSS expc<>+40(SB), Y11
	VBROADCASTSS expc<>+36(SB), Y10
	VPBROADCASTD expc<>+44(SB), Y9
	VBROADCASTSS geluc<>+8(SB), Y6
	VBROADCASTSS geluc<>+12(SB), Y8
	XORQ         AX, AX

geluloop:
	CMPQ         AX, CX
	JGE          geludone
	VMOVUPS      (SI)(AX*4), Y0
	VBROADCASTSS geluc<>+0(SB), Y1
	VMULPS       Y1, Y0, Y1
	VFMADD213PS  Y10, Y0, Y1      // 1 + 0.044715·x²
	VBROADCASTSS geluc<>+4(SB), Y2
	VMULPS       Y2, Y0, Y2
	VMULPS       Y1, Y2, Y2       // z
	VCMPPS       $1, Y11, Y2, Y5  // z below the threshold: exp is 0
	VCMPPS       $1, Y2, Y6, Y4   // z above 88: exp is +Inf
	VMULPS       Y14, Y2, Y1
	VROUNDPS     $0, Y1, Y1       // k
	VFNMADD231PS Y13, Y1, Y2
	VFNMADD231PS Y12, Y1, Y2      // r = z - k·ln2
	VBROADCASTSS expc<>+12(SB), Y3
	VBROADCASTSS expc<>+16(SB), Y7
	VFMADD213PS  Y7, Y2, Y3
	VBROADCASTSS expc<>+20(SB), Y7
	VFMADD213PS  Y7, Y2, Y3
	VBROADCASTSS expc<>+24(SB), Y7
	VFMADD213PS  Y7, Y2, Y3
	VBROADCASTSS expc<>+28(SB), Y7
	VFMADD213PS  Y7, Y2, Y3
	VBROADCASTSS expc<>+32(SB), Y7
	VFMADD213PS  Y7, Y2, Y3
	VFMADD213PS  Y10, Y2, Y3
	VFMADD213PS  Y10, Y2, Y3      // e^r
	VCVTPS2DQ    Y1, Y1
	VPADDD       Y9, Y1, Y1
	VPSLLD       $23, Y1, Y1      // 2^k
	VMULPS       Y1, Y3, Y3
	VANDNPS      Y3, Y5, Y3
	VBLENDVPS    Y4, Y8, Y3, Y3
	VADDPS       Y10, Y3, Y3
	VDIVPS       Y3, Y0, Y0
	VMOVUPS      Y0, (DI)(AX*4)
	ADDQ         $8, AX
	JMP          geluloop

geludone:
	VZEROUPPER
	RET
