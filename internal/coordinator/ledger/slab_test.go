package ledger

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// vmaHugeKB is the AnonHugePages figure, in kB, that /proc/self/smaps
// gives for the mapping holding addr; -1 if no mapping holds it.
func vmaHugeKB(t *testing.T, addr uintptr) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			in = err1 == nil && err2 == nil && uint64(addr) >= l && uint64(addr) < h
			continue
		}
		if in && f[0] == "AnonHugePages:" {
			kb, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	return -1
}

// TestSlabsAreHugePageAligned: every slab starts on a 2 MiB boundary and
// is zeroed, whatever its length, and freeing it unmaps it.
func TestSlabsAreHugePageAligned(t *testing.T) {
	for _, n := range []int{4096, mapSlots * 8, hugePage + 1, pageSize * int(unsafe.Sizeof(entry{}))} {
		sl, err := mapSlab(n)
		if err != nil {
			t.Fatal(err)
		}
		addr := uintptr(unsafe.Pointer(&sl.mem[0]))
		if addr%hugePage != 0 || len(sl.mem) != n {
			t.Errorf("mapSlab(%d) at %#x, %d bytes; want a multiple of %#x, %d bytes", n, addr, len(sl.mem), hugePage, n)
		}
		if sl.mem[0] != 0 || sl.mem[n-1] != 0 {
			t.Errorf("mapSlab(%d) not zeroed", n)
		}
		sl.mem[n-1] = 1
		if kb := vmaHugeKB(t, addr); kb < 0 {
			t.Errorf("mapSlab(%d): no mapping at %#x in /proc/self/smaps", n, addr)
		}
		sl.free()
		if kb := vmaHugeKB(t, addr); kb != -1 {
			t.Errorf("after free, a mapping (%d kB huge) still holds %#x", kb, addr)
		}
	}
}

// TestSlabsGetHugePages: an entry page written through is backed by
// transparent huge pages (the three 2 MiB pages its 5 MiB touch, in a
// 6 MiB mapping) where the kernel allows them on advice, and by none where its
// mode is "never" (the advice then does nothing). Both outcomes are
// asserted, so the test cannot pass without looking.
func TestSlabsGetHugePages(t *testing.T) {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		t.Fatalf("reading the kernel's huge-page mode: %v", err)
	}
	off := strings.Contains(string(mode), "[never]")
	p, sl := newEntryPage()
	if sl == nil {
		t.Fatal("newEntryPage fell back to the Go heap")
	}
	defer sl.free()
	b := entryBytes(p)
	for i := 0; i < len(b); i += osPage {
		b[i] = 1
	}
	kb := vmaHugeKB(t, uintptr(unsafe.Pointer(&b[0])))
	switch {
	case off && kb != 0:
		t.Fatalf("kernel mode %q, yet the entry page has %d kB of huge pages", strings.TrimSpace(string(mode)), kb)
	case !off && kb < 3*2048:
		t.Fatalf("entry page of %d bytes has %d kB of huge pages, want at least %d (kernel mode %q)", len(b), kb, 3*2048, strings.TrimSpace(string(mode)))
	}
}
