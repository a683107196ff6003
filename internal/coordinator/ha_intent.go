package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/intentstore"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// The intent writes the handlers make. Without HA they go through
// applyIntent (memory, then the state file fsync'd before the reply); with HA they commit to etcd under the leader's
// fence first, then apply the committed change here at once (the watch
// delivers the same revision later, and the mirror skips it).

// setQuota refuses a new salt while maxQuotas or more are held (400,
// nothing changes); replacing a held salt's limit always works.
func (s *Server) setQuota(ctx context.Context, salt string, limit int64) error {
	if s.ha == nil {
		// The check outside applyIntent spares a refusal the state-file
		// write; the one inside makes it exact under concurrent PUTs.
		if ok, n := s.quotas.Admits(salt, maxQuotas); !ok {
			return s.tooManyQuotas(n)
		}
		var refused error
		err := s.applyIntent(func() {
			if s.quotas.SetBounded(salt, limit, maxQuotas) != nil {
				refused = s.tooManyQuotas(s.quotas.Len())
			}
		})
		if refused != nil {
			return refused
		}
		return err
	}
	s.ha.quotaMu.Lock()
	defer s.ha.quotaMu.Unlock()
	if ok, n := s.quotas.Admits(salt, maxQuotas); !ok {
		return s.tooManyQuotas(n)
	}
	return s.intentWrite(ctx, func(ctx context.Context, f intentstore.Fence) (intentstore.Change, error) {
		rev, err := s.ha.store.PutQuota(ctx, f, salt, limit)
		return intentstore.Change{Kind: intentstore.KindQuota, Salt: salt, Bytes: limit, Revision: rev}, err
	}, nil)
}

func (s *Server) deleteQuota(ctx context.Context, salt string) (bool, error) {
	if s.ha == nil {
		var ok bool
		err := s.applyIntent(func() { ok = s.quotas.Delete(salt) })
		return ok, err
	}
	var existed bool
	err := s.intentWrite(ctx, func(ctx context.Context, f intentstore.Fence) (intentstore.Change, error) {
		ok, rev, err := s.ha.store.DeleteQuota(ctx, f, salt)
		existed = ok
		return intentstore.Change{Kind: intentstore.KindQuota, Salt: salt, Deleted: true, Revision: rev}, err
	}, nil)
	return existed, err
}

func (s *Server) setDefaultLimit(ctx context.Context, limit *int64) error {
	if s.ha == nil {
		return s.applyIntent(func() { s.quotas.SetDefault(limit) })
	}
	return s.intentWrite(ctx, func(ctx context.Context, f intentstore.Fence) (intentstore.Change, error) {
		rev, err := s.ha.store.SetDefault(ctx, f, limit)
		c := intentstore.Change{Kind: intentstore.KindDefault, Deleted: limit == nil, Revision: rev}
		if limit != nil {
			c.Bytes = *limit
		}
		return c, err
	}, nil)
}

// pin adjusts the pin counts of keys, the fan-out of one pinned sequence.
func (s *Server) pin(ctx context.Context, model string, worldSize int64, salt string, hashes [][]byte, keys []objkey.Key, delta int32) error {
	if s.ha == nil {
		return s.applyIntent(func() { s.ledger.Pin(keys, delta) })
	}
	g := intentstore.NewPinGroup(model, worldSize, salt, hashes)
	return s.intentWrite(ctx, func(ctx context.Context, f intentstore.Fence) (intentstore.Change, error) {
		n, rev, err := s.ha.store.Pin(ctx, f, g, int64(delta))
		return intentstore.Change{Kind: intentstore.KindPin, PinID: g.ID(), Pin: intentstore.PinRecord{PinGroup: g, Count: n}, Deleted: n == 0, Revision: rev}, err
	}, keys)
}

