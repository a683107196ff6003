// Package quota is the coordinator's per-cache_salt byte budget registry and
// its default limit for salts without an explicit entry.
package quota

import (
	"errors"
	"math"
	"sort"
	"sync"
)

// GiB is upstream's "GB": 1024**3 bytes.
const GiB = 1 << 30

// ErrInvalidLimit is returned for a negative or non-finite limit.
var ErrInvalidLimit = errors.New("invalid quota limit")

// MaxQuotas bounds the explicit entries a client may create, as the MP
// server's own table (internal/quota.MaxQuotas): each is kept in memory,
// mirrored to etcd or the state file, listed by GET /quota and walked by
// every eviction plan. Replacing or deleting an entry is always allowed.
const MaxQuotas = 100_000

// ErrTooMany is SetBounded's refusal of a new salt at the bound.
var ErrTooMany = errors.New("too many quotas")

// BytesFromGB converts GiB to bytes, truncating toward zero like Python int().
func BytesFromGB(gb float64) (int64, error) {
	if math.IsNaN(gb) || math.IsInf(gb, 0) || gb < 0 {
		return 0, ErrInvalidLimit
	}
	v := gb * GiB
	if v >= math.MaxInt64 {
		return 0, ErrInvalidLimit
	}
	return int64(v), nil
}

// GB converts bytes to GiB.
func GB(b int64) float64 { return float64(b) / GiB }

// Limits is an immutable snapshot used by the eviction planner.
type Limits struct {
	Explicit map[string]int64
	Default  *int64
}

// Effective returns the salt's limit: the explicit entry if any, else the
// default; ok is false when the salt is exempt (no entry, null default).
func (l Limits) Effective(salt string) (int64, bool) {
	if v, ok := l.Explicit[salt]; ok {
		return v, true
	}
	if l.Default != nil {
		return *l.Default, true
	}
	return 0, false
}

// Registry holds the limits. Safe for concurrent use.
type Registry struct {
	mu       sync.RWMutex
	explicit map[string]int64
	def      *int64
	// overReported: OverBound has reported the table over its bound and
	// it has not been back within it since.
	overReported bool
}

// New returns an empty registry with a null default (unquota'd salts exempt).
func New() *Registry { return &Registry{explicit: map[string]int64{}} }

// Set creates or updates a salt's limit in bytes, whatever the number of
// entries: for changes already accepted (the HA mirror applying what etcd
// committed). A client's request goes through SetBounded.
func (r *Registry) Set(salt string, limit int64) {
	r.mu.Lock()
	r.explicit[salt] = limit
	r.mu.Unlock()
}

// SetBounded is Set for a client's request: a salt without an entry is
// refused with ErrTooMany (nothing changes) while bound or more entries are
// held. A table restored or mirrored over bound keeps every entry and
// refuses new salts until it is below bound.
func (r *Registry) SetBounded(salt string, limit int64, bound int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.explicit[salt]; !ok && len(r.explicit) >= bound {
		return ErrTooMany
	}
	r.explicit[salt] = limit
	return nil
}

// Admits reports whether SetBounded(salt, _, bound) would succeed now, and
// the number of entries held.
func (r *Registry) Admits(salt string, bound int) (bool, int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.explicit[salt]
	return ok || len(r.explicit) < bound, len(r.explicit)
}

// Len is the number of explicit entries.
func (r *Registry) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.explicit)
}

// OverBound returns the number of entries and whether it is over bound for
// the first time since the table was last within bound (or ever), so a
// caller warns once per episode rather than on every check.
func (r *Registry) OverBound(bound int) (n int, first bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n = len(r.explicit)
	if n <= bound {
		r.overReported = false
		return n, false
	}
	first = !r.overReported
	r.overReported = true
	return n, first
}

// Delete removes a salt's entry and reports whether one existed.
func (r *Registry) Delete(salt string) bool {
	r.mu.Lock()
	_, ok := r.explicit[salt]
	delete(r.explicit, salt)
	r.mu.Unlock()
	return ok
}

// Get returns a salt's explicit limit.
func (r *Registry) Get(salt string) (int64, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, ok := r.explicit[salt]
	return v, ok
}

// SetDefault sets the default limit; nil restores exemption.
func (r *Registry) SetDefault(limit *int64) {
	r.mu.Lock()
	if limit == nil {
		r.def = nil
	} else {
		v := *limit
		r.def = &v
	}
	r.mu.Unlock()
}

// Default returns the default limit (nil when unset).
func (r *Registry) Default() *int64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.def == nil {
		return nil
	}
	v := *r.def
	return &v
}

// Snapshot copies the limits.
func (r *Registry) Snapshot() Limits {
	r.mu.RLock()
	defer r.mu.RUnlock()
	m := make(map[string]int64, len(r.explicit))
	for k, v := range r.explicit {
		m[k] = v
	}
	var d *int64
	if r.def != nil {
		v := *r.def
		d = &v
	}
	return Limits{Explicit: m, Default: d}
}

// Restore replaces the whole state (used when loading the state file). It
// keeps every entry, also past MaxQuotas: they were accepted once.
func (r *Registry) Restore(l Limits) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.explicit = map[string]int64{}
	for k, v := range l.Explicit {
		r.explicit[k] = v
	}
	r.def = nil
	if l.Default != nil {
		v := *l.Default
		r.def = &v
	}
}

// Salts lists salts with an explicit entry, sorted.
func (r *Registry) Salts() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.explicit))
	for k := range r.explicit {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
