package s3_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/l2/s3"
	"github.com/lmcache-go/lmcache/internal/manualclock"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

// outage sits in front of a working S3 and can make it unreachable: in
// "reset" mode every request's connection is closed without an answer, in
// "hang" mode requests are held until the client gives up.
type outage struct {
	next     http.Handler
	mode     atomic.Value // "", "reset", "hang"
	requests atomic.Int64
	release  chan struct{}
}

func newOutage() *outage {
	o := &outage{release: make(chan struct{})}
	o.mode.Store("")
	return o
}

func (o *outage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.requests.Add(1)
	switch o.mode.Load().(string) {
	case "reset":
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	case "hang":
		select {
		case <-r.Context().Done():
		case <-o.release:
		}
		return
	}
	o.next.ServeHTTP(w, r)
}

func breakerSetup(t *testing.T) (*s3.Adapter, *outage, *manualclock.Clock) {
	o := newOutage()
	srv := s3test.FakeWith(t, func(h http.Handler) http.Handler { o.next = h; return o })
	t.Cleanup(func() { close(o.release) })
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	c := configFor(srv, srv.Bucket)
	c.MaxAttempts = 2
	c.BreakerThreshold = 3
	c.BreakerCooldown = 10 * time.Second
	c.OpTimeout = 300 * time.Millisecond
	c.Now = clk.Now
	a := newAdapter(t, c)
	t.Cleanup(func() { _ = a.Close() })
	return a, o, clk
}

func assertBroken(t *testing.T, a *s3.Adapter, keys []objkey.Key, objs [][]byte) {
	t.Helper()
	ctx := context.Background()
	if err := a.Store(ctx, keys, objs); !errors.Is(err, l2.ErrUnavailable) {
		t.Fatalf("Store while broken = %v, want ErrUnavailable", err)
	}
	hits, err := a.LookupAndLock(ctx, keys)
	if !errors.Is(err, l2.ErrUnavailable) || slices.Contains(hits, true) {
		t.Fatalf("LookupAndLock while broken = %v, %v; want all-miss and ErrUnavailable", hits, err)
	}
	dst := [][]byte{make([]byte, len(objs[0]))}
	ok, err := a.Load(ctx, keys[:1], dst)
	if !errors.Is(err, l2.ErrUnavailable) || ok[0] {
		t.Fatalf("Load while broken = %v, %v", ok, err)
	}
	if _, err := a.List(ctx, "", 10, ""); !errors.Is(err, l2.ErrUnavailable) {
		t.Fatalf("List while broken = %v", err)
	}
	if _, err := a.Delete(ctx, keys); !errors.Is(err, l2.ErrUnavailable) {
		t.Fatalf("Delete while broken = %v", err)
	}
	st := a.Status()
	if st["connection_disabled"] != true || st["is_healthy"] != false {
		t.Fatalf("status while broken = %v", st)
	}
}

// TestBreakerOpensFailsFastAndRecovers: with S3 resetting connections the
// breaker opens after 3 failed calls; from then on no call reaches S3 (they
// fail fast with ErrUnavailable); after the cool-down one probe goes out,
// and once S3 is back the adapter serves again.
func TestBreakerOpensFailsFastAndRecovers(t *testing.T) {
	a, o, clk := breakerSetup(t)
	ctx := context.Background()
	keys := l2test.Keys(t, 1, "")
	objs := l2test.Objects(t, 1)
	if err := a.Store(ctx, keys, objs); err != nil {
		t.Fatal(err)
	}
	more := l2test.KeysFor(t, keys[0].ModelName, 1, "")
	o.mode.Store("reset")
	for i := 0; i < 3; i++ {
		err := a.Store(ctx, more, objs)
		if err == nil || errors.Is(err, l2.ErrUnavailable) {
			t.Fatalf("failing store %d = %v, want a transport error", i, err)
		}
	}
	if st := a.Status(); st["breaker_state"] != "open" {
		t.Fatalf("after 3 failures: %v", st)
	}
	if got := l2.BreakerStateOf(a); got != l2.BreakerOpen { // the lmcache_mp_l2_breaker_state gauge's value
		t.Fatalf("BreakerStateOf after 3 failures = %d, want %d", got, l2.BreakerOpen)
	}
	before := o.requests.Load()
	assertBroken(t, a, append(keys, more...), [][]byte{objs[0], objs[0]})
	if got := o.requests.Load(); got != before {
		t.Fatalf("%d requests reached S3 while the breaker was open", got-before)
	}

	// Cool-down over, S3 still down: exactly one probe call goes out.
	clk.Advance(10 * time.Second)
	if err := a.Store(ctx, more, objs); err == nil || errors.Is(err, l2.ErrUnavailable) {
		t.Fatalf("probe = %v, want a transport error", err)
	}
	probeReqs := o.requests.Load() - before
	if probeReqs != 2 { // the one probe call's SDK attempts (s3_max_attempts 2)
		t.Fatalf("probe sent %d requests, want 2", probeReqs)
	}
	before = o.requests.Load()
	assertBroken(t, a, keys, objs)
	if got := o.requests.Load(); got != before {
		t.Fatalf("requests reached S3 after a failed probe")
	}

	// S3 back; after the cool-down the probe succeeds and service resumes.
	o.mode.Store("")
	clk.Advance(10 * time.Second)
	hits, err := a.LookupAndLock(ctx, keys)
	if err != nil || !hits[0] {
		t.Fatalf("lookup after recovery = %v %v", hits, err)
	}
	l2test.LoadAll(t, a, keys, objs)
	a.Unlock(keys)
	if err := a.Store(ctx, more, objs); err != nil {
		t.Fatalf("store after recovery: %v", err)
	}
	st := a.Status()
	if st["breaker_state"] != "closed" || st["is_healthy"] != true || st["breaker_trips"] != int64(2) {
		t.Fatalf("status after recovery = %v", st)
	}
	if got := l2.BreakerStateOf(a); got != l2.BreakerClosed {
		t.Fatalf("BreakerStateOf after recovery = %d, want %d", got, l2.BreakerClosed)
	}
}

