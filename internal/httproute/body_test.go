package httproute_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/lmcache-go/lmcache/internal/httproute"
)

// TestOpenAPIEmptyVersionDefaults: a service that does not know its
// version (an unstamped build without VCS information) still gets a valid
// OpenAPI document, with info.version "NA", for blank versions too.
func TestOpenAPIEmptyVersionDefaults(t *testing.T) {
	for _, v := range []string{"", "  "} {
		tb, err := httproute.New(httproute.Config{Title: "t", Version: v}, []httproute.Route{
			{Method: "GET", Path: "/x", Statuses: map[int]string{200: "ok"}, Response: httproute.DetailBody{},
				Handle: func(http.ResponseWriter, *http.Request) error { return nil }},
		})
		if err != nil {
			t.Fatal(err)
		}
		doc, err := tb.OpenAPI()
		if err != nil {
			t.Fatal(err)
		}
		if doc.Info.Version != httproute.UnknownVersion || httproute.UnknownVersion != "NA" {
			t.Fatalf("version %q: info.version %q, want NA", v, doc.Info.Version)
		}
		if err := doc.Validate(context.Background()); err != nil {
			t.Fatalf("version %q: document invalid: %v", v, err)
		}
		raw, err := doc.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		loaded, err := openapi3.NewLoader().LoadFromData(raw)
		if err != nil {
			t.Fatal(err)
		}
		if err := loaded.Validate(context.Background()); err != nil {
			t.Fatalf("version %q: reloaded document invalid: %v", v, err)
		}
	}
}

// TestScaledDeadline: the body read deadline is per started unit of the
// limit, at least one unit.
func TestScaledDeadline(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		limit int64
		want  time.Duration
	}{
		{0, 30 * time.Second},
		{1 * mib, 30 * time.Second},
		{16 * mib, 30 * time.Second},
		{16*mib + 1, 60 * time.Second},
		{1 << 30, 32 * time.Minute},
	} {
		if got := httproute.ScaledDeadline(30*time.Second, 16*mib, c.limit); got != c.want {
			t.Errorf("limit %d: %v, want %v", c.limit, got, c.want)
		}
	}
	if got := httproute.ScaledDeadline(time.Second, 0, 1<<30); got != time.Second {
		t.Errorf("unit 0: %v, want 1s", got)
	}
}

// TestLimitBodyAndBodyError: LimitBody refuses a declared length over the
// limit before reading, and BodyError maps a streamed read past the limit
// to ErrBodyTooLarge (413 through the base rules), other read failures to
// ErrBodyRead, and nil to nil.
func TestLimitBodyAndBodyError(t *testing.T) {
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/", strings.NewReader("0123456789"))
	if err := httproute.LimitBody(w, r, 4, 0); !errors.Is(err, httproute.ErrBodyTooLarge) || err.Error() != "request body exceeds 4 bytes" {
		t.Fatalf("declared over the limit: %v", err)
	}
	r = httptest.NewRequest("POST", "/", strings.NewReader("0123456789"))
	r.ContentLength = -1 // streamed: the limit bites while reading
	if err := httproute.LimitBody(w, r, 4, 0); err != nil {
		t.Fatal(err)
	}
	_, rerr := io.ReadAll(r.Body)
	err := httproute.BodyError(rerr)
	if !errors.Is(err, httproute.ErrBodyTooLarge) || err.Error() != "request body exceeds 4 bytes" {
		t.Fatalf("streamed over the limit: %v", err)
	}
	var e httproute.Errors
	if code := e.Status(err); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", code)
	}
	if err := httproute.BodyError(fmt.Errorf("conn: %w", io.ErrClosedPipe)); !errors.Is(err, httproute.ErrBodyRead) || e.Status(err) != http.StatusBadRequest {
		t.Fatalf("read failure: %v", err)
	}
	if httproute.BodyError(nil) != nil {
		t.Fatal("BodyError(nil) != nil")
	}
	var buf bytes.Buffer
	r = httptest.NewRequest("POST", "/", strings.NewReader("0123"))
	if err := httproute.ReadBody(&buf, w, r, 4, 0); err != nil || buf.String() != "0123" {
		t.Fatalf("at the limit: %v %q", err, buf.String())
	}
}

// TestFreeFormBodies: a map[string]any body (request or response) is
// listed, typed ones (a struct, a map of typed values) are not.
func TestFreeFormBodies(t *testing.T) {
	h := func(http.ResponseWriter, *http.Request) error { return nil }
	tb, err := httproute.New(httproute.Config{Title: "t", Version: "1"}, []httproute.Route{
		{Method: "POST", Path: "/free", Request: map[string]any{}, Response: map[string]any{}, Statuses: map[int]string{200: "ok", 400: "bad"}, Handle: h},
		{Method: "GET", Path: "/typed", Response: httproute.DetailBody{}, Statuses: map[int]string{200: "ok"}, Handle: h},
		{Method: "GET", Path: "/map", Response: map[string]httproute.DetailBody{}, Statuses: map[int]string{200: "ok"}, Handle: h},
	})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := tb.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(httproute.FreeFormBodies(doc), "|"), "POST /free 200|POST /free request"; got != want {
		t.Fatalf("free-form bodies %q, want %q", got, want)
	}
}

// TestDecodeJSONOneValue: exactly one JSON value is accepted, numbers as
// json.Number; a stray closing delimiter or a second value after it is
// ErrTrailingJSON, and a syntax error is the decoder's own.
func TestDecodeJSONOneValue(t *testing.T) {
	var v map[string]any
	if err := httproute.DecodeJSON([]byte(` {"n": 1} `), &v); err != nil || v["n"] != json.Number("1") {
		t.Fatalf("one object: %v, %v", v, err)
	}
	for _, b := range []string{`{"n": 1}]`, `{"n": 1}}`, `{"n": 1} {}`, `{"n": 1} 2`} {
		if err := httproute.DecodeJSON([]byte(b), &v); !errors.Is(err, httproute.ErrTrailingJSON) {
			t.Errorf("%s: %v, want ErrTrailingJSON", b, err)
		}
	}
	if err := httproute.DecodeJSON([]byte(`{"n": `), &v); err == nil || errors.Is(err, httproute.ErrTrailingJSON) {
		t.Errorf("truncated object: %v, want a syntax error", err)
	}
}
