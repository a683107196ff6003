package leader_test

import (
	"context"
	"testing"

	"github.com/lmcache-go/lmcache/internal/etcdtest"
	"github.com/lmcache-go/lmcache/internal/polltest"
)

// TestStandbyElectedAfterCompactionKeepsLeading: a standby queued long
// enough for etcd to compact past its key's creation (auto-compaction on
// any real cluster) keeps the term it wins. The term used to watch its own
// key from create revision + 1, a compacted revision by then, so the watch
// failed at once and the new leader stepped down as "key gone" the moment
// it was elected: a spurious lost term and a second election.
func TestStandbyElectedAfterCompactionKeepsLeading(t *testing.T) {
	p := startPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	// Two writes after B queued, then compact at the second: B's create
	// revision + 1 is below the compaction revision.
	for range 2 {
		if _, err := p.admin.Put(ctx, "/test/other", "x"); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := p.admin.Get(ctx, "/test/other")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.admin.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}

	p.a.stop() // A resigns; B is elected
	p.a.next(t, false)
	gainB := p.b.next(t, true)
	before := p.b.e.Renewals()
	polltest.Until(t, waitFor, "two renewals of B's term", func() bool { return p.b.e.Renewals() >= before+2 })
	select {
	case s := <-p.b.changes:
		t.Fatalf("B's term changed after it was elected past a compaction: %+v (won %+v)", s, gainB)
	default:
	}
	if !p.b.e.Leading() || p.b.e.Revision() != gainB.Revision {
		t.Fatalf("B Leading %v Revision %d, want true %d", p.b.e.Leading(), p.b.e.Revision(), gainB.Revision)
	}
}

// TestLeaderKeepsTermWhenItsWatchResumesPastACompaction: a leader whose
// connection to etcd drops and comes back after etcd compacted past the
// start of its key's watch keeps its term. The watch on a quiet key
// resumes from the revision it started at, which etcd refuses as
// compacted; the key itself is still there with the term's create
// revision, so nothing was lost. The term used to end on that error, as if
// the key had been deleted.
func TestLeaderKeepsTermWhenItsWatchResumesPastACompaction(t *testing.T) {
	c := startCluster(t)
	admin := newClient(t, c.Endpoints)
	proxies, viaProxy := etcdtest.ProxyAll(t, c)
	// The long TTL leaves the reconnect below time to spare before the
	// renew deadline, so only the watch can end the term.
	a := runElectorTTL(t, newClient(t, viaProxy), "coord-a", memberLossTTL)
	gainA := a.next(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var last int64
	for range 2 {
		resp, err := admin.Put(ctx, "/test/other", "x")
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
	}
	if _, err := admin.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	// Drop every connection of A's client; its watch resumes on reconnect.
	for _, p := range proxies {
		p.Cut()
	}
	for _, p := range proxies {
		p.Heal()
	}
	before := a.e.Renewals()
	polltest.Until(t, waitFor, "three renewals after the reconnect", func() bool { return a.e.Renewals() >= before+3 })
	select {
	case s := <-a.changes:
		t.Fatalf("A's term changed after its watch resumed past a compaction: %+v (won %+v)", s, gainA)
	default:
	}
	if !a.e.Leading() || a.e.Revision() != gainA.Revision {
		t.Fatalf("A Leading %v Revision %d, want true %d", a.e.Leading(), a.e.Revision(), gainA.Revision)
	}
}