// TestBreakerHangingS3: requests that hang time out (op timeout), the
// breaker opens, and later calls do not wait at all: they never reach S3.
func TestBreakerHangingS3(t *testing.T) {
	a, o, _ := breakerSetup(t)
	ctx := context.Background()
	keys := l2test.Keys(t, 1, "")
	o.mode.Store("hang")
	for i := 0; i < 3; i++ {
		hits, err := a.LookupAndLock(ctx, keys)
		if err == nil || errors.Is(err, l2.ErrUnavailable) || hits[0] {
			t.Fatalf("hanging lookup %d = %v %v, want a timeout error", i, hits, err)
		}
	}
	before := o.requests.Load()
	for i := 0; i < 20; i++ {
		if _, err := a.LookupAndLock(ctx, keys); !errors.Is(err, l2.ErrUnavailable) {
			t.Fatalf("lookup with open breaker = %v", err)
		}
	}
	if got := o.requests.Load(); got != before {
		t.Fatalf("%d requests reached the hanging S3 after the breaker opened", got-before)
	}
}

// TestCallerCancelDoesNotTrip: cancelled calls say nothing about S3.
func TestCallerCancelDoesNotTrip(t *testing.T) {
	a, o, _ := breakerSetup(t)
	o.mode.Store("hang")
	keys := l2test.Keys(t, 1, "")
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _ = a.LookupAndLock(ctx, keys)
	}
	if st := a.Status(); st["breaker_state"] != "closed" || st["connection_failures"] != 0 {
		t.Fatalf("status after cancelled calls = %v", st)
	}
}

// TestBreakerOpensOnSlowCalls: against an S3 that accepts requests and
// answers nothing, the breaker opens once three calls have run past the
// slow-call limit, long before their one-minute op timeout; later calls
// fail fast without reaching S3. After the cool-down a probe that hangs too
// is counted slow and reopens the breaker; once S3 answers again a probe
// closes it.
func TestBreakerOpensOnSlowCalls(t *testing.T) {
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	a, o := stallSetup(t, func(c *s3.Config) { c.BreakerCooldown, c.Now = 10*time.Second, clk.Now })
	keys := l2test.Keys(t, 1, "")

	o.mode.Store("hang")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { _, _ = a.LookupAndLock(ctx, keys) })
	}
	waitStatus(t, a, func(st map[string]any) bool { return st["breaker_state"] == "open" })
	if st := a.Status(); st["slow_calls"] != int64(3) || st["breaker_trips"] != int64(1) {
		t.Fatalf("after three hanging calls: %v", st)
	}
	before := o.requests.Load()
	if _, err := a.LookupAndLock(context.Background(), keys); !errors.Is(err, l2.ErrUnavailable) {
		t.Fatalf("lookup with the breaker open = %v, want ErrUnavailable", err)
	}
	if got := o.requests.Load(); got != before {
		t.Fatalf("%d requests reached the stalled S3 after the breaker opened", got-before)
	}
	cancel()
	wg.Wait()
	if st := a.Status(); st["breaker_state"] != "open" {
		t.Fatalf("cancelled slow calls closed the breaker: %v", st)
	}

	// Cool-down over, S3 still stalled: the probe hangs, counts slow, and
	// the breaker is open again while the probe still waits.
	clk.Advance(10 * time.Second)
	pctx, pcancel := context.WithCancel(context.Background())
	wg.Go(func() { _, _ = a.LookupAndLock(pctx, keys) })
	waitStatus(t, a, func(st map[string]any) bool { return st["slow_calls"] == int64(4) })
	if st := a.Status(); st["breaker_state"] != "open" || st["breaker_trips"] != int64(2) {
		t.Fatalf("after a hanging probe: %v", st)
	}
	pcancel()
	wg.Wait()

	o.mode.Store("")
	clk.Advance(10 * time.Second)
	if _, err := a.LookupAndLock(context.Background(), keys); err != nil {
		t.Fatalf("probe after recovery: %v", err)
	}
	if st := a.Status(); st["breaker_state"] != "closed" || st["is_healthy"] != true {
		t.Fatalf("after a good probe: %v", st)
	}
}

