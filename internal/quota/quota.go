// Package quota is the per-cache_salt limit registry behind /quota and the
// IsolatedLRU eviction policies. Limits are soft: they never reject a write,
// they only tell the eviction loops how much of a salt to keep.
//
// Allowlist semantics (as upstream's MP server): a salt without a registered
// limit has limit 0, so an IsolatedLRU tier evicts all of it.
package quota

import (
	"errors"
	"fmt"
	"maps"
	"sync"
)

// DefaultSentinel is the path segment that stands for the empty salt in the
// HTTP API, in both directions.
const DefaultSentinel = "_default"

// ErrNegative is returned for a negative limit.
var ErrNegative = errors.New("quota limit must be non-negative")

// MaxQuotas bounds the registered limits. Each is kept in memory, listed by
// GET /quota and walked by every IsolatedLRU eviction cycle; a script
// registering a quota per request id would otherwise grow all three
// without bound. Replacing or deleting a registered limit is always
// allowed.
const MaxQuotas = 100_000

// ErrTooMany is returned for a new salt once MaxQuotas are registered.
var ErrTooMany = fmt.Errorf("too many quotas: at most %d cache_salt limits may be registered; delete unused ones first", MaxQuotas)

// FromPath maps an HTTP path segment to a salt ("_default" → "").
func FromPath(segment string) string {
	if segment == DefaultSentinel {
		return ""
	}
	return segment
}

// ToPath maps a salt to its HTTP form ("" → "_default").
func ToPath(salt string) string {
	if salt == "" {
		return DefaultSentinel
	}
	return salt
}

// Manager holds limits in bytes. The zero value is not usable; use New.
// One mutex suffices: limits change on operator requests and are read once
// per eviction cycle.
type Manager struct {
	mu     sync.RWMutex
	limits map[string]int64
}

// New returns an empty manager.
func New() *Manager { return &Manager{limits: map[string]int64{}} }

// Set registers or replaces salt's limit. 0 is allowed (and listed).
func (m *Manager) Set(salt string, limitBytes int64) error {
	if limitBytes < 0 {
		return fmt.Errorf("%w (got %d)", ErrNegative, limitBytes)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, known := m.limits[salt]; !known && len(m.limits) >= MaxQuotas {
		return ErrTooMany
	}
	m.limits[salt] = limitBytes
	return nil
}

// Delete removes salt's limit and reports whether it existed.
func (m *Manager) Delete(salt string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.limits[salt]
	delete(m.limits, salt)
	return ok
}

// Get returns salt's limit and whether one is registered.
func (m *Manager) Get(salt string) (int64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	v, ok := m.limits[salt]
	return v, ok
}

// LimitBytes is the limit eviction uses: the registered value, or 0 for an
// unregistered salt (allowlist).
func (m *Manager) LimitBytes(salt string) int64 {
	v, _ := m.Get(salt)
	return v
}

// List returns a copy of every registered limit.
func (m *Manager) List() map[string]int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return maps.Clone(m.limits)
}
