package periodic

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"
)

// TestListFiltersAndHealth: the shared /periodic-threads query filters by
// level, running and active; an unknown level wraps ErrInvalidLevel with
// the message both services answer; Health lists no idle loop.
func TestListFiltersAndHealth(t *testing.T) {
	r := NewRegistry()
	nop := func(context.Context) (Summary, error) { return Summary{}, nil }
	r.Register("b-low", Low, time.Second, 0, nop)
	r.Register("a-high", High, time.Second, 0, nop)
	l, err := r.List(url.Values{})
	if err != nil || len(l.Threads) != 2 || l.Threads[0].Name != "a-high" || l.Summary.TotalCount != 2 {
		t.Fatalf("List() = %+v, %v", l, err)
	}
	l, err = r.List(url.Values{"level": {"low"}})
	if err != nil || len(l.Threads) != 1 || l.Threads[0].Name != "b-low" || l.Summary.TotalCount != 2 {
		t.Fatalf("level=low = %+v, %v", l, err)
	}
	l, err = r.List(url.Values{"running_only": {"yes"}})
	if err != nil || len(l.Threads) != 0 {
		t.Fatalf("running_only = %+v, %v", l, err)
	}
	_, err = r.List(url.Values{"level": {"urgent"}})
	if !errors.Is(err, ErrInvalidLevel) || err.Error() != "Invalid level: urgent. Valid values: critical, high, medium, low" {
		t.Fatalf("bad level err = %v", err)
	}
	h := r.Health()
	if !h.Healthy || h.UnhealthyCount != 0 || h.UnhealthyThreads == nil {
		t.Fatalf("health = %+v", h)
	}
}
