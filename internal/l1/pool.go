// Package l1 is the first storage tier: one mmap'd pool (optionally a POSIX
// shared-memory file that vLLM workers map too), an aligned all-or-nothing
// batch allocator over it, and the object table that tracks which key lives
// where, in which state, under which leases.
package l1

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ShmPrefix is prepended to every shared-memory pool name, as upstream does,
// so the data path's clients find the segment under the name they expect.
const ShmPrefix = "lmcache_l1_pool_"

// DefaultShmDir is where Linux exposes POSIX shared memory.
const DefaultShmDir = "/dev/shm"

// PoolConfig configures NewPool.
type PoolConfig struct {
	Size    int64       // bytes; rounded up to Align
	Align   int64       // power of two; 0 means 4096
	ShmName string      // "" = anonymous private mapping
	ShmDir  string      // "" = /dev/shm
	ShmMode os.FileMode // 0 = 0600
	// HugePages backs a private pool with reserved 2 MiB hugetlb pages
	// (--l1-use-hugepages). As upstream it requires SHM off and enough free
	// pages in /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages.
	HugePages bool
}

// HugePageSize is the hugetlb page size used by PoolConfig.HugePages.
const HugePageSize = 2 << 20

// freeHugePagesFile reports free 2 MiB hugetlb pages (a variable for tests).
var freeHugePagesFile = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"

func freeHugePages() (int64, error) {
	b, err := os.ReadFile(freeHugePagesFile)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// Pool is one contiguous mapping. The memory is committed lazily by the
// kernel on first touch, so a large pool costs nothing until it is used.
// Pool itself has no lock: its bytes are owned by whoever holds the slot
// (see Table), and the mapping lives until Close.
type Pool struct {
	mem  []byte
	name string // shm name without "/", "" when private
	path string
}

// NormalizeShmName applies upstream's naming: leading "/" stripped and the
// lmcache_l1_pool_ prefix added if missing. "" stays "" (SHM off).
func NormalizeShmName(name string) string {
	name = strings.TrimLeft(name, "/")
	if name == "" {
		return ""
	}
	if !strings.HasPrefix(name, ShmPrefix) {
		name = ShmPrefix + name
	}
	return name
}

// NewPool maps the pool. With a shm name it creates the file exclusively,
// replacing a stale one left by a crashed server (the data-path research
// shows a stale arena otherwise blocks restarts), sizes it with ftruncate
// before anyone can be told its name, and maps it shared.
func NewPool(cfg PoolConfig) (*Pool, error) {
	align := cfg.Align
	if align == 0 {
		align = 4096
	}
	if align < 0 || align&(align-1) != 0 {
		return nil, fmt.Errorf("l1: align bytes %d is not a power of two", align)
	}
	if cfg.Size <= 0 {
		return nil, fmt.Errorf("l1: pool size must be positive (got %d)", cfg.Size)
	}
	size := roundUp(cfg.Size, align)
	p := &Pool{name: NormalizeShmName(cfg.ShmName)}
	if cfg.HugePages {
		if p.name != "" {
			return nil, errors.New(`l1: --l1-use-hugepages needs --shm-name ""`)
		}
		size = roundUp(size, HugePageSize)
		need := size / HugePageSize
		free, err := freeHugePages()
		if err != nil {
			return nil, fmt.Errorf("l1: --l1-use-hugepages: cannot read free huge pages: %w", err)
		}
		if free < need {
			return nil, fmt.Errorf("l1: --l1-use-hugepages: %d free 2 MiB huge pages, need %d (reserve them with vm.nr_hugepages)", free, need)
		}
		const mapHuge2MB = 21 << unix.MAP_HUGE_SHIFT
		mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|mapHuge2MB)
		if err != nil {
			return nil, fmt.Errorf("l1: mmap %d bytes of huge pages: %w", size, err)
		}
		p.mem = mem
		return p, nil
	}
	if p.name == "" {
		mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			return nil, fmt.Errorf("l1: mmap %d bytes: %w", size, err)
		}
		// Best effort: where transparent huge pages are in "madvise" mode
		// this backs the pool with 2 MiB pages (fewer TLB misses on large
		// copies); elsewhere it is a no-op.
		_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
		p.mem = mem
		return p, nil
	}
	dir := cfg.ShmDir
	if dir == "" {
		dir = DefaultShmDir
	}
	mode := cfg.ShmMode
	if mode == 0 {
		mode = 0o600
	}
	p.path = filepath.Join(dir, p.name)
	if err := os.Remove(p.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("l1: remove stale shm %s: %w", p.path, err)
	}
	fd, err := unix.Open(p.path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return nil, fmt.Errorf("l1: create shm %s: %w", p.path, err)
	}
	defer unix.Close(fd)
	// The umask may have cleared bits the operator asked for (e.g. 0660 for
	// a worker group); set them explicitly.
	if err := unix.Fchmod(fd, uint32(mode.Perm())); err != nil {
		_ = os.Remove(p.path)
		return nil, fmt.Errorf("l1: chmod shm %s: %w", p.path, err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		_ = os.Remove(p.path)
		return nil, fmt.Errorf("l1: size shm %s to %d: %w", p.path, size, err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = os.Remove(p.path)
		return nil, fmt.Errorf("l1: mmap shm %s: %w", p.path, err)
	}
	// Honoured only where shmem huge pages are in "advise" mode.
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	p.mem = mem
	return p, nil
}

// Size is the mapped size in bytes.
func (p *Pool) Size() int64 { return int64(len(p.mem)) }

// Name is the shm name without a leading "/" ("" when private).
func (p *Pool) Name() string { return p.name }

// Path is the backing file ("" when private).
func (p *Pool) Path() string { return p.path }

// Bytes returns pool memory [off, off+n). It panics on a range outside the
// pool, which would be an engine bug.
func (p *Pool) Bytes(off, n int64) []byte {
	if off < 0 || n < 0 || off+n > int64(len(p.mem)) {
		panic(fmt.Sprintf("l1: range [%d,%d) outside pool of %d bytes", off, off+n, len(p.mem)))
	}
	return p.mem[off : off+n : off+n]
}

// Close unmaps the pool and unlinks the shm file. No slice from Bytes may
// be used afterwards.
func (p *Pool) Close() error {
	var errs []error
	if p.mem != nil {
		errs = append(errs, unix.Munmap(p.mem))
		p.mem = nil
	}
	if p.path != "" {
		if err := os.Remove(p.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func roundUp(n, align int64) int64 { return (n + align - 1) &^ (align - 1) }
