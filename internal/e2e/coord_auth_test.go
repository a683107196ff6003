package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCoordAuthFleetEviction runs `lmcache coordinator` with --auth-token
// and --mp-auth-token and one real `lmcache server` with --http-auth-token
// and --coordinator-auth-token over an fs L2 adapter, all as processes.
// The server registers and reports its stores with its token; the
// coordinator refuses a quota change without the token; with it, the
// eviction loop's DELETE /cache/objects (carrying the MP token) removes the
// files from the server's adapter, the delete events bring usage to zero,
// and neither process ever logs a token.
func TestCoordAuthFleetEviction(t *testing.T) {
	const (
		coordTok = "coord-e2e-s3cret"
		mpTok    = "mp-e2e-s3cret"
	)
	dir := t.TempDir()
	adapter, _ := json.Marshal(map[string]any{"type": "fs", "base_path": dir})
	layout := fmt.Sprintf(`{"model_name":%q,"world_size":1,"num_layers":2,"hidden_size":64,"dtype":"float16","object_bytes":%d}`, model, objectBytes)

	coordPort := freePort(t)
	coordURL := "http://127.0.0.1:" + itoa(coordPort)
	coord := start(t, "coordinator", []string{"LMCACHE_MP_COORDINATOR_AUTH_TOKEN=" + coordTok, "LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=false"},
		"coordinator", "--host", "127.0.0.1", "--port", itoa(coordPort), "--mp-auth-token", mpTok,
		"--eviction-check-interval", "0.2", "--chunk-size", itoa(chunkSize))
	waitFor(t, "coordinator healthz", healthy(coordURL+"/healthz"))

	httpPort := freePort(t)
	server := "http://127.0.0.1:" + itoa(httpPort)
	srv := start(t, "server", []string{"LMCACHE_COORDINATOR_AUTH_TOKEN=" + coordTok},
		"server", "--instance-id", "s1", "--http-port", itoa(httpPort), "--port", itoa(freePort(t)),
		"--http-auth-token", mpTok, "--l1-size-gb", "0.0625", "--chunk-size", itoa(chunkSize), "--l2-adapter", string(adapter),
		"--register-model", layout, "--coordinator-url", coordURL, "--coordinator-advertise-ip", "127.0.0.1",
		"--coordinator-heartbeat-interval", "0.5", "--coordinator-event-reporting", "--coordinator-event-flush-interval", "0.2")
	waitFor(t, "server healthcheck", healthy(server+"/healthcheck"))
	waitFor(t, "registration with the token", func() bool {
		var got struct {
			Instances []struct {
				InstanceID string `json:"instance_id"`
			} `json:"instances"`
		}
		call(t, "GET", coordURL+"/instances", nil, nil, &got)
		return len(got.Instances) == 1 && got.Instances[0].InstanceID == "s1"
	})

	mpAuth := map[string]string{"Authorization": "Bearer " + mpTok}
	coordAuth := map[string]string{"Authorization": "Bearer " + coordTok}
	hdr := map[string]string{"X-LMCache-Model": model, "X-LMCache-Tokens": tokenHeader(tokens(0)), "X-LMCache-Cache-Salt": salt, "Authorization": "Bearer " + mpTok}
	var res struct {
		Stored int `json:"stored"`
	}
	if code, _ := call(t, "POST", server+"/api/kv/store", bytes.Repeat([]byte{7}, 8*objectBytes), hdr, &res); code != http.StatusOK || res.Stored != 8 {
		t.Fatalf("store: %d %+v", code, res)
	}
	files := func() int {
		n := 0
		_ = filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
			if err == nil && info.Mode().IsRegular() {
				n++
			}
			return nil
		})
		return n
	}
	usage := func() int64 {
		var q quotaView
		if code, _ := call(t, "GET", coordURL+"/quota/"+salt, nil, nil, &q); code != http.StatusOK {
			t.Fatalf("GET /quota/%s: %d", salt, code)
		}
		return gbToBytes(q.UsageGB)
	}
	waitFor(t, "8 files in the adapter", func() bool { return files() == 8 })
	waitFor(t, "store events counted by the coordinator", func() bool { return usage() == 8*objectBytes })

	// No token, a wrong one, and the MP server's token are all refused, and
	// nothing changes.
	for _, h := range []map[string]string{nil, {"Authorization": "Bearer nope"}, mpAuth} {
		var body map[string]any
		if code, _ := call(t, "PUT", coordURL+"/quota/"+salt, map[string]any{"limit_gb": 0}, h, &body); code != http.StatusUnauthorized || body["detail"] != "missing or invalid bearer token" {
			t.Fatalf("PUT /quota with %v: %d %v", h, code, body)
		}
	}
	var q quotaView
	call(t, "GET", coordURL+"/quota/"+salt, nil, nil, &q)
	if q.QuotaLimitGB != 0 || files() != 8 {
		t.Fatalf("a refused quota applied: %+v, %d files", q, files())
	}

	if code, _ := call(t, "PUT", coordURL+"/quota/"+salt, map[string]any{"limit_gb": 0}, coordAuth, nil); code != http.StatusOK {
		t.Fatalf("PUT /quota with the token: %d", code)
	}
	waitFor(t, "eviction to empty the adapter", func() bool { return files() == 0 })
	waitFor(t, "delete events to bring usage to zero", func() bool { return usage() == 0 })
	var page struct {
		Entries []any `json:"entries"`
	}
	if code, _ := call(t, "GET", server+"/cache/objects", nil, mpAuth, &page); code != http.StatusOK || len(page.Entries) != 0 {
		t.Fatalf("server listing after eviction: %d %d entries", code, len(page.Entries))
	}
	var metrics bytes.Buffer
	resp, err := client.Get(coordURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = metrics.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(metrics.String(), "lmcache_coordinator_eviction_keys_dispatched_total 8\n") ||
		!strings.Contains(metrics.String(), "lmcache_coordinator_eviction_dispatch_failures_total 0\n") {
		t.Fatalf("dispatch metrics:\n%s", metrics.String())
	}

	srv.Stop(t)
	coord.Stop(t)
	for _, p := range []*proc{coord, srv} {
		out := p.Output(t)
		if strings.Contains(out, coordTok) || strings.Contains(out, mpTok) {
			t.Errorf("%s log contains a token", p.Name)
		}
	}
}
