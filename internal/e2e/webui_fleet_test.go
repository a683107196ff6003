package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
)

// The coordinator console's figures that come from GET /ui/api/fleet (last
// heartbeat, eviction watermark, relayed prefetches), checked from
// TestWebConsoleFleet against the JSON routes.

type fleetView struct {
	Instances []struct {
		InstanceID string `json:"instance_id"`
	} `json:"instances"`
	Salts []struct {
		CacheSalt           string `json:"cache_salt"`
		EvictionStartsBytes *int64 `json:"eviction_starts_bytes"`
		OverWatermark       bool   `json:"over_watermark"`
	} `json:"salts"`
	Prefetches struct {
		InFlight  int   `json:"in_flight"`
		Submitted int64 `json:"submitted"`
		Completed int64 `json:"completed"`
	} `json:"prefetches"`
}

func getFleet(t *testing.T, coordURL, tok string) fleetView {
	t.Helper()
	var v fleetView
	if code, _ := call(t, "GET", coordURL+"/ui/api/fleet", nil, map[string]string{"Authorization": "Bearer " + tok}, &v); code != http.StatusOK {
		t.Fatalf("GET /ui/api/fleet: %d", code)
	}
	return v
}

// consoleFleetFigures: each fleet row's last heartbeat equals GET
// /instances' last_heartbeat_time, and the salt's "eviction starts at"
// equals GET /ui/api/fleet's (0.8 x 0.5 GiB, not reached); the token
// state reads wantState.
func consoleFleetFigures(t *testing.T, ctx context.Context, coordURL, tok, wantState string) {
	t.Helper()
	eventually(t, "last heartbeats equal GET /instances", func() string {
		var inst struct {
			Instances []struct {
				InstanceID        string  `json:"instance_id"`
				LastHeartbeatTime float64 `json:"last_heartbeat_time"`
			} `json:"instances"`
		}
		call(t, "GET", coordURL+"/instances", nil, nil, &inst)
		want := map[string]float64{}
		for _, in := range inst.Instances {
			want[in.InstanceID] = in.LastHeartbeatTime
		}
		var got map[string]float64
		eval(t, ctx, `Object.fromEntries([...document.querySelectorAll('#fleet-table tbody tr')].map(r => [r.dataset.id, Number(r.querySelector('[data-k=last_heartbeat_time]').dataset.value)]))`, &got)
		if len(want) != 3 || fmt.Sprint(got) != fmt.Sprint(want) || want["s1"] <= 0 || want["s2"] <= 0 || want[l1Instance] <= 0 {
			return fmt.Sprintf("page %v, route %v", got, want)
		}
		return ""
	})
	watermark, quotaBytes := 0.8, int64(1<<29) // --trigger-watermark 0.8 of the 0.5 GB quota
	starts := int64(watermark * float64(quotaBytes))
	eventually(t, "eviction watermark equals GET /ui/api/fleet", func() string {
		var route *int64
		over := true
		for _, s := range getFleet(t, coordURL, tok).Salts {
			if s.CacheSalt == salt {
				route, over = s.EvictionStartsBytes, s.OverWatermark
			}
		}
		var got struct {
			Starts float64 `json:"starts"`
			Over   string  `json:"over"`
			State  string  `json:"state"`
		}
		eval(t, ctx, `(() => { const r = document.querySelector('#quota-table tr[data-id="`+salt+`"]');
			return {starts: Number(r.querySelector('[data-k=eviction_starts_bytes]').dataset.value), over: r.querySelector('[data-k=over_watermark]').dataset.value,
				state: document.getElementById('auth-state').textContent}; })()`, &got)
		if route == nil || *route != starts || int64(got.Starts) != *route || over || got.Over != "no" || got.State != wantState {
			return fmt.Sprintf("page %+v, route %v over %v (want %d, state %q)", got, route, over, starts, wantState)
		}
		return ""
	})
}

