package mpclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDeleteObjectsReplies: a 2xx reply with "ok": false is ErrNotOK (with
// the server's error text), "ok": true or no "ok" field is success, a
// non-2xx is a StatusError; the token goes out as a bearer header and never
// into an error.
func TestDeleteObjectsReplies(t *testing.T) {
	var reply string
	var code int
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = append(auth, r.Header.Get("Authorization"))
		w.WriteHeader(code)
		_, _ = w.Write([]byte(reply))
	}))
	defer srv.Close()
	c := New(5 * time.Second)
	defer c.Close()
	c.Token = "tok-s3cret"
	keys := []objkey.Encoded{{ChunkHashHex: "0a", ModelName: "m"}}
	for _, tc := range []struct {
		code    int
		reply   string
		want    error
		wantMsg string
	}{
		{200, `{"ok":true,"deleted":1}`, nil, ""},
		{200, `{"deleted":1}`, nil, ""},
		{200, `{"ok":false,"error":"adapter down"}`, ErrNotOK, `adapter down`},
		{500, `{"detail":"boom"}`, ErrStatus, "500"},
	} {
		code, reply = tc.code, tc.reply
		err := c.DeleteObjects(context.Background(), srv.URL, keys)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%d %s: %v", tc.code, tc.reply, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.wantMsg) || strings.Contains(err.Error(), c.Token) {
			t.Errorf("%d %s: err %v, want %v mentioning %q", tc.code, tc.reply, err, tc.want, tc.wantMsg)
		}
	}
	if len(auth) != 4 || auth[0] != "Bearer tok-s3cret" || auth[3] != "Bearer tok-s3cret" {
		t.Fatalf("Authorization headers %v", auth)
	}
}

// TestReplyOverLimitIsAnError: a reply longer than the read bound is an
// error (ErrReplyTooLarge), not its first 64 MiB taken for the whole: a 2xx
// delete reply whose "ok": false lies past the bound was a success, and a
// prefetch status body cut at the bound was relayed as if complete.
func TestReplyOverLimitIsAnError(t *testing.T) {
	pad := bytes.Repeat([]byte("x"), maxReply)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"ok":false,"error":"`)
		_, _ = w.Write(pad)
		_, _ = io.WriteString(w, `"}`)
	}))
	defer srv.Close()
	c := New(30 * time.Second)
	defer c.Close()
	err := c.DeleteObjects(context.Background(), srv.URL, []objkey.Encoded{{ChunkHashHex: "0a", ModelName: "m"}})
	if !errors.Is(err, ErrReplyTooLarge) {
		t.Fatalf("delete with a %d-byte reply: err %v, want ErrReplyTooLarge", len(pad)+24, err)
	}
	code, body, err := c.PrefetchStatus(context.Background(), srv.URL, "r1")
	if !errors.Is(err, ErrReplyTooLarge) || body != nil {
		t.Fatalf("prefetch status with a %d-byte reply: code %d, %d body bytes, err %v; want ErrReplyTooLarge and no body", len(pad)+24, code, len(body), err)
	}
}

// TestStatusErrorTextBounded: a non-2xx reply's body and an ok=false
// reply's error text reach WARN lines and 502 bodies through the error, so
// only their first maxErrorText bytes are kept (with the full length said).
func TestStatusErrorTextBounded(t *testing.T) {
	big := strings.Repeat("e", 1<<20)
	var code int
	var reply string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(code)
		_, _ = io.WriteString(w, reply)
	}))
	defer srv.Close()
	c := New(30 * time.Second)
	defer c.Close()
	keys := []objkey.Encoded{{ChunkHashHex: "0a", ModelName: "m"}}
	for _, tc := range []struct {
		code  int
		reply string
		want  error
		total int
	}{
		{503, big, ErrStatus, len(big)},
		{200, `{"ok":false,"error":"` + big + `"}`, ErrNotOK, len(big) + 2},
	} {
		code, reply = tc.code, tc.reply
		err := c.DeleteObjects(context.Background(), srv.URL, keys)
		if !errors.Is(err, tc.want) {
			t.Fatalf("%d: err %v, want %v", tc.code, err, tc.want)
		}
		msg := err.Error()
		if len(msg) > maxErrorText+200 || !strings.Contains(msg, strings.Repeat("e", 100)) || !strings.Contains(msg, strconv.Itoa(tc.total)+" bytes") {
			t.Fatalf("%d: error text is %d bytes (want at most %d plus a note naming %d bytes): %.300q", tc.code, len(msg), maxErrorText, tc.total, msg)
		}
	}
	code, reply = 400, big
	if _, err := c.SubmitPrefetch(context.Background(), srv.URL, PrefetchRequest{}); !errors.Is(err, ErrStatus) || len(err.Error()) > maxErrorText+200 {
		t.Fatalf("submit answered 400 with %d bytes: err %.300v, want a StatusError of at most %d bytes", len(big), err, maxErrorText+200)
	}
}
