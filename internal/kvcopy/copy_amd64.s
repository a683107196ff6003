#include "textflag.h"

// func copyStream(dst, src unsafe.Pointer, n, count, dstStep, srcStep uintptr)
//
// count rows of n bytes (n a multiple of 32, dst 32-byte aligned: the Go
// caller checks) from src+k·srcStep to dst+k·dstStep. AVX2 unaligned
// loads, non-temporal stores (no read-for-ownership of destination lines
// the copy overwrites whole), software prefetch of the source four rows
// ahead (strided rows defeat the hardware prefetcher) and 1 KiB ahead
// within a row; SFENCE before returning so the stores are ordered before
// whatever the caller does next (the commit that publishes the object).
TEXT ·copyStream(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), BX
	MOVQ count+24(FP), CX
	MOVQ dstStep+32(FP), R8
	MOVQ srcStep+40(FP), R9
	TESTQ CX, CX
	JZ done
row:
	MOVQ DI, R10
	MOVQ SI, R11
	MOVQ BX, DX
	LEAQ (SI)(R9*4), R12
	PREFETCHT0 0(R12)
	PREFETCHT0 64(R12)
	PREFETCHT0 128(R12)
	PREFETCHT0 192(R12)
loop128:
	CMPQ DX, $128
	JB loop32
	PREFETCHT0 1024(R11)
	PREFETCHT0 1088(R11)
	VMOVDQU 0(R11), Y0
	VMOVDQU 32(R11), Y1
	VMOVDQU 64(R11), Y2
	VMOVDQU 96(R11), Y3
	VMOVNTDQ Y0, 0(R10)
	VMOVNTDQ Y1, 32(R10)
	VMOVNTDQ Y2, 64(R10)
	VMOVNTDQ Y3, 96(R10)
	ADDQ $128, R10
	ADDQ $128, R11
	SUBQ $128, DX
	JMP loop128
loop32:
	TESTQ DX, DX
	JZ next
	VMOVDQU 0(R11), Y0
	VMOVNTDQ Y0, 0(R10)
	ADDQ $32, R10
	ADDQ $32, R11
	SUBQ $32, DX
	JMP loop32
next:
	ADDQ R8, DI
	ADDQ R9, SI
	DECQ CX
	JNZ row
done:
	SFENCE
	VZEROUPPER
	RET
