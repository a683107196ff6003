package fs_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2/fs"
)

// TestStartRemovesTempsOfEarlierSamePid: a container restarted after a
// crash runs the server under the same host name and pid, so the crashed
// run's interrupted writes carried this process's own host.pid and were
// kept as "a live process's writes in progress". Only a start an hour
// later removed them: until then they held disk space outside usage. A
// temp this very process is writing (another adapter on the directory)
// is still kept.
func TestStartRemovesTempsOfEarlierSamePid(t *testing.T) {
	dir := t.TempDir()
	samePid := fs.TmpPrefix + fs.TmpHost() + "." + strconv.Itoa(os.Getpid()) + "."
	files := map[string]bool{ // name -> survives start
		samePid + "00aa":                    false, // an earlier process, the name form without nonce
		samePid + "0badcafe.00bb":           false, // an earlier process, another nonce
		fs.TmpPrefix + fs.TmpOwner + "00cc": true,  // this process
	}
	for name := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a := newAdapter(t, func(c *fs.Config) { c.BasePath = dir })
	defer a.Close()
	for name, keep := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		if got := err == nil; got != keep {
			t.Errorf("%s exists=%v after start, want %v", name, got, keep)
		}
	}
}
