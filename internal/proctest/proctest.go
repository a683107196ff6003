// Package proctest runs the real lmcache binary in tests: it builds
// cmd/lmcache once per test process, starts it as child processes with
// their output in a log file, stops them cleanly at cleanup (a process that
// does not exit 0 on SIGTERM fails the test) and removes the build when
// the tests are done. deploy/ and internal/e2e share it.
package proctest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// StopTimeout is how long a stopped process may take to exit before it is
// killed (and the test fails).
const StopTimeout = 30 * time.Second

var (
	buildOnce sync.Once
	binPath   string
	binRev    string
	buildErr  error
)

// Main runs the package's tests, removes the built binary, and fails the
// run if goroutines leaked: call it from TestMain.
func Main(m *testing.M) {
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

// headRev is `git rev-parse HEAD` of the checkout the test runs in.
func headRev() (string, error) {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "", fmt.Errorf("git rev-parse HEAD: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Binary builds cmd/lmcache once, unstamped (no -ldflags) with VCS
// stamping on, and returns its path and the HEAD revision it was built at.
// Others may commit to a shared tree while it builds, so the build is
// retried until HEAD did not move during it.
func Binary(t testing.TB) (path, rev string) {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lmcache-proctest-")
		if err != nil {
			buildErr = fmt.Errorf("temp dir: %w", err)
			return
		}
		binPath = filepath.Join(dir, "lmcache")
		for range 5 {
			before, err := headRev()
			if err != nil {
				buildErr = err
				return
			}
			out, err := exec.Command("go", "build", "-buildvcs=true", "-o", binPath, "github.com/lmcache-go/lmcache/cmd/lmcache").CombinedOutput()
			if err != nil {
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
		buildErr = errors.New("HEAD moved during each of 5 builds")
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath, binRev
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// for a child process to bind. It picks at random below the kernel's
// ephemeral range: a port the kernel hands out (to a listener on port 0
// or to an outgoing connection's source) would be one that any of the
// test binaries running beside this one can take between the probe and
// the child's bind, while below the range only another FreePort can,
// one chance in thousands, and that one probes first. A port is handed
// out once per test process, so two picks in a row (a server's HTTP and
// ZMQ ports) never collide with each other.
func FreePort(t testing.TB) int {
	t.Helper()
	low, high := belowEphemeral()
	return freePortIn(t, low, high)
}

// freePortIn is FreePort's pick from [low, high): random tries, then the
// kernel's choice.
func freePortIn(t testing.TB, low, high int) int {
	t.Helper()
	for range 64 {
		port := low + rand.IntN(high-low)
		if _, loaded := handedOut.LoadOrStore(port, true); loaded {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // in use: pick another
		}
		ln.Close()
		return port
	}
	// Crowded or unusual port layout: the kernel's choice.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	handedOut.Store(port, true)
	return port
}

// handedOut holds every port FreePort returned or found taken in this
// process (a set of int; it only grows, by a few ports per test).
var handedOut sync.Map

// belowEphemeral is the range FreePort picks from: from 10000 up to the
// low end of /proc/sys/net/ipv4/ip_local_port_range (32768 by default on
// Linux), or 10000-30000 where that file is missing or leaves no room.
// The file is read once per test process.
var belowEphemeral = sync.OnceValues(func() (low, high int) {
	low, high = 10000, 30000
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return low, high
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo < low+1000 {
		return low, high
	}
	return low, lo
})

// Proc is one running lmcache process.
type Proc struct {
	// Name labels the process in failures and names its log file.
	Name string
	// Cmd is the running command (its Process for signals and the pid).
	Cmd *exec.Cmd
	// Log is the file holding the process's stdout and stderr.
	Log  string
	done chan struct{}
	err  error // read only after done is closed
}

// Start runs the binary with args and extra environment variables. At
// cleanup a process still running gets SIGTERM and must exit 0 within
// StopTimeout; one that already exited must have exited 0 (unless the
// test stopped it itself); on failure the log's tail is printed.
func Start(t testing.TB, name string, env []string, args ...string) *Proc {
	t.Helper()
	bin, _ := Binary(t)
	return StartBinary(t, bin, name, env, args...)
}

// StartBinary is Start for another copy of the binary, at bin.
func StartBinary(t testing.TB, bin, name string, env []string, args ...string) *Proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	p := &Proc{Name: name, Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
			if p.err != nil {
				t.Errorf("%s exited on its own: %v", name, p.err)
			}
		default:
			p.Stop(t)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- %s log ---\n%s", name, tail(b, 6000))
		}
	})
	return p
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's exit error; call it after Done is closed.
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// Stop sends SIGTERM and waits; see StopWith.
func (p *Proc) Stop(t testing.TB) { p.StopWith(t, syscall.SIGTERM) }

// StopWith sends sig and waits for the exit, which must be status 0; a
// process still running after StopTimeout is killed and fails the test.
// A process that already exited is left alone (and its exit is not
// checked again at cleanup).
func (p *Proc) StopWith(t testing.TB, sig syscall.Signal) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(sig)
	ctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
	defer cancel()
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("%s exited with %v after %v", p.Name, p.err, sig)
		}
	case <-ctx.Done():
		_ = p.Cmd.Process.Kill()
		<-p.done
		t.Errorf("%s did not stop within %v of %v", p.Name, StopTimeout, sig)
	}
	// Reported here: cleanup must not report the same exit again.
	p.err = nil
}

// Output is what the process has written to stdout and stderr so far.
func (p *Proc) Output(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
