package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/httpapi"
)

// budgetRefusals is the refusal counter's value for route, scraped.
func budgetRefusals(e *env, route string) string {
	e.t.Helper()
	m := string(e.expect(200, "GET", "/metrics", nil).body)
	prefix := `lmcache_mp_http_kv_body_budget_refused_total{route="` + route + `"} `
	for _, l := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			return v
		}
	}
	e.t.Fatalf("no %s in /metrics", prefix)
	return ""
}

// budgetInUse is the in-use gauge's value, scraped.
func budgetInUse(e *env) int64 {
	e.t.Helper()
	v, ok := metricValue(e.t, string(e.expect(200, "GET", "/metrics", nil).body), "lmcache_mp_http_kv_body_budget_in_use_bytes")
	if !ok {
		e.t.Fatal("no lmcache_mp_http_kv_body_budget_in_use_bytes in /metrics")
	}
	return int64(v)
}

// nextHold is the size of the next reservation of the KV budget, or a
// failure after 10 s without one.
func nextHold(t *testing.T, held <-chan int64) int64 {
	t.Helper()
	select {
	case n := <-held:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no reservation of the KV budget within 10 s")
		return 0
	}
}

// stallStore sends a raw-form store of body for toks with its headers and
// half its body, then stalls; the caller writes the rest on the returned
// connection.
func stallStore(t *testing.T, e *env, toks string, body []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // a hung server fails the test rather than hanging it
	fmt.Fprintf(c, "POST /api/kv/store HTTP/1.1\r\nHost: x\r\n%s: %s\r\n%s: %s\r\nContent-Length: %d\r\n\r\n",
		httpapi.HeaderModel, testModel, httpapi.HeaderTokens, toks, len(body))
	if _, err := c.Write(body[:len(body)/2]); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestKVBodyBudget: the KV stores in flight share one byte budget. While a
// store whose body is still arriving holds it, a second store is refused
// at once with 503, Retry-After and a JSON detail, counted once in
// lmcache_mp_http_kv_body_budget_refused_total{route="store"}, and stores
// nothing; once the first store is done the same request succeeds. A
// store larger than the whole budget is 413.
func TestKVBodyBudget(t *testing.T) {
	held := make(chan int64, 8)
	e := start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.KVBodyBudgetBytes = objBytes
		httpapi.OnBudgetAcquired(o, func(n int64) { held <- n })
	}})
	if got := budgetRefusals(e, "store"); got != "0" {
		t.Fatalf("refusals before = %s", got)
	}

	// The first store sends its headers and half its body, then stalls.
	first := payload(1, 3)
	c := stallStore(t, e, tokens(0, testChunk), first)
	if n := nextHold(t, held); n != objBytes {
		t.Fatalf("first store reserved %d bytes, want %d", n, objBytes)
	}

	second := map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(1000, testChunk)}
	r := e.expect(503, "POST", "/api/kv/store", payload(1, 5), second)
	if ra := r.header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After = %q, want 1", ra)
	}
	if m := r.json(t); !strings.Contains(fmt.Sprint(m["detail"]), "in-flight budget") {
		t.Errorf("503 body = %v", m)
	}
	if got := budgetRefusals(e, "store"); got != "1" {
		t.Errorf("refusals after one refused store = %s, want 1", got)
	}
	lookup := func(toks string) any {
		return e.expect(200, "POST", "/api/kv/lookup", nil, map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: toks}).json(t)["hit_chunks"]
	}
	if h := lookup(tokens(1000, testChunk)); h != float64(0) {
		t.Fatalf("the refused store was stored: hit_chunks %v", h)
	}

	// The first store completes and releases the budget.
	if _, err := c.Write(first[objBytes/2:]); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), `"stored":1`) {
		t.Fatalf("first store: %d %s", res.StatusCode, body)
	}
	if m := e.expect(200, "POST", "/api/kv/store", payload(1, 5), second).json(t); m["stored"] != float64(1) {
		t.Fatalf("retried store = %v", m)
	}
	nextHold(t, held)
	if h := lookup(tokens(1000, testChunk)); h != float64(1) {
		t.Fatalf("retried store: hit_chunks %v", h)
	}
	if got := budgetRefusals(e, "store"); got != "1" {
		t.Errorf("refusals at the end = %s, want 1", got)
	}

	// Two chunks are more than the whole budget: 413, not a 503 to retry.
	r = e.expect(413, "POST", "/api/kv/store", payload(2, 7), map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(2000, 2*testChunk)})
	if m := r.json(t); !strings.Contains(fmt.Sprint(m["detail"]), "exceeds the 1024-byte in-flight budget") {
		t.Errorf("413 body = %v", m)
	}
	// A raw retrieve holds a chunk twice (the copy out of L1 and the
	// joined body): one cached chunk is more than the whole budget, 413
	// rather than a miss.
	r = e.expect(413, "POST", "/api/kv/retrieve", nil, map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(1000, testChunk)})
	if m := r.json(t); !strings.Contains(fmt.Sprint(m["detail"]), "retrieve of 2048 bytes exceeds the 1024-byte in-flight budget") {
		t.Errorf("retrieve 413 body = %v", m)
	}
}

