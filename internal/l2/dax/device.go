package dax

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Device states, as upstream names them.
const (
	stateActive    = "active"
	stateDraining  = "draining"
	stateMigrating = "migrating"
	stateResizing  = "resizing"
	stateRemoving  = "removing"
	stateClosed    = "closed"
	stateFailed    = "failed"
	stateRemoved   = "removed"
)

func readable(state string) bool {
	switch state {
	case stateActive, stateDraining, stateMigrating, stateResizing:
		return true
	}
	return false
}

func live(state string) bool {
	switch state {
	case stateClosed, stateFailed, stateRemoved:
		return false
	}
	return true
}

// device is one mapped region cut into fixed slots.
//
// Locking: the mapping (mem, file, gen) is guarded by mapMu. Data copies
// hold it for reading, so they run in parallel; remap and unmap hold it for
// writing and therefore wait for copies in flight. Everything else (state,
// free list, counts) is guarded by the adapter's mu. gen changes whenever
// the mapping does, so a slot handed out under an older mapping is refused.
type device struct {
	index int
	path  string
	id    string

	// Guarded by Adapter.mu.
	state     string
	sizeBytes int64
	maxSlots  int
	free      []int // free slot numbers, used as a stack
	// cutFree holds the free slots at or above maxSlots while a shrink
	// is in progress (nil otherwise).
	cutFree   []int
	liveSlots int
	borrowed  int // slots reserved by stores still copying

	mapMu sync.RWMutex
	mem   []byte
	file  *os.File
	gen   atomic.Uint64 // written under mapMu (write), read anywhere

	inflightStore, inflightLoad atomic.Int64

	// mapFault (nil outside tests) runs in remap after the old mapping is
	// gone; an error it returns fails the new mapping.
	mapFault func(size int64) error
}

// identity is upstream's device identity: rdev for character devices,
// (st_dev, st_ino) for files.
func identity(path string) (string, bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFCHR {
		return fmt.Sprintf("rdev:%d:%d", unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))), true, nil
	}
	return fmt.Sprintf("ino:%d:%d", st.Dev, st.Ino), false, nil
}

// mapDevice opens and maps path with size bytes. A plain file shorter than
// size is extended; a missing path is an error (device-DAX nodes are never
// created by us).
func mapDevice(path string, size int64) (*os.File, []byte, string, error) {
	id, isChar, err := identity(path)
	if err != nil {
		return nil, nil, "", err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, "", err
	}
	mem, err := mapFile(f, size, isChar)
	if err != nil {
		f.Close()
		return nil, nil, "", err
	}
	return f, mem, id, nil
}

func mapFile(f *os.File, size int64, isChar bool) ([]byte, error) {
	if !isChar {
		info, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if info.Size() < size {
			if err := f.Truncate(size); err != nil {
				return nil, fmt.Errorf("extend %s to %d bytes: %w", f.Name(), size, err)
			}
		}
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s (%d bytes): %w", f.Name(), size, err)
	}
	return mem, nil
}

// remap replaces the mapping with one of size bytes. The caller holds
// mapMu for writing.
func (d *device) remap(size int64) error {
	isChar := false
	if _, c, err := identity(d.path); err == nil {
		isChar = c
	}
	// A failed remap leaves no mapping (mem nil); the remap that restores
	// the old size must not unmap again: Munmap refuses an empty region,
	// and the restore would always fail.
	if d.mem != nil {
		if err := unix.Munmap(d.mem); err != nil {
			return fmt.Errorf("munmap %s: %w", d.path, err)
		}
		d.mem = nil
	}
	d.gen.Add(1)
	if d.mapFault != nil {
		if err := d.mapFault(size); err != nil {
			return err
		}
	}
	mem, err := mapFile(d.file, size, isChar)
	if err != nil {
		return err
	}
	d.mem = mem
	if !isChar {
		// Shrinking a plain file gives the space back; errors are harmless.
		_ = d.file.Truncate(size)
	}
	return nil
}

// unmap releases the mapping and the file. The caller holds mapMu for
// writing.
func (d *device) unmap() error {
	var err error
	if d.mem != nil {
		err = unix.Munmap(d.mem)
		d.mem = nil
	}
	d.gen.Add(1)
	if d.file != nil {
		if cerr := d.file.Close(); err == nil {
			err = cerr
		}
		d.file = nil
	}
	return err
}

// freeSlotLocked returns slot s, taken under mapping generation gen, to
// the free list, unless the device was remapped or retired since (then
// the slot is gone or belongs to a rebuilt free list). A slot in the
// cut-off range of a shrink in progress goes to cutFree. Caller holds
// Adapter.mu.
func (d *device) freeSlotLocked(s int, gen uint64) {
	if d.gen.Load() != gen || !live(d.state) {
		return
	}
	if s < d.maxSlots {
		d.free = append(d.free, s)
	} else {
		d.cutFree = append(d.cutFree, s)
	}
}

// slot returns the bytes of slot s, or nil if the mapping changed since gen.
// The caller holds mapMu for reading.
func (d *device) slot(s int, slotBytes int64, gen uint64) []byte {
	if d.mem == nil || d.gen.Load() != gen {
		return nil
	}
	off := int64(s) * slotBytes
	if off+slotBytes > int64(len(d.mem)) {
		return nil
	}
	return d.mem[off : off+slotBytes]
}
