package kvcopy

import "golang.org/x/sys/cpu"

// copyRuns is in copy_amd64.s.
//
//go:noescape
func copyRuns(d *streamRun, nd, ahead uintptr)

// haveStream: the kernel needs AVX2 (VMOVDQU/VMOVNTDQ on 32-byte
// registers); without it every run goes through copy().
var haveStream = cpu.X86.HasAVX2
