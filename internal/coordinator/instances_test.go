package coordinator_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

func ids(t *testing.T, c *coord) []string {
	t.Helper()
	m := c.must("GET", "/instances", nil, 200)
	var out []string
	for _, e := range m["instances"].([]any) {
		out = append(out, e.(map[string]any)["instance_id"].(string))
	}
	return out
}

// TestInstancesLifecycle covers research 10.1 and 10.4 over a real listener.
func TestInstancesLifecycle(t *testing.T) {
	c := startCoord(t, nil)
	if got := c.must("GET", "/healthz", nil, 200); got["status"] != "healthy" || len(got) != 1 {
		t.Fatalf("healthz = %v", got)
	}
	if _, raw := c.do("GET", "/instances", nil); string(raw) != `{"instances":[]}` {
		t.Fatalf("empty fleet = %s", raw)
	}
	got := c.must("POST", "/instances", map[string]any{"instance_id": "i1", "ip": "127.0.0.1", "http_port": 8080}, 200)
	if got["instance_id"] != "i1" || got["re_registered"] != false {
		t.Fatalf("register = %v", got)
	}
	if l := ids(t, c); len(l) != 1 || l[0] != "i1" {
		t.Fatalf("list = %v", l)
	}
	got = c.must("POST", "/instances", map[string]any{"instance_id": "i1", "ip": "127.0.0.1", "http_port": 9090}, 200)
	if got["re_registered"] != true {
		t.Fatalf("re-register = %v", got)
	}
	if got := c.must("PUT", "/instances/i1/heartbeat", nil, 200); got["instance_id"] != "i1" {
		t.Fatalf("heartbeat = %v", got)
	}
	code, raw := c.do("PUT", "/instances/ghost/heartbeat", nil)
	if code != 404 || string(raw) != `{"error":"unknown instance ghost; re-register"}` {
		t.Fatalf("unknown heartbeat = %d %s", code, raw)
	}
	if code, raw := c.do("DELETE", "/instances/i1", nil); code != 204 || len(raw) != 0 {
		t.Fatalf("delete = %d %q", code, raw)
	}
	if l := ids(t, c); len(l) != 0 {
		t.Fatalf("after delete = %v", l)
	}
	if code, _ := c.do("DELETE", "/instances/never", nil); code != 204 {
		t.Fatalf("delete unknown = %d", code)
	}
}

func TestRegisterGeneratesIDAndKeepsOrder(t *testing.T) {
	c := startCoord(t, nil)
	got := c.must("POST", "/instances", map[string]any{"ip": "10.0.0.5", "http_port": 8080, "instance_id": "  "}, 200)
	id := got["instance_id"].(string)
	if !regexp.MustCompile(`^mp-[0-9a-f]{32}$`).MatchString(id) {
		t.Fatalf("generated id %q", id)
	}
	c.must("POST", "/instances", map[string]any{"instance_id": "b", "ip": "h", "http_port": 1}, 200)
	c.must("POST", "/instances", map[string]any{"instance_id": "c", "ip": "h", "http_port": 1}, 200)
	c.must("POST", "/instances", map[string]any{"instance_id": id, "ip": "h", "http_port": 2}, 200) // keeps position
	if l := ids(t, c); strings.Join(l, ",") != id+",b,c" {
		t.Fatalf("order %v", l)
	}
	c.do("DELETE", "/instances/b", nil)
	c.must("POST", "/instances", map[string]any{"instance_id": "b", "ip": "h", "http_port": 1}, 200) // moves to end
	if l := ids(t, c); strings.Join(l, ",") != id+",c,b" {
		t.Fatalf("order after re-add %v", l)
	}
}

func TestRegisterMetadataAndP2PFields(t *testing.T) {
	c := startCoord(t, nil)
	before := float64(time.Now().Unix())
	c.must("POST", "/instances", map[string]any{"instance_id": " n1 ", "ip": " 10.1.2.3 ", "http_port": "8080",
		"metadata": map[string]any{"zone": "a"}, "p2p_advertised_url": " tcp://10.1.2.3:7000 ", "mq_port": 5555, "extra": 1}, 200)
	e := c.must("GET", "/instances", nil, 200)["instances"].([]any)[0].(map[string]any)
	if e["instance_id"] != "n1" || e["ip"] != "10.1.2.3" || e["http_port"] != 8080.0 || e["p2p_advertised_url"] != "tcp://10.1.2.3:7000" ||
		e["mq_port"] != 5555.0 || e["metadata"].(map[string]any)["zone"] != "a" {
		t.Fatalf("entry %v", e)
	}
	if rt := e["registration_time"].(float64); rt < before-1 || rt > before+60 {
		t.Fatalf("registration_time %v", rt)
	}
	c.must("POST", "/instances", map[string]any{"instance_id": "n2", "ip": "h", "http_port": 1}, 200)
	e = c.must("GET", "/instances", nil, 200)["instances"].([]any)[1].(map[string]any)
	if e["p2p_advertised_url"] != "" || e["mq_port"] != 0.0 || len(e["metadata"].(map[string]any)) != 0 {
		t.Fatalf("defaults %v", e)
	}
}

