package fs_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/logtest"
)

// TestRecoverCountsSkippedFiles: in a real directory, recover_on_start
// adopts the one object file, leaves our temp file and a subdirectory to
// their own handling, and counts the two regular files whose names are no
// object's (they stay on disk, outside usage): RecoverSkipped and /status
// say 2, and one warning names the count and the first such file.
func TestRecoverCountsSkippedFiles(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"Qwen-SEP-Qwen3-8B@0x01000100@0@9f2c00ff10e1.data": "from-python",
		"bogus-name.data":         "not ours",
		"notes.txt":               "not ours either",
		fs.TmpPrefix + "abcdef01": "torn write",
	}
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "subdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	logs := &logtest.Buffer{}
	a, err := fs.New(fs.Config{BasePath: dir, RecoverOnStart: true, PersistEnabled: true, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if keys, _ := a.Recovered(); len(keys) != 1 {
		t.Fatalf("recovered %d keys, want 1", len(keys))
	}
	if u := a.Usage(); u.TotalBytesUsed != int64(len("from-python")) {
		t.Fatalf("usage %d, want %d", u.TotalBytesUsed, len("from-python"))
	}
	if n := a.RecoverSkipped(); n != 2 {
		t.Errorf("RecoverSkipped = %d, want 2", n)
	}
	if n := a.Status()["recover_skipped_files"]; n != 2 {
		t.Errorf("status recover_skipped_files = %v, want 2", n)
	}
	out := logs.String()
	if n := strings.Count(out, "skipped files it cannot adopt"); n != 1 || !strings.Contains(out, "count=2") || !strings.Contains(out, "example=bogus-name.data") {
		t.Errorf("want one warning with count=2 and example=bogus-name.data:\n%s", out)
	}
	for _, n := range []string{"bogus-name.data", "notes.txt"} {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Errorf("skipped file %s: %v; want it left on disk", n, err)
		}
	}
}
