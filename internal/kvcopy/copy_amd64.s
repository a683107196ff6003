#include "textflag.h"

// func copyRuns(d *streamRun, nd, ahead uintptr)
//
// Copies the rows of nd run descriptors {dst, src, n, count, dstStep,
// srcStep} (n a multiple of 32, dst 32-byte aligned, count ≥ 1: the Go
// caller checks) with AVX2 unaligned loads and non-temporal stores (no
// read-for-ownership of destination lines the copy overwrites whole).
// A second cursor walks the same rows ahead rows in front of the copy,
// across descriptor boundaries, and prefetches each row's first 256
// bytes: strided rows (HND's 256-byte head rows) defeat the hardware
// prefetcher, and a cursor confined to one run would leave every run's
// first rows unprefetched. Rows longer than 128 bytes also prefetch
// 1 KiB ahead within the row. SFENCE before returning orders the stores
// before whatever the caller does next (the commit that publishes the
// object).
TEXT ·copyRuns(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), R12
	MOVQ nd+8(FP), R13
	MOVQ ahead+16(FP), BX
	TESTQ R13, R13
	JZ rdone
	IMULQ $48, R13
	ADDQ R12, R13
	// Prefetch cursor: R14 descriptor, AX row address, R9 rows left;
	// ahead 0 parks it at the end (no software prefetch at all).
	MOVQ R13, R14
	TESTQ BX, BX
	JZ rdesc
	MOVQ R12, R14
	MOVQ 8(R14), AX
	MOVQ 24(R14), R9
rdesc:
	CMPQ R12, R13
	JAE rdone
	MOVQ 0(R12), DI
	MOVQ 8(R12), SI
	MOVQ 24(R12), CX
	TESTQ CX, CX
	JZ rnextdesc
rrow:
	// One cursor step: prefetch its row and move it on. Before the first
	// row it steps ahead+1 times (BX counts the extra ones down), so row
	// r is copied after row r+ahead was prefetched.
	CMPQ R14, R13
	JAE prdone
	PREFETCHT0 0(AX)
	PREFETCHT0 64(AX)
	PREFETCHT0 128(AX)
	PREFETCHT0 192(AX)
	ADDQ 40(R14), AX
	DECQ R9
	JNZ prdone
prnext:
	ADDQ $48, R14
	CMPQ R14, R13
	JAE prdone
	MOVQ 8(R14), AX
	MOVQ 24(R14), R9
	TESTQ R9, R9
	JZ prnext
prdone:
	TESTQ BX, BX
	JZ rcopy
	DECQ BX
	JMP rrow
rcopy:
	MOVQ DI, R10
	MOVQ SI, R11
	MOVQ 16(R12), DX
rnt128:
	CMPQ DX, $128
	JB rnt32
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
	JMP rnt128
rnt32:
	TESTQ DX, DX
	JZ rrownext
	VMOVDQU 0(R11), Y0
	VMOVNTDQ Y0, 0(R10)
	ADDQ $32, R10
	ADDQ $32, R11
	SUBQ $32, DX
	JMP rnt32
rrownext:
	ADDQ 32(R12), DI
	ADDQ 40(R12), SI
	DECQ CX
	JNZ rrow
rnextdesc:
	ADDQ $48, R12
	JMP rdesc
rdone:
	SFENCE
	VZEROUPPER
	RET
