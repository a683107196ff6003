package kvwrap

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode: no input panics or hangs, and whatever decodes is a
// consistent wrapper (known dtype, bounded rank, a view inside its
// segment or storage, a safe segment name).
//
//	go test -run '^$' -fuzz FuzzDecode -fuzztime 60s ./internal/kvwrap/
func FuzzDecode(f *testing.F) {
	names, _ := filepath.Glob(filepath.Join("testdata", "*.pkl"))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		w, err := Decode(p)
		if err != nil {
			return
		}
		if w.ItemSize <= 0 || len(w.Shape) == 0 || len(w.Shape) > MaxRank || len(w.Shape) != len(w.Stride) {
			t.Fatalf("inconsistent wrapper %+v", w)
		}
		ext, err := w.Extent()
		if err != nil {
			t.Fatalf("decoded wrapper has no extent: %v", err)
		}
		if w.Kind == KindCUDAIPC && (ext > w.CUDA.StorageBytes || w.CUDA.StorageOffsetBytes < 0) {
			t.Fatalf("extent %d past CUDA storage %+v", ext, w.CUDA)
		}
		if w.Kind == KindRawCUDAIPC && ext > w.NBytes {
			t.Fatalf("extent %d past raw allocation %d", ext, w.NBytes)
		}
		if w.Kind == KindCPUShm {
			if ext > w.NBytes {
				t.Fatalf("extent %d past segment %d", ext, w.NBytes)
			}
			if _, err := ShmName(w.ShmName); err != nil {
				t.Fatalf("unsafe name %q decoded", w.ShmName)
			}
		}
	})
}
