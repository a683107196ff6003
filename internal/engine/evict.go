package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lmcache-go/lmcache/internal/eviction"
	"github.com/lmcache-go/lmcache/internal/l1"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// l2DeleteTimeout bounds one eviction delete on an adapter (upstream waits
// up to 30 s for S3 deletes).
const l2DeleteTimeout = 30 * time.Second

// startEvictionLoops registers and starts the L1 eviction loop and, when
// some adapter has an "eviction" block, the L2 one (one loop for all such
// adapters, as upstream's single thread). Both run every EvictionInterval
// on goroutines owned by wg until ctx ends.
func (e *Engine) startEvictionLoops(ctx context.Context, wg *sync.WaitGroup) {
	d := e.cfg.EvictionInterval
	l1 := e.cfg.Loops.Register(LoopL1Eviction, periodic.High, d, d, func(context.Context) (periodic.Summary, error) {
		n := e.l1EvictOnce()
		e.pf.reap(time.Now())
		return periodic.Summary{Message: fmt.Sprintf("evicted=%d", n)}, nil
	})
	wg.Go(func() { l1.Run(ctx) })
	enabled := false
	for _, p := range e.l2pol {
		enabled = enabled || p != nil
	}
	if !enabled {
		return
	}
	// Medium: one cycle may wait up to l2DeleteTimeout on a slow adapter,
	// which is not a stalled loop.
	l2 := e.cfg.Loops.Register(LoopL2Eviction, periodic.Medium, d, d, e.l2EvictCycle)
	wg.Go(func() { l2.Run(ctx) })
}

