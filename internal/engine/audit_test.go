package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestZeroConfigDefaults: the defaults the engine applies to a Config that
// sets only the L1 size, as literals, both in the resolved config and in
// what Status and the shared-memory file show.
func TestZeroConfigDefaults(t *testing.T) {
	c, err := Config{L1SizeBytes: 1 << 20}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.L1ReadTTL != 300*time.Second {
		t.Errorf("L1ReadTTL %v, want 300s", c.L1ReadTTL)
	}
	if c.L1WriteTTL != 600*time.Second {
		t.Errorf("L1WriteTTL %v, want 600s", c.L1WriteTTL)
	}
	if c.ShmMode != 0o600 {
		t.Errorf("ShmMode %o, want 600", c.ShmMode)
	}
	if c.L2StorePolicy != "default" {
		t.Errorf("L2StorePolicy %q, want default", c.L2StorePolicy)
	}
	if c.StoreRetryBase != 100*time.Millisecond || c.StoreRetryMax != 30*time.Second || c.StoreMaxAttempts != 8 {
		t.Errorf("store retry base %v max %v attempts %d, want 100ms 30s 8", c.StoreRetryBase, c.StoreRetryMax, c.StoreMaxAttempts)
	}
	if c.L2PrefetchMaxInFlight != 8 {
		t.Errorf("L2PrefetchMaxInFlight %d, want 8", c.L2PrefetchMaxInFlight)
	}
	// The engine's zero value is "no lookup budget" (upstream's behaviour);
	// the 200 ms default is the server flag's.
	if c.L2LookupTimeout != 0 {
		t.Errorf("L2LookupTimeout %v, want 0 (no budget)", c.L2LookupTimeout)
	}
	if c.L1AlignBytes != 4096 || c.EvictionPolicy != "LRU" {
		t.Errorf("align %d policy %q, want 4096 LRU", c.L1AlignBytes, c.EvictionPolicy)
	}

	dir := t.TempDir()
	e, err := New(Config{L1SizeBytes: 1 << 20, ShmName: "defaults", ShmDir: dir}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeChecked(t, e)
	st := e.Status()
	l1m := st["l1_manager"].(map[string]any)
	if l1m["read_ttl_seconds"] != 300.0 || l1m["write_ttl_seconds"] != 600.0 {
		t.Errorf("status TTLs read %v write %v, want 300 600", l1m["read_ttl_seconds"], l1m["write_ttl_seconds"])
	}
	sc := st["store_controller"].(map[string]any)
	if sc["store_policy"] != "default" || sc["max_attempts"] != 8 {
		t.Errorf("status store controller %v", sc)
	}
	if pc := st["prefetch_controller"].(map[string]any); pc["max_in_flight"] != 8 {
		t.Errorf("status prefetch max_in_flight %v, want 8", pc["max_in_flight"])
	}
	fi, err := os.Stat(filepath.Join(dir, e.pool.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("shm file mode %o, want 600", fi.Mode().Perm())
	}
}

// TestUnknownEvictionPolicyListsSupported: --eviction-policy ARC is
// refused and the message names every supported policy.
func TestUnknownEvictionPolicyListsSupported(t *testing.T) {
	e, err := New(Config{L1SizeBytes: 1 << 20, EvictionPolicy: "ARC"}, nil, nil)
	if err == nil {
		closeChecked(t, e)
		t.Fatal("ARC accepted")
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("error %v is not ErrInvalid", err)
	}
	const want = `unknown eviction policy "ARC" (want LRU, IsolatedLRU or noop)`
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
}

// TestUnpolledPrefetchReaped: a finished job nobody polls is kept for
// 10 minutes, then dropped by the eviction tick and counted in
// PrefetchReaped; a later poll gets ErrNotFound.
func TestUnpolledPrefetchReaped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{})
		defer h.stop(t)
		cs := chunks("", 0, 2, 1)
		h.mustPut(t, flat(cs))
		if err := h.Prefetch(PrefetchRequest{ID: "idle", Chunks: cs}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if r, err := h.PeekPrefetch("idle"); err != nil || !r.Done || r.PrefixChunks != 2 {
			t.Fatalf("job not finished: %+v %v", r, err)
		}
		time.Sleep(9 * time.Minute)
		synctest.Wait()
		if c := h.Counters(); c.PrefetchReaped != 0 {
			t.Fatalf("reaped after 9 min: %d", c.PrefetchReaped)
		}
		if r, err := h.PeekPrefetch("idle"); err != nil || !r.Done {
			t.Fatalf("job gone before 10 min: %+v %v", r, err)
		}
		time.Sleep(time.Minute + 2*time.Second)
		synctest.Wait()
		if c := h.Counters(); c.PrefetchReaped != 1 {
			t.Fatalf("PrefetchReaped %d, want 1", c.PrefetchReaped)
		}
		if _, err := h.PollPrefetch("idle"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("poll after reap: %v, want ErrNotFound", err)
		}
	})
}