// intentWrite runs one fenced etcd write and applies what it committed.
func (s *Server) intentWrite(ctx context.Context, write func(context.Context, intentstore.Fence) (intentstore.Change, error), keys []objkey.Key) error {
	key, rev, ok := s.ha.el.FenceKey()
	if !ok {
		return withMsg(ErrNotLeader, "this coordinator stopped leading while handling the request; nothing was changed, retry at the leader")
	}
	ctx, cancel := context.WithTimeout(ctx, intentWriteTimeout)
	defer cancel()
	s.ha.mirror.begin()
	defer s.ha.mirror.end()
	c, err := write(ctx, intentstore.Fence{Key: key, Revision: rev})
	switch {
	case errors.Is(err, intentstore.ErrFenced):
		return withMsg(ErrNotLeader, "this coordinator is no longer the leader (fence revision %d); nothing was changed, retry at the leader", rev)
	case errors.Is(err, intentstore.ErrTooLarge):
		return badRequest("%v; in HA mode split the pin", err)
	case err != nil:
		s.ha.intentErrors.Inc()
		s.log.Error("intent write to etcd failed", "err", err)
		return withMsg(ErrIntentStore, "the intent store (etcd) did not confirm the change: %v; it may or may not have been applied, retry", err)
	}
	if c.Revision > 0 { // 0: a no-op unpin
		s.ha.mirror.apply(s, c, keys)
	}
	return nil
}

// intentMirror holds what this coordinator applied from etcd: the revision
// of each quota, the default and each pin record, and each pinned
// sequence's count and keys (so a count change adds exactly the difference
// to the ledger's pins).
type intentMirror struct {
	mu   sync.Mutex
	revs map[string]int64
	pins map[string]mirrorPin
	// seen is the highest revision the watch (or a full load) delivered;
	// it delivers revisions in order, so nothing at or below seen comes
	// again. gone lists deletions applied above seen: their revs entry
	// must stay until the watch passes them, so that an older change of
	// the same name still in flight is skipped, and is then forgotten
	// (without that, every quota and pinned sequence ever deleted would
	// keep an entry for good).
	seen int64
	gone []goneName
	// writing counts this coordinator's intent writes between their start
	// and their own apply. Such an apply can come after the watch has
	// delivered later changes of the same name, so no deletion is
	// forgotten while one is in flight.
	writing int
	loaded  atomic.Bool // the first full load is applied
}

// goneName is a deletion applied at rev.
type goneName struct {
	name string
	rev  int64
}

type mirrorPin struct {
	count int64
	keys  []objkey.Key
}

func (m *intentMirror) init() {
	m.revs = map[string]int64{}
	m.pins = map[string]mirrorPin{}
}

// apply applies c unless something at its revision or later already was.
func (m *intentMirror) apply(s *Server, c intentstore.Change, keys []objkey.Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name := c.Name()
	if c.Revision <= m.revs[name] {
		return
	}
	m.revs[name] = c.Revision
	if c.Deleted {
		m.gone = append(m.gone, goneName{name, c.Revision})
		m.forget()
	}
	s.ha.intentApply.Inc()
	switch c.Kind {
	case intentstore.KindQuota:
		if c.Deleted {
			s.quotas.Delete(c.Salt)
		} else {
			s.quotas.Set(c.Salt, c.Bytes)
		}
	case intentstore.KindDefault:
		if c.Deleted {
			s.quotas.SetDefault(nil)
		} else {
			v := c.Bytes
			s.quotas.SetDefault(&v)
		}
	case intentstore.KindPin:
		old := m.pins[c.PinID]
		var next int64
		if !c.Deleted {
			next = c.Pin.Count
		}
		if keys == nil {
			keys = old.keys
		}
		if keys == nil && next > 0 {
			var err error
			if keys, err = s.pinKeys(c.Pin.PinGroup); err != nil {
				s.ha.intentErrors.Inc()
				s.log.Error("pin record from etcd does not resolve to keys; skipped", "pin", c.PinID, "err", err)
				return
			}
		}
		if d := next - old.count; d != 0 {
			s.ledger.Pin(keys, int32(max(min(d, 1<<30), -1<<30)))
		}
		if next == 0 {
			delete(m.pins, c.PinID)
		} else {
			m.pins[c.PinID] = mirrorPin{count: next, keys: keys}
		}
	}
}

// caughtUp records that the watch (or a load) delivered everything up to
// rev and forgets the deletions it passed.
func (m *intentMirror) caughtUp(rev int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rev > m.seen {
		m.seen = rev
		m.forget()
	}
}

// begin and end bracket one of this coordinator's intent writes (see
// writing).
func (m *intentMirror) begin() {
	m.mu.Lock()
	m.writing++
	m.mu.Unlock()
}

func (m *intentMirror) end() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writing--
	m.forget()
}

// forget drops the revs entries of deletions at or below seen while no
// write of this coordinator is in flight; must hold mu. An entry a later
// change has moved past belongs to that change.
func (m *intentMirror) forget() {
	if m.writing > 0 {
		return
	}
	kept := m.gone[:0]
	for _, g := range m.gone {
		switch {
		case g.rev > m.seen:
			kept = append(kept, g)
		case m.revs[g.name] == g.rev:
			delete(m.revs, g.name)
		}
	}
	clear(m.gone[len(kept):])
	m.gone = kept
}