func TestRegisterValidation422(t *testing.T) {
	c := startCoord(t, nil)
	cases := []struct {
		name string
		body any
		loc  string
	}{
		{"missing ip and port", map[string]any{"instance_id": "x"}, "ip"},
		{"port not int", map[string]any{"ip": "h", "http_port": "nope"}, "http_port"},
		{"port fractional", map[string]any{"ip": "h", "http_port": 8080.5}, "http_port"},
		{"port zero", map[string]any{"ip": "h", "http_port": 0}, "http_port"},
		{"port too big", map[string]any{"ip": "h", "http_port": 65536}, "http_port"},
		{"blank ip", map[string]any{"ip": "   ", "http_port": 1}, "ip"},
		{"ip not string", map[string]any{"ip": 5, "http_port": 1}, "ip"},
		{"metadata value not string", map[string]any{"ip": "h", "http_port": 1, "metadata": map[string]any{"a": 1}}, "metadata"},
		{"mq_port out of range", map[string]any{"ip": "h", "http_port": 1, "mq_port": 70000}, "mq_port"},
		{"missing body", nil, "body"},
		{"malformed json", "{", "body"},
		{"array body", "[]", "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := c.must("POST", "/instances", tc.body, 422)
			d := m["detail"].([]any)[0].(map[string]any)
			loc := d["loc"].([]any)
			if loc[0] != "body" || (tc.loc != "body" && loc[1] != tc.loc) {
				t.Fatalf("loc %v, want %s", loc, tc.loc)
			}
		})
	}
	if l := ids(t, c); len(l) != 0 {
		t.Fatalf("a rejected registration was recorded: %v", l)
	}
}

// TestHealthSweepDropsSilentInstance is research 10.4: a never-heartbeating
// instance disappears; a heartbeating one stays. The heartbeats go out
// back to back, so only a stall of a whole second (the timeout) could
// drop the live one.
func TestHealthSweepDropsSilentInstance(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) {
		cfg.InstanceTimeout = 1
		cfg.HealthCheckInterval = 0.05
	})
	c.must("POST", "/instances", map[string]any{"instance_id": "silent", "ip": "h", "http_port": 1}, 200)
	c.must("POST", "/instances", map[string]any{"instance_id": "alive", "ip": "h", "http_port": 1}, 200)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				if code, _ := c.do("PUT", "/instances/alive/heartbeat", nil); code != 200 {
					t.Errorf("heartbeat of the live instance = %d", code)
					return
				}
			}
		}
	}()
	waitFor(t, "silent instance to be swept", func() bool {
		l := ids(t, c)
		return len(l) == 1 && l[0] == "alive"
	})
	close(stop)
	<-done
	code, _ := c.do("PUT", "/instances/silent/heartbeat", nil)
	if code != 404 {
		t.Fatalf("heartbeat after sweep = %d", code)
	}
}

func TestHealthSweepDisabledAtZero(t *testing.T) {
	c := startCoord(t, func(cfg *config.Config) {
		cfg.InstanceTimeout = 0.01
		cfg.HealthCheckInterval = 0
		cfg.EvictionCheckInterval = 0.01
	})
	c.must("POST", "/instances", map[string]any{"instance_id": "x", "ip": "h", "http_port": 1}, 200)
	// No sweep loop is registered; ten eviction cycles at the timeout's
	// interval give a wrong one ample chances to sweep.
	waitFor(t, "ten eviction cycles", func() bool { return c.threads()[coordinator.LoopEviction].TotalRuns >= 10 })
	if th := c.threads(); len(th) != 2 || th[coordinator.LoopLedgerReserve].Name == "" {
		t.Fatalf("loops with the sweep disabled: %v, want only eviction and the ledger reserve", th)
	}
	if l := ids(t, c); len(l) != 1 {
		t.Fatalf("instance swept with the sweep disabled: %v", l)
	}
	// A stale instance still heartbeats until a sweep removes it.
	c.must("PUT", "/instances/x/heartbeat", nil, 200)
}
