package httpapi_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// keysFor computes the keys the server derives for toks (world size 1).
func keysFor(t *testing.T, toks []int64, salt string) []objkey.Key {
	t.Helper()
	h, err := tokenhash.New(tokenhash.Blake3, testChunk)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := h.ChunkHashes(toks)
	if err != nil {
		t.Fatal(err)
	}
	ks, err := objkey.FanOut(hs, testModel, 1, -1, nil, salt)
	if err != nil {
		t.Fatal(err)
	}
	return ks[0]
}

func tokSlice(start, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(start + i)
	}
	return out
}

func TestCacheObjectsListAndDelete(t *testing.T) {
	e := start(t, envOpts{})
	if m := e.store(tokens(0, 3*testChunk+5), "user-a", payload(3, 1)); m["chunks"] != float64(3) || m["stored"] != float64(3) {
		t.Fatalf("store = %v", m)
	}
	e.store(tokens(1000, testChunk), "", payload(1, 2))
	ents := e.waitListed(4) // the first adapter's listing (fs)
	// Each adapter uploads on its own workers: fs holding all four says
	// nothing about dax.
	daxQuery := "/cache/objects?adapter=dax&model_name=" + testModel
	waitFor(t, "4 entries listed by dax", func() bool {
		m := e.expect(200, "GET", daxQuery, nil).json(t)
		return len(m["entries"].([]any)) == 4
	})
	first := ents[0].(map[string]any)
	key := first["key"].(map[string]any)
	for _, f := range []string{"chunk_hash_hex", "model_name", "kv_rank", "object_group_id", "cache_salt"} {
		if _, ok := key[f]; !ok {
			t.Fatalf("entry key lacks %q: %v", f, key)
		}
	}
	if first["size_bytes"] != float64(objBytes) || key["model_name"] != testModel {
		t.Fatalf("entry = %v", first)
	}

	// Pagination with an opaque token walks every entry exactly once.
	seen := map[string]bool{}
	tok := ""
	for pages := 0; ; pages++ {
		q := "/cache/objects?page_size=1"
		if tok != "" {
			q += "&page_token=" + tok
		}
		m := e.expect(200, "GET", q, nil).json(t)
		if m["adapter"] != "fs" {
			t.Fatalf("adapter = %v", m["adapter"])
		}
		for _, en := range m["entries"].([]any) {
			seen[en.(map[string]any)["key"].(map[string]any)["chunk_hash_hex"].(string)] = true
		}
		next, _ := m["next_page_token"].(string)
		if m["next_page_token"] == nil {
			break
		}
		tok = next
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
	}
	if len(seen) != 4 {
		t.Fatalf("paginated %d distinct keys, want 4", len(seen))
	}
	if m := e.expect(200, "GET", "/cache/objects?model_name=other", nil).json(t); len(m["entries"].([]any)) != 0 || m["next_page_token"] != nil {
		t.Fatalf("model filter = %v", m)
	}
	if m := e.expect(200, "GET", daxQuery, nil).json(t); m["adapter"] != "dax" || len(m["entries"].([]any)) != 4 {
		t.Fatalf("dax listing = %v", m)
	}
	for _, q := range []string{"page_size=0", "page_size=5001", "page_size=abc", "tier=x"} {
		m := e.expect(422, "GET", "/cache/objects?"+q, nil).json(t)
		if _, ok := m["detail"].([]any); !ok {
			t.Errorf("%s: 422 body %v", q, m)
		}
	}
	e.expect(200, "GET", "/cache/objects?page_size=5000", nil)
	e.expect(200, "GET", "/cache/objects?page_size=1&tier=l2", nil)
	if m := e.expect(400, "GET", "/cache/objects?tier=l1", nil).json(t); m["detail"] != "tier 'l1' not supported; only 'l2'" {
		t.Fatalf("tier l1 = %v", m)
	}
	if m := e.expect(404, "GET", "/cache/objects?adapter=s3", nil).json(t); m["detail"] != "no L2 adapter with type_name='s3'" {
		t.Fatalf("unknown adapter = %v", m)
	}
	if m := e.expect(501, "GET", "/cache/objects?adapter=nolist", nil).json(t); !strings.Contains(m["detail"].(string), "does not support listing") {
		t.Fatalf("nolist = %v", m)
	}
	e.expect(400, "GET", "/cache/objects?page_token=%21%21not-base64", nil)

	// DELETE validation happens before any effect.
	ks := keysFor(t, tokSlice(0, 3*testChunk), "user-a")
	enc := func(k objkey.Key) map[string]any {
		return map[string]any{"chunk_hash_hex": k.HashHex(), "model_name": k.ModelName, "kv_rank": k.KVRank, "object_group_id": k.ObjectGroupID, "cache_salt": k.CacheSalt}
	}
	bad := []any{enc(ks[0]), map[string]any{"chunk_hash_hex": "zz", "model_name": testModel, "kv_rank": 0}}
	if m := e.expect(400, "DELETE", "/cache/objects", map[string]any{"keys": bad}).json(t); !strings.HasPrefix(m["detail"].(string), "keys[1]: ") {
		t.Fatalf("bad key = %v", m)
	}
	badSalt := []any{map[string]any{"chunk_hash_hex": "aa", "model_name": testModel, "kv_rank": 0, "cache_salt": "a/b"}}
	if m := e.expect(400, "DELETE", "/cache/objects", map[string]any{"keys": badSalt}).json(t); !strings.HasPrefix(m["detail"].(string), "keys[0]: ") {
		t.Fatalf("bad salt = %v", m)
	}
	many := make([]any, 10001)
	for i := range many {
		many[i] = map[string]any{"chunk_hash_hex": "aa", "model_name": "m", "kv_rank": 0}
	}
	if m := e.expect(400, "DELETE", "/cache/objects", map[string]any{"keys": many}).json(t); m["detail"] != "too many keys in a single request (limit=10000, got=10001)" {
		t.Fatalf("cap = %v", m)
	}
	e.expect(422, "DELETE", "/cache/objects", `{}`)
	e.expect(422, "DELETE", "/cache/objects", `{"keys":"x"}`)
	e.expect(422, "DELETE", "/cache/objects", `{"keys":[{"model_name":"m","kv_rank":0}]}`)
	e.expect(422, "DELETE", "/cache/objects", `not json`)
	if m := e.expect(404, "DELETE", "/cache/objects", map[string]any{"keys": []any{enc(ks[0])}, "adapter": "s3"}).json(t); m["detail"] != "no L2 adapter with type_name='s3'" {
		t.Fatalf("unknown adapter = %v", m)
	}
	e.waitListed(4) // nothing was deleted by the rejected requests

	path := filepath.Join(e.fsDir, ks[0].FSName())
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("object file missing before delete: %v", err)
	}
	m := e.expect(200, "DELETE", "/cache/objects", map[string]any{"keys": []any{enc(ks[0]), enc(ks[1])}}).json(t)
	if m["requested"] != float64(2) || m["adapter"] != "fs" || m["ok"] != true || m["deleted"] != float64(2) {
		t.Fatalf("delete = %v", m)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("object file still there after delete: %v", err)
	}
	e.waitListed(2)
	// Idempotent: absent keys are skipped silently.
	if m := e.expect(200, "DELETE", "/cache/objects", map[string]any{"keys": []any{enc(ks[0])}}).json(t); m["ok"] != true || m["deleted"] != float64(0) {
		t.Fatalf("repeat delete = %v", m)
	}
}

