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
		if len(want) != 2 || fmt.Sprint(got) != fmt.Sprint(want) || want["s1"] <= 0 || want["s2"] <= 0 {
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
