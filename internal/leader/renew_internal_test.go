package leader

import (
	"context"
	"errors"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lmcache-go/lmcache/internal/etcdtest"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// TestRenewOnceCountsEachOutcome drives single renewals of a real etcd
// lease and checks each is counted exactly once under its outcome: a
// renewal of a live lease (renewals 1); the same lease after an admin
// revoked it (renewal_failures_total{reason="lease_gone"} 1, the term told
// on lost, the campaign aborted, the loop stopped with ErrIrrecoverable);
// a renewal while etcd is cut off (reason="error" 1, retried: nothing
// reported lost, nothing aborted, the loop keeps running).
func TestRenewOnceCountsEachOutcome(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := etcdtest.NewClient(t, c.Endpoints)
	proxy := etcdtest.StartProxy(t, c.Endpoints[0])
	cli := etcdtest.NewClient(t, []string{proxy.URL()})
	e, err := New(Config{Client: cli, ID: "coord-a", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	grant, err := admin.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	aborts := 0
	rt := &renewTerm{lease: grant.ID, lost: lost, abort: func() { aborts++ }}
	failures := func(reason string) float64 {
		var m dto.Metric
		if err := e.renewFailures.WithLabelValues(reason).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}

	if _, err := e.renewOnce(ctx, rt); err != nil {
		t.Fatalf("renewal of a live lease: %v", err)
	}
	if e.Renewals() != 1 || failures(RenewFailError) != 0 || failures(RenewFailLeaseGone) != 0 {
		t.Fatalf("after a renewal: renewals %d, error %v, lease_gone %v", e.Renewals(), failures(RenewFailError), failures(RenewFailLeaseGone))
	}

	if _, err := admin.Revoke(ctx, grant.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.renewOnce(ctx, rt)
	if !errors.Is(err, periodic.ErrIrrecoverable) || !errors.Is(err, errLost) {
		t.Fatalf("renewal of a revoked lease: %v, want ErrIrrecoverable and errLost", err)
	}
	select {
	case lerr := <-lost:
		if !errors.Is(lerr, errLost) {
			t.Errorf("lost got %v", lerr)
		}
	default:
		t.Error("revoked lease not reported on lost")
	}
	if aborts != 1 || e.Renewals() != 1 || failures(RenewFailLeaseGone) != 1 || failures(RenewFailError) != 0 {
		t.Fatalf("after revoke: aborts %d, renewals %d, lease_gone %v, error %v", aborts, e.Renewals(), failures(RenewFailLeaseGone), failures(RenewFailError))
	}

	proxy.Cut()
	_, err = e.renewOnce(ctx, rt)
	if err == nil || errors.Is(err, periodic.ErrIrrecoverable) {
		t.Fatalf("renewal with etcd cut off: %v, want a retryable error", err)
	}
	if aborts != 1 || len(lost) != 0 || e.Renewals() != 1 || failures(RenewFailError) != 1 || failures(RenewFailLeaseGone) != 1 {
		t.Fatalf("after the cut: aborts %d, lost %d, renewals %d, error %v, lease_gone %v", aborts, len(lost), e.Renewals(), failures(RenewFailError), failures(RenewFailLeaseGone))
	}

	// A renewal cut short by the term ending is not a failure.
	done, stop := context.WithCancel(ctx)
	stop()
	if sum, err := e.renewOnce(done, rt); err != nil || sum.Message != "stopping" {
		t.Fatalf("renewal after the term ended: %+v %v", sum, err)
	}
	if failures(RenewFailError) != 1 || failures(RenewFailLeaseGone) != 1 {
		t.Fatalf("a cancelled renewal was counted: error %v, lease_gone %v", failures(RenewFailError), failures(RenewFailLeaseGone))
	}
}
