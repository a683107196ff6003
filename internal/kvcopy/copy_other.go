//go:build !amd64

package kvcopy

// haveStream: only amd64 has the streaming kernel; elsewhere every run
// goes through copy().
const haveStream = false

func copyRuns(d *streamRun, nd, ahead uintptr) {
	panic("kvcopy: no streaming copy on this architecture")
}
