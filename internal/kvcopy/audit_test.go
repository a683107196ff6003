package kvcopy

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lmcache-go/lmcache/internal/kvwrap"
)

// TestOpenRefusesSymlinkAndNonRegular: a segment name that is a symlink
// (even to a valid segment) is refused by O_NOFOLLOW, and one naming a
// FIFO is refused as not a regular file.
func TestOpenRefusesSymlinkAndNonRegular(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	p := &producer{format: "NHD", nl: 2, nb: 4, bs: 8, nh: 2, hs: 4, item: 2}
	p.build(t, r)
	reg := Registration{Hints: hints(p)}
	dir := t.TempDir()
	for _, n := range p.names {
		b, err := os.ReadFile(filepath.Join(DefaultDir, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Control: the copies in dir open.
	c, err := Open(dir, p.ws, reg)
	if err != nil {
		t.Fatalf("regular copies refused: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	target := strings.TrimPrefix(p.ws[1].ShmName, "/")
	if err := os.Symlink(filepath.Join(dir, target), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	link, fifo := p.ws[1], p.ws[1]
	link.ShmName, fifo.ShmName = "/link", "/fifo"

	_, err = Open(dir, []kvwrap.Wrapper{p.ws[0], link}, reg)
	if !errors.Is(err, ErrSegment) || !errors.Is(err, unix.ELOOP) {
		t.Fatalf("symlink: %v, want ErrSegment wrapping ELOOP", err)
	}
	_, err = Open(dir, []kvwrap.Wrapper{p.ws[0], fifo}, reg)
	if !errors.Is(err, ErrSegment) || !strings.Contains(err.Error(), "is not a regular file") {
		t.Fatalf("fifo: %v, want ErrSegment: not a regular file", err)
	}
	if n := OpenMappings(); n != 0 {
		t.Fatalf("%d mappings left after refused opens", n)
	}
}
