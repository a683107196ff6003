package coordinator_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// buildBinary builds cmd/lmcache (owned by the CLI, which dispatches
// `lmcache coordinator` to runCoordinator). A binary that does not build
// fails the test: CI must not pass on a skipped end-to-end check.
var (
	buildOnce sync.Once
	builtBin  string
	buildErr  string
)

func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lmcache-coordinator-test")
		if err != nil {
			buildErr = err.Error()
			return
		}
		bin := filepath.Join(dir, "lmcache")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/lmcache-go/lmcache/cmd/lmcache")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Sprintf("%v\n%s", err, out)
			return
		}
		builtBin = bin
	})
	if builtBin == "" {
		t.Fatalf("cmd/lmcache does not build: %s", buildErr)
	}
	return builtBin
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestBinaryEvictsThroughMPServer runs `lmcache coordinator` as a process
// against a recording MP server: registration, event ingest, a quota of 0
// and the eviction loop's DELETE /cache/objects, then a clean SIGTERM.
func TestBinaryEvictsThroughMPServer(t *testing.T) {
	bin := buildBinary(t)
	port := freePort(t)
	cmd := exec.Command(bin, "coordinator", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--eviction-check-interval", "0.05")
	cmd.Env = append(os.Environ(), "LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=False")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &coord{t: t, base: "http://127.0.0.1:" + strconv.Itoa(port), client: &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}}
	defer c.client.CloseIdleConnections()
	waitFor(t, "healthz", func() bool {
		resp, err := c.client.Get(c.base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	mp := newMP(t)
	mp.register(c, "mp-1")
	c.events(rev("store", "0a", "t", 100), rev("store", "0b", "t", 100))
	c.must("PUT", "/quota/t", map[string]any{"limit_gb": 0}, 200)
	waitFor(t, "eviction DELETE", func() bool { return len(mp.deleteBatches()) > 0 })
	if got := strings.Join(hexes(mp.deleteBatches()[0]), ","); got != "t/0a,t/0b" {
		t.Fatalf("victims %s", got)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit %v\n%s", err, stderr.String())
	}
}

// TestBinaryConfigErrorsHelpAndSignals runs the real `lmcache coordinator`
// process: invalid values exit 2 with one line, --help lists the flags,
// it serves /healthz and SIGINT/SIGTERM stop it with status 0.
func TestBinaryConfigErrorsHelpAndSignals(t *testing.T) {
	bin := buildBinary(t)
	run := func(env []string, args ...string) (int, string, string) {
		cmd := exec.Command(bin, append([]string{"coordinator"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stdout.String(), stderr.String()
	}
	code, _, stderr := run(nil, "--eviction-ratio", "2")
	if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "--eviction-ratio") {
		t.Fatalf("flag: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = run([]string{"LMCACHE_MP_COORDINATOR_EVICTION_RATIO=2"})
	if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "LMCACHE_MP_COORDINATOR_EVICTION_RATIO") {
		t.Fatalf("env: exit %d, stderr %q", code, stderr)
	}
	code, stdout, _ := run(nil, "--help")
	if code != 0 || !strings.Contains(stdout, "--timeout-keep-alive int") || !strings.Contains(stdout, "(default 0.2)") {
		t.Fatalf("help: exit %d\n%s", code, stdout)
	}

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		cmd := exec.Command(bin, "coordinator", "--host", "127.0.0.1", "--port", strconv.Itoa(port))
		cmd.Env = append(os.Environ(), "LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=False")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: &http.Transport{}, Timeout: time.Second}
		waitFor(t, "healthz", func() bool {
			resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/healthz")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var buf bytes.Buffer
			_, _ = buf.ReadFrom(resp.Body)
			return resp.StatusCode == 200 && buf.String() == `{"status":"healthy"}`
		})
		client.CloseIdleConnections()
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%v: exit %v\n%s", sig, err, stderr.String())
		}
		if !strings.Contains(stderr.String(), "MP coordinator listening on http://127.0.0.1:"+strconv.Itoa(port)) {
			t.Fatalf("startup log missing:\n%s", stderr.String())
		}
	}
}
