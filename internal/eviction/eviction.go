// Package eviction holds the victim-selection policies shared by the L1 tier
// and the L2 eviction loop: LRU, IsolatedLRU (one LRU per cache_salt) and
// noop. A policy only orders keys; the tier decides eligibility (locked
// objects are never victims) and performs the deletion, then reports it back
// with Remove.
//
// Policies are not safe for concurrent use: the L1 table calls them under its
// own mutex and the L2 loop wraps each in a mutex (see Locked).
package eviction

import (
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Names accepted by New (upstream spelling of --eviction-policy).
const (
	LRUName         = "LRU"
	IsolatedLRUName = "IsolatedLRU"
	NoopName        = "noop"
)

// Policy orders tracked keys for eviction.
type Policy interface {
	// Add tracks keys created together (one request's chunks in token
	// order). They are inserted in reverse so the batch's last key becomes
	// the least recent: within a request tail chunks go first and cached
	// prefixes survive. Re-adding a tracked key moves it like Touch.
	Add(keys []objkey.Key)
	// Touch marks keys as used now, with the same reverse rule.
	Touch(keys []objkey.Key)
	// Remove forgets keys (they left the tier).
	Remove(keys []objkey.Key)
	// Len is the number of tracked keys.
	Len() int
	// Victims returns up to Target(Len(), ratio) keys for which eligible
	// is true, least recent first. Ineligible keys are skipped and do not
	// count toward the target. Nothing is removed.
	Victims(ratio float64, eligible func(objkey.Key) bool) []objkey.Key
}

// Isolated is a policy that keeps one order per cache_salt, so each salt
// can be held to its own quota.
type Isolated interface {
	Policy
	// Salts lists salts with tracked keys, sorted.
	Salts() []string
	// SaltLen is the number of tracked keys of salt.
	SaltLen(salt string) int
	// SaltVictims is Victims restricted to salt's keys, with the target
	// computed from SaltLen.
	SaltVictims(salt string, ratio float64, eligible func(objkey.Key) bool) []objkey.Key
}

// New returns the named policy.
func New(name string) (Policy, error) {
	switch name {
	case LRUName:
		return NewLRU(), nil
	case IsolatedLRUName:
		return NewIsolatedLRU(), nil
	case NoopName:
		return Noop{}, nil
	}
	return nil, fmt.Errorf("unknown eviction policy %q (want %s, %s or %s)", name, LRUName, IsolatedLRUName, NoopName)
}

// Target is upstream's victim count: int(n*ratio) with ratio clamped to
// [0,1], but at least 1 when ratio > 0 and n > 0.
func Target(n int, ratio float64) int {
	if n <= 0 || ratio <= 0 {
		return 0
	}
	if ratio > 1 {
		ratio = 1
	}
	t := int(float64(n) * ratio)
	if t < 1 {
		t = 1
	}
	return t
}

// LRU is a single least-recently-used order: a List of keys plus an index.
type LRU struct {
	index map[objkey.Key]*Elem[objkey.Key]
	list  List[objkey.Key]
}

// NewLRU returns an empty LRU.
func NewLRU() *LRU { return &LRU{index: map[objkey.Key]*Elem[objkey.Key]{}} }

// Add implements Policy.
func (l *LRU) Add(keys []objkey.Key) {
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		e, ok := l.index[k]
		if !ok {
			e = &Elem[objkey.Key]{Value: k}
			l.index[k] = e
		}
		l.list.PushBack(e)
	}
}

// Touch implements Policy; untracked keys are ignored.
func (l *LRU) Touch(keys []objkey.Key) {
	for i := len(keys) - 1; i >= 0; i-- {
		if e, ok := l.index[keys[i]]; ok {
			l.list.PushBack(e)
		}
	}
}

// Remove implements Policy.
func (l *LRU) Remove(keys []objkey.Key) {
	for _, k := range keys {
		if e, ok := l.index[k]; ok {
			l.list.Remove(e)
			delete(l.index, k)
		}
	}
}

// Len implements Policy.
func (l *LRU) Len() int { return len(l.index) }

// Victims implements Policy.
func (l *LRU) Victims(ratio float64, eligible func(objkey.Key) bool) []objkey.Key {
	return l.list.Oldest(ratio, eligible)
}

// Order returns every tracked key, least recent first (tests, debugging).
func (l *LRU) Order() []objkey.Key {
	out := make([]objkey.Key, 0, l.list.Len())
	for e := l.list.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value)
	}
	return out
}

