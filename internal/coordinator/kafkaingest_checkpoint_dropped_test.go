package coordinator_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestFinalCheckpointFailureCounted: a coordinator whose --checkpoint-path
// directory was removed while it ran cannot write its checkpoint at a
// clean stop. That failure is counted in the same counter the periodic
// checkpoint's failures go to (checkpoint_save_failures_total 1, saves 0,
// read in-process after Run returned) and logged at ERROR; no artifact
// appears. The directory is removed rather than made read-only so the
// write fails even for root.
func TestFinalCheckpointFailureCounted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "coord.ckpt")
	c := startCoord(t, func(cfg *config.Config) { cfg.Ingest.CheckpointPath = path; cfg.Ingest.CheckpointInterval = 0 })
	h := strings.Repeat("0", 62) + "10"
	wantReply(t, c.postEvents(cacheBatch("mp-a", 1, 1, "store", "l2", "fs", "a", h, 100)), 1, 0, 0)
	metric(t, c, "lmcache_coordinator_checkpoint_save_failures_total 0")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	c.stop()
	if err := c.wait(); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	c.srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, line := range []string{"lmcache_coordinator_checkpoint_save_failures_total 1\n", "lmcache_coordinator_checkpoint_saves_total 0\n"} {
		if !strings.Contains(body, line) {
			t.Errorf("metrics after stop lack %q:\n%s", line, body)
		}
	}
	if !c.logs.Has(`level=ERROR msg="final checkpoint failed`) {
		t.Errorf("no ERROR line about the final checkpoint:\n%s", c.logs.String())
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("checkpoint at %s after a failed final save (err %v)", path, err)
	}
}