// consolePrefetch reads the page's prefetch facts and whether the job's
// row is shown.
func consolePrefetch(t *testing.T, ctx context.Context, rid string) (inFlight, completed float64, row bool) {
	t.Helper()
	var got struct {
		InFlight, Completed float64
		Row                 bool
	}
	eval(t, ctx, `(() => { const v = k => Number(document.querySelector('#prefetch-facts [data-k='+k+']')?.dataset.value);
		return {InFlight: v('in_flight'), Completed: v('completed'), Row: document.querySelector('#prefetch-table tr[data-id="s1/`+rid+`"]') !== null}; })()`, &got)
	return got.InFlight, got.Completed, got.Row
}

// consolePrefetchInFlight submits a warm prefetch to s1 through the
// coordinator; the page shows it in flight, as the route does.
func consolePrefetchInFlight(t *testing.T, ctx context.Context, coordURL, tok string) string {
	t.Helper()
	var sub struct {
		RequestID string `json:"request_id"`
		Status    string `json:"status"`
	}
	body := map[string]any{"instance_id": "s1", "model_name": model, "world_size": 1, "token_ids": tokens(0), "cache_salt": salt}
	if code, _ := call(t, "POST", coordURL+"/cache/prefetches", body, map[string]string{"Authorization": "Bearer " + tok}, &sub); code != http.StatusOK || sub.Status != "submitted" || sub.RequestID == "" {
		t.Fatalf("POST /cache/prefetches: %d %+v", code, sub)
	}
	eventually(t, "the prefetch in flight on the page and the route", func() string {
		r := getFleet(t, coordURL, tok).Prefetches
		n, _, row := consolePrefetch(t, ctx, sub.RequestID)
		if r.InFlight != 1 || r.Submitted != 1 || n != float64(r.InFlight) || !row {
			return fmt.Sprintf("page in_flight %v row %v, route %+v", n, row, r)
		}
		return ""
	})
	return sub.RequestID
}

// consolePrefetchDone polls the job through the coordinator until it
// completes; then the page shows none in flight and one completed.
func consolePrefetchDone(t *testing.T, ctx context.Context, coordURL, tok, rid string) {
	t.Helper()
	waitFor(t, "the prefetch to complete", func() bool {
		var st struct {
			Status string `json:"status"`
		}
		code, _ := call(t, "GET", coordURL+"/cache/prefetches/s1/"+rid, nil, map[string]string{"Authorization": "Bearer " + tok}, &st)
		return code == http.StatusOK && st.Status == "completed"
	})
	eventually(t, "no prefetch in flight on the page and the route", func() string {
		r := getFleet(t, coordURL, tok).Prefetches
		n, done, row := consolePrefetch(t, ctx, rid)
		if r.InFlight != 0 || r.Completed != 1 || n != 0 || done != 1 || row {
			return fmt.Sprintf("page in_flight %v completed %v row %v, route %+v", n, done, row, r)
		}
		return ""
	})
}

// l1Instance is a registered instance that posts tier "l1" facts through
// POST /events, as newer upstream servers may (lmcache-go servers report
// L2 only): two keys of 4096 and 2048 bytes.
const l1Instance = "mp-l1"

const l1FactBytes, l1FactKeys = 4096 + 2048, 2

// postL1Facts registers l1Instance and posts its L1 store batch, shaped
// as upstream's HttpCacheEventSink posts it (the coordinator's
// cacheBatch fixture).
func postL1Facts(t *testing.T, coordURL, tok string) {
	t.Helper()
	auth := map[string]string{"Authorization": "Bearer " + tok}
	reg := map[string]any{"instance_id": l1Instance, "ip": "127.0.0.1", "http_port": freePort(t)}
	if code, _ := call(t, "POST", coordURL+"/instances", reg, auth, nil); code != http.StatusOK {
		t.Fatalf("register %s: %d", l1Instance, code)
	}
	entry := func(hash string, size int) map[string]any {
		return map[string]any{"key": map[string]any{"chunk_hash_hex": hash, "model_name": model, "kv_rank": 0, "cache_salt": "l1-only"},
			"size_bytes": size, "token_ids": []any{}, "token_offset": -1}
	}
	batch := map[string]any{"instance_id": l1Instance, "incarnation": 7, "seq": 1, "event_type": "store", "tier": "l1", "backend": "dram",
		"entries": []any{entry("a1", 4096), entry("a2", 2048)}, "shared": false, "ts": 1767225600.25, "capacity_bytes": 0, "capacity_revision": 0}
	var reply struct {
		Applied int `json:"applied"`
	}
	if code, _ := call(t, "POST", coordURL+"/events", map[string]any{"batches": []any{batch}}, auth, &reply); code != http.StatusOK || reply.Applied != 1 {
		t.Fatalf("POST /events: %d %+v", code, reply)
	}
}

