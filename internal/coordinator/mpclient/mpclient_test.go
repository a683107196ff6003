package mpclient

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
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
