package periodic

import (
	"net/url"
	"strings"
)

// Listing is the body of GET /periodic-threads on both services: the
// summary over every loop and the loops the query kept.
type Listing struct {
	Summary SummaryCounts `json:"summary"`
	Threads []Status      `json:"threads"`
}

// levelError is a level filter that names no level; its text is the
// message both services answer with.
type levelError struct{ value string }

func (e levelError) Error() string {
	return "Invalid level: " + e.value + ". Valid values: critical, high, medium, low"
}

func (e levelError) Unwrap() error { return ErrInvalidLevel }

// truthy is upstream's query flag test.
func truthy(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on", "t", "y":
		return true
	}
	return false
}

// List applies the query of GET /periodic-threads (level=,
// running_only=, active_only=). An unknown level is an error wrapping
// ErrInvalidLevel.
func (r *Registry) List(q url.Values) (Listing, error) {
	var level Level
	if q.Has("level") {
		l, err := ParseLevel(q.Get("level"))
		if err != nil {
			return Listing{}, levelError{q.Get("level")}
		}
		level = l
	}
	running, active := truthy(q.Get("running_only")), truthy(q.Get("active_only"))
	all := r.All()
	out := Listing{Summary: Summarize(all), Threads: []Status{}}
	for _, t := range all {
		if level != "" && t.Level != level || running && !t.IsRunning || active && !t.IsActive {
			continue
		}
		out.Threads = append(out.Threads, t)
	}
	return out, nil
}

// UnhealthyLoop is one entry of Health (fields in JSON-name order, the
// order the services wrote before).
type UnhealthyLoop struct {
	Interval   float64  `json:"interval"`
	LastRunAgo *float64 `json:"last_run_ago"`
	Level      Level    `json:"level"`
	Name       string   `json:"name"`
}

// Health is the body of GET /periodic-threads-health.
type Health struct {
	Healthy          bool            `json:"healthy"`
	UnhealthyCount   int             `json:"unhealthy_count"`
	UnhealthyThreads []UnhealthyLoop `json:"unhealthy_threads"`
}

// Health reports the critical and high loops that run but do not tick.
func (r *Registry) Health() Health {
	bad := Unhealthy(r.All())
	h := Health{Healthy: len(bad) == 0, UnhealthyCount: len(bad), UnhealthyThreads: make([]UnhealthyLoop, 0, len(bad))}
	for _, t := range bad {
		h.UnhealthyThreads = append(h.UnhealthyThreads, UnhealthyLoop{Name: t.Name, Level: t.Level, LastRunAgo: t.LastRunAgo, Interval: t.Interval})
	}
	return h
}
