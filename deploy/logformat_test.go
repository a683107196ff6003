package deploy

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestCoordinatorUpstreamLogFormat runs the real coordinator with
// LMCACHE_LOG_FORMAT=upstream and checks every line has the shape of
// upstream's lmcache/logging.py, and that an unknown format is refused
// with status 2 and one line naming the variable.
func TestCoordinatorUpstreamLogFormat(t *testing.T) {
	port := itoa(freePort(t))
	p := startEnv(t, "coordinator-upstream-log", []string{"LMCACHE_LOG_FORMAT=upstream"}, "coordinator", "--host", "127.0.0.1", "--port", port)
	waitOK(t, p, "http://127.0.0.1:"+port+"/healthz")
	raw, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	shape := regexp.MustCompile(`^\x1b\[(1|32;20|33;20|31;20|31;1)m\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] LMCache (DEBUG|INFO|WARNING|ERROR|CRITICAL):\x1b\[0m .+ \x1b\[3m\([a-z_]+\.go:\d+:lmcache[a-z.]*\)\x1b\[0m$`)
	listening := regexp.MustCompile(`^\x1b\[32;20m\[[^]]+\] LMCache INFO:\x1b\[0m MP coordinator listening on http://127\.0\.0\.1:` + port + ` component=coordinator \x1b\[3m\(`)
	lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	saw := false
	for _, l := range lines {
		if !shape.MatchString(l) {
			t.Errorf("line %q does not have upstream's shape", l)
		}
		saw = saw || listening.MatchString(l)
	}
	if !saw {
		t.Errorf("no INFO line for the listening address in %q", lines)
	}

	bin, _ := lmcacheBin(t)
	cmd := exec.Command(bin, "coordinator", "--host", "127.0.0.1", "--port", itoa(freePort(t)))
	cmd.Env = append(os.Environ(), "LMCACHE_LOG_FORMAT=xml")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || strings.Count(string(out), "\n") != 1 || !strings.Contains(string(out), "LMCACHE_LOG_FORMAT") {
		t.Errorf("LMCACHE_LOG_FORMAT=xml: %v, output %q; want status 2 and one line naming the variable", err, out)
	}
}
