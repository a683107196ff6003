package e2e

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
)

// TestEventsFleetFallsBackThroughRealCoordinator: the fallback against the
// real coordinator. A real `lmcache coordinator` is reached through a
// proxy that answers POST /events with the 404 a coordinator predating it
// gives (FastAPI's {"detail":"Not Found"}) and forwards everything else; a
// real `lmcache server` on --coordinator-event-endpoint auto tries /events
// once, then reports through /quota/events: the coordinator's usage equals
// what was stored, its instance row has a /quota/events stream (seq from 1)
// and no /events stream.
func TestEventsFleetFallsBackThroughRealCoordinator(t *testing.T) {
	coord, coordURL := startEventsCoordinator(t)
	defer coord.Stop(t)
	target, err := url.Parse(coordURL)
	if err != nil {
		t.Fatal(err)
	}
	fwd := httputil.NewSingleHostReverseProxy(target)
	var eventsHits atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/events" {
			eventsHits.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"detail":"Not Found"}`))
			return
		}
		fwd.ServeHTTP(w, r)
	}))
	defer proxy.Close()

	srv, server := startEventServer(t, proxy.URL, t.TempDir(), "--coordinator-event-endpoint", "auto")
	defer srv.Stop(t)
	storeChunks(t, server, 0)
	storeChunks(t, server, 500)
	waitFor(t, "stores counted by the real coordinator through /quota/events", func() bool {
		var q quotaView
		if code, _ := call(t, "GET", coordURL+"/quota/"+salt, nil, nil, &q); code != http.StatusOK {
			t.Fatalf("GET /quota/%s: %d", salt, code)
		}
		return gbToBytes(q.UsageGB) == 16*objectBytes
	})
	var got struct {
		Instances []instanceEvents `json:"instances"`
	}
	call(t, "GET", coordURL+"/instances", nil, nil, &got)
	var row instanceEvents
	for _, in := range got.Instances {
		if in.InstanceID == "ev1" {
			row = in
		}
	}
	if row.EventStream != nil || row.QuotaEventStream == nil || row.QuotaEventStream.LastSeq < 1 || row.QuotaEventStream.Duplicates != 0 || row.QuotaEventStream.GapDetected {
		t.Fatalf("instance streams: events %+v, quota events %+v", row.EventStream, row.QuotaEventStream)
	}
	if n := eventsHits.Load(); n != 1 {
		t.Fatalf("/events tried %d times, want once (the fallback is remembered)", n)
	}
}
