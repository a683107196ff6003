package coordinator

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
)

// The web console's own route, GET /ui/api/fleet (hidden from the OpenAPI
// document like /ui itself; open like the coordinator's other reads): the
// figures no upstream route has a place for. Per instance the last
// heartbeat and its age against --instance-timeout; per salt the limit in
// force, the usage and the level at which eviction starts (trigger
// watermark × limit, the planner's rule); active pins; and the warm
// prefetches submitted through this coordinator that no poll has yet seen
// completed.

// ConsoleInstance is one registered server's liveness.
type ConsoleInstance struct {
	InstanceID string `json:"instance_id"`
	// LastHeartbeatTime is Unix seconds, like registration_time.
	LastHeartbeatTime pyFloat `json:"last_heartbeat_time"`
	// HeartbeatAgeSeconds is how long ago that was (the sweep drops the
	// instance past instance_timeout).
	HeartbeatAgeSeconds pyFloat `json:"heartbeat_age_seconds"`
	// L1Reported says whether the instance's current incarnation posted a
	// tier "l1" fact through POST /events: without one, GET /instances'
	// l1_used_bytes and l1_keys read 0 for lack of reports, not because
	// its L1 is empty (lmcache-go servers report L2 only).
	L1Reported bool `json:"l1_reported"`
}

// ConsoleSalt is one salt's quota against usage.
type ConsoleSalt struct {
	CacheSalt string `json:"cache_salt"`
	// LimitSource is "quota" (PUT /quota/{salt}), "default" (the default
	// limit) or "none" (exempt: never evicted).
	LimitSource string `json:"limit_source" enum:"quota,default,none"`
	// LimitBytes is the limit in force; null when exempt.
	LimitBytes *int64 `json:"limit_bytes"`
	UsageBytes int64  `json:"usage_bytes"`
	// EvictionStartsBytes is trigger_watermark × limit: at this usage the
	// next eviction cycle plans victims. Null when exempt.
	EvictionStartsBytes *int64 `json:"eviction_starts_bytes"`
	// OverWatermark reports usage at or past EvictionStartsBytes.
	OverWatermark bool `json:"over_watermark"`
}

// ConsolePrefetch is one warm prefetch relayed through the coordinator.
type ConsolePrefetch struct {
	InstanceID string  `json:"instance_id"`
	RequestID  string  `json:"request_id"`
	AgeSeconds pyFloat `json:"age_seconds"`
}

// ConsolePrefetches counts the relayed warm prefetches.
type ConsolePrefetches struct {
	// InFlight is how many were submitted and not yet polled as completed
	// (or 404) through GET /cache/prefetches/{instance_id}/{request_id}.
	InFlight int               `json:"in_flight"`
	Jobs     []ConsolePrefetch `json:"jobs"`
	// Submitted, Completed and Forgotten count since start; Forgotten are
	// jobs nobody polled within the servers' result lifetime (10 min) or
	// pushed out past maxTrackedPrefetches.
	Submitted int64 `json:"submitted"`
	Completed int64 `json:"completed"`
	Forgotten int64 `json:"forgotten"`
}

// ConsoleFleet is GET /ui/api/fleet.
type ConsoleFleet struct {
	Now              pyFloat           `json:"now"`
	InstanceTimeout  pyFloat           `json:"instance_timeout"`
	TriggerWatermark pyFloat           `json:"trigger_watermark"`
	EvictionRatio    pyFloat           `json:"eviction_ratio"`
	Instances        []ConsoleInstance `json:"instances"`
	Salts            []ConsoleSalt     `json:"salts"`
	ActivePins       int               `json:"active_pins"`
	Prefetches       ConsolePrefetches `json:"prefetches"`
}

// Bounds of the prefetch view: the servers discard an unpolled result after
// prefetchForget (engine's prefetchResultTTL), so tracking longer would
// only show jobs that no longer exist.
const (
	prefetchForget       = 10 * time.Minute
	maxTrackedPrefetches = 10000
)

type prefetchKey struct{ instance, request string }

// prefetchTracker remembers the warm prefetches relayed through this
// coordinator until a poll shows them done. One mutex; every operation is
// a map update or, for the console, a copy of at most
// maxTrackedPrefetches entries.
type prefetchTracker struct {
	mu                              sync.Mutex
	jobs                            map[prefetchKey]time.Time
	submitted, completed, forgotten int64
}

func newPrefetchTracker() *prefetchTracker {
	return &prefetchTracker{jobs: map[prefetchKey]time.Time{}}
}

func (p *prefetchTracker) add(k prefetchKey, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(now)
	if _, ok := p.jobs[k]; !ok && len(p.jobs) >= maxTrackedPrefetches {
		oldest, at := prefetchKey{}, now
		for j, t := range p.jobs {
			if !t.After(at) {
				oldest, at = j, t
			}
		}
		delete(p.jobs, oldest)
		p.forgotten++
	}
	p.jobs[k] = now
	p.submitted++
}

func (p *prefetchTracker) done(k prefetchKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.jobs[k]; ok {
		delete(p.jobs, k)
		p.completed++
	}
}

func (p *prefetchTracker) expireLocked(now time.Time) {
	for k, t := range p.jobs {
		if now.Sub(t) > prefetchForget {
			delete(p.jobs, k)
			p.forgotten++
		}
	}
}

