package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// eventStream is the coordinator's per-instance view of one event door
// (GET /instances, ours).
type eventStream struct {
	Incarnation int64 `json:"incarnation"`
	LastSeq     int64 `json:"last_seq"`
	GapDetected bool  `json:"gap_detected"`
	Applied     int64 `json:"applied"`
	Duplicates  int64 `json:"duplicates"`
	Stale       int64 `json:"stale"`
	Fences      int64 `json:"fences"`
}

type instanceEvents struct {
	InstanceID       string       `json:"instance_id"`
	EventStream      *eventStream `json:"event_stream"`
	QuotaEventStream *eventStream `json:"quota_event_stream"`
}

func startEventServer(t *testing.T, coordURL, dir string, endpoint ...string) (*proc, string) {
	t.Helper()
	adapter, _ := json.Marshal(map[string]any{"type": "fs", "base_path": dir})
	layout := fmt.Sprintf(`{"model_name":%q,"world_size":1,"num_layers":2,"hidden_size":64,"dtype":"float16","object_bytes":%d}`, model, objectBytes)
	httpPort := freePort(t)
	url := "http://127.0.0.1:" + itoa(httpPort)
	args := []string{"server", "--instance-id", "ev1", "--http-port", itoa(httpPort), "--port", itoa(freePort(t)),
		"--l1-size-gb", "0.0625", "--chunk-size", itoa(chunkSize), "--l2-adapter", string(adapter),
		"--register-model", layout, "--coordinator-url", coordURL, "--coordinator-advertise-ip", "127.0.0.1",
		"--coordinator-heartbeat-interval", "0.5", "--coordinator-event-reporting", "--coordinator-event-flush-interval", "0.2"}
	args = append(args, endpoint...)
	p := start(t, "server", nil, args...)
	waitFor(t, "server healthcheck", healthy(url+"/healthcheck"))
	return p, url
}

func storeChunks(t *testing.T, server string, from int) {
	t.Helper()
	hdr := map[string]string{"X-LMCache-Model": model, "X-LMCache-Tokens": tokenHeader(tokens(from)), "X-LMCache-Cache-Salt": salt}
	var res struct {
		Stored int `json:"stored"`
	}
	if code, _ := call(t, "POST", server+"/api/kv/store", bytes.Repeat([]byte{7}, 8*objectBytes), hdr, &res); code != http.StatusOK || res.Stored != 8 {
		t.Fatalf("store: %d %+v", code, res)
	}
}

// TestEventsFleetUsageThroughEvents runs `lmcache coordinator` and an
// `lmcache server` (fs L2) as processes, the server on the default
// --coordinator-event-endpoint auto. Its stores reach the coordinator
// through POST /events (the /events stream has a cursor, the /quota/events
// one none) and usage equals what was stored. A restart of the server (same
// --instance-id, a new incarnation) fences its previous incarnation: the
// L2 usage is kept, and the new stream's stores add to it.
func TestEventsFleetUsageThroughEvents(t *testing.T) {
	coord, coordURL := startEventsCoordinator(t)
	defer coord.Stop(t)
	usage := func() int64 {
		var q quotaView
		if code, _ := call(t, "GET", coordURL+"/quota/"+salt, nil, nil, &q); code != http.StatusOK {
			t.Fatalf("GET /quota/%s: %d", salt, code)
		}
		return gbToBytes(q.UsageGB)
	}
	row := func() instanceEvents {
		var got struct {
			Instances []instanceEvents `json:"instances"`
		}
		call(t, "GET", coordURL+"/instances", nil, nil, &got)
		for _, in := range got.Instances {
			if in.InstanceID == "ev1" {
				return in
			}
		}
		return instanceEvents{}
	}

	dir := t.TempDir()
	srv, server := startEventServer(t, coordURL, dir)
	storeChunks(t, server, 0)
	waitFor(t, "store events counted by the coordinator", func() bool { return usage() == 8*objectBytes })
	first := row()
	if first.EventStream == nil || first.QuotaEventStream != nil || first.EventStream.Incarnation <= 0 || first.EventStream.Applied < 1 ||
		first.EventStream.Duplicates != 0 || first.EventStream.Stale != 0 || first.EventStream.GapDetected {
		t.Fatalf("streams after the first server: events %+v quota %+v", first.EventStream, first.QuotaEventStream)
	}
	srv.Stop(t)

	srv, server = startEventServer(t, coordURL, dir)
	defer srv.Stop(t)
	storeChunks(t, server, 1000)
	waitFor(t, "the restarted server's stores", func() bool { return usage() == 16*objectBytes })
	second := row()
	if second.EventStream == nil || second.EventStream.Incarnation <= first.EventStream.Incarnation || second.EventStream.Fences != 1 || second.EventStream.Stale != 0 {
		t.Fatalf("stream after the restart: %+v (first incarnation %d)", second.EventStream, first.EventStream.Incarnation)
	}
	resp, err := client.Get(coordURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(raw), "lmcache_coordinator_event_gate_fences_total 1\n") ||
		!strings.Contains(string(raw), `lmcache_coordinator_event_gate_batches_total{door="quota_events",result="admitted"} 0`+"\n") {
		t.Fatalf("gate metrics:\n%s", raw)
	}
}

