package coordinator

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lmcache-go/lmcache/internal/coordinator/intentstore"
	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
)

// TestMirrorKeepsDeletionWhileOwnWriteInFlight: this coordinator's write A
// (quota set, revision 19) and write B (its deletion, 20) race; B applies
// first and the watch delivers both before A's own apply comes. The
// deletion's revision must still be known then, or A would set the deleted
// quota again; once no write is in flight it is forgotten.
func TestMirrorKeepsDeletionWhileOwnWriteInFlight(t *testing.T) {
	s := &Server{quotas: quota.New(), ledger: ledger.New(), ha: &haState{intentApply: prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})}}
	m := &s.ha.mirror
	m.init()
	set := intentstore.Change{Kind: intentstore.KindQuota, Salt: "t", Bytes: 1, Revision: 19}
	del := intentstore.Change{Kind: intentstore.KindQuota, Salt: "t", Deleted: true, Revision: 20}
	m.begin() // A
	m.begin() // B
	m.apply(s, del, nil)
	m.end()              // B
	m.apply(s, set, nil) // the watch: skipped, 19 is older than 20
	m.apply(s, del, nil)
	m.caughtUp(20)
	m.apply(s, set, nil) // A's own apply, late
	m.end()              // A
	if _, ok := s.quotas.Get("t"); ok {
		t.Fatal("a late apply of an older write set the deleted quota again")
	}
	if len(m.revs) != 0 || len(m.gone) != 0 {
		t.Fatalf("mirror keeps %v, pending %v; want nothing once no write is in flight", m.revs, m.gone)
	}
}
