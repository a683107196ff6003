package engine

import (
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// KV event media, as upstream LMCache's KV event channel names them.
const (
	KVMediumCPU     = "CPU"     // L1
	KVMediumStorage = "STORAGE" // any L2 adapter
)

// KVEventSink receives the storage events a KV-aware router needs
// (internal/kvevents.Recorder): chunks stored in and removed from a tier.
// Calls are synchronous, from the goroutine that changed the tier, outside
// the tier's locks (L1 changes one at a time, in the table's order); they
// must not block.
type KVEventSink interface {
	Stored(medium string, keys []objkey.Key)
	Removed(medium string, keys []objkey.Key)
}

// AddKVEventSink makes s see every L1 store (a committed write or an L2
// load), every L1 removal (eviction, delete, clear, a temporary object
// freed), and every L2 store and delete of every adapter. Register before
// Run.
func (e *Engine) AddKVEventSink(s KVEventSink) {
	e.AddL1Listener(kvL1{s})
	for _, a := range e.adapters {
		a.AddListener(kvL2{s})
	}
}

// kvL1 adapts a sink to the L1 listener interface.
type kvL1 struct{ s KVEventSink }

func (l kvL1) OnL1Stored(keys []objkey.Key, _ []int64) { l.s.Stored(KVMediumCPU, keys) }
func (l kvL1) OnL1Accessed([]objkey.Key)               {}
func (l kvL1) OnL1Deleted(keys []objkey.Key)           { l.s.Removed(KVMediumCPU, keys) }

// kvL2 adapts a sink to the adapter listener interface.
type kvL2 struct{ s KVEventSink }

func (l kvL2) OnStored(keys []objkey.Key, _ []int64) { l.s.Stored(KVMediumStorage, keys) }
func (l kvL2) OnAccessed([]objkey.Key)               {}
func (l kvL2) OnDeleted(keys []objkey.Key)           { l.s.Removed(KVMediumStorage, keys) }