// IsolatedLRU keeps one LRU per cache_salt.
type IsolatedLRU struct {
	salts map[string]*LRU
	n     int
}

// NewIsolatedLRU returns an empty IsolatedLRU.
func NewIsolatedLRU() *IsolatedLRU { return &IsolatedLRU{salts: map[string]*LRU{}} }

// Add implements Policy. Runs of keys are grouped per salt preserving
// their order, so the reverse-insertion rule holds inside each salt.
func (p *IsolatedLRU) Add(keys []objkey.Key) { p.apply(keys, true) }

// Touch implements Policy.
func (p *IsolatedLRU) Touch(keys []objkey.Key) { p.apply(keys, false) }

func (p *IsolatedLRU) apply(keys []objkey.Key, add bool) {
	if len(keys) == 0 {
		return
	}
	// Fast path, no grouping: one request has one salt.
	salt := keys[0].CacheSalt
	if !slices.ContainsFunc(keys[1:], func(k objkey.Key) bool { return k.CacheSalt != salt }) {
		p.applySalt(salt, keys, add)
		return
	}
	groups := map[string][]objkey.Key{}
	for _, k := range keys {
		groups[k.CacheSalt] = append(groups[k.CacheSalt], k)
	}
	for s, ks := range groups {
		p.applySalt(s, ks, add)
	}
}

func (p *IsolatedLRU) applySalt(salt string, keys []objkey.Key, add bool) {
	l := p.salts[salt]
	if l == nil {
		if !add {
			return
		}
		l = NewLRU()
		p.salts[salt] = l
	}
	before := l.Len()
	if add {
		l.Add(keys)
	} else {
		l.Touch(keys)
	}
	p.n += l.Len() - before
}

// Remove implements Policy.
func (p *IsolatedLRU) Remove(keys []objkey.Key) {
	for _, k := range keys {
		l := p.salts[k.CacheSalt]
		if l == nil {
			continue
		}
		if e, ok := l.index[k]; ok {
			l.list.Remove(e)
			delete(l.index, k)
			p.n--
		}
		if l.Len() == 0 {
			delete(p.salts, k.CacheSalt)
		}
	}
}

// Len implements Policy.
func (p *IsolatedLRU) Len() int { return p.n }

// Victims implements Policy without a salt: every salt gives up the same
// fraction of its own keys (upstream requires a salt here; the L1 loop
// uses this when the pool as a whole crosses its watermark).
func (p *IsolatedLRU) Victims(ratio float64, eligible func(objkey.Key) bool) []objkey.Key {
	var out []objkey.Key
	for _, s := range p.Salts() {
		out = append(out, p.SaltVictims(s, ratio, eligible)...)
	}
	return out
}

// Salts implements Isolated.
func (p *IsolatedLRU) Salts() []string {
	out := make([]string, 0, len(p.salts))
	for s := range p.salts {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// SaltLen implements Isolated.
func (p *IsolatedLRU) SaltLen(salt string) int {
	if l := p.salts[salt]; l != nil {
		return l.Len()
	}
	return 0
}

// SaltVictims implements Isolated.
func (p *IsolatedLRU) SaltVictims(salt string, ratio float64, eligible func(objkey.Key) bool) []objkey.Key {
	l := p.salts[salt]
	if l == nil {
		return nil
	}
	return l.Victims(ratio, eligible)
}

// Noop tracks nothing and never evicts (buffer-only deployments).
type Noop struct{}

// Add implements Policy.
func (Noop) Add([]objkey.Key) {}

// Touch implements Policy.
func (Noop) Touch([]objkey.Key) {}

// Remove implements Policy.
func (Noop) Remove([]objkey.Key) {}

// Len implements Policy.
func (Noop) Len() int { return 0 }

// Victims implements Policy.
func (Noop) Victims(float64, func(objkey.Key) bool) []objkey.Key { return nil }

// Locked wraps a policy with a mutex for use from several goroutines (L2
// listeners fire on adapter goroutines while the eviction loop reads).
type Locked struct {
	mu sync.Mutex
	p  Policy
}

// NewLocked wraps p.
func NewLocked(p Policy) *Locked { return &Locked{p: p} }

// Do runs f with exclusive access to the policy.
func (l *Locked) Do(f func(Policy)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(l.p)
}
