package coordinator_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestIntentWriteFailureAnswers500AndChangesNothing: with --state-file, a
// quota or default-limit change whose state-file write fails (here the
// path became a non-empty directory, so the rename over it fails even for
// root) is answered 500 and undone: the quota and the default limit stay
// as they were, in memory and on disk.
func TestIntentWriteFailureAnswers500AndChangesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	c := startCoord(t, func(cfg *config.Config) { cfg.StateFile = path })
	c.must("PUT", "/quota/a", map[string]any{"limit_gb": 1.0}, 200)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, req := range []struct {
		method, path string
		body         any
	}{
		{"PUT", "/quota/a", map[string]any{"limit_gb": 2.0}},
		{"DELETE", "/quota/a", nil},
		{"PUT", "/quota/config", map[string]any{"default_limit_gb": 3.0}},
	} {
		if code, raw := c.do(req.method, req.path, req.body); code != 500 {
			t.Errorf("%s %s with an unwritable state file: %d %s, want 500", req.method, req.path, code, raw)
		}
	}
	q := c.must("GET", "/quota/a", nil, 200)
	if q["quota_limit_gb"] != 1.0 || q["quota_exists"] != true {
		t.Errorf("quota after the failed writes: %v, want limit 1 still set", q)
	}
	if d := c.must("GET", "/quota/config", nil, 200); d["default_limit_gb"] != nil {
		t.Errorf("default limit after the failed write: %v, want null", d)
	}
	if !c.logs.Has("writing state file failed; change undone") {
		t.Errorf("no log line about the undone change:\n%s", c.logs.String())
	}
}
