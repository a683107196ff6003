package wire

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode feeds arbitrary frames to every request decoder: they must
// return an error or a value, never panic, and a decoded key re-encodes to
// a frame that decodes to the same key.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "golden", "*.msgpack"))
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = DecodeOpFrame(b)
		var p RegisterPayload
		if Unmarshal(b, &p) == nil {
			_, _ = p.Hybrid()
		}
		var k Key
		if Unmarshal(b, &k) != nil {
			return
		}
		_, _ = k.NullChunks()
		var back Key
		if err := Unmarshal(Marshal(&k), &back); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if back.ModelName != k.ModelName || len(back.TokenIDs) != len(k.TokenIDs) || back.WorkerID != k.WorkerID || back.End != k.End {
			t.Fatalf("round trip changed the key: %+v vs %+v", back, k)
		}
	})
}
