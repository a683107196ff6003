package kvcopy

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// copyStream is in copy_amd64.s.
//
//go:noescape
func copyStream(dst, src unsafe.Pointer, n, count, dstStep, srcStep uintptr)

// haveStream: the kernel needs AVX2 (VMOVDQU/VMOVNTDQ on 32-byte
// registers); without it every run goes through copy().
var haveStream = cpu.X86.HasAVX2
