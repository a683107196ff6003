package e2e

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// noResync keeps a coordinator from listing the objects of the first server
// that registers.
var noResync = []string{"LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=False"}

// TestCoordinatorHelpHealthzAndSignals runs the real `lmcache coordinator`
// process: --help lists the flags with their defaults, it serves /healthz,
// logs its listen address, and SIGTERM and SIGINT both stop it with status
// 0. Bad values exiting 2 are in TestBadFlagsExitTwoWithOneLine.
func TestCoordinatorHelpHealthzAndSignals(t *testing.T) {
	code, stdout, _ := runBin(t, nil, "coordinator", "--help")
	if code != 0 || !strings.Contains(stdout, "  --timeout-keep-alive\n") || !strings.Contains(stdout, "(default 0.2; env LMCACHE_MP_COORDINATOR_EVICTION_RATIO)") {
		t.Fatalf("coordinator --help: exit %d\n%s", code, stdout)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		port := itoa(freePort(t))
		p := start(t, "coordinator-"+sig.String(), noResync, "coordinator", "--host", "127.0.0.1", "--port", port)
		base := "http://127.0.0.1:" + port
		waitFor(t, "healthz", healthy(base+"/healthz"))
		resp, err := client.Get(base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != `{"status":"healthy"}` {
			t.Fatalf("GET /healthz = %s", body)
		}
		p.StopWith(t, sig) // fails the test unless the exit status is 0
		if out := p.Output(t); !strings.Contains(out, "MP coordinator listening on "+base) {
			t.Fatalf("%v: startup log missing:\n%s", sig, out)
		}
	}
}

// recordingMP is an MP server's DELETE /cache/objects that records the keys
// of each request.
type recordingMP struct {
	*httptest.Server
	mu      sync.Mutex
	batches [][]objkey.Encoded
}

func newRecordingMP(t *testing.T) *recordingMP {
	m := &recordingMP{}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodDelete || r.URL.Path != "/cache/objects" {
			http.NotFound(w, r)
			return
		}
		var body struct {
			Keys []objkey.Encoded `json:"keys"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		m.mu.Lock()
		m.batches = append(m.batches, body.Keys)
		m.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"deleted":` + itoa(len(body.Keys)) + `,"skipped":0,"ok":true}`))
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *recordingMP) deletes() [][]objkey.Encoded {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([][]objkey.Encoded(nil), m.batches...)
}

// TestCoordinatorEvictsThroughMPServer runs `lmcache coordinator` as a
// process against a recording MP server: registration, event ingest, a
// quota of 0 and the eviction loop's DELETE /cache/objects naming exactly
// the stored keys, then a clean SIGTERM (checked by the process cleanup).
func TestCoordinatorEvictsThroughMPServer(t *testing.T) {
	port := itoa(freePort(t))
	start(t, "coordinator", noResync, "coordinator", "--host", "127.0.0.1", "--port", port, "--eviction-check-interval", "0.05")
	base := "http://127.0.0.1:" + port
	waitFor(t, "healthz", healthy(base+"/healthz"))

	mp := newRecordingMP(t)
	host, p, _ := net.SplitHostPort(strings.TrimPrefix(mp.URL, "http://"))
	mpPort, _ := strconv.Atoi(p)
	if code, _ := call(t, "POST", base+"/instances", map[string]any{"instance_id": "mp-1", "ip": host, "http_port": mpPort}, nil, nil); code != http.StatusOK {
		t.Fatalf("register: %d", code)
	}
	store := func(hash string) map[string]any {
		return map[string]any{"type": "store", "bytes": 100, "key": map[string]any{
			"chunk_hash_hex": hash, "model_name": "m", "kv_rank": 16777472, "object_group_id": 0, "cache_salt": "t"}}
	}
	if code, _ := call(t, "POST", base+"/quota/events", map[string]any{"instance_id": "mp-1", "seq": 1, "events": []any{store("0a"), store("0b")}}, nil, nil); code != http.StatusOK {
		t.Fatalf("events: %d", code)
	}
	if code, _ := call(t, "PUT", base+"/quota/t", map[string]any{"limit_gb": 0}, nil, nil); code != http.StatusOK {
		t.Fatalf("PUT quota: %d", code)
	}
	waitFor(t, "eviction DELETE", func() bool { return len(mp.deletes()) > 0 })
	var got []string
	for _, k := range mp.deletes()[0] {
		got = append(got, k.CacheSalt+"/"+k.ChunkHashHex)
	}
	if strings.Join(got, ",") != "t/0a,t/0b" {
		t.Fatalf("victims %v, want t/0a,t/0b", got)
	}
}
