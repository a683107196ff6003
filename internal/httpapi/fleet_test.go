package httpapi_test

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordclient"
	"github.com/lmcache-go/lmcache/internal/coordinator"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// TestFleetWithRealCoordinator runs the real coordinator and one MP server
// (real engine, fs adapters, HTTP API, coordinator client): registration,
// store events from write-behind, warm prefetch through the coordinator's
// relay, and DELETE /cache/objects reaching the coordinator as delete
// events.
func TestFleetWithRealCoordinator(t *testing.T) {
	cfg := config.Default()
	cfg.Host, cfg.Port = "127.0.0.1", 0
	cfg.HealthCheckInterval, cfg.EvictionCheckInterval, cfg.EnableStartupResync = 0, 0, false
	cfg.ChunkSize = testChunk
	co, err := coordinator.New(cfg, coordinator.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	coURL := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = co.Run(ctx, ln) }()
	defer func() { cancel(); wg.Wait() }()

	e := start(t, envOpts{})
	_, portStr, _ := net.SplitHostPort(strings.TrimPrefix(e.base, "http://"))
	port, _ := strconv.Atoi(portStr)
	cc, err := coordclient.New(coordclient.Config{URL: coURL, AdvertiseIP: "127.0.0.1", HTTPPort: port, InstanceID: "mp-1",
		HeartbeatInterval: 50 * time.Millisecond, EventReporting: true, EventFlushInterval: 20 * time.Millisecond,
		Metrics: e.srv.Metrics(), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	e.eng.AddL2Listener(cc)
	cctx, ccancel := context.WithCancel(context.Background())
	wg.Add(1)
	go func() { defer wg.Done(); _ = cc.Run(cctx) }()
	defer ccancel()

	co2 := &env{t: t, base: coURL, hc: e.hc}
	waitFor(t, "registration", func() bool {
		var out struct{ Instances []map[string]any }
		_ = json.Unmarshal(co2.expect(200, "GET", "/instances", nil).body, &out)
		return len(out.Instances) == 1 && out.Instances[0]["http_port"] == float64(port)
	})
	usage := func() float64 {
		var out struct {
			TotalGB float64 `json:"total_gb"`
		}
		_ = json.Unmarshal(co2.expect(200, "GET", "/quota?tier=l2", nil).body, &out)
		return out.TotalGB * (1 << 30)
	}

	e.store(tokens(0, 2*testChunk), "tenant", payload(2, 4))
	ents := e.waitListed(2)
	waitFor(t, "store events at the coordinator", func() bool { return math.Abs(usage()-2*objBytes) < 0.5 })

	// Warm prefetch relayed by the coordinator.
	e.expect(200, "POST", "/cache/clear", nil)
	sub := co2.expect(200, "POST", "/cache/prefetches", map[string]any{
		"instance_id": "mp-1", "model_name": testModel, "world_size": 1, "token_ids": tokSlice(0, 2*testChunk), "cache_salt": "tenant",
	}).json(t)
	rid, _ := sub["request_id"].(string)
	if len(rid) != 32 || sub["chunks"] != float64(2) || sub["status"] != "submitted" {
		t.Fatalf("relayed submit = %v", sub)
	}
	waitFor(t, "relayed completion", func() bool {
		r := co2.do("GET", "/cache/prefetches/mp-1/"+rid, nil, nil)
		if r.code != http.StatusOK {
			t.Fatalf("relayed poll: %d %s", r.code, r.body)
		}
		m := r.json(t)
		return m["status"] == "completed" && m["found_keys"] == float64(2)
	})
	co2.expect(404, "GET", "/cache/prefetches/mp-1/"+rid, nil)
	kv := map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, 2*testChunk), httpapi.HeaderCacheSalt: "tenant"}
	if r := e.expect(200, "POST", "/api/kv/lookup", nil, kv).json(t); r["l1_keys"] != float64(2) {
		t.Fatalf("after relayed warm: %v", r)
	}

	// An operator DELETE reaches the coordinator as delete events.
	var keys []any
	for _, en := range ents {
		keys = append(keys, en.(map[string]any)["key"])
	}
	if m := e.expect(200, "DELETE", "/cache/objects", map[string]any{"keys": keys}).json(t); m["ok"] != true || m["deleted"] != float64(2) {
		t.Fatalf("delete = %v", m)
	}
	waitFor(t, "delete events at the coordinator", func() bool { return usage() == 0 })
}