// TestKVRetrieveBudget: a retrieve answer is buffered twice in the raw
// form (the copy out of L1 and the joined body), and takes the KV budget
// for both. A cached prefix larger than the whole budget is answered cut
// to the longest prefix that fits, the hit headers counting what is
// returned; while a stalled store holds the budget, a retrieve is 503 with
// Retry-After, counted under route="retrieve". The framed form reserves
// each chunk once, and the in-use gauge shows what a stalled store holds.
func TestKVRetrieveBudget(t *testing.T) {
	held := make(chan int64, 8)
	e := start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.KVBodyBudgetBytes = 3 * objBytes
		httpapi.OnBudgetAcquired(o, func(n int64) { held <- n })
	}})
	data := payload(3, 11)
	e.store(tokens(0, 3*testChunk), "", data)
	if n := nextHold(t, held); n != 3*objBytes {
		t.Fatalf("the store reserved %d bytes, want %d", n, 3*objBytes)
	}
	hdr := map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, 3*testChunk)}
	r := e.expect(200, "POST", "/api/kv/retrieve", nil, hdr)
	if n := nextHold(t, held); n != 2*objBytes {
		t.Fatalf("the retrieve reserved %d bytes, want %d (one chunk, twice)", n, 2*objBytes)
	}
	if string(r.body) != string(data[:objBytes]) {
		t.Fatalf("retrieve answered %d bytes, want the first chunk's %d", len(r.body), objBytes)
	}
	if h := r.header.Get(httpapi.HeaderHitChunks); h != "1" {
		t.Fatalf("%s = %q, want 1", httpapi.HeaderHitChunks, h)
	}
	if got := budgetRefusals(e, "retrieve"); got != "0" {
		t.Fatalf("retrieve refusals before = %s", got)
	}
	// The framed form writes each object as it goes: once per chunk, so
	// the whole three-chunk prefix fits.
	frames := decodeFrames(t, streamRetrieve(e, 200, testModel, tokSlice(0, 3*testChunk), "").body)
	if n := nextHold(t, held); n != 3*objBytes {
		t.Fatalf("the framed retrieve reserved %d bytes, want %d (three chunks, once)", n, 3*objBytes)
	}
	if len(frames) != 4 {
		t.Fatalf("framed retrieve: %d frames, want a manifest and three chunks", len(frames))
	}
	if got := budgetInUse(e); got != 0 {
		t.Fatalf("budget in use with nothing in flight = %v", got)
	}

	stalled := payload(2, 13)
	c := stallStore(t, e, tokens(5000, 2*testChunk), stalled)
	if n := nextHold(t, held); n != 2*objBytes {
		t.Fatalf("the stalled store reserved %d bytes, want %d", n, 2*objBytes)
	}
	if got := budgetInUse(e); got != 2*objBytes {
		t.Fatalf("budget in use while the store stalls = %v, want %d", got, 2*objBytes)
	}
	r = e.expect(503, "POST", "/api/kv/retrieve", nil, hdr)
	if ra := r.header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After = %q, want 1", ra)
	}
	if got := budgetRefusals(e, "retrieve"); got != "1" {
		t.Errorf("retrieve refusals = %s, want 1", got)
	}
	if _, err := c.Write(stalled[len(stalled)/2:]); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("stalled store: %d", res.StatusCode)
	}
	if r := e.expect(200, "POST", "/api/kv/retrieve", nil, hdr); string(r.body) != string(data[:objBytes]) {
		t.Fatalf("retrieve after the store ended: %d bytes", len(r.body))
	}
}
