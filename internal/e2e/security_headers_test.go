package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// vmRSS reads a process's resident set in bytes from /proc/<pid>/status.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestSecurityHostileHeaders runs the real binary and opens 100
// connections that each try to send a 7 MB header that never ends (the
// issue's attack: 25 MB → 1.56 GB RSS before), plus 100 that send 100 KiB
// of header and then stall. The resident set must stay under 300 MB while
// they are open, probes must still answer, and after they close it must
// be back under 200 MB.
func TestSecurityHostileHeaders(t *testing.T) {
	const (
		flooders    = 100
		stallers    = 100
		floodBytes  = 7 << 20
		stallBytes  = 100 << 10
		peakBound   = 300 << 20
		settleBound = 200 << 20
	)
	httpPort := freePort(t)
	addr := "127.0.0.1:" + itoa(httpPort)
	srv := start(t, "server", nil, "server", "--http-port", itoa(httpPort), "--port", itoa(freePort(t)), "--l1-size-gb", "0.0625")
	waitFor(t, "healthcheck", healthy("http://"+addr+"/healthcheck"))
	pid := srv.Cmd.Process.Pid
	base := vmRSS(t, pid)
	t.Logf("RSS at start: %d MiB", base>>20)

	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	chunk := []byte(strings.Repeat("a", 64<<10))
	// Every write has a deadline: a server that neither reads a header
	// nor refuses it would otherwise hold a sender, and this test, forever.
	// A sender hitting it is a failure.
	const writeDeadline = 90 * time.Second
	closeAll := sync.OnceFunc(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	t.Cleanup(func() { closeAll(); wg.Wait() })
	// sent gets one value per sender once it has written everything it
	// meant to or the server refused it (a failed write): nil, or the
	// write deadline's error.
	sent := make(chan error, flooders+stallers)
	for i := range flooders + stallers {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SetWriteDeadline(time.Now().Add(writeDeadline)); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		limit := floodBytes
		if i >= flooders {
			limit = stallBytes
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var werr error
			defer func() { sent <- werr }()
			write := func(b []byte) bool {
				_, err := c.Write(b)
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					werr = fmt.Errorf("sender %d: a write blocked for %v: the server neither read nor refused its header", i, writeDeadline)
				}
				return err == nil
			}
			if !write([]byte("GET / HTTP/1.1\r\nHost: x\r\nX-Flood: ")) {
				return
			}
			for n := 0; n < limit; n += len(chunk) {
				// The server refuses the header past its limit and
				// closes; the write then fails, which ends this sender.
				if !write(chunk[:min(len(chunk), limit-n)]) {
					return
				}
			}
		}()
	}
	peak := base
	sample := func() {
		if r := vmRSS(t, pid); r > peak {
			peak = r
		}
	}
	// Sample while the senders run, until every one has sent all it
	// meant to or been refused; connections stay open afterwards. The
	// write deadlines end every sender within writeDeadline; the overall
	// deadline only guards against a sender that never reports.
	overall := time.NewTimer(writeDeadline + 30*time.Second)
	defer overall.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for n := 0; n < flooders+stallers; {
		select {
		case err := <-sent:
			n++
			if err != nil {
				t.Error(err)
			}
		case <-tick.C:
		case <-overall.C:
			t.Fatalf("%d of %d senders still writing after %v", flooders+stallers-n, flooders+stallers, writeDeadline+30*time.Second)
		}
		sample()
	}
	sample()
	if !healthy("http://" + addr + "/healthcheck")() {
		t.Error("healthcheck fails while hostile connections are open")
	}
	sample()
	t.Logf("peak RSS with %d hostile connections: %d MiB", flooders+stallers, peak>>20)
	if peak > peakBound {
		t.Errorf("peak RSS %d MiB, bound %d MiB", peak>>20, peakBound>>20)
	}
	closeAll()
	wg.Wait()
	var after int64
	waitFor(t, "RSS to settle", func() bool {
		after = vmRSS(t, pid)
		return after < settleBound
	})
	t.Logf("RSS after the connections closed: %d MiB", after>>20)
	if !healthy("http://" + addr + "/healthcheck")() {
		t.Fatal("healthcheck fails after the attack")
	}
}
