package s3_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/l2/s3"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// configFor is the config a user would write for a local S3 server.
func configFor(srv *s3test.Server, bucket string) s3.Config {
	c := s3.Defaults()
	c.Endpoint = srv.Endpoint
	c.Region = s3test.Region
	c.DisableTLS = true
	c.AddressingStyle = "path"
	c.Bucket = bucket
	c.AccessKeyID = srv.AccessKey
	c.SecretAccessKey = srv.SecretKey
	return c
}

func newAdapter(t testing.TB, c s3.Config) *s3.Adapter {
	t.Helper()
	a, err := s3.New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestConformanceVersity(t *testing.T) {
	srv := s3test.Versity(t)
	l2test.Run(t, func(t *testing.T) l2.Adapter { return newAdapter(t, configFor(srv, srv.NewBucket(t))) })
}

func TestConformanceGofakes3(t *testing.T) {
	srv := s3test.Fake(t)
	l2test.Run(t, func(t *testing.T) l2.Adapter { return newAdapter(t, configFor(srv, srv.NewBucket(t))) })
}

// TestConformanceViaFlag builds the adapter from the --l2-adapter JSON a
// user would pass, against versitygw.
func TestConformanceViaFlag(t *testing.T) {
	srv := s3test.Versity(t)
	l2test.Run(t, func(t *testing.T) l2.Adapter {
		js := `{"type":"s3","s3_endpoint":"` + srv.Endpoint + `","s3_region":"us-east-1","disable_tls":true,` +
			`"s3_addressing_style":"path","s3_bucket":"` + srv.NewBucket(t) + `",` +
			`"aws_access_key_id":"` + srv.AccessKey + `","aws_secret_access_key":"` + srv.SecretKey + `","max_capacity_gb":1}`
		spec, err := l2.ParseSpec(1, []byte(js))
		if err != nil {
			t.Fatal(err)
		}
		a, err := l2.Open(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Usage().TotalCapacityBytes; got != 1<<30 {
			t.Fatalf("capacity = %d", got)
		}
		return a
	})
}

var goldenHash, _ = hex.DecodeString("9f2c00ff10e1")

func goldenKey(t testing.TB, salt string) objkey.Key {
	k, err := objkey.New(goldenHash, "Qwen/Qwen3-8B", objkey.RankFor(1, 0), 0, salt)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func getRaw(t *testing.T, srv *s3test.Server, bucket, name string) []byte {
	t.Helper()
	out, err := srv.Client.GetObject(context.Background(), &awss3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(name)})
	if err != nil {
		t.Fatalf("get %q: %v", name, err)
	}
	defer out.Body.Close()
	b, _ := io.ReadAll(out.Body)
	return b
}

func putRaw(t *testing.T, srv *s3test.Server, bucket, name string, body []byte) {
	t.Helper()
	_, err := srv.Client.PutObject(context.Background(), &awss3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(name), Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body))),
	})
	if err != nil {
		t.Fatalf("put %q: %v", name, err)
	}
}

// TestGoldenNamesAndForeignObjects: what the adapter writes is named exactly
// as upstream names it; objects written by a Python server under those
// names are read back; foreign objects in the bucket are never listed.
func TestGoldenNamesAndForeignObjects(t *testing.T) {
	srv := s3test.Versity(t)
	a := newAdapter(t, configFor(srv, srv.Bucket))
	defer a.Close()
	ctx := context.Background()
	plain, salted := goldenKey(t, ""), goldenKey(t, "user-a")
	if err := a.Store(ctx, []objkey.Key{plain, salted}, [][]byte{[]byte("plain-go"), []byte("salted-go")}); err != nil {
		t.Fatal(err)
	}
	names := srv.Keys(t, srv.Bucket)
	want := []string{"Qwen/Qwen3-8B@01000100@0@9f2c00ff10e1", "Qwen/Qwen3-8B@01000100@0@9f2c00ff10e1@user-a"}
	if !slices.Equal(names, want) {
		t.Fatalf("objects = %q\nwant      %q", names, want)
	}
	if got := getRaw(t, srv, srv.Bucket, want[1]); string(got) != "salted-go" {
		t.Fatalf("object body = %q, want raw bytes", got)
	}

	// Written by "Python": upstream name for group 0x1a, rank of worker 1 of 2.
	pyKey, _ := objkey.New(goldenHash, "meta-llama/Llama-3-8B", objkey.RankFor(2, 1), 26, "")
	putRaw(t, srv, srv.Bucket, "meta-llama/Llama-3-8B@02010201@1a@9f2c00ff10e1", []byte("from-python"))
	for _, foreign := range []string{"README", "Qwen/Qwen3-8B@notes.txt", "Qwen/Qwen3-8B@zz@0@00", "backup/2024/dump.tar", "a@b@c@d@e@f"} {
		putRaw(t, srv, srv.Bucket, foreign, []byte("x"))
	}
	hits, err := a.LookupAndLock(ctx, []objkey.Key{pyKey})
	if err != nil || !hits[0] {
		t.Fatalf("lookup of python-written object: %v %v", hits, err)
	}
	dst := [][]byte{make([]byte, len("from-python"))}
	if ok, err := a.Load(ctx, []objkey.Key{pyKey}, dst); err != nil || !ok[0] || string(dst[0]) != "from-python" {
		t.Fatalf("load python-written object: %v %v %q", ok, err, dst[0])
	}
	a.Unlock([]objkey.Key{pyKey})

	var listed []string
	token := ""
	for {
		p, err := a.List(ctx, "", 2, token)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range p.Entries {
			listed = append(listed, e.Key.S3Name())
		}
		if token = p.NextPageToken; token == "" {
			break
		}
	}
	sort.Strings(listed)
	wantListed := []string{"Qwen/Qwen3-8B@01000100@0@9f2c00ff10e1", "Qwen/Qwen3-8B@01000100@0@9f2c00ff10e1@user-a", "meta-llama/Llama-3-8B@02010201@1a@9f2c00ff10e1"}
	if !slices.Equal(listed, wantListed) {
		t.Fatalf("listed %q\nwant   %q", listed, wantListed)
	}
	p, err := a.List(ctx, "Qwen/Qwen3-8B", 100, "")
	if err != nil || len(p.Entries) != 2 {
		t.Fatalf("model listing = %+v, %v", p, err)
	}
}