// l2EvictCycle is one cycle of the L2 eviction loop over every adapter with
// an eviction policy. A failed Delete on any adapter fails the cycle (after
// the other adapters had their turn), so the loop's failed_runs shows it
// as well as the per-adapter counter.
func (e *Engine) l2EvictCycle(ctx context.Context) (periodic.Summary, error) {
	n := 0
	var errs []error
	for i := range e.adapters {
		if e.l2pol[i] != nil {
			k, err := e.l2EvictOnce(ctx, i)
			n += k
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return periodic.Summary{Message: fmt.Sprintf("evicted=%d", n)}, errors.Join(errs...)
}

// l1EvictOnce is one cycle of the L1 eviction controller:
//
//   - expired leases are swept (reclaiming what crashed clients left);
//   - LRU: when used/total reaches the watermark, EvictionRatio of the
//     tracked keys are evicted, least recent first, skipping locked ones;
//   - IsolatedLRU: every salt whose L1 bytes reach watermark × its quota is
//     trimmed by EvictionRatio of its keys, and a salt without a quota (or
//     with quota 0) is evicted entirely (allowlist semantics, as upstream
//     applies to L2). If the pool as a whole still crosses the watermark,
//     every salt gives up EvictionRatio of its keys;
//   - noop: nothing.
func (e *Engine) l1EvictOnce() int {
	e.st.evictTicks.Add(1)
	e.withEvents(func() { e.deletedL1(e.table.Sweep()) })
	wm, ratio := e.cfg.EvictionTriggerWatermark, e.cfg.EvictionRatio
	used, total := e.table.Usage()
	over := total > 0 && float64(used)/float64(total) >= wm
	var cuts []l1.Cut
	switch e.cfg.EvictionPolicy {
	case PolicyLRU:
		if over {
			cuts = append(cuts, l1.Cut{Global: true, Ratio: ratio})
		}
	case PolicyIsolatedLRU:
		for salt, b := range e.table.UsageBySalt() {
			switch limit := e.quotas.LimitBytes(salt); {
			case limit == 0:
				cuts = append(cuts, l1.Cut{Salt: salt, Ratio: 1})
			case float64(b) >= wm*float64(limit):
				cuts = append(cuts, l1.Cut{Salt: salt, Ratio: ratio})
			}
		}
		if over {
			cuts = append(cuts, l1.Cut{Global: true, Ratio: ratio})
		}
	}
	if len(cuts) == 0 {
		return 0
	}
	defer e.unlockEvents(e.lockEvents())
	evicted, _ := e.table.Evict(cuts)
	if len(evicted) == 0 {
		return 0
	}
	e.st.evictTriggered.Add(1)
	for _, k := range evicted {
		e.st.l1Evicted.add(k.CacheSalt, 1)
	}
	e.deletedL1(evicted)
	return len(evicted)
}

// l2EvictOnce is one cycle for adapter i. Isolation policies apply the
// per-salt quota logic (research 3.4): a salt using b ≥ watermark × limit
// bytes loses ratio of its keys, a salt with limit 0 (unregistered) loses
// all of them. Other policies evict ratio of the tracked keys when the
// adapter's usage fraction reaches the watermark; an unbounded adapter
// (fraction -1) is never evicted that way. Victims go to one Delete call;
// the adapter skips keys it has locked and fires OnDeleted for the rest,
// which removes them from the policy; victims it kept (locked, or gone
// from the tier without an event) become the most recent keys, so they
// cannot stall the cycles after. A Delete error is counted in the
// adapter's EvictionDeleteFailed and returned (wrapped); the keys the
// adapter did delete before failing are still accounted for.
func (e *Engine) l2EvictOnce(ctx context.Context, i int) (int, error) {
	a, pol, ev := e.adapters[i], e.l2pol[i], e.cfg.L2[i].Eviction
	e.st.adapters[i].evictionTicks.Add(1)
	u := a.Usage()
	var victims []objkey.Key
	pol.Do(func(p eviction.Policy) {
		if iso, ok := p.(eviction.Isolated); ok {
			for salt, b := range u.BytesByCacheSalt {
				if b <= 0 {
					continue
				}
				limit := e.quotas.LimitBytes(salt)
				r := ev.EvictionRatio
				if limit == 0 {
					r = 1
				} else if float64(b) < ev.TriggerWatermark*float64(limit) {
					continue
				}
				victims = append(victims, iso.SaltVictims(salt, r, nil)...)
			}
			return
		}
		if f := u.Fraction(); f < 0 || f < ev.TriggerWatermark {
			return
		}
		victims = p.Victims(ev.EvictionRatio, nil)
	})
	if len(victims) == 0 {
		return 0, nil
	}
	dctx, cancel := context.WithTimeout(ctx, l2DeleteTimeout)
	defer cancel()
	deleted, err := a.Delete(dctx, victims)
	if err != nil {
		// The victims stay on the tier and in the policy, so the next
		// cycle retries them; one log per failed cycle is bounded by
		// the eviction interval.
		e.st.adapters[i].evictionDeleteFailed.Add(1)
		e.log.Warn("L2 eviction delete failed (counted in lmcache_mp_l2_eviction_delete_failures_total)", "adapter", i, "keys", len(victims), "err", err)
		err = fmt.Errorf("L2 adapter %d (%s): eviction delete of %d keys: %w", i, a.TypeName(), len(victims), err)
	}
	// Remove again in case the adapter does not notify listeners of its own
	// deletions; Remove is idempotent.
	pol.Do(func(p eviction.Policy) { p.Remove(deleted) })
	if err == nil && len(deleted) < len(victims) {
		// The victims the adapter kept are locked (being read right now)
		// or no longer on the tier (another server sharing it removed
		// them, or it lost them without an event). Left least recent they
		// would be every cycle's victims again, and once they filled the
		// cycle's target nothing else would ever be evicted; moved to the
		// most recent end, the next cycle takes the keys after them, and a
		// key that is gone is asked for again only after a whole round.
		gone := make(map[objkey.Key]struct{}, len(deleted))
		for _, k := range deleted {
			gone[k] = struct{}{}
		}
		kept := make([]objkey.Key, 0, len(victims)-len(deleted))
		for _, k := range victims {
			if _, ok := gone[k]; !ok {
				kept = append(kept, k)
			}
		}
		pol.Do(func(p eviction.Policy) { p.Touch(kept) })
	}
	e.st.adapters[i].evicted.Add(int64(len(deleted)))
	for _, k := range deleted {
		e.st.l2EvictedObj.add(k.CacheSalt, 1)
	}
	return len(deleted), err
}