func TestPrefetchWarmsL1(t *testing.T) {
	e := start(t, envOpts{})
	toks := tokSlice(0, 2*testChunk+3)
	body := func(extra map[string]any) map[string]any {
		m := map[string]any{"model_name": testModel, "world_size": 1, "token_ids": toks, "cache_salt": "user-a"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	if m := e.expect(409, "POST", "/cache/prefetches", body(map[string]any{"world_size": 2})).json(t); !strings.Contains(m["detail"].(string), "no layout registered for model_name='org/model' world_size=2") {
		t.Fatalf("409 = %v", m)
	}
	e.expect(400, "POST", "/cache/prefetches", body(map[string]any{"cache_salt": "bad@salt"}))
	e.expect(400, "POST", "/cache/prefetches", body(map[string]any{"token_ids": make([]int, 1_000_001)}))
	e.expect(400, "POST", "/cache/prefetches", body(map[string]any{"source_tier": "l1"}))
	e.expect(400, "POST", "/cache/prefetches", body(map[string]any{"token_ids": []int64{-1}}))
	e.expect(422, "POST", "/cache/prefetches", `{"world_size":1}`)
	e.expect(422, "POST", "/cache/prefetches", body(map[string]any{"world_size": "one"}))
	e.expect(422, "POST", "/cache/prefetches", body(map[string]any{"world_size": 0}))
	if m := e.expect(202, "POST", "/cache/prefetches", body(map[string]any{"token_ids": tokSlice(0, testChunk-1)})).json(t); m["status"] != "noop" || m["chunks"] != float64(0) || m["request_id"] != nil {
		t.Fatalf("noop = %v", m)
	}

	data := payload(2, 9)
	e.store(tokens(0, 2*testChunk), "user-a", data)
	e.waitListed(2)
	e.expect(200, "POST", "/cache/clear", nil)
	kv := map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, 2*testChunk), httpapi.HeaderCacheSalt: "user-a"}
	waitFor(t, "L1 to be empty", func() bool {
		r := e.expect(200, "POST", "/api/kv/lookup", nil, kv).json(t)
		return r["l1_keys"] == float64(0)
	})

	m := e.expect(202, "POST", "/cache/prefetches", body(nil)).json(t)
	id, _ := m["request_id"].(string)
	if len(id) != 32 || m["chunks"] != float64(2) || m["status"] != "submitted" {
		t.Fatalf("submit = %v", m)
	}
	var done map[string]any
	waitFor(t, "prefetch completion", func() bool {
		r := e.expect(200, "GET", "/cache/prefetches/"+id, nil).json(t)
		if r["request_id"] != id {
			t.Fatalf("poll = %v", r)
		}
		if r["status"] == "completed" {
			done = r
			return true
		}
		if r["status"] != "pending" {
			t.Fatalf("poll = %v", r)
		}
		return false
	})
	if done["found_keys"] != float64(2) || done["total_keys"] != float64(2) {
		t.Fatalf("completed = %v", done)
	}
	// Exactly once: the next poll is 404.
	if r := e.expect(404, "GET", "/cache/prefetches/"+id, nil).json(t); !strings.Contains(r["detail"].(string), "unknown prefetch request_id") {
		t.Fatalf("second poll = %v", r)
	}
	// The warmed chunks are now L1 hits.
	r := e.expect(200, "POST", "/api/kv/lookup", nil, kv).json(t)
	if r["hit_chunks"] != float64(2) || r["l1_keys"] != float64(2) || r["l2_keys"] != float64(0) {
		t.Fatalf("lookup after warm = %v", r)
	}
}

