package coordinator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// TestReRegistrationRefreshesLiveness: POST /instances for a registered id
// counts as its heartbeat for the liveness sweep. On the bubble's fake
// clock, with --instance-timeout 7 and a sweep every second, two instances
// register at t=0 and one re-registers at t=6.5 s, shortly before it
// would expire. The sweep at t=8 drops only the other one (silent 8 s >
// 7 s); the re-registered one, silent 1.5 s, stays until its own timeout
// runs out from the re-registration (t=13.5 s) and goes at the sweep
// after, t=14. GET /instances reports the re-registration time as its
// last heartbeat.
func TestReRegistrationRefreshesLiveness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		cfg := testConfig()
		cfg.InstanceTimeout = 7
		cfg.HealthCheckInterval = 1
		ln, stop := runPiped(t, cfg)
		defer stop()
		tr := &http.Transport{DisableKeepAlives: true,
			DialContext: func(context.Context, string, string) (net.Conn, error) { return ln.Dial(), nil }}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr}
		call := func(method, path string, body any) []byte {
			t.Helper()
			var rd io.Reader
			if body != nil {
				b, err := json.Marshal(body)
				if err != nil {
					t.Fatal(err)
				}
				rd = bytes.NewReader(b)
			}
			req, err := http.NewRequest(method, "http://coordinator"+path, rd)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: %d %s %v", method, path, resp.StatusCode, raw, err)
			}
			return raw
		}
		register := func(id string, wantRe bool) {
			t.Helper()
			raw := call("POST", "/instances", map[string]any{"instance_id": id, "ip": "h", "http_port": 1})
			var got struct {
				InstanceID   string `json:"instance_id"`
				ReRegistered bool   `json:"re_registered"`
			}
			if err := json.Unmarshal(raw, &got); err != nil || got.InstanceID != id || got.ReRegistered != wantRe {
				t.Fatalf("register %s: %s (%v), want re_registered %v", id, raw, err, wantRe)
			}
		}
		// listed returns the registered ids and their last heartbeats, in
		// seconds after t0.
		listed := func() ([]string, map[string]float64) {
			t.Helper()
			var got struct {
				Instances []struct {
					InstanceID        string  `json:"instance_id"`
					LastHeartbeatTime float64 `json:"last_heartbeat_time"`
				} `json:"instances"`
			}
			if err := json.Unmarshal(call("GET", "/instances", nil), &got); err != nil {
				t.Fatal(err)
			}
			var ids []string
			beats := map[string]float64{}
			for _, in := range got.Instances {
				ids = append(ids, in.InstanceID)
				beats[in.InstanceID] = in.LastHeartbeatTime - float64(t0.UnixNano())/1e9
			}
			return ids, beats
		}
		at := func(d time.Duration) {
			t.Helper()
			time.Sleep(time.Until(t0.Add(d)))
			synctest.Wait()
		}

		register("refreshed", false)
		register("silent", false)
		at(6500 * time.Millisecond)
		register("refreshed", true)
		if ids, beats := listed(); !slices.Equal(ids, []string{"refreshed", "silent"}) || beats["refreshed"] != 6.5 || beats["silent"] != 0 {
			t.Fatalf("at 6.5 s: %v, last heartbeats %v; want both, refreshed at 6.5 s and silent at 0", ids, beats)
		}
		at(8500 * time.Millisecond)
		if ids, beats := listed(); !slices.Equal(ids, []string{"refreshed"}) || beats["refreshed"] != 6.5 {
			t.Fatalf("at 8.5 s (after the sweep that expires a t=0 heartbeat): %v, last heartbeats %v; want only refreshed, at 6.5 s", ids, beats)
		}
		at(13500 * time.Millisecond)
		if ids, _ := listed(); !slices.Equal(ids, []string{"refreshed"}) {
			t.Fatalf("at 13.5 s (sweep at 13 s, 6.5 s after the re-registration): %v, want [refreshed]", ids)
		}
		at(14500 * time.Millisecond)
		if ids, _ := listed(); len(ids) != 0 {
			t.Fatalf("at 14.5 s (sweep at 14 s, 7.5 s after the re-registration): %v, want none", ids)
		}
	})
}