// reload replaces the mirrored intent with a full load: every stored value
// is applied, and whatever this coordinator holds that etcd no longer has
// is removed as of the load's revision.
func (m *intentMirror) reload(s *Server, st intentstore.State) {
	seen := map[string]bool{}
	for _, c := range st.Changes {
		seen[c.Name()] = true
		m.apply(s, c, nil)
	}
	var gone []intentstore.Change
	for _, salt := range s.quotas.Salts() {
		gone = append(gone, intentstore.Change{Kind: intentstore.KindQuota, Salt: salt})
	}
	if s.quotas.Default() != nil {
		gone = append(gone, intentstore.Change{Kind: intentstore.KindDefault})
	}
	m.mu.Lock()
	for id := range m.pins {
		gone = append(gone, intentstore.Change{Kind: intentstore.KindPin, PinID: id})
	}
	m.mu.Unlock()
	for _, c := range gone {
		if !seen[c.Name()] {
			c.Deleted, c.Revision = true, st.Revision
			m.apply(s, c, nil)
		}
	}
	m.caughtUp(st.Revision)
	m.loaded.Store(true)
}

// pinKeys is a stored pinned sequence's keys, fanned out as the pin
// handler does.
func (s *Server) pinKeys(g intentstore.PinGroup) ([]objkey.Key, error) {
	hashes, err := g.HashBytes()
	if err != nil {
		return nil, err
	}
	groups, err := objkey.FanOut(hashes, g.Model, int(g.WorldSize), -1, []int64{0}, g.Salt)
	if err != nil {
		return nil, fmt.Errorf("fan out: %w", err)
	}
	return groups[0], nil
}

// intentCycle is the intent-mirror worker: load everything once (and after
// any watch failure), then apply watched changes as they come.
func (s *Server) intentCycle(ctx context.Context) (periodic.Summary, error) {
	h := s.ha
	if h.wch == nil {
		lctx, cancel := context.WithTimeout(ctx, intentWriteTimeout)
		st, err := h.store.Load(lctx)
		cancel()
		if st.Revision == 0 {
			// etcd unreachable: wait a cycle's worth before retrying.
			t := time.NewTimer(haStepWait)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			return periodic.Summary{}, fmt.Errorf("load intent from etcd: %w", err)
		}
		if err != nil {
			h.intentErrors.Inc()
			s.log.Error("intent in etcd has values that do not parse; skipped", "err", err)
		}
		h.mirror.reload(s, st)
		s.warnQuotasOverBound("etcd")
		wctx, wcancel := context.WithCancel(ctx)
		h.wch, h.wcancel = h.store.Watch(wctx, st.Revision+1), wcancel
		msg := fmt.Sprintf("loaded %d quotas, default set %v, %d pinned sequences at revision %d", len(st.Quotas), st.Default != nil, len(st.Pins), st.Revision)
		s.log.Info("intent loaded from etcd", "quotas", len(st.Quotas), "pins", len(st.Pins), "revision", st.Revision)
		return periodic.Summary{Message: msg}, nil
	}
	t := time.NewTimer(haStepWait)
	defer t.Stop()
	select {
	case wr, ok := <-h.wch:
		if !ok || wr.Canceled || wr.Err() != nil {
			h.wcancel()
			h.wch, h.wcancel = nil, nil
			if ctx.Err() != nil {
				return periodic.Summary{Message: "stopped"}, nil
			}
			return periodic.Summary{}, fmt.Errorf("intent watch ended (%v); reloading", wr.Err())
		}
		cs, err := h.store.Decode(wr)
		var last int64
		for _, c := range cs {
			h.mirror.apply(s, c, nil)
		}
		for _, ev := range wr.Events {
			last = max(last, ev.Kv.ModRevision)
		}
		h.mirror.caughtUp(last)
		s.warnQuotasOverBound("etcd")
		if err != nil {
			h.intentErrors.Inc()
			s.log.Error("watched intent values do not parse; skipped", "err", err)
		}
		return periodic.Summary{Message: fmt.Sprintf("applied %d changes", len(cs))}, nil
	case <-t.C:
		return periodic.Summary{Message: "watching"}, nil
	case <-ctx.Done():
		return periodic.Summary{Message: "stopped"}, nil
	}
}
