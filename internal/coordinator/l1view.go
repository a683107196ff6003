package coordinator

import (
	"strings"
	"sync"

	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
)

// maxL1Facts bounds the L1 view across all instances; past it new L1 store
// facts are dropped and counted (l1_facts_dropped_total).
var maxL1Facts = 1_000_000

// l1View is the per-instance L1 usage reported through POST /events
// (tier "l1"). The ledger accounts L2 only (its quotas, LRU and eviction
// act on L2 objects, which outlive an MP server's process), so L1 facts
// stay here: bytes and keys per instance, shown in GET /instances, and
// void when the emitter's incarnation changes (its memory restarted empty),
// as upstream's key directory drops an instance's L1 placements on fence.
type l1View struct {
	mu    sync.Mutex
	by    map[string]*l1Instance
	total int
}

type l1Instance struct {
	keys  map[ledger.Key]int64
	bytes int64
}

func newL1View() *l1View { return &l1View{by: map[string]*l1Instance{}} }

// store records key at size for instance; it reports false when the view
// is full and the fact was dropped.
func (v *l1View) store(instance string, k ledger.Key, size int64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	in := v.by[instance]
	var old int64
	ok := false
	if in != nil {
		old, ok = in.keys[k]
	}
	if !ok {
		// Checked before an instance's entry is made: a full view must
		// not keep an empty entry for every new instance id it refuses.
		if v.total >= maxL1Facts {
			return false
		}
		v.total++
		k.Model, k.Salt = strings.Clone(k.Model), strings.Clone(k.Salt)
	}
	if in == nil {
		in = &l1Instance{keys: map[ledger.Key]int64{}}
		// Clone what is kept: decoded strings may alias the request body.
		v.by[strings.Clone(instance)] = in
	}
	in.keys[k] = size
	in.bytes += size - old
	return true
}

func (v *l1View) remove(instance string, k ledger.Key) {
	v.mu.Lock()
	defer v.mu.Unlock()
	in := v.by[instance]
	if in == nil {
		return
	}
	if old, ok := in.keys[k]; ok {
		delete(in.keys, k)
		in.bytes -= old
		v.total--
	}
}

// fence forgets everything instance reported for L1 and returns how many
// facts were dropped: on a new incarnation (its memory restarted empty),
// and when the instance deregisters or is swept (its process stopped or is
// unreachable). Without the latter, servers that come back under a new id
// (the default: a random UUID per start) would leave their predecessors'
// facts in the view for good, until maxL1Facts is reached and every new
// fact is dropped.
func (v *l1View) fence(instance string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	in := v.by[instance]
	if in == nil {
		return 0
	}
	delete(v.by, instance)
	v.total -= len(in.keys)
	return len(in.keys)
}

// usage is instance's L1 bytes and key count.
func (v *l1View) usage(instance string) (bytes int64, keys int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if in := v.by[instance]; in != nil {
		return in.bytes, len(in.keys)
	}
	return 0, 0
}
