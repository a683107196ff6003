package mqclient

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lmcache-go/lmcache/internal/wire"
)

// Pool is the server's shared-memory L1 pool mapped into this process, as
// a vLLM worker maps it after registering.
type Pool struct {
	mem []byte
}

// OpenPool maps the segment a registration reply names. dir is where POSIX
// shared memory lives ("" = /dev/shm).
func OpenPool(dir, name string, size int64) (*Pool, error) {
	if dir == "" {
		dir = "/dev/shm"
	}
	if name == "" || size <= 0 {
		return nil, fmt.Errorf("mqclient: the server offers no shared-memory pool (name %q, size %d)", name, size)
	}
	f, err := os.OpenFile(filepath.Join(dir, strings.TrimPrefix(name, "/")), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("mqclient: open pool: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("mqclient: stat pool: %w", err)
	}
	if st.Size() < size {
		return nil, fmt.Errorf("mqclient: pool file is %d bytes, registration says %d", st.Size(), size)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mqclient: mmap pool: %w", err)
	}
	// Fault the whole pool in writable up front, without changing a byte,
	// as a vLLM worker does when it pins the pool for DMA. Kernels before
	// 5.14 lack MADV_POPULATE_WRITE; pages then fault in on first use.
	_ = unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	return &Pool{mem: mem}, nil
}

// Slot returns the pool bytes of a slot.
func (p *Pool) Slot(s wire.Slot) ([]byte, error) {
	off, n := int64(s.Offset), int64(s.Length)
	// The slot comes from the server's reply: compare n with the room
	// after off rather than off+n with the size, which a huge offset or
	// length overflows past the check into a slicing panic.
	if off < 0 || n < 0 || off > int64(len(p.mem)) || n > int64(len(p.mem))-off {
		return nil, fmt.Errorf("mqclient: slot [%d, +%d) outside the %d-byte pool", off, n, len(p.mem))
	}
	return p.mem[off : off+n : off+n], nil
}

// Close unmaps the pool.
func (p *Pool) Close() error {
	if p.mem == nil {
		return nil
	}
	err := syscall.Munmap(p.mem)
	p.mem = nil
	return err
}