// countingHandler counts DeleteObjects requests and their keys.
type countingHandler struct {
	next    http.Handler
	mu      sync.Mutex
	batches []int
}

func (h *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, ok := r.URL.Query()["delete"]; ok && r.Method == http.MethodPost {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.batches = append(h.batches, strings.Count(string(body), "<Object>"))
		h.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	h.next.ServeHTTP(w, r)
}

func TestDeleteBatchesOf1000(t *testing.T) {
	ch := &countingHandler{}
	srv := s3test.FakeWith(t, func(h http.Handler) http.Handler { ch.next = h; return ch })
	c := configFor(srv, srv.Bucket)
	c.NumIOThreads = 16
	a := newAdapter(t, c)
	defer a.Close()
	ctx := context.Background()
	keys := l2test.Keys(t, 2105, "")
	objs := make([][]byte, len(keys))
	for i := range objs {
		objs[i] = []byte{byte(i), 1}
	}
	if err := a.Store(ctx, keys, objs); err != nil {
		t.Fatal(err)
	}
	rec := l2test.NewRecorder()
	a.AddListener(rec)
	deleted, err := a.Delete(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(deleted) != len(keys) || len(rec.DeletedKeys()) != len(keys) {
		t.Fatalf("deleted %d, notified %d, want %d", len(deleted), len(rec.DeletedKeys()), len(keys))
	}
	if want := []int{1000, 1000, 105}; !slices.Equal(ch.batches, want) {
		t.Fatalf("DeleteObjects batches = %v, want %v", ch.batches, want)
	}
	if n := len(srv.Keys(t, srv.Bucket)); n != 0 {
		t.Fatalf("%d objects left", n)
	}
	if u := a.Usage(); u.TotalBytesUsed != 0 {
		t.Fatalf("usage after delete = %+v", u)
	}
}

func TestParseConfig(t *testing.T) {
	spec, err := l2.ParseSpec(2, []byte(`{"type":"s3","s3_endpoint":"s3://my-bucket","s3_region":"us-west-2","s3_num_io_threads":8,"s3_prefer_http2":false,"max_capacity_gb":0.5,"s3_breaker_cooldown_s":1.5,"shared":true}`))
	if err != nil {
		t.Fatal(err)
	}
	c := spec.Options.(s3.Config)
	if c.Endpoint != "s3://my-bucket" || c.Region != "us-west-2" || c.NumIOThreads != 8 || c.PreferHTTP2 || c.MaxCapacityBytes != 1<<29 || c.BreakerCooldown.Seconds() != 1.5 || !spec.Shared || c.AddressingStyle != "virtual" {
		t.Fatalf("config = %+v", c)
	}
	for in, msg := range map[string]string{
		`{"type":"s3","s3_region":"x"}`:   "s3_endpoint is required",
		`{"type":"s3","s3_endpoint":"h"}`: "s3_region is required",
		`{"type":"s3","s3_endpoint":"h:9000","s3_region":"r","s3_addressing_style":"path"}`: "s3_bucket is required with s3_addressing_style \"path\"",
		`{"type":"s3","s3_endpoint":"h","s3_region":"r","s3_addressing_style":"dns"}`:       "s3_addressing_style must be \"virtual\" or \"path\"",
		`{"type":"s3","s3_endpoint":"h","s3_region":"r","aws_access_key_id":"k"}`:           "must be set together",
		`{"type":"s3","s3_endpoint":"localhost:9000","s3_region":"r"}`:                      "names no bucket",
		`{"type":"s3","s3_endpoint":"h","s3_region":"r","s3_num_io_threads":0}`:             "s3_num_io_threads must be a positive integer",
	} {
		_, err := l2.ParseSpec(1, []byte(in))
		if err == nil || !strings.Contains(err.Error(), "--l2-adapter #1 ('s3'): ") || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s:\n got %v\nwant %q", in, err, msg)
		}
	}
}

func TestEndpointForms(t *testing.T) {
	cases := []struct {
		cfg                      s3.Config
		wantEndpoint, wantBucket string
	}{
		{s3.Config{Endpoint: "s3://my-bucket.minio.local:9000", Region: "r", DisableTLS: true}, "http://minio.local:9000", "my-bucket"},
		{s3.Config{Endpoint: "my-bucket.s3.us-west-2.amazonaws.com", Region: "r"}, "https://s3.us-west-2.amazonaws.com", "my-bucket"},
		{s3.Config{Endpoint: "s3://my-bucket", Region: "r"}, "s3://my-bucket", "my-bucket"},
		{s3.Config{Endpoint: "http://127.0.0.1:7070", Region: "r", AddressingStyle: "path", Bucket: "b"}, "http://127.0.0.1:7070", "b"},
		{s3.Config{Endpoint: "minio:9000", Region: "r", AddressingStyle: "path", Bucket: "b"}, "https://minio:9000", "b"},
		{s3.Config{Endpoint: "b.example.com", Region: "r", Bucket: "b"}, "https://example.com", "b"},
	}
	for _, c := range cases {
		a, err := s3.New(context.Background(), c.cfg)
		if err != nil {
			t.Fatalf("%+v: %v", c.cfg, err)
		}
		st := a.Status()
		if st["endpoint"] != c.wantEndpoint || a.Bucket() != c.wantBucket {
			t.Errorf("%s: endpoint %v bucket %v, want %v %v", c.cfg.Endpoint, st["endpoint"], a.Bucket(), c.wantEndpoint, c.wantBucket)
		}
		_ = a.Close()
	}
}

func TestStatusShape(t *testing.T) {
	srv := s3test.Fake(t)
	a := newAdapter(t, configFor(srv, srv.Bucket))
	defer a.Close()
	st := a.Status()
	for _, k := range []string{"is_healthy", "type", "endpoint", "region", "connection_failures", "connection_disabled", "current_size_bytes", "max_capacity_bytes"} {
		if _, ok := st[k]; !ok {
			t.Errorf("status lacks %q", k)
		}
	}
	if st["type"] != "S3L2Adapter" || st["is_healthy"] != true {
		t.Fatalf("status = %v", st)
	}
}

// TestCABundle: with s3_ca_bundle naming the server's certificate the
// adapter talks TLS to it; without it the same server is refused (unknown
// authority); a bundle with no certificate is a start-up error.
func TestCABundle(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket("tls-bucket"); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(gofakes3.New(backend).Server())
	ts.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are expected
	ts.StartTLS()
	defer ts.Close()
	dir := t.TempDir()
	bundle := filepath.Join(dir, "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	if err := os.WriteFile(bundle, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := s3.Defaults()
	cfg.Endpoint, cfg.Region, cfg.AddressingStyle, cfg.Bucket = ts.URL, s3test.Region, "path", "tls-bucket"
	cfg.AccessKeyID, cfg.SecretAccessKey, cfg.MaxAttempts = "k", "s", 1
	ctx := context.Background()
	keys, objs := l2test.Keys(t, 2, ""), l2test.Objects(t, 2)

	untrusted := newAdapter(t, cfg)
	defer untrusted.Close()
	var uerr x509.UnknownAuthorityError
	if err := untrusted.Store(ctx, keys, objs); !errors.As(err, &uerr) {
		t.Fatalf("store without the bundle = %v, want an unknown-authority error", err)
	}

	cfg.CABundle = bundle
	a := newAdapter(t, cfg)
	defer a.Close()
	if err := a.Store(ctx, keys, objs); err != nil {
		t.Fatalf("store over TLS: %v", err)
	}
	hits, err := a.LookupAndLock(ctx, keys)
	if err != nil || !slices.Equal(hits, []bool{true, true}) {
		t.Fatalf("lookup over TLS = %v %v", hits, err)
	}
	l2test.LoadAll(t, a, keys, objs)
	a.Unlock(keys)

	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.CABundle = empty
	if _, err := s3.New(ctx, cfg); err == nil || !strings.Contains(err.Error(), "holds no PEM certificates") {
		t.Fatalf("bundle without certificates: %v", err)
	}
}