func TestClear(t *testing.T) {
	e := start(t, envOpts{})
	e.store(tokens(0, testChunk), "", payload(1, 3))
	kv := map[string]string{httpapi.HeaderModel: testModel, httpapi.HeaderTokens: tokens(0, testChunk)}
	if r := e.expect(200, "POST", "/api/kv/lookup", nil, kv).json(t); r["l1_keys"] != float64(1) {
		t.Fatalf("lookup = %v", r)
	}
	if m := e.expect(400, "POST", "/cache/clear", `{"tier":"l2"}`).json(t); m["detail"] != "tier 'l2' not supported; only 'l1'" {
		t.Fatalf("l2 = %v", m)
	}
	e.expect(422, "POST", "/cache/clear", `{"tier":"x"}`)
	e.expect(422, "POST", "/cache/clear", `{"force":"yes"}`)
	m := e.expect(200, "POST", "/cache/clear", `{"tier":"l1","force":false}`).json(t)
	if m["status"] != "ok" || m["cleared"].(map[string]any)["tier"] != "l1" {
		t.Fatalf("clear = %v", m)
	}
	if r := e.expect(200, "POST", "/api/kv/lookup", nil, kv).json(t); r["l1_keys"] != float64(0) {
		t.Fatalf("lookup after clear = %v", r)
	}
}

// blockReader is an in-test KV context: instance 0 has two layers of four
// blocks, instance 1 has no layers, instance 2 uses an unsupported format.
type blockReader struct{}

type layer struct{ idx int }

func (l layer) Block(id int) ([]byte, error) {
	if id < 0 || id >= 4 {
		return nil, fmt.Errorf("block %d out of range", id)
	}
	return bytes.Repeat([]byte{byte(l.idx*16 + id)}, 32), nil
}

func (blockReader) KVLayers(id int) ([]httpapi.KVLayer, error) {
	switch id {
	case 0:
		return []httpapi.KVLayer{layer{0}, layer{1}}, nil
	case 1:
		return nil, nil
	case 2:
		return nil, fmt.Errorf("cross-layer layout: %w", httpapi.ErrUnsupported)
	}
	return nil, fmt.Errorf("instance %d: %w", id, httpapi.ErrNotFound)
}

