package mpmetrics

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoEngineDependency keeps the metrics package (and so the coordinator
// client, which links it) free of the storage engine: the engine's counter
// snapshot lives in package stats.
func TestNoEngineDependency(t *testing.T) {
	for _, pkg := range []string{"github.com/lmcache-go/lmcache/internal/mpmetrics", "github.com/lmcache-go/lmcache/internal/coordclient"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		if !strings.Contains(string(out), "internal/mpmetrics/stats\n") {
			t.Fatalf("go list -deps %s does not list internal/mpmetrics/stats:\n%s", pkg, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/lmcache-go/lmcache/internal/engine") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}