func (p *prefetchTracker) view(now time.Time) ConsolePrefetches {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(now)
	out := ConsolePrefetches{InFlight: len(p.jobs), Jobs: make([]ConsolePrefetch, 0, len(p.jobs)),
		Submitted: p.submitted, Completed: p.completed, Forgotten: p.forgotten}
	for k, t := range p.jobs {
		out.Jobs = append(out.Jobs, ConsolePrefetch{InstanceID: k.instance, RequestID: k.request, AgeSeconds: pyFloat(now.Sub(t).Seconds())})
	}
	sort.Slice(out.Jobs, func(i, j int) bool {
		a, b := out.Jobs[i], out.Jobs[j]
		return a.AgeSeconds > b.AgeSeconds || a.AgeSeconds == b.AgeSeconds && a.RequestID < b.RequestID
	})
	return out
}

// bodyRecorder keeps a copy of a small JSON reply (the relayed prefetch
// bodies) so the tracker can read its outcome; past captureLimit it stops
// copying and the reply counts as unreadable.
type bodyRecorder struct {
	http.ResponseWriter
	code int
	buf  bytes.Buffer
}

const captureLimit = 64 << 10

func (b *bodyRecorder) WriteHeader(code int) {
	b.code = code
	b.ResponseWriter.WriteHeader(code)
}

func (b *bodyRecorder) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	if b.buf.Len()+len(p) <= captureLimit {
		b.buf.Write(p)
	}
	return b.ResponseWriter.Write(p)
}

// trackSubmit wraps POST /cache/prefetches: a submitted job joins the
// tracker (a noop submit, with no request id, does not).
func (p *prefetchTracker) trackSubmit(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		rec := &bodyRecorder{ResponseWriter: w}
		err := h(rec, r)
		var out prefetchResponse
		if err == nil && rec.code == http.StatusOK && json.Unmarshal(rec.buf.Bytes(), &out) == nil && out.Status == "submitted" && out.RequestID != "" {
			p.add(prefetchKey{out.InstanceID, out.RequestID}, time.Now())
		}
		return err
	}
}

// trackPoll wraps GET /cache/prefetches/{instance_id}/{request_id}: a
// "completed" answer, or the server's 404 (consumed or never known), ends
// the job's tracking.
func (p *prefetchTracker) trackPoll(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		rec := &bodyRecorder{ResponseWriter: w}
		err := h(rec, r)
		var out struct {
			Status string `json:"status"`
		}
		k := prefetchKey{r.PathValue("instance_id"), r.PathValue("request_id")}
		switch {
		case err != nil:
		case rec.code == http.StatusNotFound:
			p.done(k)
		case rec.code == http.StatusOK && json.Unmarshal(rec.buf.Bytes(), &out) == nil && out.Status == "completed":
			p.done(k)
		}
		return err
	}
}

// consoleFleet serves GET /ui/api/fleet.
func (s *Server) consoleFleet(p *prefetchTracker) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, _ *http.Request) error {
		now := time.Now()
		out := ConsoleFleet{Now: pyFloat(unixSeconds(now)), InstanceTimeout: pyFloat(s.cfg.InstanceTimeout),
			TriggerWatermark: pyFloat(s.cfg.TriggerWatermark), EvictionRatio: pyFloat(s.cfg.EvictionRatio),
			Instances: []ConsoleInstance{}, Salts: []ConsoleSalt{}}
		beats := s.reg.LastHeartbeats()
		for _, in := range s.reg.List() {
			if t, ok := beats[in.InstanceID]; ok {
				out.Instances = append(out.Instances, ConsoleInstance{InstanceID: in.InstanceID,
					LastHeartbeatTime: pyFloat(unixSeconds(t)), HeartbeatAgeSeconds: pyFloat(now.Sub(t).Seconds()),
					L1Reported: s.l1.reported(in.InstanceID)})
			}
		}
		usage, _ := s.ledger.Usage()
		limits := s.quotas.Snapshot()
		names := map[string]struct{}{}
		for k := range usage {
			names[k] = struct{}{}
		}
		for k := range limits.Explicit {
			names[k] = struct{}{}
		}
		sorted := make([]string, 0, len(names))
		for k := range names {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			out.Salts = append(out.Salts, consoleSalt(k, usage[k], limits, s.cfg.TriggerWatermark))
		}
		out.ActivePins = s.ledger.Stats().PinnedKeys
		out.Prefetches = p.view(now)
		writeJSON(w, http.StatusOK, out)
		return nil
	}
}

// consoleSalt applies the eviction planner's rule (ledger.ComputePlan: a
// salt is planned once its bytes reach watermark × limit) to one salt.
func consoleSalt(salt string, used int64, limits quota.Limits, watermark float64) ConsoleSalt {
	row := ConsoleSalt{CacheSalt: salt, LimitSource: "none", UsageBytes: used}
	lim, ok := limits.Effective(salt)
	if !ok {
		return row
	}
	row.LimitSource = "default"
	if _, explicit := limits.Explicit[salt]; explicit {
		row.LimitSource = "quota"
	}
	starts := int64(watermark * float64(lim))
	row.LimitBytes, row.EvictionStartsBytes = &lim, &starts
	row.OverWatermark = float64(used) >= watermark*float64(lim) && used > 0
	return row
}

// reported says whether instance has L1 facts on record in its current
// incarnation (a store made the entry; a fence, on a new incarnation,
// removes it; deletes keep it, at 0 bytes).
func (v *l1View) reported(instance string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.by[instance] != nil
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