func md5hex(parts ...[]byte) string {
	h := md5New()
	for _, p := range parts {
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestChecksums(t *testing.T) {
	e := start(t, envOpts{})
	if m := e.expect(501, "POST", "/cache/checksums", `{"block_ids":[0],"chunk_size":1}`).json(t); m["detail"] != "checksum not supported for this engine type" {
		t.Fatalf("501 = %v", m)
	}
	e = start(t, envOpts{mutate: func(o *httpapi.Options) { o.KVBlocks = blockReader{} }})
	if m := e.expect(404, "POST", "/cache/checksums", `{"block_ids":[0],"chunk_size":1,"instance_id":7}`).json(t); m["detail"] != "instance_id 7 not registered" {
		t.Fatalf("404 = %v", m)
	}
	if m := e.expect(400, "POST", "/cache/checksums", `{"block_ids":[],"chunk_size":1}`).json(t); m["detail"] != "block_ids is required" {
		t.Fatalf("400 = %v", m)
	}
	if m := e.expect(400, "POST", "/cache/checksums", `{"block_ids":[0],"chunk_size":0}`).json(t); m["detail"] != "chunk_size must be positive" {
		t.Fatalf("400 = %v", m)
	}
	e.expect(400, "POST", "/cache/checksums", `{"block_ids":[0]}`)
	if m := e.expect(404, "POST", "/cache/checksums", `{"block_ids":[0],"chunk_size":1,"instance_id":1}`).json(t); m["detail"] != "kv_caches empty" {
		t.Fatalf("empty = %v", m)
	}
	e.expect(501, "POST", "/cache/checksums", `{"block_ids":[0],"chunk_size":1,"instance_id":2}`)
	e.expect(422, "POST", "/cache/checksums", `{"block_ids":"0","chunk_size":1}`)
	e.expect(400, "POST", "/cache/checksums", `{"block_ids":[9],"chunk_size":1}`)

	blk := func(l, id int) []byte { b, _ := layer{l}.Block(id); return b }
	m := e.expect(200, "POST", "/cache/checksums", `{"block_ids":[0,2,3],"chunk_size":2}`).json(t)
	sums := m["chunk_checksums"].([]any)
	want0 := md5hex(blk(0, 0), blk(0, 2), blk(1, 0), blk(1, 2))
	want1 := md5hex(blk(0, 3), blk(1, 3))
	if m["status"] != "success" || m["num_chunks"] != float64(2) || m["layerwise"] != false || len(sums) != 2 || sums[0] != want0 || sums[1] != want1 {
		t.Fatalf("checksums = %v (want %s %s)", m, want0, want1)
	}
	if m["block_id_ranges"] != "0,[2,3]" {
		t.Fatalf("block_id_ranges = %v", m["block_id_ranges"])
	}
	m = e.expect(200, "POST", "/cache/checksums", `{"block_ids":[0,2,3],"chunk_size":2,"layerwise":true}`).json(t)
	lw := m["chunk_checksums"].(map[string]any)
	if l1 := lw["layer_1"].([]any); len(lw) != 2 || l1[0] != md5hex(blk(1, 0), blk(1, 2)) || l1[1] != md5hex(blk(1, 3)) {
		t.Fatalf("layerwise = %v", lw)
	}
}

// reusingReader is blockReader's instance 0 served the way a zero-copy
// reader would: every Block call overwrites and returns the same buffer,
// which KVLayer allows.
type reusingReader struct{ buf []byte }

type reusingLayer struct {
	r   *reusingReader
	idx int
}

func (l reusingLayer) Block(id int) ([]byte, error) {
	b, err := layer{l.idx}.Block(id)
	if err != nil {
		return nil, err
	}
	l.r.buf = append(l.r.buf[:0], b...)
	return l.r.buf, nil
}

func (r *reusingReader) KVLayers(id int) ([]httpapi.KVLayer, error) {
	if id != 0 {
		return nil, fmt.Errorf("instance %d: %w", id, httpapi.ErrNotFound)
	}
	return []httpapi.KVLayer{reusingLayer{r, 0}, reusingLayer{r, 1}}, nil
}

// TestChecksumsHashEachBlockAsRead: POST /cache/checksums hashes every
// block as it is read and keeps none, so a request holds one block at a
// time rather than a copy of every (layer, block) it names (16 MiB of
// block ids over tens of layers was terabytes). A reader that reuses one
// buffer shows it: kept blocks would all be the last one read.
func TestChecksumsHashEachBlockAsRead(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.KVBlocks = &reusingReader{} }})
	blk := func(l, id int) []byte { b, _ := layer{l}.Block(id); return b }
	m := e.expect(200, "POST", "/cache/checksums", `{"block_ids":[0,2,3],"chunk_size":2}`).json(t)
	want := []any{md5hex(blk(0, 0), blk(0, 2), blk(1, 0), blk(1, 2)), md5hex(blk(0, 3), blk(1, 3))}
	if got := m["chunk_checksums"]; !reflect.DeepEqual(got, want) {
		t.Fatalf("chunk_checksums = %v, want %v", got, want)
	}
	m = e.expect(200, "POST", "/cache/checksums", `{"block_ids":[0,2,3],"chunk_size":2,"layerwise":true}`).json(t)
	wantLW := map[string]any{
		"layer_0": []any{md5hex(blk(0, 0), blk(0, 2)), md5hex(blk(0, 3))},
		"layer_1": []any{md5hex(blk(1, 0), blk(1, 2)), md5hex(blk(1, 3))},
	}
	if got := m["chunk_checksums"]; !reflect.DeepEqual(got, wantLW) {
		t.Fatalf("layerwise chunk_checksums = %v, want %v", got, wantLW)
	}
	// A bad block id anywhere is still the 400 before any answer.
	e.expect(400, "POST", "/cache/checksums", `{"block_ids":[0,9],"chunk_size":1}`)
}

