package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/dax"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/polltest"
)

// TestMain checks for leaked goroutines and, when the whole suite ran,
// that every documented (route, status) pair was observed by some test.
func TestMain(m *testing.M) {
	code := m.Run()
	full := flag.Lookup("test.run").Value.String() == "" && flag.Lookup("test.fuzz").Value.String() == ""
	if code == 0 && full {
		if msg := missingCoverage(); msg != "" {
			fmt.Fprintln(os.Stderr, "FAIL: documented statuses never observed:\n  "+msg)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const (
	testChunk = 16
	testModel = "org/model"
	// registerJSON gives 2 (K,V) * 2 layers * 16 tokens * 8 * 2 bytes = 1024 bytes per chunk object.
	registerJSON = `{"model_name":"org/model","world_size":1,"num_layers":2,"hidden_size":8,"dtype":"bfloat16"}`
	objBytes     = 1024
)

// coverage records which documented (route, status) pairs the tests saw.
var coverage = struct {
	sync.Mutex
	seen map[string]map[int]bool
}{seen: map[string]map[int]bool{}}

var patternMux = func() *http.ServeMux {
	m := http.NewServeMux()
	for _, r := range httpapi.Routes() {
		m.HandleFunc(r.Pattern, func(http.ResponseWriter, *http.Request) {})
	}
	return m
}()

func record(req *http.Request, code int) {
	_, pat := patternMux.Handler(req)
	if pat == "" {
		return
	}
	coverage.Lock()
	if coverage.seen[pat] == nil {
		coverage.seen[pat] = map[int]bool{}
	}
	coverage.seen[pat][code] = true
	coverage.Unlock()
}

// listlessAdapter is an fs adapter that refuses to list, as upstream's
// non-S3 adapters (fault injection for the 501 path).
type listlessAdapter struct{ *fs.Adapter }

func (listlessAdapter) TypeName() string { return "nolist" }
func (listlessAdapter) List(context.Context, string, int, string) (l2.Page, error) {
	return l2.Page{}, l2.ErrListUnsupported
}

// genFake is a generic engine.Reconfigurer named "gen" over a real fs
// adapter (the engine's pass-through path); it records calls and can fail
// with an adapter-chosen status.
type genFake struct {
	*fs.Adapter
	mu    sync.Mutex
	calls []map[string]any
}

func (*genFake) TypeName() string { return "gen" }

type statusErr struct {
	code int
	msg  string
}

func (e statusErr) Error() string   { return e.msg }
func (e statusErr) HTTPStatus() int { return e.code }

func (d *genFake) Reconfigure(_ context.Context, op string, args map[string]any) (map[string]any, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	call := map[string]any{"op": op}
	for k, v := range args {
		call[k] = v
	}
	d.calls = append(d.calls, call)
	if args["device_path"] == "/dev/busy" {
		return nil, statusErr{409, "device /dev/busy has locked slots"}
	}
	return map[string]any{"status": "ok", "operation": op, "adapter_index": 0, "args": args}, nil
}

func (d *genFake) ReconfigureStatus() map[string]any {
	return map[string]any{"backend": "gen", "supported_operations": []string{"status", "flush"}}
}

func (d *genFake) lastCall() map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.calls) == 0 {
		return nil
	}
	return d.calls[len(d.calls)-1]
}

type env struct {
	t      *testing.T
	base   string
	srv    *httpapi.Server
	eng    *engine.Engine
	fsA    *fs.Adapter
	fsDir  string
	dax    *dax.Adapter
	daxDir string
	gen    *genFake
	loops  *periodic.Registry
	hc     *http.Client
	token  string
}

type envOpts struct {
	noAdapters bool // no standard adapters (extraAdapt still apply)
	noEngine   bool // server without an engine: routes answer 503
	mutate     func(*httpapi.Options)
	extraAdapt []l2.Adapter
	shared     []int // adapter indices configured with "shared": true
}

func newFS(t *testing.T) (*fs.Adapter, string) {
	t.Helper()
	dir := t.TempDir()
	a, err := fs.New(fs.Config{BasePath: dir, PersistEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a, dir
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, o envOpts) *env {
	t.Helper()
	e := &env{t: t, loops: periodic.NewRegistry()}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var adapters []l2.Adapter
	if !o.noAdapters {
		e.fsA, e.fsDir = newFS(t)
		nl, _ := newFS(t)
		gf, _ := newFS(t)
		e.gen = &genFake{Adapter: gf}
		e.daxDir = t.TempDir()
		dev := filepath.Join(e.daxDir, "dax0")
		if err := os.WriteFile(dev, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		dx, err := dax.New(dax.Config{SlotBytes: objBytes, HotplugEnabled: true, Devices: []dax.DeviceConfig{{Path: dev, SizeBytes: 16 * objBytes}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dx.Close() })
		e.dax = dx
		adapters = []l2.Adapter{e.fsA, listlessAdapter{nl}, e.dax, e.gen}
	}
	// extraAdapt follows the standard set, or is the whole set with
	// noAdapters.
	adapters = append(adapters, o.extraAdapt...)
	layout, err := httpapi.ParseRegisterModel(registerJSON, testChunk)
	if err != nil {
		t.Fatal(err)
	}
	opts := httpapi.Options{
		Config: map[string]map[string]any{
			"mp":              {"http_host": "127.0.0.1", "chunk_size": testChunk},
			"storage_manager": {"l1_size_gb": 0.015625},
			"observability":   {"disable_metrics": false},
		},
		Version: "0.3.1", Commit: "ca79ea33",
		ChunkSize: testChunk, RegisteredModels: []engine.Layout{layout},
		Periodic: e.loops, Logger: logger, InstanceID: "test-instance",
	}
	if o.mutate != nil {
		o.mutate(&opts)
	}
	e.token = opts.AuthToken
	srv, err := httpapi.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if !o.noEngine {
		cfgs := make([]engine.AdapterConfig, len(adapters))
		for _, i := range o.shared {
			cfgs[i].Shared = true
		}
		eng, err := engine.New(engine.Config{L1SizeBytes: 16 << 20, L2: cfgs}, adapters, logger)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		e.eng = eng
		wg.Add(1)
		go func() { defer wg.Done(); _ = eng.Run(ctx) }()
		if err := srv.SetEngine(eng); err != nil {
			cancel()
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	e.base = "http://" + ln.Addr().String()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ctx, ln); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	tr := &http.Transport{}
	e.hc = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	t.Cleanup(func() {
		if e.eng != nil {
			// Let write-behind drain first: engine.Run does not return when
			// it is cancelled with uploads still queued (the store worker
			// re-queues the batch and retries it forever; reported to the
			// engine owner).
			drainWriteBehind(t, e.eng)
		}
		cancel()
		wg.Wait()
		tr.CloseIdleConnections()
		if e.eng != nil {
			// Every read lease, upload pin and staged write a test took must
			// be gone once the server has stopped; name the keys that are not.
			if err := e.eng.CloseChecked(); err != nil {
				t.Error(err)
			}
		}
	})
	if !o.noEngine {
		e.waitReady()
	}
	return e
}

// drainWriteBehind waits for every adapter's queued and in-flight
// write-behind uploads to finish, and fails the test (naming what is still
// pending per adapter) if they do not within 10 s: a cleanup that went on
// with uploads queued would hang in engine.Run or report leaks that are
// really a stuck upload.
func drainWriteBehind(t testing.TB, eng *engine.Engine) {
	t.Helper()
	var pending []string
	polltest.Until(pendingTB{t, &pending}, 10*time.Second, "write-behind to drain", func() bool {
		pending = pending[:0]
		for i, a := range eng.Counters().L2 {
			if a.PendingStores > 0 || a.InflightStores > 0 {
				pending = append(pending, fmt.Sprintf("adapter %d: %d pending, %d in flight", i, a.PendingStores, a.InflightStores))
			}
		}
		return len(pending) == 0
	})
}

// pendingTB adds what was still pending to polltest's timeout failure.
type pendingTB struct {
	testing.TB
	pending *[]string
}

func (p pendingTB) Fatalf(format string, args ...any) {
	p.TB.Helper()
	p.TB.Fatalf(format+"; still busy: %s", append(args, strings.Join(*p.pending, "; "))...)
}

func (e *env) waitReady() {
	e.t.Helper()
	polltest.Until(e.t, 10*time.Second, "the engine to become ready", e.eng.Ready)
}

type resp struct {
	code   int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

// do sends a request; body may be nil, []byte, string or any JSON value.
func (e *env) do(method, path string, body any, hdr map[string]string) resp {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.base+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if e.token != "" {
		req.Header.Set("Authorization", "Bearer "+e.token)
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	res, err := e.hc.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	record(req, res.StatusCode)
	return resp{code: res.StatusCode, header: res.Header, body: b}
}

// expect asserts the status and returns the response.
func (e *env) expect(code int, method, path string, body any, hdr ...map[string]string) resp {
	e.t.Helper()
	var h map[string]string
	if len(hdr) > 0 {
		h = hdr[0]
	}
	r := e.do(method, path, body, h)
	if r.code != code {
		e.t.Fatalf("%s %s: status %d, want %d; body %s", method, path, r.code, code, r.body)
	}
	return r
}

// tokens returns n token ids starting at start.
func tokens(start, n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprint(start + i)
	}
	return strings.Join(parts, ",")
}

func payload(chunks int, seed byte) []byte {
	b := make([]byte, chunks*objBytes)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// store primes chunks via the KV API.
func (e *env) store(toks string, salt string, data []byte) map[string]any {
	e.t.Helper()
	return e.expect(200, "POST", "/api/kv/store", data, map[string]string{
		httpapi.HeaderModel: testModel, httpapi.HeaderTokens: toks, httpapi.HeaderCacheSalt: salt,
	}).json(e.t)
}

// waitListed polls GET /cache/objects until want entries are listed for
// the primary adapter (write-behind is asynchronous).
func (e *env) waitListed(want int) []any {
	e.t.Helper()
	var ents []any
	polltest.Until(e.t, 10*time.Second, fmt.Sprintf("%d entries listed", want), func() bool {
		m := e.expect(200, "GET", "/cache/objects?page_size=5000", nil).json(e.t)
		ents, _ = m["entries"].([]any)
		return len(ents) == want
	})
	return ents
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	polltest.Until(t, 10*time.Second, what, cond)
}

// missingCoverage lists documented statuses no test observed.
func missingCoverage() string {
	coverage.Lock()
	defer coverage.Unlock()
	var missing []string
	for _, r := range httpapi.Routes() {
		for _, c := range r.Statuses {
			if !coverage.seen[r.Pattern][c] {
				missing = append(missing, fmt.Sprintf("%s -> %d", r.Pattern, c))
			}
		}
	}
	sort.Strings(missing)
	return strings.Join(missing, "\n  ")
}
