package httplimit

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestRefusedCallIs503JSON: once Stop has refused new calls, a request
// that still reaches the wrapped handler (one read from a connection just
// before its close) does not run it and gets 503 {"detail": "server is
// shutting down"} as JSON, the error shape of both services, with the
// connection marked to close; before the refusal the handler runs.
func TestRefusedCallIs503JSON(t *testing.T) {
	tr := newTracker()
	ran := 0
	h := tr.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++ }))

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	if rec.Code != http.StatusOK || ran != 1 {
		t.Fatalf("before the refusal: %d, handler ran %d times; want 200, 1", rec.Code, ran)
	}

	tr.refuse()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	if rec.Code != http.StatusServiceUnavailable || ran != 1 {
		t.Fatalf("after the refusal: %d, handler ran %d times; want 503, 1", rec.Code, ran)
	}
	if got := rec.Body.String(); got != `{"detail":"server is shutting down"}` {
		t.Errorf("body %q", got)
	}
	if ct, conn := rec.Header().Get("Content-Type"), rec.Header().Get("Connection"); ct != "application/json" || conn != "close" {
		t.Errorf("Content-Type %q, Connection %q; want application/json, close", ct, conn)
	}
	if n := tr.count(); n != 0 {
		t.Errorf("%d calls tracked after the refused one, want 0", n)
	}
}
