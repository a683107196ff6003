package engine

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/lmcache-go/lmcache/internal/mpmetrics/stats"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Counters is a point-in-time snapshot of the engine's counters and gauges
// (see stats.Counters for what each field feeds).
type Counters = stats.Counters

// L2Counters are one adapter's counters (see stats.L2Counters).
type L2Counters = stats.L2Counters

// saltCounts is a small concurrent per-salt counter.
type saltCounts struct {
	mu sync.Mutex
	m  map[string]int64
}

func (s *saltCounts) add(salt string, n int64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]int64{}
	}
	s.m[salt] += n
	s.mu.Unlock()
}

// addKeys adds n per key, under one lock acquisition for the batch.
func (s *saltCounts) addKeys(keys []objkey.Key, n int64) {
	if len(keys) == 0 || n == 0 {
		return
	}
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]int64{}
	}
	run, cnt := keys[0].CacheSalt, int64(0)
	for _, k := range keys {
		if k.CacheSalt != run {
			s.m[run] += cnt
			run, cnt = k.CacheSalt, 0
		}
		cnt += n
	}
	s.m[run] += cnt
	s.mu.Unlock()
}

// addMasked adds 1 per key (chunk-major) whose mask entry is true.
func (s *saltCounts) addMasked(chunks [][]objkey.Key, mask []bool) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]int64{}
	}
	run, cnt, i := "", int64(0), 0
	for _, ks := range chunks {
		for _, k := range ks {
			if mask[i] {
				if k.CacheSalt != run {
					if cnt > 0 {
						s.m[run] += cnt
					}
					run, cnt = k.CacheSalt, 0
				}
				cnt++
			}
			i++
		}
	}
	if cnt > 0 {
		s.m[run] += cnt
	}
	s.mu.Unlock()
}

func (s *saltCounts) snapshot() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		return map[string]int64{}
	}
	return maps.Clone(s.m)
}

// adapterStats are the live counters of one adapter.
type adapterStats struct {
	storeSubmitted, storeCompleted, storeFailed, storeRetried, storeAbandoned atomic.Int64
	storeObjects, storeBytes                                                  atomic.Int64
	loadCompleted, loadObjects, loadBytes, loadFailed                         atomic.Int64
	evicted, evictionTicks, evictionDeleteFailed                              atomic.Int64
	inflightStores, inflightLoads, pendingStores                              atomic.Int64
}

// liveStats are the engine-wide live counters.
type liveStats struct {
	l1Read, l1Write, l1Evicted              saltCounts
	evictTicks, evictTriggered              atomic.Int64
	allocFailStore, allocFailPrefetch       atomic.Int64
	readFailNotFound                        atomic.Int64
	activeJobs, prefetchRequests            atomic.Int64
	hitL1, hitL2, miss                      atomic.Int64
	l2Lookup, l2LoadSub                     atomic.Int64
	prefetchDropped, prefetchReaped         atomic.Int64
	lookupTimeouts, lookupUnavailable       atomic.Int64
	l2LookupObj, l2LoadSubObj, l2LoadDone   saltCounts
	storeSubObj, storeDoneObj, l2EvictedObj saltCounts
	storeDropped                            atomic.Int64
	adapters                                []*adapterStats
}
