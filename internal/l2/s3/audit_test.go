package s3_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/l2/s3"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

// refusePut answers 403 to PUTs whose path ends with suffix and passes
// everything else to the real S3 behind it.
type refusePut struct {
	next   http.Handler
	suffix string
}

func (h *refusePut) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, h.suffix) {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>denied</Message></Error>`))
		return
	}
	h.next.ServeHTTP(w, r)
}

// TestStorePartialFailureCountsLanded: a store whose PUTs partly fail has
// still put the others in the bucket. Those objects must count in usage
// and reach the listeners (the eviction policy); uncounted, they held
// bucket space outside usage and eviction for the life of the process.
func TestStorePartialFailureCountsLanded(t *testing.T) {
	keys := l2test.Keys(t, 3, "salt-a")
	objs := l2test.Objects(t, 3)
	h := &refusePut{suffix: keys[1].S3Name()}
	srv := s3test.FakeWith(t, func(next http.Handler) http.Handler { h.next = next; return h })
	a := newAdapter(t, configFor(srv, srv.Bucket))
	defer a.Close()
	rec := l2test.NewRecorder()
	a.AddListener(rec)
	if err := a.Store(context.Background(), keys, objs); err == nil {
		t.Fatal("store with a refused PUT succeeded")
	}
	landed := srv.Keys(t, srv.Bucket)
	if len(landed) != 2 {
		t.Fatalf("bucket holds %v, want the 2 objects not refused", landed)
	}
	want := int64(len(objs[0]) + len(objs[2]))
	if u := a.Usage(); u.TotalBytesUsed != want || u.BytesByCacheSalt["salt-a"] != want {
		t.Fatalf("usage after partial store = %d (salt %d), want %d", u.TotalBytesUsed, u.BytesByCacheSalt["salt-a"], want)
	}
	for _, i := range []int{0, 2} {
		if sz, ok := rec.Stored[keys[i]]; !ok || sz != int64(len(objs[i])) {
			t.Fatalf("listener not told of landed object %d (stored %v)", i, rec.Stored)
		}
	}
	if _, ok := rec.Stored[keys[1]]; ok {
		t.Fatal("listener told of the refused object")
	}
}

// holdPut stores PUTs of names ending with suffix in the S3 behind it but
// holds their answers until release is closed, telling reached once one
// is stored.
type holdPut struct {
	next    http.Handler
	suffix  string
	reached chan struct{}
	release chan struct{}
}

func (h *holdPut) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut || !strings.HasSuffix(r.URL.Path, h.suffix) {
		h.next.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	h.next.ServeHTTP(rec, r)
	close(h.reached)
	<-h.release
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// TestDeleteDuringStoreKeepsUsage: a delete of a key whose PUT has landed
// but not yet been answered used to remove the object, after which the
// store counted it: usage held an object the bucket did not. A key being
// stored is now skipped, as a locked one is, so whatever the order the
// object is counted exactly when it is in the bucket.
func TestDeleteDuringStoreKeepsUsage(t *testing.T) {
	keys := l2test.Keys(t, 1, "")
	objs := l2test.Objects(t, 1)
	h := &holdPut{suffix: keys[0].S3Name(), reached: make(chan struct{}), release: make(chan struct{})}
	srv := s3test.FakeWith(t, func(next http.Handler) http.Handler { h.next = next; return h })
	a := newAdapter(t, configFor(srv, srv.Bucket))
	defer a.Close()
	stored := make(chan error, 1)
	go func() { stored <- a.Store(context.Background(), keys, objs) }()
	select {
	case <-h.reached:
	case <-time.After(time.Minute):
		close(h.release)
		t.Fatal("PUT never reached S3")
	}
	deleted, err := a.Delete(context.Background(), keys)
	close(h.release)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stored:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("store did not return")
	}
	inBucket := len(srv.Keys(t, srv.Bucket)) == 1
	used := a.Usage().TotalBytesUsed
	if inBucket != (used == int64(len(objs[0]))) || !inBucket && used != 0 {
		t.Fatalf("object in bucket: %v, usage %d (deleted %v): usage does not match the bucket", inBucket, used, deleted)
	}
}

// noLength sends GET answers without Content-Length (chunked), as some
// S3-compatible servers and proxies do.
type noLength struct{ next http.Handler }

type stripLength struct{ http.ResponseWriter }

func (w stripLength) WriteHeader(code int) {
	w.Header().Del("Content-Length")
	w.ResponseWriter.WriteHeader(code)
}

func (w stripLength) Write(b []byte) (int, error) {
	w.Header().Del("Content-Length")
	return w.ResponseWriter.Write(b)
}

func (h noLength) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		w = stripLength{w}
	}
	h.next.ServeHTTP(w, r)
}

// TestLoadLongerObjectWithoutLengthNotLoaded: an object longer than its
// buffer is not loaded, also when the answer has no Content-Length to
// compare: reading only the buffer's length reported a truncated object
// as loaded.
func TestLoadLongerObjectWithoutLengthNotLoaded(t *testing.T) {
	srv := s3test.FakeWith(t, func(next http.Handler) http.Handler { return noLength{next} })
	a := newAdapter(t, configFor(srv, srv.Bucket))
	defer a.Close()
	keys := l2test.Keys(t, 1, "")
	objs := [][]byte{bytes.Repeat([]byte{7}, 64<<10)}
	if err := a.Store(context.Background(), keys, objs); err != nil {
		t.Fatal(err)
	}
	ok, err := a.Load(context.Background(), keys, [][]byte{make([]byte, len(objs[0])/2)})
	if err != nil || ok[0] {
		t.Fatalf("Load into a buffer half the object's size = %v, %v; want not loaded", ok, err)
	}
	// The exact size still loads, without a length to check against.
	l2test.LoadAll(t, a, keys, objs)
}

// TestListSkipsNonCanonicalNames: the S3 name parser is as lenient as
// upstream's, so a foreign object named with upper-case hex parses to a
// key whose own name is another. Listed under that key, it looked stored
// (the coordinator's resync adopts listings), yet every operation on the
// key addresses the canonical name: a delete "succeeded" (S3 reports a
// missing key deleted) and the object stayed, to be listed again.
func TestListSkipsNonCanonicalNames(t *testing.T) {
	srv := s3test.Fake(t)
	a := newAdapter(t, configFor(srv, srv.Bucket))
	defer a.Close()
	keys := l2test.Keys(t, 1, "")
	canonical := keys[0].S3Name()
	upper := strings.Replace(canonical, keys[0].HashHex(), strings.ToUpper(keys[0].HashHex()), 1)
	if upper == canonical {
		t.Fatalf("name %q has no lower-case hash to change", canonical)
	}
	putRaw(t, srv, srv.Bucket, upper, []byte("foreign"))
	page, err := a.List(context.Background(), "", 100, "")
	if err != nil || len(page.Entries) != 0 {
		t.Fatalf("List = %+v, %v; want no entries", page, err)
	}
	if err := a.Store(context.Background(), keys, l2test.Objects(t, 1)); err != nil {
		t.Fatal(err)
	}
	page, err = a.List(context.Background(), keys[0].ModelName, 100, "")
	if err != nil || len(page.Entries) != 1 || page.Entries[0].Key != keys[0] {
		t.Fatalf("List after storing the key = %+v, %v; want the key once", page, err)
	}
}

// TestSecondsOutOfRangeRefused: a seconds key whose value does not fit a
// time.Duration (over about 292 years) or rounds to zero is refused.
// The conversion used to wrap such a value to a negative or zero
// duration, which New then silently replaced with the default: a user
// asking for a very long timeout got 30 s without a word.
func TestSecondsOutOfRangeRefused(t *testing.T) {
	for _, key := range []string{"s3_breaker_cooldown_s", "s3_op_timeout_s", "s3_connect_timeout_s", "s3_slow_call_s"} {
		for _, v := range []string{"1e10", "1e-12"} {
			_, err := l2.ParseSpec(1, []byte(`{"type":"s3","s3_endpoint":"s3://b","s3_region":"r","`+key+`":`+v+`}`))
			if err == nil || !strings.Contains(err.Error(), key) {
				t.Errorf("%s = %s: err %v, want an error naming the key", key, v, err)
			}
		}
	}
	spec, err := l2.ParseSpec(1, []byte(`{"type":"s3","s3_endpoint":"s3://b","s3_region":"r","s3_op_timeout_s":86400}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Options.(s3.Config).OpTimeout; got != 24*time.Hour {
		t.Fatalf("s3_op_timeout_s 86400 = %v, want 24h", got)
	}
}
