// Package registry is the coordinator's fleet membership: registered MP
// servers, their heartbeats and the staleness sweep. It is safe for
// concurrent use; one mutex guards all state because every operation is
// short.
package registry

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	mrand "math/rand/v2"
	"sync"
	"time"
)

// Instance is one registered MP server as reported by GET /instances.
type Instance struct {
	InstanceID       string            `json:"instance_id"`
	IP               string            `json:"ip"`
	HTTPPort         int               `json:"http_port"`
	RegistrationTime float64           `json:"registration_time"`
	Metadata         map[string]string `json:"metadata"`
	P2PAdvertisedURL string            `json:"p2p_advertised_url"`
	MQPort           int               `json:"mq_port"`
}

type entry struct {
	inst          Instance
	lastHeartbeat time.Time // carries a monotonic reading
}

// Bounds of a registry (see ErrFull). A fleet has thousands of servers at
// most, each registration a few hundred bytes; anyone who can reach POST
// /instances can add entries (until the sweep drops them, never when it is
// off), each with up to a mebibyte of ids and metadata.
const (
	DefaultMaxInstances = 100_000
	DefaultMaxBytes     = 64 << 20
)

// ErrFull is a registration refused because the registry holds its maximum
// number of instances (a new id) or bytes of them (a new id, or a known one
// whose entry would grow).
var ErrFull = errors.New("registry full")

// Registry holds the fleet. The order slice keeps first-registration order,
// which GET /instances reports (upstream iterates a Python dict).
type Registry struct {
	mu    sync.Mutex
	byID  map[string]*entry
	order []string
	now   func() time.Time
	// bytes is the size of the entries (see size), bounded by maxBytes;
	// the count is bounded by maxN.
	bytes, maxBytes int64
	maxN            int
}

// New returns an empty registry with the default bounds. now may be nil
// (time.Now).
func New(now func() time.Time) *Registry {
	if now == nil {
		now = time.Now
	}
	return &Registry{byID: map[string]*entry{}, now: now, maxN: DefaultMaxInstances, maxBytes: DefaultMaxBytes}
}

// SetLimits replaces the bounds on the number of instances and their bytes.
func (r *Registry) SetLimits(maxInstances int, maxBytes int64) {
	r.mu.Lock()
	r.maxN, r.maxBytes = maxInstances, maxBytes
	r.mu.Unlock()
}

// size approximates the memory an entry holds: its strings and a fixed
// overhead for the entry, the map slot and each metadata pair.
func size(in *Instance) int64 {
	n := 128 + 2*len(in.InstanceID) + len(in.IP) + len(in.P2PAdvertisedURL)
	for k, v := range in.Metadata {
		n += 32 + len(k) + len(v)
	}
	return int64(n)
}

// NewID mints an id like upstream: "mp-" and 32 lowercase hex digits.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	// Mark it as a version-4 UUID so it has the same shape as uuid4().hex.
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return "mp-" + hex.EncodeToString(b[:])
}

// Register inserts or replaces inst (generating an id when empty) and counts
// as a heartbeat. It reports the id and whether it replaced an entry; a new
// instance past the bounds is refused with ErrFull.
func (r *Registry) Register(inst Instance) (string, bool, error) {
	if inst.InstanceID == "" {
		inst.InstanceID = NewID()
	}
	if inst.Metadata == nil {
		inst.Metadata = map[string]string{}
	}
	now := r.now()
	inst.RegistrationTime = float64(now.UnixNano()) / 1e9
	n := size(&inst)
	r.mu.Lock()
	defer r.mu.Unlock()
	old, existed := r.byID[inst.InstanceID]
	grow := n
	if existed {
		grow -= size(&old.inst)
	}
	if !existed && len(r.order) >= r.maxN || grow > 0 && r.bytes+grow > r.maxBytes {
		return "", existed, ErrFull
	}
	if !existed {
		r.order = append(r.order, inst.InstanceID)
	}
	r.byID[inst.InstanceID] = &entry{inst: inst, lastHeartbeat: now}
	r.bytes += grow
	return inst.InstanceID, existed, nil
}

// Heartbeat records liveness; false for an unknown id.
func (r *Registry) Heartbeat(id string) bool {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byID[id]
	if ok {
		e.lastHeartbeat = now
	}
	return ok
}

// Deregister removes id and reports whether it was present.
func (r *Registry) Deregister(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.removeLocked(id)
}

func (r *Registry) removeLocked(id string) bool {
	e, ok := r.byID[id]
	if !ok {
		return false
	}
	delete(r.byID, id)
	r.bytes -= size(&e.inst)
	for i, o := range r.order {
		if o == id {
			r.order = append(r.order[:i], r.order[i+1:]...)
			break
		}
	}
	return true
}

// Get returns a copy of one instance.
func (r *Registry) Get(id string) (Instance, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byID[id]
	if !ok {
		return Instance{}, false
	}
	return copyInst(e.inst), true
}

// List returns a snapshot in first-registration order.
func (r *Registry) List() []Instance {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Instance, 0, len(r.order))
	for _, id := range r.order {
		out = append(out, copyInst(r.byID[id].inst))
	}
	return out
}

// LastHeartbeats returns when each instance last registered or heartbeat.
func (r *Registry) LastHeartbeats() map[string]time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]time.Time, len(r.byID))
	for id, e := range r.byID {
		out[id] = e.lastHeartbeat
	}
	return out
}

// Len is the number of registered instances.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.order)
}

// Random returns a uniformly random instance, false when the fleet is empty.
func (r *Registry) Random() (Instance, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.order) == 0 {
		return Instance{}, false
	}
	return copyInst(r.byID[r.order[mrand.IntN(len(r.order))]].inst), true
}

// SweepStale deregisters every instance silent for strictly longer than
// timeout and returns their ids.
func (r *Registry) SweepStale(timeout time.Duration) []string {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var gone []string
	// One pass that keeps the live ids in order: removing each stale id
	// on its own (a scan and a copy of order per id) made a sweep of n
	// stale instances take n² steps under the lock.
	kept := r.order[:0]
	for _, id := range r.order {
		e := r.byID[id]
		if now.Sub(e.lastHeartbeat) > timeout {
			delete(r.byID, id)
			r.bytes -= size(&e.inst)
			gone = append(gone, id)
			continue
		}
		kept = append(kept, id)
	}
	clear(r.order[len(kept):])
	r.order = kept
	return gone
}

func copyInst(in Instance) Instance {
	md := make(map[string]string, len(in.Metadata))
	for k, v := range in.Metadata {
		md[k] = v
	}
	in.Metadata = md
	return in
}
