package coordinator_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// TestStaleTempFilesRemovedAtStart: the temporary files a crash between
// writing and renaming the checkpoint or the state file left are removed
// at the next start; other files in the directory, another state file's
// temporary file among them, are not. Before, every such crash left one (as
// large as the checkpoint) for good.
func TestStaleTempFilesRemovedAtStart(t *testing.T) {
	dir := t.TempDir()
	ckpt, state := filepath.Join(dir, "coord.ckpt"), filepath.Join(dir, "state.json")
	stale := []string{".coord.ckpt.tmp-123", ".coord.ckpt.tmp-456", ".state.json.tmp-789"}
	kept := []string{".other.json.tmp-1", "coord.ckpt.tmp-notours", "notes.txt"}
	for _, name := range append(slices.Clone(stale), kept...) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := startCoord(t, func(cfg *config.Config) {
		cfg.Ingest.CheckpointPath, cfg.Ingest.CheckpointInterval = ckpt, 0
		cfg.StateFile = state
	})
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	// state.json is written at start; the checkpoint only at stop.
	want := append(slices.Clone(kept), "state.json")
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("directory holds %v, want %v", names, want)
	}
	if !c.logs.Has(`msg="removed temporary files an interrupted write left" component=coordinator path=` + ckpt + " files=2") {
		t.Fatalf("no log line for the checkpoint's temporary files:\n%s", c.logs.String())
	}
}
