// Package atomicfile replaces a file so that a crash leaves the old or the
// new content, never a mix, and says when the replacement may not be
// durable. The coordinator's checkpoint and state file and the bench report
// are written through it; the fs L2 adapter, whose temporaries live in its
// own directory and whose fsyncs are optional, shares only SyncDir.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Write replaces path with the concatenation of parts so that a
// crash leaves either the old file or the new one, never a mix: it writes a
// temporary file next to path (named with TempPrefix, so RemoveStaleTemps
// finds one a crash left), fsyncs it, renames it over path and fsyncs the
// directory. A directory fsync that fails is an error even though the new
// file is already in place (ErrNotDurable): the rename may not survive a
// power loss, and a caller told "saved" would believe it does.
func Write(path string, parts ...[]byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, TempPrefix(path)+"*")
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	tmp := f.Name()
	renamed := false
	defer func() {
		if err != nil && !renamed {
			f.Close()
			os.Remove(tmp)
		}
	}()
	for _, p := range parts {
		if _, err = f.Write(p); err != nil {
			return fmt.Errorf("atomicfile: write %s: %w", tmp, err)
		}
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("atomicfile: fsync %s: %w", tmp, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("atomicfile: close %s: %w", tmp, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("atomicfile: rename over %s: %w", path, err)
	}
	renamed = true
	if err = syncDir(dir); err != nil {
		return fmt.Errorf("%w: fsync directory %s after replacing %s: %w", ErrNotDurable, dir, filepath.Base(path), err)
	}
	return nil
}

// ErrNotDurable marks a Write that replaced the file but could not
// fsync its directory: readers see the new content now, but the rename may
// be lost in a power failure. A caller that undoes its change on a failed
// write should not undo it on this one, since the file already holds it.
var ErrNotDurable = errors.New("file replaced but not durable")

// SyncDir fsyncs directory dir, making a rename or create in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir is SyncDir, a variable so that tests can make it fail (no real
// file system fails on demand).
var syncDir = SyncDir

// TempPrefix is how the names of the temporary files Write creates next
// to path begin: "." + its base name + ".tmp-".
func TempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// RemoveStaleTemps deletes the temporary files (TempPrefix) an interrupted
// write left next to path and returns how many. A process killed between
// creating one and renaming it over path leaves it behind, as large as the
// artifact, and each crash of a crash loop would leave another until the
// disk is full. Call it at startup, before this process writes to path.
func RemoveStaleTemps(path string) (int, error) {
	dir, prefix := filepath.Dir(path), TempPrefix(path)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("atomicfile: read %s: %w", dir, err)
	}
	n := 0
	var errs []error
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("atomicfile: remove stale temporary files: %w", err)
	}
	return n, nil
}