// consoleFleetL1: the fleet table's L1 cells read "not reported" for s1
// and s2 (GET /instances says 0 for them, and /ui/api/fleet l1_reported
// false) and, for l1Instance, the bytes and keys GET /instances reports.
func consoleFleetL1(t *testing.T, ctx context.Context, coordURL string) {
	t.Helper()
	type l1 struct {
		Bytes, Keys string
	}
	eventually(t, "fleet L1 cells equal GET /instances and l1_reported", func() string {
		var inst struct {
			Instances []struct {
				InstanceID  string `json:"instance_id"`
				L1UsedBytes int64  `json:"l1_used_bytes"`
				L1Keys      int    `json:"l1_keys"`
			} `json:"instances"`
		}
		call(t, "GET", coordURL+"/instances", nil, nil, &inst)
		var fv struct {
			Instances []struct {
				InstanceID string `json:"instance_id"`
				L1Reported bool   `json:"l1_reported"`
			} `json:"instances"`
		}
		call(t, "GET", coordURL+"/ui/api/fleet", nil, nil, &fv)
		reported := map[string]bool{}
		for _, in := range fv.Instances {
			reported[in.InstanceID] = in.L1Reported
		}
		want := map[string]l1{}
		for _, in := range inst.Instances {
			if reported[in.InstanceID] {
				want[in.InstanceID] = l1{fmt.Sprintf("%d %d", in.L1UsedBytes, in.L1UsedBytes), fmt.Sprintf("%d %d", in.L1Keys, in.L1Keys)}
			} else {
				want[in.InstanceID] = l1{fmt.Sprintf("not reported %d", in.L1UsedBytes), fmt.Sprintf("not reported %d", in.L1Keys)}
			}
		}
		// Each cell as "<text> <data-value>", with the value of an
		// unreported one read as the route's 0.
		var got map[string]l1
		eval(t, ctx, `(() => { const c = (r, k) => { const td = r.querySelector('[data-k='+k+']');
				return td.textContent === 'not reported' ? 'not reported ' + Number(td.dataset.value) : td.dataset.value + ' ' + td.dataset.value; };
			return Object.fromEntries([...document.querySelectorAll('#fleet-table tbody tr')].map(r => [r.dataset.id, {Bytes: c(r, 'l1_used_bytes'), Keys: c(r, 'l1_keys')}])); })()`, &got)
		wantFixed := map[string]l1{"s1": {"not reported 0", "not reported 0"}, "s2": {"not reported 0", "not reported 0"},
			l1Instance: {fmt.Sprintf("%d %d", l1FactBytes, l1FactBytes), fmt.Sprintf("%d %d", l1FactKeys, l1FactKeys)}}
		if fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(want) != fmt.Sprint(wantFixed) {
			return fmt.Sprintf("page %v, routes %v, want %v", got, want, wantFixed)
		}
		var text string
		eval(t, ctx, `document.querySelector('#fleet-table tr[data-id="`+l1Instance+`"] [data-k=l1_used_bytes]').textContent`, &text)
		if text != "6.0 KiB" {
			return fmt.Sprintf("%s L1 used reads %q, want 6.0 KiB", l1Instance, text)
		}
		return ""
	})
}