// specEraCoordinator is a stand-in for a coordinator that predates POST
// /events: membership answers as upstream's, /events is 404, and
// /quota/events batches are recorded.
type specEraCoordinator struct {
	mu         sync.Mutex
	eventsHits int
	seqs       []int64
	stored     int64
}

func (c *specEraCoordinator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "POST" && r.URL.Path == "/instances":
		var in struct {
			InstanceID string `json:"instance_id"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		_ = json.NewEncoder(w).Encode(map[string]any{"instance_id": in.InstanceID, "re_registered": false})
	case r.Method == "PUT" && strings.HasSuffix(r.URL.Path, "/heartbeat"):
		_, _ = w.Write([]byte(`{"instance_id":"ev1"}`))
	case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/instances/"):
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == "/events":
		c.eventsHits++
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"detail":"Not Found"}`))
	case r.Method == "POST" && r.URL.Path == "/quota/events":
		var b struct {
			Seq    int64 `json:"seq"`
			Events []struct {
				Type  string `json:"type"`
				Bytes int64  `json:"bytes"`
			} `json:"events"`
		}
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		c.seqs = append(c.seqs, b.Seq)
		for _, e := range b.Events {
			if e.Type == "store" {
				c.stored += e.Bytes
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]int{"recorded": len(b.Events)})
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// TestEventsFleetFallsBackToQuotaEvents: a real `lmcache server` on
// --coordinator-event-endpoint auto against a coordinator without POST
// /events tries /events once, then reports every store through
// /quota/events (seq 1, 2, ...), and the bytes recorded equal what was
// stored.
func TestEventsFleetFallsBackToQuotaEvents(t *testing.T) {
	stand := &specEraCoordinator{}
	hs := httptest.NewServer(stand)
	defer hs.Close()
	srv, server := startEventServer(t, hs.URL, t.TempDir(), "--coordinator-event-endpoint", "auto")
	defer srv.Stop(t)
	storeChunks(t, server, 0)
	storeChunks(t, server, 500)
	waitFor(t, "stores recorded through /quota/events", func() bool {
		stand.mu.Lock()
		defer stand.mu.Unlock()
		return stand.stored == 16*objectBytes
	})
	stand.mu.Lock()
	defer stand.mu.Unlock()
	if stand.eventsHits != 1 {
		t.Fatalf("/events tried %d times, want once (the fallback is remembered)", stand.eventsHits)
	}
	for i, s := range stand.seqs {
		if s != int64(i+1) {
			t.Fatalf("/quota/events seqs %v, want 1, 2, ...", stand.seqs)
		}
	}
}

// startEventsCoordinator runs `lmcache coordinator` on a free port with no
// startup resync and no eviction loop, waits until it is healthy and
// returns it with its base URL; the caller stops it.
func startEventsCoordinator(t *testing.T) (*proc, string) {
	t.Helper()
	coordPort := freePort(t)
	coordURL := "http://127.0.0.1:" + itoa(coordPort)
	coord := start(t, "coordinator", []string{"LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=false"},
		"coordinator", "--host", "127.0.0.1", "--port", itoa(coordPort), "--eviction-check-interval", "0", "--chunk-size", itoa(chunkSize))
	waitFor(t, "coordinator healthz", healthy(coordURL+"/healthz"))
	return coord, coordURL
}
