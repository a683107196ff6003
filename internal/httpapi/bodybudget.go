package httpapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
)

// DefaultKVBodyBudgetBytes is Options.KVBodyBudgetBytes' default: 2 GiB,
// twice the default per-request cap (MaxKVBodyBytes), so one largest
// store and a retrieve (or many small stores) are in flight together,
// while the heap the KV routes can pin stays fixed whatever the L1 size
// and connection cap (512 connections x 1 GiB was the bound before).
const DefaultKVBodyBudgetBytes = 2 << 30

// bodyRetryAfter is the Retry-After (seconds) of a refused KV transfer:
// the budget frees as soon as an in-flight transfer ends.
const bodyRetryAfter = "1"

// bodyBudget is the one budget of KV payload bytes held in the server's
// heap at once, shared by POST /api/kv/store (both forms) and the buffered
// answers of POST /api/kv/retrieve.
type bodyBudget struct {
	size    int64
	sem     *semaphore.Weighted
	inUse   prometheus.Gauge
	refused *prometheus.CounterVec
	// acquired, when set (tests only, before serving), is called after
	// each successful reservation: the event a test waits for to know the
	// budget is held.
	acquired func(n int64)
}

func newBodyBudget(size int64, reg prometheus.Registerer) (*bodyBudget, error) {
	b := &bodyBudget{size: size, sem: semaphore.NewWeighted(size)}
	b.inUse = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lmcache_mp_http_kv_body_budget_in_use_bytes",
		Help: "KV payload bytes the HTTP API holds for in-flight /api/kv/store bodies and /api/kv/retrieve answers (bounded by --http-kv-body-budget-mb).",
	})
	b.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lmcache_mp_http_kv_body_budget_refused_total",
		Help: "/api/kv requests answered 503 (Retry-After) because the in-flight KV body budget (--http-kv-body-budget-mb) was taken, by route: store, retrieve. Nothing was stored or read.",
	}, []string{"route"})
	var err error
	if b.inUse, err = register(reg, b.inUse); err != nil {
		return nil, err
	}
	if b.refused, err = register(reg, b.refused); err != nil {
		return nil, err
	}
	for _, r := range []string{"store", "retrieve"} {
		b.refused.WithLabelValues(r) // exported as 0 before the first refusal
	}
	return b, nil
}

// register registers c, or returns the collector already registered under
// its name (several servers may share one mpmetrics registry in tests).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return c, fmt.Errorf("httpapi: register metrics: %w", err)
		}
		existing, ok := are.ExistingCollector.(C)
		if !ok {
			return c, fmt.Errorf("httpapi: register metrics: %w", err)
		}
		return existing, nil
	}
	return c, nil
}

// reserve takes n bytes of the budget for a transfer of route before its
// bytes are read or copied, and returns the release the handler defers.
// More than the whole budget can never be had: that is the 413 of an
// oversized body. A budget taken by other transfers is refused at once, a
// 503 with Retry-After: waiting would park the request on a connection
// slot while its client cannot tell a slow server from a busy one, and
// the client (upstream's SDK, the connector) retries on its own.
func (s *Server) reserve(w http.ResponseWriter, route string, n int64) (func(), error) {
	b := s.budget
	if n > b.size {
		return nil, errf(ErrTooLarge, "%s of %d bytes exceeds the %d-byte in-flight budget of KV transfers (--http-kv-body-budget-mb)", route, n, b.size)
	}
	if n <= 0 {
		return func() {}, nil
	}
	if !b.sem.TryAcquire(n) {
		b.refused.WithLabelValues(route).Inc()
		w.Header().Set("Retry-After", bodyRetryAfter)
		return nil, errf(ErrUnavailable, "server busy: the %d-byte in-flight budget of KV transfers (--http-kv-body-budget-mb) cannot hold this %s of %d bytes now; retry later", b.size, route, n)
	}
	b.inUse.Add(float64(n))
	if b.acquired != nil {
		b.acquired(n)
	}
	return func() {
		b.inUse.Sub(float64(n))
		b.sem.Release(n)
	}, nil
}
