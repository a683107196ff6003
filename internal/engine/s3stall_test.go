package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2/s3"
	"github.com/lmcache-go/lmcache/internal/manualclock"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

// TestLookupBudgetStalledS3 is the stalled-S3 proof on a real versitygw
// frozen with SIGSTOP (sockets open, nothing answered). A lookup that
// misses L1 answers with the L1 prefix once its L2 budget is spent instead
// of waiting the S3 op timeout (the wait below has a deadline shorter than
// that timeout, so only the budget can end it), and counts the timeout.
// With lookups alone talking to S3, each lookup its budget cut counts
// toward the breaker: the third opens it, and the next lookup skips S3 at
// once (no budget spent, counted unavailable). After SIGCONT a half-open
// probe lookup closes it. Frozen again, a lookup's GET is abandoned at its
// slow limit; uploads queued during the stall hang past it and open the
// breaker. After SIGCONT every pending upload lands (counted: 0 abandoned,
// all keys in the bucket) and a half-open probe closes the breaker. The
// breaker's cool-down runs on a manual clock, so "at once" does not depend
// on how fast this machine is.
func TestLookupBudgetStalledS3(t *testing.T) {
	srv := s3test.Versity(t)
	cfg := s3.Defaults()
	cfg.Endpoint, cfg.Region, cfg.DisableTLS = srv.Endpoint, s3test.Region, true
	cfg.AddressingStyle, cfg.Bucket = "path", srv.Bucket
	cfg.AccessKeyID, cfg.SecretAccessKey = srv.AccessKey, srv.SecretKey
	const opTimeout, waitDeadline, cooldown = 40 * time.Second, 20 * time.Second, 10 * time.Second
	cfg.MaxAttempts, cfg.OpTimeout = 1, opTimeout
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	cfg.SlowCall, cfg.BreakerCooldown, cfg.Now = time.Second, cooldown, clk.Now
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
		clk.Advance(cooldown) // in case a slow setup upload opened it
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
	// Lookups only: three cut by their budget open the breaker.
	for i := 1; i <= 3; i++ {
		r := lookup(fmt.Sprintf("stalled-%d", i))
		c, st := h.Counters(), a.Status()
		if r.PrefixChunks != 4 || r.L1Keys != 4 || r.L2Keys != 0 || r.Err != nil || c.L2LookupTimeouts != int64(i) {
			t.Fatalf("lookup %d against stalled S3: %+v, timeouts %d; want the L1 prefix 4, no error, %d timeouts", i, r, c.L2LookupTimeouts, i)
		}
		want := "closed"
		if i == 3 {
			want = "open"
		}
		if st["breaker_state"] != want || st["slow_calls"] != int64(i) {
			t.Fatalf("after %d lookups cut by their budget: %v; want %s and %d slow calls", i, st, want, i)
		}
	}
	r := lookup("skips-s3")
	if c := h.Counters(); r.PrefixChunks != 4 || r.Err != nil || c.L2LookupTimeouts != 3 || c.L2LookupUnavailable != 1 {
		t.Fatalf("lookup with the breaker open: %+v, timeouts %d, unavailable %d; want the L1 prefix at once (3 timeouts, 1 unavailable)",
			r, c.L2LookupTimeouts, c.L2LookupUnavailable)
	}
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	// After the cool-down the next lookup is the half-open probe; S3's
	// answer (chunk 100 is absent) closes the breaker. A probe the loaded
	// machine made miss its budget reopens it, and the next cool-down
	// admits another.
	n := 0
	waitFor(t, func() bool {
		n++
		clk.Advance(cooldown)
		if r := lookup(fmt.Sprintf("thawed-%d", n)); r.PrefixChunks != 4 || r.Err != nil {
			t.Fatalf("lookup after thaw: %+v", r)
		}
		return a.Status()["breaker_state"] == "closed"
	})

	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	thawed = false
	timeouts := h.Counters().L2LookupTimeouts
	// A lookup whose chunk 3 this server uploaded and L1 no longer holds:
	// S3 confirms it from memory (no request), so the GET is what hangs.
	// A lookup's loads are made fail-slow: the GET is abandoned at its
	// slow-call limit and the lookup answers the 3 L1 chunks, no error.
	// Its HEAD of chunk 100 is cut by the budget; with the abandoned GET
	// that is two of the three failures that open the breaker.
	if _, skipped := h.DeleteL1(flat(resident[3:]), false); skipped != 0 {
		t.Fatalf("chunk 3 not deletable: %d skipped", skipped)
	}
	l1Chunks = 3
	if r := lookup("needs-get"); r.PrefixChunks != 3 || r.L2Keys != 0 || r.Err != nil || h.Counters().L2[0].LoadFailed != 1 ||
		h.Counters().L2LookupTimeouts != timeouts+1 {
		t.Fatalf("lookup whose S3 chunk hangs in its GET: %+v, L2 %+v; want the 3 L1 chunks, no error, 1 failed load, 1 more timeout", r, h.Counters().L2[0])
	}
	if st := a.Status(); st["breaker_state"] != "closed" || st["connection_failures"] != 2 {
		t.Fatalf("after one cut HEAD and one abandoned GET: %v", st)
	}

	// Uploads during the stall: they hang, count slow, and open the breaker.
	pending := flat(chunks("t", 10, 20, 1))
	h.mustPut(t, pending)
	waitFor(t, func() bool { return a.Status()["breaker_state"] == "open" })
	unavailable := h.Counters().L2LookupUnavailable
	r = lookup("broken")
	if c := h.Counters(); r.PrefixChunks != l1Chunks || r.Err != nil || c.L2LookupUnavailable != unavailable+1 || c.L2[0].StoreObjects != 4 {
		t.Fatalf("lookup with the breaker open: %+v, counters %+v", r, c)
	}

	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	// The retried uploads probe after each cool-down; the first that S3
	// answers closes the breaker and the rest follow.
	waitFor(t, func() bool {
		clk.Advance(cooldown)
		return h.Counters().L2[0].StoreObjects == 14
	})
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
	n = 0
	waitFor(t, func() bool {
		n++
		clk.Advance(cooldown)
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
