//go:build !amd64

package kvcopy

import "unsafe"

// haveStream: only amd64 has the streaming kernel; elsewhere every run
// goes through copy().
const haveStream = false

func copyStream(dst, src unsafe.Pointer, n, count, dstStep, srcStep uintptr) {
	panic("kvcopy: no streaming copy on this architecture")
}
