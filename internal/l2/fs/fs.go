// Package fs is the "fs" L2 adapter: one file per object under a base
// directory, named by upstream's FS codec (objkey.Key.FSName) and holding the
// raw object bytes, so a directory can be shared with Python servers.
//
// Writes go to a hidden temp file and are renamed into place, so a crash
// never leaves a torn object under a real name. Concurrency: every public
// method may run concurrently; file operations take no adapter lock, and the
// bookkeeping (locks, usage) lives in a bookkeep.Book. Every operation
// passes the bookkeep.Gate, so Close waits for in-flight calls.
package fs

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lmcache-go/lmcache/internal/atomicfile"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/bookkeep"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// tmpPrefix marks our temp files; they never end in ".data", so neither we
// nor upstream mistake them for objects. A temp file is named
// tmpPrefix + <host>.<pid>.<process nonce>. + <random hex>, so a starting
// adapter can tell the leftovers of a dead process on this host from the
// writes in progress of a live server sharing the directory.
const tmpPrefix = ".lmcache-tmp-"

// staleTmpAge is how old a temp file of another host (or of the older,
// ownerless name form) must be before start-up deletes it; younger ones may
// belong to a live server on another host sharing the directory.
const staleTmpAge = time.Hour

// Adapter is the fs adapter.
type Adapter struct {
	cfg    Config
	tmpDir string
	book   *bookkeep.Book
	gate   bookkeep.Gate

	recoveredKeys  []objkey.Key
	recoveredSizes []int64
	// recoverSkipped counts the regular files recover could not adopt (a
	// name that is no object's, or an unreadable Info): they stay on disk
	// outside usage and eviction, so /status reports them.
	recoverSkipped int

	// Test hooks (nil outside tests): afterRename runs in Store once an
	// object's file is in place, afterRemove in Delete once a file is
	// removed, so tests can interleave a store and a delete of one key.
	afterRename, afterRemove func(objkey.Key)
	// dirSynced (nil outside tests) runs after fsync synced a directory.
	dirSynced func(dir string)
	// dirRead (nil outside tests) runs after List read base_path.
	dirRead func()

	// listMu guards listNames, the sorted regular-file names of base_path
	// as the first page of the latest listing read them, and listAt, when.
	// The later pages of a listing continue in it rather than reading the
	// whole directory again per page (which made a listing of n files in
	// pages of p cost n²/p entries: hours for the coordinator's resync of
	// a million objects). Files written since are not in it; a listing is
	// no snapshot of a changing directory either way.
	listMu    sync.Mutex
	listNames []string
	listAt    time.Time
}

// listSnapshotTTL is how long later pages may continue in the names the
// first page read; a page after that reads the directory again.
const listSnapshotTTL = time.Minute

var _ l2.Adapter = (*Adapter)(nil)

