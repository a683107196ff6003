//go:build linux && (amd64 || arm64)

package kvcuda

import (
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// TestMemcpy2DLayout: the struct matches CUDA_MEMCPY2D's 64-bit layout
// (cuda.h: 128 bytes, widthInBytes at 112).
func TestMemcpy2DLayout(t *testing.T) {
	var m memcpy2D
	if s, w, h, dp := unsafe.Sizeof(m), unsafe.Offsetof(m.widthInBytes), unsafe.Offsetof(m.height), unsafe.Offsetof(m.dstPitch); s != 128 || w != 112 || h != 120 || dp != 104 {
		t.Fatalf("CUDA_MEMCPY2D layout: size %d, widthInBytes at %d, height at %d, dstPitch at %d", s, w, h, dp)
	}
	if o := unsafe.Offsetof(m.srcHost); o != 24 {
		t.Fatalf("srcHost at %d, want 24", o)
	}
	if o := unsafe.Offsetof(m.dstMemoryType); o != 72 {
		t.Fatalf("dstMemoryType at %d, want 72", o)
	}
}

// TestBindingSignatures: purego accepts every driver signature (it
// checks them when registering, so a bad one would otherwise fail only
// on a GPU machine). The functions are registered against an unrelated
// libc symbol and never called.
func TestBindingSignatures(t *testing.T) {
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW)
	if err != nil {
		t.Fatalf("libc.so.6: %v", err)
	}
	addr, err := purego.Dlsym(libc, "abs")
	if err != nil {
		t.Fatal(err)
	}
	c := &cuda{}
	if err := c.bind(func(string) (uintptr, error) { return addr, nil }); err != nil {
		t.Fatal(err)
	}
	if c.cuIpcOpenMemHandle == nil || c.cuMemcpy2DAsync == nil || c.cuCtxSynchronize == nil {
		t.Fatal("functions left unbound")
	}
}
