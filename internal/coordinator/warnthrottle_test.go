package coordinator_test

import (
	"fmt"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/manualclock"
)

// TestRefusalWarnsThrottled: registrations refused because the registry
// is full and event-gate resets are each logged at WARN at most once per
// 10 s; the next line after a quiet interval reports how many were held
// back ("suppressed"). The metrics count every occurrence. Before, every
// refused registration and every reset logged its own line.
func TestRefusalWarnsThrottled(t *testing.T) {
	defer coordinator.SetMaxSeqTracked(1)()
	c, recs := startCoordRecorded(t, nil)
	clk := manualclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c.srv.SetWarnClock(clk.Now)
	c.srv.SetRegistryLimits(1, 1<<20)
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-0", "ip": "127.0.0.1", "http_port": 8080}, 200)
	register := func(i int) {
		c.must("POST", "/instances", map[string]any{"instance_id": fmt.Sprintf("mp-%d", i), "ip": "10.0.0.1", "http_port": 8080}, 503)
	}
	// One distinct emitter per batch: with room for one cursor, every
	// batch after the first resets the gate.
	emit := func(i int) {
		c.must("POST", "/quota/events", map[string]any{"instance_id": fmt.Sprintf("e-%d", i), "seq": 1, "events": []any{}}, 200)
	}
	emit(0)
	for i := 1; i <= 5; i++ {
		register(i)
		emit(i)
	}
	clk.Advance(9 * time.Second)
	register(6)
	emit(6)
	const fullMsg, resetMsg = "registration refused: the registry is full", "usage-event seq tracker reset: too many distinct instance ids"
	if got := len(recs.withMsg(fullMsg)); got != 1 {
		t.Fatalf("%d registry-full lines within 10 s, want 1", got)
	}
	if got := len(recs.withMsg(resetMsg)); got != 1 {
		t.Fatalf("%d gate-reset lines within 10 s, want 1", got)
	}
	clk.Advance(time.Second)
	register(7)
	emit(7)
	base := map[string]string{"component": "coordinator"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	wantFull := []logRecord{
		{Level: slog.LevelWarn, Msg: fullMsg, Attrs: with("instance_id", "mp-1", "ip", "10.0.0.1", "registered", "1")},
		{Level: slog.LevelWarn, Msg: fullMsg, Attrs: with("instance_id", "mp-7", "ip", "10.0.0.1", "registered", "1", "suppressed", "5")},
	}
	if got := recs.withMsg(fullMsg); !reflect.DeepEqual(got, wantFull) {
		t.Fatalf("registry-full lines %+v, want %+v", got, wantFull)
	}
	wantReset := []logRecord{
		{Level: slog.LevelWarn, Msg: resetMsg, Attrs: with("limit", "1")},
		{Level: slog.LevelWarn, Msg: resetMsg, Attrs: with("limit", "1", "suppressed", "5")},
	}
	if got := recs.withMsg(resetMsg); !reflect.DeepEqual(got, wantReset) {
		t.Fatalf("gate-reset lines %+v, want %+v", got, wantReset)
	}
	metric(t, c, "lmcache_coordinator_registrations_refused_total 7")
	metric(t, c, "lmcache_coordinator_event_seq_tracker_resets_total 7")
}
