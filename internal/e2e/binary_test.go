package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func runBin(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(lmcacheBin(t), args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), stdout.String(), stderr.String()
	case err != nil:
		t.Fatal(err)
	}
	return 0, stdout.String(), stderr.String()
}

// TestServerStartsOnEmbeddedDefaults starts `lmcache server` with no flags:
// L1 only, HTTP on 127.0.0.1:8080, and a clean stop on SIGTERM.
func TestServerStartsOnEmbeddedDefaults(t *testing.T) {
	start(t, "server-defaults", nil, "server")
	const base = "http://127.0.0.1:8080"
	waitFor(t, "healthcheck", healthy(base+"/healthcheck"))
	resp, err := http.Get(base + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != `{"status":"healthy"}` {
		t.Fatalf("GET /healthcheck = %d %s", resp.StatusCode, body)
	}
	var adapters struct {
		Adapters []any `json:"adapters"`
	}
	if code, _ := call(t, "GET", base+"/config/adapters", nil, nil, &adapters); code != 200 || len(adapters.Adapters) != 0 {
		t.Fatalf("GET /config/adapters = %d %+v, want no L2", code, adapters)
	}
	// L1 is 1 GiB of DRAM, from the embedded default, and there is no L2.
	var status struct {
		StorageManager struct {
			L1 struct {
				Total      int64            `json:"memory_total_bytes"`
				Configured int64            `json:"memory_configured_bytes"`
				ByBackend  map[string]int64 `json:"capacity_bytes_by_backend"`
			} `json:"l1_manager"`
			NumL2 *int  `json:"num_l2_adapters"`
			L2    []any `json:"l2_adapters"`
		} `json:"storage_manager"`
	}
	if code, _ := call(t, "GET", base+"/status", nil, nil, &status); code != 200 {
		t.Fatalf("GET /status = %d", code)
	}
	sm := status.StorageManager
	if sm.L1.Total != 1<<30 || sm.L1.Configured != 1<<30 || len(sm.L1.ByBackend) != 1 || sm.L1.ByBackend["dram"] != 1<<30 ||
		sm.NumL2 == nil || *sm.NumL2 != 0 || sm.L2 == nil || len(sm.L2) != 0 {
		t.Fatalf("GET /status storage_manager = %+v, want L1 1073741824 bytes of dram and no L2 adapters", sm)
	}
	var cfg struct {
		Sources struct {
			SM map[string]string `json:"storage_manager"`
		} `json:"_sources"`
		SM struct {
			L1SizeGB *float64 `json:"l1_size_gb"`
		} `json:"storage_manager"`
	}
	if code, _ := call(t, "GET", base+"/config", nil, nil, &cfg); code != 200 || cfg.SM.L1SizeGB == nil || *cfg.SM.L1SizeGB != 1 ||
		cfg.Sources.SM["l1_size_gb"] != "default" || cfg.Sources.SM["l2_adapter"] != "default" {
		t.Fatalf("GET /config = %d, l1_size_gb %v from %q, l2_adapter from %q; want 1 GiB and both defaults",
			code, cfg.SM.L1SizeGB, cfg.Sources.SM["l1_size_gb"], cfg.Sources.SM["l2_adapter"])
	}
}

// TestBadFlagsExitTwoWithOneLine checks the CLI contract for both
// subcommands: status 2 and one line naming the flag or variable.
func TestBadFlagsExitTwoWithOneLine(t *testing.T) {
	cases := []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"server", "--eviction-ratio", "2"}, "--eviction-ratio"},
		{nil, []string{"server", "--l2-adapter", `{"type":"nope"}`}, "nope"},
		{nil, []string{"server", "--register-model", `{"model_name":"m"}`}, "--register-model"},
		{[]string{"LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL=-1"}, []string{"server"}, "LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL"},
		{nil, []string{"coordinator", "--eviction-ratio", "2"}, "--eviction-ratio"},
		{[]string{"LMCACHE_MP_COORDINATOR_EVICTION_RATIO=2"}, []string{"coordinator"}, "LMCACHE_MP_COORDINATOR_EVICTION_RATIO"},
		{nil, []string{"no-such-command"}, "unknown command"},
	}
	for _, c := range cases {
		code, _, stderr := runBin(t, c.env, c.args...)
		if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want 2 and one line naming %s", c.env, c.args, code, stderr, c.want)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	code, out, _ := runBin(t, nil, "server", "--help")
	if code != 0 || !strings.Contains(out, "--l1-size-gb") || !strings.Contains(out, "--coordinator-url") {
		t.Fatalf("server --help: exit %d\n%s", code, out)
	}
}

// TestVersionFromBuildVCS builds the binary both ways explicitly (the
// environment's GOFLAGS may say either): with VCS stamping `lmcache
// version` names the checkout's commit, without it (and without -ldflags
// -X) it reports upstream's NA-NA.
func TestVersionFromBuildVCS(t *testing.T) {
	dir := t.TempDir()
	head := func() string {
		out, err := exec.Command("git", "rev-parse", "HEAD").Output()
		if err != nil {
			t.Fatalf("git rev-parse HEAD: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	for _, vcs := range []bool{true, false} {
		bin := filepath.Join(dir, fmt.Sprintf("lmcache-vcs-%v", vcs))
		before := head()
		build := exec.Command("go", "build", fmt.Sprintf("-buildvcs=%v", vcs), "-o", bin, "github.com/lmcache-go/lmcache/cmd/lmcache")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build -buildvcs=%v: %v\n%s", vcs, err, out)
		}
		after := head() // a commit landing during the build may be either
		out, err := exec.Command(bin, "version").Output()
		if err != nil {
			t.Fatalf("version (buildvcs=%v): %v", vcs, err)
		}
		got := strings.TrimSpace(string(out))
		if vcs && !strings.HasSuffix(got, "-"+before) && !strings.HasSuffix(got, "-"+after) {
			t.Errorf("-buildvcs=true: version %q does not end with HEAD %s", got, after)
		}
		if !vcs && got != "NA-NA" {
			t.Errorf("-buildvcs=false: version %q, want NA-NA", got)
		}
	}
}
