package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/creack/pty"
)

// TestProgressOnlyOnTerminal: a real pseudo-terminal gets the progress
// line, a pipe and a regular file get none.
func TestProgressOnlyOnTerminal(t *testing.T) {
	master, tty, err := pty.Open()
	if err != nil {
		t.Fatalf("pty.Open: %v", err)
	}
	defer master.Close()
	defer tty.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if ProgressWriter(w) != nil || ProgressWriter(file) != nil || ProgressWriter(nil) != nil {
		t.Fatal("progress enabled on a pipe or a file")
	}
	pw := ProgressWriter(tty)
	if pw == nil {
		t.Fatal("progress disabled on a terminal")
	}
	// Fake time: two ticks of the 1s period, then the run ends.
	synctest.Test(t, func(t *testing.T) {
		c := &counters{start: time.Now()}
		c.stored.Store(3 << 29)
		c.verified.Store(1 << 30)
		c.refusals.Store(2)
		c.lookups = make([]time.Duration, 5)
		stop := startProgress(context.Background(), time.Second, pw, c)
		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		stop()
	})
	got := make(chan string, 1)
	go func() {
		var b strings.Builder
		buf := make([]byte, 4096)
		for !strings.HasSuffix(b.String(), "\n") {
			n, err := master.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		got <- b.String()
	}()
	var out string
	select {
	case out = <-got:
	case <-time.After(10 * time.Second):
		master.Close()
		t.Fatal("no progress output on the terminal within 10s")
	}
	line := "\r\x1b[Kbench: %5.1fs stored 1.50 GiB, retrieved+verified 1.00 GiB, lookups 5, store refusals 2"
	want := strings.Replace(line, "%5.1f", "  1.0", 1) + strings.Replace(line, "%5.1f", "  2.0", 1) + "\r\n"
	if out != want {
		t.Fatalf("terminal got %q\nwant %q", out, want)
	}
}
