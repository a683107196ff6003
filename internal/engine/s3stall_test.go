package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2/s3"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

// TestLookupBudgetStalledS3 is the stalled-S3 proof on a real versitygw
// frozen with SIGSTOP (sockets open, nothing answered). A lookup that
// misses L1 answers with the L1 prefix once its L2 budget is spent instead
// of waiting the S3 op timeout (the wait below has a deadline shorter than
// that timeout, so only the budget can end it), and counts the timeout.
// Uploads queued during the stall hang past the slow-call limit and open
// the breaker; lookups then skip S3 without an error. After SIGCONT every
// pending upload lands (counted: 0 abandoned, all keys in the bucket) and a
// half-open probe closes the breaker.
func TestLookupBudgetStalledS3(t *testing.T) {
	srv := s3test.Versity(t)
	cfg := s3.Defaults()
	cfg.Endpoint, cfg.Region, cfg.DisableTLS = srv.Endpoint, s3test.Region, true
	cfg.AddressingStyle, cfg.Bucket = "path", srv.Bucket
	cfg.AccessKeyID, cfg.SecretAccessKey = srv.AccessKey, srv.SecretKey
	const opTimeout, waitDeadline = 40 * time.Second, 20 * time.Second
	cfg.MaxAttempts, cfg.OpTimeout = 1, opTimeout
	cfg.SlowCall, cfg.BreakerCooldown = time.Second, 200*time.Millisecond
	a, err := s3.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	h := start(t, Config{L2LookupTimeout: 200 * time.Millisecond, StoreMaxAttempts: 1000,
		StoreRetryBase: 10 * time.Millisecond, StoreRetryMax: 200 * time.Millisecond}, a)
	defer h.stop(t)

	resident := chunks("t", 0, 4, 1)
	h.mustPut(t, flat(resident))
	waitFor(t, func() bool { return h.Counters().L2[0].StoreObjects == 4 })
	// A loaded machine may have made a setup upload slow; a fresh answer
	// from the healthy S3 (a 404) clears the breaker's count.
	absent := flat(chunks("t", 200, 201, 1))
	waitFor(t, func() bool {
		hits, err := a.LookupAndLock(context.Background(), absent)
		if err == nil && hits[0] {
			t.Fatal("absent key found")
		}
		st := a.Status()
		return st["breaker_state"] == "closed" && st["connection_failures"] == 0
	})
	// Four L1 chunks, then one that no tier holds: the lookup must ask S3.
	query := append(slices.Clone(resident), chunks("t", 100, 101, 1)...)
	l1Chunks := 4 // resident chunks the lookups below lock (and release)
	lookup := func(id string) PrefetchResult {
		t.Helper()
		if err := h.Prefetch(PrefetchRequest{ID: id, Chunks: query, Readers: 1}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
		defer cancel()
		r, err := h.WaitPrefetch(ctx, id)
		if err != nil {
			t.Fatalf("lookup %s did not answer within %v (S3 op timeout %v): %v", id, waitDeadline, opTimeout, err)
		}
		h.ReleaseRead(id, flat(query[:r.PrefixChunks]), 1)
		return r
	}

	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			_ = srv.Thaw()
		}
	}()
	r := lookup("stalled")
	c := h.Counters()
	if r.PrefixChunks != 4 || r.L1Keys != 4 || r.L2Keys != 0 || r.Err != nil || c.L2LookupTimeouts != 1 {
		t.Fatalf("lookup against stalled S3: %+v, timeouts %d; want the L1 prefix 4, no error, 1 timeout", r, c.L2LookupTimeouts)
	}
	if st := a.Status(); st["breaker_state"] != "closed" {
		t.Fatalf("a lookup cut by its budget moved the breaker: %v", st)
	}

	// A lookup whose chunk 3 this server uploaded and L1 no longer holds:
	// S3 confirms it from memory (no request), so the GET is what hangs.
	// A lookup's loads are made fail-slow: the GET is abandoned at its
	// slow-call limit and the lookup answers the 3 L1 chunks, no error.
	if _, skipped := h.DeleteL1(flat(resident[3:]), false); skipped != 0 {
		t.Fatalf("chunk 3 not deletable: %d skipped", skipped)
	}
	l1Chunks = 3
	if r := lookup("needs-get"); r.PrefixChunks != 3 || r.L2Keys != 0 || r.Err != nil || h.Counters().L2[0].LoadFailed != 1 {
		t.Fatalf("lookup whose S3 chunk hangs in its GET: %+v, L2 %+v; want the 3 L1 chunks, no error, 1 failed load", r, h.Counters().L2[0])
	}
	if st := a.Status(); st["breaker_state"] != "closed" || st["slow_calls"].(int64) < 1 {
		t.Fatalf("after one abandoned GET: %v", st)
	}

	// Uploads during the stall: they hang, count slow, and open the breaker.
	pending := flat(chunks("t", 10, 20, 1))
	h.mustPut(t, pending)
	waitFor(t, func() bool { return a.Status()["breaker_state"] == "open" })
	r = lookup("broken")
	if c := h.Counters(); r.PrefixChunks != l1Chunks || r.Err != nil || c.L2LookupUnavailable == 0 || c.L2[0].StoreObjects != 4 {
		t.Fatalf("lookup with the breaker open: %+v, counters %+v", r, c)
	}

	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	waitFor(t, func() bool { return h.Counters().L2[0].StoreObjects == 14 })
	if c := h.Counters(); c.L2[0].StoreAbandoned != 0 || c.L2[0].PendingStores != 0 || c.L1PendingUpload != 0 {
		t.Fatalf("after thaw: %+v", c.L2[0])
	}
	names := srv.Keys(t, srv.Bucket)
	for _, k := range append(flat(resident), pending...) {
		if !slices.Contains(names, k.S3Name()) {
			t.Errorf("upload %s lost", k.S3Name())
		}
	}
	if len(names) != 14 {
		t.Errorf("bucket holds %d objects, want 14", len(names))
	}
	// After the cool-down the next lookup is the half-open probe; its
	// answer closes the breaker. Until then lookups answer from L1 (3
	// chunks); afterwards chunk 3 comes back from S3.
	n := 0
	waitFor(t, func() bool {
		n++
		r := lookup(fmt.Sprintf("probe-%d", n))
		if r.PrefixChunks < 3 || r.Err != nil {
			t.Fatalf("lookup after thaw: %+v", r)
		}
		return a.Status()["breaker_state"] == "closed"
	})
	if r := lookup("healed"); r.PrefixChunks != 4 || r.L2Keys != 1 || r.Err != nil {
		t.Fatalf("lookup once the breaker closed: %+v; want chunk 3 loaded from S3", r)
	}
}
