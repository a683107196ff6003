package coordinator

import (
	"context"
	"errors"
	"fmt"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/coordinator/mpclient"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// evictionCycle is the eviction loop's periodic cycle.
func (s *Server) evictionCycle(ctx context.Context) (periodic.Summary, error) {
	r := s.RunEvictionCycle(ctx)
	if r.Standby {
		return periodic.Summary{Message: "standby: the HA leader evicts"}, nil
	}
	return periodic.Summary{Message: fmt.Sprintf("victims=%d in_flight=%d phantoms_dropped=%d walked=%d requests=%d target=%s", r.Victims, r.InFlight, r.PhantomsDropped, r.Walked, r.Requests, r.Target)}, nil
}

// phantomDispatches is how many times a key is sent for eviction, each
// dispatch answered 2xx, before a cycle that would send it again drops it
// from the ledger instead (ledger.PlanOptions.MaxDispatches). The MP
// server's DELETE reply does not say which keys it found (absent keys are
// skipped silently), so a key whose delete event never comes back (the
// event was lost, or applied before the store it raced) is told from one
// whose event is merely late by the count: with the default 30 s in-flight
// TTL that is about 90 s without news. Dropping a key that does still
// exist only forgets it until its next store event.
const phantomDispatches = 3

// CycleResult summarises one eviction cycle.
type CycleResult struct {
	// Victims is the number of keys chosen this cycle.
	Victims int
	// InFlight is how many keys were withheld because an earlier dispatch
	// of them is still awaiting delete events.
	InFlight int
	// Target is the instance the deletes were sent to ("" when none).
	Target string
	// Requests is the number of DELETE /cache/objects spawned.
	Requests int
	// Standby: this coordinator does not lead (HA), so nothing was planned.
	Standby bool
	// Walked is how many ledger entries the plan visited under the ledger
	// lock (ledger.Plan.Walked), the cycle's cost to ingest.
	Walked int
	// PhantomsDropped is the number of keys removed from the ledger instead
	// of being sent again: they were sent phantomDispatches times and no
	// delete or store event of them came back.
	PhantomsDropped int
}

// RunEvictionCycle runs one eviction cycle now: plan, pick one random
// registered server, and send the victims as DELETE /cache/objects batches
// of at most 10,000 keys. The requests run in goroutines owned by the server
// (Run waits for them); usage changes only when the delete events come back.
// A failed request, or an empty fleet, releases its victims' in-flight marks
// so the next cycle sends them again.
func (s *Server) RunEvictionCycle(ctx context.Context) CycleResult {
	s.cycleMu.Lock()
	defer s.cycleMu.Unlock()
	// In HA mode only the leader dispatches, under its term's context (a
	// lost term cancels its DELETEs) and stamped with its fencing token.
	ctx, fence, leading := s.dispatchTerm(ctx)
	if !leading {
		return CycleResult{Standby: true}
	}
	s.metrics.evictionCycles.Inc()
	plan := s.ledger.ComputePlan(s.quotas.Snapshot(), ledger.PlanOptions{
		Ratio:         s.cfg.EvictionRatio,
		Watermark:     s.cfg.TriggerWatermark,
		InflightTTL:   config.Seconds(s.cfg.InflightTTL),
		Mark:          s.cfg.InflightTTL > 0,
		MaxDispatches: phantomDispatches,
	})
	res := CycleResult{Victims: plan.Len(), InFlight: plan.InFlight, PhantomsDropped: plan.Dropped, Walked: plan.Walked}
	if plan.Dropped > 0 {
		s.metrics.phantomsDropped.Add(float64(plan.Dropped))
		s.log.Warn("eviction dropped keys from the ledger that were sent for deletion repeatedly without a delete event coming back (most likely already gone from L2)",
			"keys", plan.Dropped, "bytes", plan.DroppedBytes, "dispatches", phantomDispatches)
	}
	if res.Victims == 0 {
		return res
	}
	victims := plan.Flat()
	inst, ok := s.reg.Random()
	if !ok {
		s.log.Warn("eviction plan has victims but no MP server is registered; retrying next cycle", "victims", res.Victims)
		s.ledger.Unmark(victims)
		return res
	}
	res.Target = inst.InstanceID
	base := mpclient.BaseURL(inst.IP, inst.HTTPPort)
	sent := 0
	for start := 0; start < len(victims); start += mpclient.MaxDeleteBatch {
		if !s.mayLead() {
			s.ledger.Unmark(victims[start:])
			break
		}
		end := min(start+mpclient.MaxDeleteBatch, len(victims))
		// Materialize one request's worth at a time: the ledger lock is held
		// only for this chunk, and victims deleted meanwhile are dropped.
		keys, vs := s.ledger.Materialize(victims[start:end])
		if len(keys) == 0 {
			continue
		}
		batch := keysToEncoded(keys)
		sent += len(batch)
		res.Requests++
		s.dispatchWG.Add(1)
		go func() {
			defer s.dispatchWG.Done()
			if err := s.mp.DeleteObjects(ctx, base, batch); err != nil {
				s.metrics.dispatchFailures.Inc()
				if errors.Is(err, mpclient.ErrNotOK) {
					s.metrics.dispatchNotOK.Inc()
				}
				s.log.Warn("eviction dispatch failed; victims will be re-planned", "instance_id", inst.InstanceID, "keys", len(batch), "fence_revision", fence, "err", s.scrub(err))
				s.ledger.Unmark(vs)
				return
			}
			s.metrics.keysDispatched.Add(float64(len(batch)))
		}()
	}
	s.log.Info("eviction dispatched", "instance_id", inst.InstanceID, "keys", sent, "salts", len(plan.Salts), "requests", res.Requests, "in_flight_withheld", plan.InFlight, "fence_revision", fence)
	return res
}

// WaitDispatches blocks until every eviction request spawned so far has
// finished (for tests and orderly shutdown).
func (s *Server) WaitDispatches() { s.dispatchWG.Wait() }
