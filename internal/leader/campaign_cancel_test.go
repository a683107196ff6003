package leader_test

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/etcdtest"
)

// waitWatchers polls the etcd member's /metrics until it holds n watchers.
func waitWatchers(t *testing.T, memberURL string, n int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		got := -1
		resp, err := http.Get(memberURL + "/metrics")
		if err == nil {
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_mvcc_watcher_total "); ok {
					f, _ := strconv.ParseFloat(v, 64)
					got = int(f)
				}
			}
			resp.Body.Close()
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd watchers %d (err %v), want %d", got, err, n)
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
}

// A standby queued behind the leader (watching for the leader's key to go)
// that is cancelled while etcd is unreachable returns from Run: its key is
// on its lease, which is revoked (or expires), so nothing waits on etcd
// without a deadline. concurrency.Election.Campaign, cancelled while
// queued, resigned with the client's own context and never returned until
// the client was closed.
func TestQueuedStandbyStopsWhileEtcdUnreachable(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := newClient(t, c.Endpoints)
	a := runElector(t, newClient(t, c.Endpoints), "coord-a")
	a.next(t, true)
	waitWatchers(t, c.Endpoints[0], 1) // A's watch on its own key
	proxy := etcdtest.StartProxy(t, c.Endpoints[0])
	b := runElector(t, newClient(t, []string{proxy.URL()}), "coord-b")
	waitKeys(t, admin, 2)
	waitWatchers(t, c.Endpoints[0], 2) // B waits for A's key to be deleted
	proxy.Cut()

	b.stop() // fails the test if Run does not return within waitFor
	if b.e.Leading() {
		t.Error("cancelled standby Leading()")
	}
	if !a.e.Leading() {
		t.Error("leader stopped leading when the standby left")
	}
	a.stop()
}
