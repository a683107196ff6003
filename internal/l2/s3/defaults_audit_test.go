package s3_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/s3"
)

// TestDefaultsFromJSON: a minimal --l2-adapter object gets these literal
// defaults, and every extension key is read from the JSON.
func TestDefaultsFromJSON(t *testing.T) {
	spec, err := l2.ParseSpec(1, []byte(`{"type":"s3","s3_endpoint":"s3://b","s3_region":"r"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := s3.Config{
		Endpoint: "s3://b", Region: "r", NumIOThreads: 64, PreferHTTP2: true, AddressingStyle: "virtual",
		MaxAttempts: 3, BreakerThreshold: 3, BreakerCooldown: 10 * time.Second,
		OpTimeout: 30 * time.Second, DialTimeout: 5 * time.Second, SlowCall: 2 * time.Second,
	}
	opt := cmpopts.IgnoreFields(s3.Config{}, "Now")
	if d := cmp.Diff(want, spec.Options.(s3.Config), opt); d != "" {
		t.Fatalf("defaults (-want +got):\n%s", d)
	}
	spec, err = l2.ParseSpec(1, []byte(`{"type":"s3","s3_endpoint":"s3://b","s3_region":"r","s3_max_attempts":5,
		"s3_breaker_failures":7,"s3_breaker_cooldown_s":2.5,"s3_op_timeout_s":11,"s3_connect_timeout_s":0.5,"s3_slow_call_s":4}`))
	if err != nil {
		t.Fatal(err)
	}
	want.MaxAttempts, want.BreakerThreshold, want.BreakerCooldown = 5, 7, 2500*time.Millisecond
	want.OpTimeout, want.DialTimeout, want.SlowCall = 11*time.Second, 500*time.Millisecond, 4*time.Second
	if d := cmp.Diff(want, spec.Options.(s3.Config), opt); d != "" {
		t.Fatalf("from JSON (-want +got):\n%s", d)
	}
}

// fakeClock is the breaker's clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// answering starts an S3 stand-in that answers every request with code
// and counts the requests; the adapter is built from JSON with one attempt
// per call and the default breaker settings.
func answering(t *testing.T, code int) (*s3.Adapter, *atomic.Int64, *fakeClock) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	spec, err := l2.ParseSpec(1, []byte(`{"type":"s3","s3_endpoint":"`+srv.URL+`","s3_region":"us-east-1",
		"s3_addressing_style":"path","s3_bucket":"bkt","aws_access_key_id":"k","aws_secret_access_key":"s","s3_max_attempts":1}`))
	if err != nil {
		t.Fatal(err)
	}
	c := spec.Options.(s3.Config)
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c.Now = clk.Now
	a, err := s3.New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a, &n, clk
}

// TestFiveHundredsOpenBreakerDefaults: three consecutive 5xx answers open
// the breaker (default s3_breaker_failures 3); while open a list sends
// nothing and fails with the exact text; the default 10 s cool-down admits
// a probe at 10 s, not before.
func TestFiveHundredsOpenBreakerDefaults(t *testing.T) {
	a, n, clk := answering(t, http.StatusInternalServerError)
	ctx := context.Background()
	for i := range 2 {
		if _, err := a.List(ctx, "", 10, ""); err == nil {
			t.Fatalf("list %d: no error from a 500", i)
		}
	}
	if st := a.Status(); st["breaker_state"] != "closed" || st["connection_failures"] != 2 {
		t.Fatalf("after two 500s: state %v failures %v", st["breaker_state"], st["connection_failures"])
	}
	if _, err := a.List(ctx, "", 10, ""); err == nil {
		t.Fatal("third list: no error")
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("requests = %d, want 3", got)
	}
	st := a.Status()
	if st["breaker_state"] != "open" || st["breaker_trips"] != int64(1) || st["connection_disabled"] != true || st["is_healthy"] != false {
		t.Fatalf("after three 500s: %v", st)
	}
	_, err := a.List(ctx, "", 10, "")
	const want = "adapter unavailable: S3 connection disabled (circuit-broken); listing unavailable"
	if err == nil || err.Error() != want {
		t.Fatalf("list while open: %v, want %q", err, want)
	}
	clk.Add(10*time.Second - time.Nanosecond)
	if _, err := a.List(ctx, "", 10, ""); err == nil || err.Error() != want {
		t.Fatalf("list just before the cool-down: %v", err)
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("requests while open = %d, want 3", got)
	}
	clk.Add(time.Nanosecond)
	if _, err := a.List(ctx, "", 10, ""); err == nil || err.Error() == want {
		t.Fatalf("probe at 10 s: %v, want the 500's error", err)
	}
	if got := n.Load(); got != 4 {
		t.Fatalf("requests after the cool-down = %d, want 4 (one probe)", got)
	}
	if st := a.Status(); st["breaker_state"] != "open" || st["breaker_trips"] != int64(2) {
		t.Fatalf("failed probe: state %v trips %v", st["breaker_state"], st["breaker_trips"])
	}
}

// TestFourHundredsKeepBreakerClosed: an answer below 500 proves S3 is
// reachable, however many there are.
func TestFourHundredsKeepBreakerClosed(t *testing.T) {
	a, n, _ := answering(t, http.StatusForbidden)
	for range 5 {
		if _, err := a.List(context.Background(), "", 10, ""); err == nil {
			t.Fatal("no error from a 403")
		}
	}
	st := a.Status()
	if n.Load() != 5 || st["breaker_state"] != "closed" || st["connection_failures"] != 0 || st["breaker_trips"] != int64(0) {
		t.Fatalf("requests %d, status %v", n.Load(), st)
	}
}

// TestStatusExtraKeysValues: the keys lmcache-go adds to report_status,
// with their values for a path-style adapter, and usage fraction -1 for
// max_capacity_gb 0.
func TestStatusExtraKeysValues(t *testing.T) {
	a, _, _ := answering(t, http.StatusOK)
	st := a.Status()
	want := map[string]any{"bucket": "bkt", "addressing_style": "path", "breaker_state": "closed", "breaker_trips": int64(0),
		"max_capacity_bytes": int64(0), "current_size_bytes": int64(0)}
	for k, v := range want {
		if st[k] != v {
			t.Errorf("status[%q] = %#v, want %#v", k, st[k], v)
		}
	}
	if f := a.Usage().Fraction(); f != -1 {
		t.Fatalf("usage fraction = %v, want -1", f)
	}
}

// TestNoKeysUsesDefaultChain: with neither aws_access_key_id nor
// aws_secret_access_key the client resolves credentials through the SDK's
// default chain, here its environment step.
func TestNoKeysUsesDefaultChain(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AWS_CONFIG_FILE", dir+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", dir+"/none")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFROMENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
	t.Setenv("AWS_SESSION_TOKEN", "")
	spec, err := l2.ParseSpec(1, []byte(`{"type":"s3","s3_endpoint":"s3://b","s3_region":"us-east-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := l2.Open(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	creds, err := a.(*s3.Adapter).Client().Options().Credentials.Retrieve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if creds.AccessKeyID != "AKIDFROMENV" || creds.SecretAccessKey != "secret-from-env" || creds.Source != "EnvConfigCredentials" {
		t.Fatalf("credentials = %+v", creds)
	}
}