// New creates the directories and, with RecoverOnStart, scans BasePath so
// files left by earlier runs (or other servers) count toward usage.
func New(cfg Config) (*Adapter, error) {
	if cfg.BasePath == "" {
		return nil, errors.New("fs: base_path is required")
	}
	if err := os.MkdirAll(cfg.BasePath, 0o755); err != nil {
		return nil, fmt.Errorf("fs: create base_path: %w", err)
	}
	a := &Adapter{cfg: cfg, tmpDir: cfg.BasePath, book: bookkeep.New(cfg.MaxCapacityBytes)}
	if cfg.RelativeTmpDir != "" {
		a.tmpDir = filepath.Join(cfg.BasePath, cfg.RelativeTmpDir)
		if err := os.MkdirAll(a.tmpDir, 0o755); err != nil {
			return nil, fmt.Errorf("fs: create relative_tmp_dir: %w", err)
		}
	}
	// base_path is read once for both start-up passes: it may hold
	// millions of files.
	baseEnts, baseErr := os.ReadDir(cfg.BasePath)
	if baseErr != nil && cfg.RecoverOnStart {
		return nil, fmt.Errorf("fs: scan base_path: %w", baseErr)
	}
	// Interrupted writes of earlier runs go first, with or without
	// recover_on_start: they hold disk space and nobody will rename them.
	a.removeStaleTemps(baseEnts)
	if cfg.RecoverOnStart {
		if err := a.recover(baseEnts); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// recover adopts the object files among ents, base_path's entries.
func (a *Adapter) recover(ents []os.DirEntry) error {
	var example string
	var exampleErr error
	skip := func(name string, err error) {
		if a.recoverSkipped == 0 {
			example, exampleErr = name, err
		}
		a.recoverSkipped++
	}
	for _, e := range ents {
		// Our temp files are not objects; removeStaleTemps owns them.
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), tmpPrefix) {
			continue
		}
		k, err := parseObjectName(e.Name())
		if err != nil {
			skip(e.Name(), err)
			continue
		}
		info, err := e.Info()
		if err != nil {
			skip(e.Name(), err)
			continue
		}
		a.recoveredKeys = append(a.recoveredKeys, k)
		a.recoveredSizes = append(a.recoveredSizes, info.Size())
	}
	a.book.Stored(a.recoveredKeys, a.recoveredSizes)
	if a.recoverSkipped > 0 {
		// One line for the whole scan: a directory shared with other
		// files could otherwise flood the log at every start.
		a.log().Warn("fs L2: recover_on_start skipped files it cannot adopt; they stay on disk, outside usage and eviction (count in /status recover_skipped_files)",
			"base_path", a.cfg.BasePath, "count", a.recoverSkipped, "example", example, "err", exampleErr)
	}
	return nil
}

// parseObjectName returns the key whose object file is name. The name
// parser is as lenient as upstream's (upper-case hex, "0X" prefixes, signs),
// so a foreign name can parse to a key whose file is another name; such a
// file is not that key's object (lookups, loads and deletes of the key use
// Path), so it is refused like any name that is no object's.
func parseObjectName(name string) (objkey.Key, error) {
	k, err := objkey.ParseFSName(name)
	if err != nil {
		return k, err
	}
	if canon := k.FSName(); canon != name {
		return objkey.Key{}, fmt.Errorf("%q is not the object file name of its key (%q)", name, canon)
	}
	return k, nil
}

// RecoverSkipped is how many files recover_on_start skipped.
func (a *Adapter) RecoverSkipped() int { return a.recoverSkipped }

func (a *Adapter) log() *slog.Logger {
	if a.cfg.Logger != nil {
		return a.cfg.Logger
	}
	return slog.Default()
}

// tmpOwner is this process's part of its temp file names. The nonce tells
// this process from an earlier one that had the same pid on the same host:
// a container's entrypoint runs as the same pid, under the same host name,
// at every restart.
var tmpOwner = tmpHost() + "." + strconv.Itoa(os.Getpid()) + "." + tmpNonce + "."

// tmpNonce is random per process.
var tmpNonce = func() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

// tmpHost is the host name reduced to characters safe in a file name
// (without dots, which separate the owner fields).
func tmpHost() string {
	h, _ := os.Hostname()
	h = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return -1
	}, h)
	if h == "" {
		h = "host"
	}
	return h
}

// removeStaleTemps deletes temp files nobody will rename: those written on
// this host by a process that is no longer alive (an interrupted write of
// an earlier run), and any older than staleTmpAge. A temp file of a live
// process on this host, or a young one of another host, is left alone.
// base_path is scanned as well as relative_tmp_dir: it is where temps go
// without relative_tmp_dir, so a run before relative_tmp_dir was set left
// its interrupted writes there, and recovery skips temp names.
// baseEnts are base_path's entries, read by the caller.
func (a *Adapter) removeStaleTemps(baseEnts []os.DirEntry) {
	a.removeStaleTempsIn(a.cfg.BasePath, baseEnts)
	if a.tmpDir != a.cfg.BasePath {
		if ents, err := os.ReadDir(a.tmpDir); err == nil {
			a.removeStaleTempsIn(a.tmpDir, ents)
		}
	}
}