// waitStatus polls the adapter status until ok holds (30 s deadline).
func waitStatus(t *testing.T, a *s3.Adapter, ok func(map[string]any) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok(a.Status()) {
		if time.Now().After(deadline) {
			t.Fatalf("status not reached in 30 s: %v", a.Status())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBreakerOpeningAbortsInFlight: a GET hanging on a stalled S3 does not
// wait its one-minute op timeout once the breaker opens (here on three
// other slow calls): it is aborted and fails with l2.ErrUnavailable, so a
// lookup waiting on it can answer from L1.
func TestBreakerOpeningAbortsInFlight(t *testing.T) {
	a, o := stallSetup(t, func(c *s3.Config) { c.BreakerCooldown = time.Hour })
	keys, objs := storeOne(t, a)
	// The GET alone is one slow call, below the threshold: the breaker
	// opens only once the lookups below hang too.
	slowBefore := a.Status()["slow_calls"].(int64) // the PUT may have been slow on a loaded machine
	o.mode.Store("hang")
	type loadResult struct {
		ok  []bool
		err error
	}
	loaded := make(chan loadResult, 1)
	go func() {
		ok, err := a.Load(context.Background(), keys, [][]byte{make([]byte, len(objs[0]))})
		loaded <- loadResult{ok, err}
	}()
	waitRequests(t, o, 2) // the PUT above and the hanging GET
	waitStatus(t, a, func(st map[string]any) bool { return st["slow_calls"] == slowBefore+1 })
	if st := a.Status(); st["breaker_state"] != "closed" {
		t.Fatalf("one slow GET opened the breaker: %v", st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	others := l2test.KeysFor(t, keys[0].ModelName, 3, "")
	for i := range 3 {
		wg.Go(func() { _, _ = a.LookupAndLock(ctx, others[i:i+1]) })
	}
	select {
	case r := <-loaded:
		if !errors.Is(r.err, l2.ErrUnavailable) || r.ok[0] {
			t.Fatalf("aborted load = %v, %v; want not loaded and ErrUnavailable", r.ok, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the hanging GET was not aborted when the breaker opened")
	}
	if st := a.Status(); st["breaker_state"] != "open" || st["breaker_trips"] != int64(1) {
		t.Fatalf("status: %v", st)
	}
	cancel()
	wg.Wait()
}

// waitRequests polls until the outage has seen n requests (30 s deadline).
func waitRequests(t *testing.T, o *outage, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for o.requests.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests reached S3, want %d", o.requests.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFailSlowAbandonsCall: under l2.WithFailSlow (a lookup's loads) a GET
// hanging on a stalled S3 is abandoned at its slow-call limit with
// l2.ErrSlow (which wraps ErrUnavailable) instead of waiting the one-minute
// op timeout; it counts as one slow call, below the breaker threshold.
func TestFailSlowAbandonsCall(t *testing.T) {
	a, o := stallSetup(t, nil)
	keys, objs := storeOne(t, a)
	slowBefore := a.Status()["slow_calls"].(int64) // the PUT may have been slow on a loaded machine
	o.mode.Store("hang")
	ctx, cancel := context.WithTimeout(l2.WithFailSlow(context.Background()), 30*time.Second)
	defer cancel()
	ok, err := a.Load(ctx, keys, [][]byte{make([]byte, len(objs[0]))})
	if !errors.Is(err, l2.ErrSlow) || !errors.Is(err, l2.ErrUnavailable) || ok[0] || ctx.Err() != nil {
		t.Fatalf("fail-slow load on a stalled S3 = %v, %v (ctx %v); want ErrSlow before the deadline", ok, err, ctx.Err())
	}
	if st := a.Status(); st["slow_calls"] != slowBefore+1 || st["breaker_state"] != "closed" {
		t.Fatalf("status: %v (slow calls before the stall: %d)", st, slowBefore)
	}
}

// stallSetup is an adapter in front of an outage for the slow-call tests:
// one SDK attempt, threshold 3, a one-minute op timeout (longer than any
// wait in them) and a 200 ms slow-call limit (a healthy call on a loaded
// machine stays below it); mut adjusts the config.
func stallSetup(t *testing.T, mut func(*s3.Config)) (*s3.Adapter, *outage) {
	t.Helper()
	o := newOutage()
	srv := s3test.FakeWith(t, func(h http.Handler) http.Handler { o.next = h; return o })
	t.Cleanup(func() { close(o.release) })
	c := configFor(srv, srv.Bucket)
	c.MaxAttempts, c.BreakerThreshold = 1, 3
	c.OpTimeout, c.SlowCall = time.Minute, 200*time.Millisecond
	if mut != nil {
		mut(&c)
	}
	a := newAdapter(t, c)
	t.Cleanup(func() { _ = a.Close() })
	return a, o
}

// storeOne stores one object while S3 is healthy.
func storeOne(t *testing.T, a *s3.Adapter) ([]objkey.Key, [][]byte) {
	t.Helper()
	keys := l2test.Keys(t, 1, "")
	objs := l2test.Objects(t, 1)
	if err := a.Store(context.Background(), keys, objs); err != nil {
		t.Fatal(err)
	}
	return keys, objs
}

// TestBreakerOpensOnDeadlineCutLookups: against an S3 that accepts requests
// and answers nothing, lookups whose caller's deadline (the engine's lookup
// budget, far below the slow-call limit here) cuts their HEADs count toward
// the breaker, one per lookup whatever its key count: the third such lookup
// opens it and the next one fails fast without reaching S3. A half-open
// probe cut the same way reopens it; a probe S3 answers closes it. A
// caller that cancels (rather than runs out of time) still counts nothing.
func TestBreakerOpensOnDeadlineCutLookups(t *testing.T) {
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	a, o := stallSetup(t, func(c *s3.Config) { c.SlowCall, c.BreakerCooldown, c.Now = time.Hour, 10*time.Second, clk.Now })
	keys := l2test.Keys(t, 4, "")
	budgeted := func() ([]bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		return a.LookupAndLock(ctx, keys)
	}

	o.mode.Store("hang")
	for i := 1; i <= 3; i++ {
		hits, err := budgeted()
		if !errors.Is(err, context.DeadlineExceeded) || slices.Contains(hits, true) {
			t.Fatalf("cut lookup %d = %v, %v; want all-miss and the deadline error", i, hits, err)
		}
		want := "closed"
		if i == 3 {
			want = "open"
		}
		if st := a.Status(); st["breaker_state"] != want || st["slow_calls"] != int64(i) {
			t.Fatalf("after %d cut lookups of 4 keys: %v; want %s and %d slow calls", i, st, want, i)
		}
	}
	before := o.requests.Load()
	if _, err := budgeted(); !errors.Is(err, l2.ErrUnavailable) {
		t.Fatalf("lookup with the breaker open = %v, want ErrUnavailable", err)
	}
	if got := o.requests.Load(); got != before {
		t.Fatalf("%d requests reached the stalled S3 after the breaker opened", got-before)
	}

	clk.Advance(10 * time.Second)
	// One of the four HEADs is the probe, the others are refused while it
	// is in flight.
	if _, err := budgeted(); err == nil {
		t.Fatal("cut probe lookup succeeded")
	}
	if st := a.Status(); st["breaker_state"] != "open" || st["breaker_trips"] != int64(2) {
		t.Fatalf("after a cut probe: %v", st)
	}

	// No deadline on this probe: on a loaded machine S3's answer could
	// miss a 50 ms budget, and the point is that an answer closes it.
	o.mode.Store("")
	clk.Advance(10 * time.Second)
	if _, err := a.LookupAndLock(context.Background(), keys); err != nil {
		t.Fatalf("probe after recovery: %v", err)
	}
	if st := a.Status(); st["breaker_state"] != "closed" || st["connection_failures"] != 0 {
		t.Fatalf("after a good probe: %v", st)
	}

	o.mode.Store("hang")
	for range 4 {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(20*time.Millisecond, cancel)
		_, _ = a.LookupAndLock(ctx, keys)
		cancel()
	}
	if st := a.Status(); st["breaker_state"] != "closed" || st["connection_failures"] != 0 {
		t.Fatalf("cancelled (not cut) lookups moved the breaker: %v", st)
	}
}
