package deploy

import (
	"bytes"
	"context"
	"fmt"
	"io"
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

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"
)

// TestMain removes the built binary after the run and checks for leaked
// goroutines.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// repoRoot is the module root; go test runs in deploy/.
const repoRoot = ".."

var (
	buildOnce sync.Once
	binPath   string
	binRev    string
	buildErr  error
)

// headRev is `git rev-parse HEAD` of the checkout.
func headRev() (string, error) {
	out, err := exec.Command("git", "-C", repoRoot, "rev-parse", "HEAD").Output()
	if err != nil {
		return "", fmt.Errorf("git rev-parse HEAD: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// lmcacheBin builds cmd/lmcache once, unstamped (no -ldflags), with VCS
// stamping on whatever GOFLAGS says, and returns it with the HEAD revision
// it was built at. Others commit to the shared tree while this runs, so a
// build is retried until HEAD did not move during it.
func lmcacheBin(t *testing.T) (string, string) {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lmcache-deploy-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "lmcache")
		for range 5 {
			before, err := headRev()
			if err != nil {
				buildErr = err
				return
			}
			cmd := exec.Command("go", "build", "-buildvcs=true", "-o", binPath, "github.com/lmcache-go/lmcache/cmd/lmcache")
			cmd.Dir = repoRoot
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build: %w\n%s", err, out)
				return
			}
			after, err := headRev()
			if err != nil {
				buildErr = err
				return
			}
			if before == after {
				binRev = after
				return
			}
		}
		buildErr = fmt.Errorf("HEAD moved during each of 5 builds")
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath, binRev
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

// proc is one running lmcache process. exec's Cancel/WaitDelay do the
// clean stop: SIGTERM at cleanup, SIGKILL (and a failure) 30s later.
type proc struct {
	log  string // stdout and stderr
	done chan struct{}
	err  error // read after done is closed
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startEnv(t, name, nil, args...)
}

// startEnv is start with extra environment variables.
func startEnv(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	bin, _ := lmcacheBin(t)
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		stop()
		f.Close()
		t.Fatal(err)
	}
	p := &proc{log: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		stop()
		<-p.done
		// Wait reports the cancellation itself; the exit status says
		// whether the stop was clean.
		if !cmd.ProcessState.Success() {
			t.Errorf("%s: %v, %v (want a clean exit on SIGTERM)", name, p.err, cmd.ProcessState)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- %s log ---\n%s", name, b)
		}
	})
	return p
}

// waitOK polls url until it answers 200, failing after a minute or when
// the process exits.
func waitOK(t *testing.T, p *proc, url string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-p.done:
			t.Fatalf("process exited (%v) before %s answered 200", p.err, url)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer 200 within a minute (last error %v)", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// metricNames are the metric family names a /metrics page exposes, parsed
// with Prometheus' own text-format parser.
func metricNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	code, body := get(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d", url, code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	out := map[string]bool{}
	for n := range fams {
		out[n] = true
	}
	return out
}

// runBin runs the binary to completion with a deadline.
func runBin(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	bin, _ := lmcacheBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// fleet is a real coordinator and a real server registered with it, both
// started from the Kubernetes manifests' arguments with loopback addresses
// and free ports substituted.
type fleet struct {
	serverHTTP, serverZMQ, coordHTTP string
	shmName                          string
}

var itoa = strconv.Itoa