// removeStaleTempsIn removes the stale temp files among ents, dir's
// entries.
func (a *Adapter) removeStaleTempsIn(dir string, ents []os.DirEntry) {
	host := tmpHost()
	for _, e := range ents {
		name, ok := strings.CutPrefix(e.Name(), tmpPrefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		stale := false
		if h, rest, ok := strings.Cut(name, "."); ok && h == host {
			pidStr, rest, _ := strings.Cut(rest, ".")
			if pid, err := strconv.Atoi(pidStr); err == nil {
				if pid == os.Getpid() {
					// Our pid is alive, but the writer is this process
					// (another adapter on the directory) only with its
					// nonce; otherwise an earlier process with the same
					// pid (restarted container) left it, and kept, it
					// held disk space until a start an hour later.
					stale = !strings.HasPrefix(rest, tmpNonce+".")
				} else {
					stale = !processAlive(pid)
				}
			}
		}
		if !stale {
			info, err := e.Info()
			stale = err == nil && time.Since(info.ModTime()) > staleTmpAge
		}
		if stale {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// processAlive reports whether pid names a live process on this host
// (EPERM: alive, owned by someone else).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// Recovered returns the objects found by the start-up scan, for seeding an
// eviction policy (upstream seeds eviction listeners only, not reporting).
func (a *Adapter) Recovered() ([]objkey.Key, []int64) { return a.recoveredKeys, a.recoveredSizes }

// Path is the file that holds k.
func (a *Adapter) Path(k objkey.Key) string { return filepath.Join(a.cfg.BasePath, k.FSName()) }

// TypeName implements l2.Adapter.
func (a *Adapter) TypeName() string { return TypeName }

func (a *Adapter) enter() error { return a.gate.Enter("fs") }

func (a *Adapter) leave() { a.gate.Leave() }

// Store implements l2.Adapter; it stops at the first failure. The objects
// renamed into place before that failure stay on disk, so they are counted
// and reported as stored: uncounted, they would hold disk space outside
// usage and eviction until a restart's recovery found them.
func (a *Adapter) Store(ctx context.Context, keys []objkey.Key, objs [][]byte) error {
	if len(keys) != len(objs) {
		return fmt.Errorf("fs: store: %d keys but %d objects", len(keys), len(objs))
	}
	if err := a.enter(); err != nil {
		return err
	}
	defer a.leave()
	// No delete of these keys runs between a rename and its count.
	if err := a.book.BeginStore(ctx, keys); err != nil {
		return fmt.Errorf("fs: store: %w", err)
	}
	sizes := make([]int64, len(keys))
	written := 0
	defer func() {
		a.book.Stored(keys[:written], sizes[:written])
		a.book.FireStored(keys[:written], sizes[:written])
		a.book.EndStore(keys)
	}()
	for i, k := range keys {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("fs: store: %w", err)
		}
		renamed, err := a.writeAtomic(a.Path(k), objs[i])
		if renamed {
			if a.afterRename != nil {
				a.afterRename(k)
			}
			sizes[i] = int64(len(objs[i]))
			written = i + 1
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// writeAtomic writes data to a temp file and renames it to dst; renamed
// reports whether dst now holds data (an error after the rename, from
// syncing the directory, leaves the object in place). With fsync the
// directory is synced after the rename as well: the file's own fsync makes
// its bytes durable, but only the directory's makes its name durable, so
// without it a power loss could lose an object a store reported written.
func (a *Adapter) writeAtomic(dst string, data []byte) (renamed bool, err error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(a.tmpDir, tmpPrefix+tmpOwner+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return false, fmt.Errorf("fs: store: %w", err)
	}
	_, werr := f.Write(data)
	if werr == nil && a.cfg.Fsync {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, dst)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("fs: store %s: %w", filepath.Base(dst), werr)
	}
	if a.cfg.Fsync {
		if err := a.syncDir(filepath.Dir(dst)); err != nil {
			return true, fmt.Errorf("fs: store %s: sync directory: %w", filepath.Base(dst), err)
		}
	}
	return true, nil
}

// syncDir fsyncs directory dir, making the names in it durable, and tells
// the test hook.
func (a *Adapter) syncDir(dir string) error {
	err := atomicfile.SyncDir(dir)
	if err == nil && a.dirSynced != nil {
		a.dirSynced(dir)
	}
	return err
}

// LookupAndLock implements l2.Adapter: a hit is a non-empty file.
func (a *Adapter) LookupAndLock(ctx context.Context, keys []objkey.Key) ([]bool, error) {
	hits := make([]bool, len(keys))
	if err := a.enter(); err != nil {
		return hits, err
	}
	defer a.leave()
	for i, k := range keys {
		info, err := os.Stat(a.Path(k))
		hits[i] = err == nil && info.Mode().IsRegular() && info.Size() > 0
	}
	a.book.LockHits(keys, hits)
	return hits, nil
}

// Unlock implements l2.Adapter.
func (a *Adapter) Unlock(keys []objkey.Key) { a.book.Unlock(keys) }

// Load implements l2.Adapter. A file whose size differs from the destination
// buffer is reported as not loaded rather than half-filling the buffer.
func (a *Adapter) Load(ctx context.Context, keys []objkey.Key, dst [][]byte) ([]bool, error) {
	ok := make([]bool, len(keys))
	if len(keys) != len(dst) {
		return ok, fmt.Errorf("fs: load: %d keys but %d buffers", len(keys), len(dst))
	}
	if err := a.enter(); err != nil {
		return ok, err
	}
	defer a.leave()
	for i, k := range keys {
		if err := ctx.Err(); err != nil {
			return ok, fmt.Errorf("fs: load: %w", err)
		}
		ok[i] = a.loadOne(a.Path(k), dst[i])
	}
	return ok, nil
}

// loadOne reads the object at path into dst; a file of another size, or
// anything but a regular file, is a miss. The open does not block: a FIFO
// or device put under an object's name (after the lookup saw a regular
// file) would otherwise hold Load, and Close after it, until a writer came.
func (a *Adapter) loadOne(path string, dst []byte) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil || !info.Mode().IsRegular() || info.Size() != int64(len(dst)) {
		return false
	}
	_, err = io.ReadFull(f, dst)
	return err == nil
}

// Delete implements l2.Adapter. A file that is already gone is reported
// as deleted only when this adapter counted it (another server sharing
// base_path, or an operator, removed it): it is gone, and usage and the
// eviction policy must drop it, or its bytes would stay counted for good
// and the policy would pick it again every cycle. A missing file this
// adapter never counted is not reported.
func (a *Adapter) Delete(ctx context.Context, keys []objkey.Key) ([]objkey.Key, error) {
	if err := a.enter(); err != nil {
		return nil, err
	}
	defer a.leave()
	victims := a.book.BeginDelete(keys)
	removed := make([]objkey.Key, 0, len(victims))
	var firstErr error
	for _, k := range victims {
		err := os.Remove(a.Path(k))
		if a.afterRemove != nil {
			a.afterRemove(k)
		}
		switch {
		case err == nil:
			removed = append(removed, k)
		case errors.Is(err, fs.ErrNotExist):
			if _, known := a.book.Size(k); known {
				removed = append(removed, k)
			}
		default:
			if firstErr == nil {
				firstErr = fmt.Errorf("fs: delete: %w", err)
			}
		}
	}
	a.book.EndDelete(victims, removed)
	return removed, firstErr
}

// List implements l2.Adapter (upstream's fs adapter cannot list; this one
// can because names decode to keys). The page token is the last file name
// returned, base64url-encoded; pages are in file-name order.
func (a *Adapter) List(ctx context.Context, modelName string, pageSize int, pageToken string) (l2.Page, error) {
	if err := a.enter(); err != nil {
		return l2.Page{}, err
	}
	defer a.leave()
	if pageSize <= 0 {
		pageSize = 1000
	}
	after := ""
	if pageToken != "" {
		b, err := base64.RawURLEncoding.DecodeString(pageToken)
		if err != nil {
			return l2.Page{}, fmt.Errorf("fs: list: %w: %w", l2.ErrBadPageToken, err)
		}
		after = string(b)
	}
	names, err := a.listing(pageToken == "")
	if err != nil {
		return l2.Page{}, err
	}
	var page l2.Page
	last := ""
	// names is sorted: the page starts right after the token's name.
	for _, name := range names[sort.SearchStrings(names, after+"\x00"):] {
		k, err := parseObjectName(name)
		if err != nil || (modelName != "" && k.ModelName != modelName) {
			continue
		}
		if len(page.Entries) == pageSize {
			page.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(last))
			break
		}
		info, err := os.Lstat(filepath.Join(a.cfg.BasePath, name))
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted (or replaced) since the directory was read
		}
		page.Entries = append(page.Entries, l2.Entry{Key: k, SizeBytes: info.Size()})
		last = name
	}
	if page.NextPageToken == "" {
		a.listMu.Lock()
		a.listNames = nil // the listing is over: do not hold its names
		a.listMu.Unlock()
	}
	return page, nil
}

// listing returns the sorted regular-file names of base_path: read afresh
// for a first page (fresh), or when the names the last first page read are
// gone or older than listSnapshotTTL; otherwise those names.
func (a *Adapter) listing(fresh bool) ([]string, error) {
	a.listMu.Lock()
	defer a.listMu.Unlock()
	if !fresh && a.listNames != nil && time.Since(a.listAt) < listSnapshotTTL {
		return a.listNames, nil
	}
	ents, err := os.ReadDir(a.cfg.BasePath) // sorted by name
	if err != nil {
		return nil, fmt.Errorf("fs: list: %w", err)
	}
	if a.dirRead != nil {
		a.dirRead()
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	a.listNames, a.listAt = names, time.Now()
	return names, nil
}

// Usage implements l2.Adapter.
func (a *Adapter) Usage() l2.Usage { return a.book.Usage() }

// Status implements l2.Adapter.
func (a *Adapter) Status() map[string]any {
	u := a.book.Usage()
	return map[string]any{
		"is_healthy":         !a.gate.Closed(),
		"type":               "FSL2Adapter",
		"base_path":          a.cfg.BasePath,
		"current_size_bytes": u.TotalBytesUsed,
		"max_capacity_bytes": u.TotalCapacityBytes,
		"num_objects":        a.book.Known(),
		"locked_key_count":   a.book.LockedKeys(),
		// A Go addition: files recover_on_start could not adopt.
		"recover_skipped_files": a.recoverSkipped,
	}
}

// AddListener implements l2.Adapter.
func (a *Adapter) AddListener(l l2.Listener) { a.book.AddListener(l) }

// Close waits for in-flight calls. With persist_enabled false it removes the
// files this process knows about (stored or recovered), as upstream does at
// shutdown.
func (a *Adapter) Close() error {
	return a.gate.Close(func() error {
		if a.cfg.PersistEnabled {
			return nil
		}
		var errs []error
		for _, e := range a.knownNames() {
			if err := os.Remove(filepath.Join(a.cfg.BasePath, e)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}

func (a *Adapter) knownNames() []string {
	ents, err := os.ReadDir(a.cfg.BasePath)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		k, err := parseObjectName(e.Name())
		if err != nil {
			continue
		}
		if _, known := a.book.Size(k); known {
			out = append(out, e.Name())
		}
	}
	return out
}
