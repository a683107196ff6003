package s3_test

import (
	"context"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/l2/s3"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

// faultProxy sits in front of a real versitygw: it answers the first
// `fail` requests with 500 InternalError (an error the SDK retries) and
// forwards the rest unchanged, recording every request's method and
// protocol. The Host header is forwarded as received, so versitygw checks
// the client's SigV4 signature over the proxy's address.
type faultProxy struct {
	next   http.Handler
	mu     sync.Mutex
	fail   int // requests still to fail; -1: all
	seen   []string
	protos []int
}

func newFaultProxy(srv *s3test.Server) *faultProxy {
	return &faultProxy{next: &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = "http", srv.Endpoint
			r.Out.Host = r.In.Host // the signed Host
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}}
}

func (p *faultProxy) setFail(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail, p.seen, p.protos = n, nil, nil
}

// requests returns the methods seen since the last setFail.
func (p *faultProxy) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.seen)
}

func (p *faultProxy) protocols() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.protos)
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.seen = append(p.seen, r.Method)
	p.protos = append(p.protos, r.ProtoMajor)
	failIt := p.fail != 0
	if p.fail > 0 {
		p.fail--
	}
	p.mu.Unlock()
	if failIt {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>injected</Message></Error>`)
		return
	}
	p.next.ServeHTTP(w, r)
}

// proxied starts versitygw behind a faultProxy on plain HTTP and returns a
// config for it (as configFor) and the proxy.
func proxied(t *testing.T) (*s3test.Server, *faultProxy, s3.Config) {
	srv := s3test.Versity(t)
	p := newFaultProxy(srv)
	ts := httptest.NewServer(p)
	t.Cleanup(ts.Close)
	c := configFor(srv, srv.Bucket)
	c.Endpoint = ts.Listener.Addr().String()
	return srv, p, c
}

// storeThrough stores one key with the adapter built from c and returns
// the requests the proxy saw for it and the store's error.
func storeThrough(t *testing.T, p *faultProxy, c s3.Config, fail int) ([]string, error) {
	t.Helper()
	a := newAdapter(t, c)
	defer a.Close()
	p.setFail(fail)
	err := a.Store(context.Background(), l2test.Keys(t, 1, ""), l2test.Objects(t, 1))
	return p.requests(), err
}

// TestRetriesDefaultThreeAttempts: with the default s3_max_attempts a PUT
// that always gets a 500 is sent exactly 3 times and the store fails; one
// that fails twice succeeds on the third attempt and the object is in
// versitygw.
func TestRetriesDefaultThreeAttempts(t *testing.T) {
	srv, p, c := proxied(t)
	if c.MaxAttempts != 3 {
		t.Fatalf("default MaxAttempts = %d, want 3", c.MaxAttempts)
	}
	reqs, err := storeThrough(t, p, c, -1)
	if err == nil || !slices.Equal(reqs, []string{"PUT", "PUT", "PUT"}) {
		t.Fatalf("store against a failing S3 = %v after %v; want an error after exactly 3 PUTs", err, reqs)
	}
	reqs, err = storeThrough(t, p, c, 2)
	if err != nil || !slices.Equal(reqs, []string{"PUT", "PUT", "PUT"}) {
		t.Fatalf("store failing twice = %v after %v; want success on the third PUT", err, reqs)
	}
	if n := len(srv.Keys(t, srv.Bucket)); n != 1 {
		t.Fatalf("%d objects in versitygw after the retried store, want 1", n)
	}
}

// TestMaxAttemptsFromConfig: s3_max_attempts N, given in the --l2-adapter
// JSON, sends a failing PUT exactly N times (1: no retry).
func TestMaxAttemptsFromConfig(t *testing.T) {
	srv, p, c := proxied(t)
	for _, n := range []int{1, 4} {
		js := `{"type":"s3","s3_endpoint":"` + c.Endpoint + `","s3_region":"us-east-1","disable_tls":true,` +
			`"s3_addressing_style":"path","s3_bucket":"` + srv.Bucket + `","s3_max_attempts":` + strconv.Itoa(n) + `,` +
			`"aws_access_key_id":"` + srv.AccessKey + `","aws_secret_access_key":"` + srv.SecretKey + `"}`
		spec, err := l2.ParseSpec(1, []byte(js))
		if err != nil {
			t.Fatal(err)
		}
		reqs, err := storeThrough(t, p, spec.Options.(s3.Config), -1)
		if want := slices.Repeat([]string{"PUT"}, n); err == nil || !slices.Equal(reqs, want) {
			t.Fatalf("s3_max_attempts %d: store = %v after %v; want an error after exactly %d PUTs", n, err, reqs, n)
		}
	}
}

// TestRetryerConfig: the client's retryer is the SDK standard retryer
// with the configured attempts, a 2 s maximum backoff and no client-side
// retry quota. The SDK exposes MaxAttempts but not the backoff cap, and
// the delays it returns are jittered, so the cap is read from the built
// retryer's options by reflection: a renamed SDK field fails here loudly.
func TestRetryerConfig(t *testing.T) {
	srv := s3test.Versity(t)
	for _, n := range []int{3, 5} {
		c := configFor(srv, srv.Bucket)
		c.MaxAttempts = n
		a := newAdapter(t, c)
		std, ok := a.Client().Options().Retryer.(*retry.Standard)
		if !ok {
			_ = a.Close()
			t.Fatalf("retryer is %T, want *retry.Standard", a.Client().Options().Retryer)
		}
		if got := std.MaxAttempts(); got != n {
			t.Errorf("MaxAttempts = %d, want %d", got, n)
		}
		opts := reflect.ValueOf(std).Elem().FieldByName("options")
		if !opts.IsValid() {
			_ = a.Close()
			t.Fatal("retry.Standard has no options field (SDK changed): check the backoff cap another way")
		}
		if got := time.Duration(opts.FieldByName("MaxBackoff").Int()); got != 2*time.Second {
			t.Errorf("MaxBackoff = %v, want 2s", got)
		}
		if rl := opts.FieldByName("RateLimiter"); rl.IsNil() || rl.Elem().Type() != reflect.TypeOf(ratelimit.None) {
			t.Errorf("RateLimiter = %v, want ratelimit.None", rl)
		}
		_ = a.Close()
	}
}

// transportOf is the *http.Transport the adapter's SDK client sends on.
func transportOf(t *testing.T, a *s3.Adapter) *http.Transport {
	t.Helper()
	hc, ok := a.Client().Options().HTTPClient.(*http.Client)
	if !ok {
		t.Fatalf("HTTP client is %T", a.Client().Options().HTTPClient)
	}
	tr, ok := hc.Transport.(*http.Transport)
	if !ok {
		t.Fatalf("transport is %T", hc.Transport)
	}
	return tr
}

// TestTransportFromConfig: s3_num_io_threads bounds the transport's idle
// pool (64 by default) and s3_prefer_http2 sets ForceAttemptHTTP2 (true by
// default), both from the --l2-adapter JSON.
func TestTransportFromConfig(t *testing.T) {
	d := s3.Defaults()
	if d.NumIOThreads != 64 || !d.PreferHTTP2 {
		t.Fatalf("defaults: s3_num_io_threads %d, s3_prefer_http2 %v; want 64, true", d.NumIOThreads, d.PreferHTTP2)
	}
	for _, tc := range []struct {
		extra string
		idle  int
		h2    bool
	}{
		{"", 64, true},
		{`,"s3_num_io_threads":8,"s3_prefer_http2":false`, 8, false},
		{`,"s3_num_io_threads":200,"s3_prefer_http2":true`, 200, true},
	} {
		spec, err := l2.ParseSpec(1, []byte(`{"type":"s3","s3_endpoint":"s3://b","s3_region":"us-east-1","aws_access_key_id":"k","aws_secret_access_key":"s"`+tc.extra+`}`))
		if err != nil {
			t.Fatal(err)
		}
		a, err := s3.New(context.Background(), spec.Options.(s3.Config))
		if err != nil {
			t.Fatal(err)
		}
		tr := transportOf(t, a)
		if tr.MaxIdleConnsPerHost != tc.idle || tr.MaxIdleConns != tc.idle || tr.ForceAttemptHTTP2 != tc.h2 {
			t.Errorf("%q: MaxIdleConnsPerHost %d, MaxIdleConns %d, ForceAttemptHTTP2 %v; want %d, %d, %v",
				tc.extra, tr.MaxIdleConnsPerHost, tr.MaxIdleConns, tr.ForceAttemptHTTP2, tc.idle, tc.idle, tc.h2)
		}
		_ = a.Close()
	}
}

// TestPreferHTTP2Protocol: against versitygw behind a TLS proxy that
// offers HTTP/2, the requests arrive as HTTP/2 with s3_prefer_http2 true
// (the default) and as HTTP/1.1 with false; over plain HTTP they are
// HTTP/1.1 either way.
func TestPreferHTTP2Protocol(t *testing.T) {
	srv := s3test.Versity(t)
	p := newFaultProxy(srv)
	ts := httptest.NewUnstartedServer(p)
	ts.EnableHTTP2 = true
	ts.Config.ErrorLog = log.New(io.Discard, "", 0)
	ts.StartTLS()
	defer ts.Close()
	if !slices.Contains(ts.TLS.NextProtos, "h2") {
		t.Fatalf("proxy offers %v, want h2", ts.TLS.NextProtos)
	}
	bundle := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	plain := httptest.NewServer(p)
	defer plain.Close()
	for _, tc := range []struct {
		endpoint string
		prefer   bool
		proto    int
	}{
		{ts.URL, true, 2},
		{ts.URL, false, 1},
		{plain.URL, true, 1},
	} {
		c := configFor(srv, srv.Bucket)
		c.Endpoint, c.DisableTLS, c.CABundle, c.PreferHTTP2 = tc.endpoint, false, bundle, tc.prefer
		_, err := storeThrough(t, p, c, 0)
		if got := p.protocols(); err != nil || !slices.Equal(got, []int{tc.proto}) {
			t.Fatalf("%s prefer_http2 %v: store = %v, request protocols %v; want one HTTP/%d request", tc.endpoint, tc.prefer, err, got, tc.proto)
		}
	}
}

// TestS3ExpressOptionHasNoEffect: s3_enable_s3express is accepted (true
// and false parse) and changes nothing: the client is built the same, S3
// Express session auth is left at the SDK default (on, used only for
// directory buckets, "--x-s3" names), and a normal bucket is served the
// same way either way.
func TestS3ExpressOptionHasNoEffect(t *testing.T) {
	srv, p, base := proxied(t)
	for _, v := range []string{"true", "false"} {
		js := `{"type":"s3","s3_endpoint":"` + base.Endpoint + `","s3_region":"us-east-1","disable_tls":true,` +
			`"s3_addressing_style":"path","s3_bucket":"` + srv.Bucket + `","s3_enable_s3express":` + v + `,` +
			`"aws_access_key_id":"` + srv.AccessKey + `","aws_secret_access_key":"` + srv.SecretKey + `"}`
		spec, err := l2.ParseSpec(1, []byte(js))
		if err != nil {
			t.Fatal(err)
		}
		c := spec.Options.(s3.Config)
		if c.EnableS3Express != (v == "true") {
			t.Fatalf("s3_enable_s3express %s parsed as %v", v, c.EnableS3Express)
		}
		a := newAdapter(t, c)
		if o := a.Client().Options(); o.DisableS3ExpressSessionAuth != nil {
			_ = a.Close()
			t.Fatalf("s3_enable_s3express %s: DisableS3ExpressSessionAuth = %v, want the SDK default (nil)", v, *o.DisableS3ExpressSessionAuth)
		}
		_ = a.Close()
		reqs, err := storeThrough(t, p, c, 0)
		if err != nil || !slices.Equal(reqs, []string{"PUT"}) {
			t.Fatalf("s3_enable_s3express %s: store = %v after %v; want one PUT (no CreateSession)", v, err, reqs)
		}
	}
}
