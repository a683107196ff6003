package httproute_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// TestPeriodicHandlers: the shared loop handlers list a registry's loops
// with the level filter, answer one loop by name, report health, and turn
// an unknown name into the caller's not-found sentinel and an unknown
// level into periodic.ErrInvalidLevel.
func TestPeriodicHandlers(t *testing.T) {
	reg := periodic.NewRegistry()
	noop := func(context.Context) (periodic.Summary, error) { return periodic.Summary{}, nil }
	reg.Register("sweep", periodic.Critical, time.Second, 0, noop)
	reg.Register("gc", periodic.Low, time.Second, 0, noop)
	notFound := errors.New("no such loop")
	h := httproute.Periodic(reg, notFound)

	get := func(handle func(http.ResponseWriter, *http.Request) error, target, name string) (*httptest.ResponseRecorder, error) {
		r := httptest.NewRequest("GET", target, nil)
		if name != "" {
			r.SetPathValue("thread_name", name)
		}
		w := httptest.NewRecorder()
		return w, handle(w, r)
	}

	w, err := get(h.List, "/periodic-threads?level=critical", "")
	if err != nil {
		t.Fatal(err)
	}
	var l periodic.Listing
	if err := json.Unmarshal(w.Body.Bytes(), &l); err != nil {
		t.Fatal(err)
	}
	if w.Code != 200 || l.Summary.TotalCount != 2 || len(l.Threads) != 1 || l.Threads[0].Name != "sweep" {
		t.Errorf("list = %d %+v", w.Code, l)
	}
	if _, err := get(h.List, "/periodic-threads?level=urgent", ""); !errors.Is(err, periodic.ErrInvalidLevel) {
		t.Errorf("unknown level: %v", err)
	}

	w, err = get(h.Get, "/periodic-threads/gc", "gc")
	var st periodic.Status
	if err != nil || json.Unmarshal(w.Body.Bytes(), &st) != nil || st.Name != "gc" || st.Level != periodic.Low {
		t.Errorf("get gc = %v %s", err, w.Body)
	}
	_, err = get(h.Get, "/periodic-threads/nope", "nope")
	if !errors.Is(err, notFound) || httproute.Message(err) != "Thread not found: nope" {
		t.Errorf("unknown loop: %v", err)
	}

	w, err = get(h.Health, "/periodic-threads-health", "")
	var hl periodic.Health
	if err != nil || json.Unmarshal(w.Body.Bytes(), &hl) != nil || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("health = %v %s", err, w.Body)
	}
	// Registered but never run: not running, so not counted unhealthy.
	if !hl.Healthy || hl.UnhealthyCount != 0 {
		t.Errorf("health = %+v", hl)
	}
}