// consoleServerFigures: a server page's models equal GET /status'
// model_layouts (the --register-model layout: "org/m (world 1)"), adapter
// 0's breaker cell reads wantBreaker as /status' breaker_state does ("no
// breaker" where the adapter reports none) with the gauge at 0 (closed or
// no breaker), and the periodic-thread table's health per thread and the
// overall verdict equal /periodic-threads and /periodic-threads-health.
func consoleServerFigures(t *testing.T, ctx context.Context, url string, auth map[string]string, wantBreaker string) {
	t.Helper()
	eventually(t, "models, breaker and thread health equal the routes on "+url, func() string {
		var st struct {
			ModelLayouts []struct {
				ModelName string `json:"model_name"`
				WorldSize int    `json:"world_size"`
			} `json:"model_layouts"`
			StorageManager struct {
				L2 []map[string]any `json:"l2_adapters"`
			} `json:"storage_manager"`
		}
		call(t, "GET", url+"/status", nil, auth, &st)
		var loops struct {
			Threads []struct {
				Name string `json:"name"`
			} `json:"threads"`
		}
		call(t, "GET", url+"/periodic-threads", nil, auth, &loops)
		var health struct {
			Healthy          bool `json:"healthy"`
			UnhealthyCount   int  `json:"unhealthy_count"`
			UnhealthyThreads []struct {
				Name string `json:"name"`
			} `json:"unhealthy_threads"`
		}
		call(t, "GET", url+"/periodic-threads-health", nil, auth, &health)
		if len(st.ModelLayouts) != 1 || len(st.StorageManager.L2) != 1 {
			return fmt.Sprintf("status model_layouts %+v, l2_adapters %v", st.ModelLayouts, st.StorageManager.L2)
		}
		wantModels := fmt.Sprintf("%s (world %d)", st.ModelLayouts[0].ModelName, st.ModelLayouts[0].WorldSize)
		routeBreaker, _ := st.StorageManager.L2[0]["breaker_state"].(string)
		gauge := metricSum(t, url, "lmcache_mp_l2_breaker_state")
		stuck := map[string]bool{}
		for _, u := range health.UnhealthyThreads {
			stuck[u.Name] = true
		}
		wantLoops := map[string]string{}
		for _, l := range loops.Threads {
			wantLoops[l.Name] = map[bool]string{true: "stuck", false: "ok"}[stuck[l.Name]]
		}
		var got struct {
			Models, ModelCount, BreakerText, BreakerValue, Healthy, Unhealthy string
			Loops                                                             map[string]string
		}
		// Null-safe: until the page's first refresh has drawn a table its
		// cells are missing, which reads as "" and is retried.
		eval(t, ctx, `(() => { const dd = k => document.querySelector('dd[data-k='+k+']');
			const b = document.querySelector('#adapters-table tr[data-id="0"] [data-k=breaker_state]');
			return {Models: dd('models')?.textContent ?? '', ModelCount: dd('models')?.dataset.value ?? '',
				BreakerText: b?.textContent ?? '', BreakerValue: b?.dataset.value ?? '',
				Healthy: dd('threads_healthy')?.dataset.value ?? '', Unhealthy: dd('unhealthy_count')?.dataset.value ?? '',
				Loops: Object.fromEntries([...document.querySelectorAll('#loops-table tbody tr')].map(r => [r.dataset.id, r.querySelector('[data-k=health]')?.dataset.value ?? '']))}; })()`, &got)
		breakerText := wantBreaker
		if wantBreaker == "" {
			breakerText = "no breaker"
		}
		switch {
		case got.Models != wantModels || wantModels != model+" (world 1)" || got.ModelCount != "1":
			return fmt.Sprintf("models: page %q (%s), route %q", got.Models, got.ModelCount, wantModels)
		case got.BreakerValue != routeBreaker || routeBreaker != wantBreaker || got.BreakerText != breakerText || gauge != 0:
			return fmt.Sprintf("breaker: page %q/%q, route %q, gauge %v, want %q", got.BreakerText, got.BreakerValue, routeBreaker, gauge, wantBreaker)
		case fmt.Sprint(got.Loops) != fmt.Sprint(wantLoops) || wantLoops["SessionManager-cleanup-thread-mq"] != "ok":
			return fmt.Sprintf("thread health: page %v, routes %v", got.Loops, wantLoops)
		case got.Healthy != fmt.Sprint(health.Healthy) || !health.Healthy || got.Unhealthy != fmt.Sprint(health.UnhealthyCount) || health.UnhealthyCount != 0:
			return fmt.Sprintf("threads healthy: page %q/%q, route %+v", got.Healthy, got.Unhealthy, health)
		}
		return ""
	})
}