// gatedReader is one layer whose first Block call waits until the request
// that asked for it has ended (its context is handed over by the test's
// handler wrapper), and which counts its calls.
type gatedReader struct {
	reqCtx chan context.Context
	mu     sync.Mutex
	calls  int
}

func (g *gatedReader) KVLayers(int) ([]httpapi.KVLayer, error) { return []httpapi.KVLayer{g}, nil }

func (g *gatedReader) Block(id int) ([]byte, error) {
	g.mu.Lock()
	g.calls++
	first := g.calls == 1
	g.mu.Unlock()
	if first {
		select {
		case ctx := <-g.reqCtx:
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				return nil, errors.New("the request context was not cancelled")
			}
		case <-time.After(10 * time.Second):
			return nil, errors.New("no request context")
		}
	}
	return []byte{byte(id)}, nil
}

// TestChecksumsStopWhenClientGoes: POST /cache/checksums stops reading
// blocks once its client has gone (a request may name millions of blocks
// per layer, and nobody reads the answer), instead of hashing every one.
func TestChecksumsStopWhenClientGoes(t *testing.T) {
	g := &gatedReader{reqCtx: make(chan context.Context, 1)}
	srv, err := httpapi.New(httpapi.Options{KVBlocks: g, ChunkSize: testChunk, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{L1SizeBytes: 1 << 20}, nil, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
		if err := eng.CloseChecked(); err != nil {
			t.Error(err)
		}
	}()
	wg.Go(func() { _ = eng.Run(ctx) })
	if err := srv.SetEngine(eng); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the engine to become ready", eng.Ready)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	handlerDone := make(chan struct{})
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(handlerDone)
		g.reqCtx <- r.Context()
		srv.Handler().ServeHTTP(w, r)
	})}
	wg.Go(func() { _ = hs.Serve(ln) })
	defer hs.Close()

	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = strconv.Itoa(i % 256)
	}
	body := `{"block_ids":[` + strings.Join(ids, ",") + `],"chunk_size":1}`
	cctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(cctx, "POST", "http://"+ln.Addr().String()+"/cache/checksums", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	errc := make(chan error, 1)
	go func() {
		res, err := (&http.Client{Transport: tr}).Do(req)
		if err == nil {
			res.Body.Close()
		}
		errc <- err
	}()
	// Cancel once the handler is reading its first block.
	waitFor(t, "the first block read", func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.calls > 0 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	select {
	case <-handlerDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not return")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.calls != 1 {
		t.Errorf("read %d of the 10000 blocks in all, want 1 (the one being read when the client went away)", g.calls)
	}
}

// TestChecksumsHugeChunkSize: a chunk_size near the int maximum is one
// chunk over every block. The chunk count was (n + chunk_size - 1) /
// chunk_size, whose sum overflowed to a negative count, and the handler
// panicked allocating it (a 500 the route does not document).
func TestChecksumsHugeChunkSize(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.KVBlocks = blockReader{} }})
	blk := func(l, id int) []byte { b, _ := layer{l}.Block(id); return b }
	m := e.expect(200, "POST", "/cache/checksums", `{"block_ids":[0,1],"chunk_size":9223372036854775807}`).json(t)
	want := []any{md5hex(blk(0, 0), blk(0, 1), blk(1, 0), blk(1, 1))}
	if m["num_chunks"] != float64(1) || !reflect.DeepEqual(m["chunk_checksums"], want) {
		t.Fatalf("checksums = %v, want one chunk %v", m, want)
	}
	m = e.expect(200, "POST", "/cache/checksums", `{"block_ids":[0,1,2],"chunk_size":9223372036854775807,"layerwise":true}`).json(t)
	if lw := m["chunk_checksums"].(map[string]any); len(lw["layer_0"].([]any)) != 1 {
		t.Fatalf("layerwise = %v, want one chunk per layer", lw)
	}
}
