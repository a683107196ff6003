package mq

import (
	"context"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Engine is the part of the storage engine the data path uses; *engine.Engine
// implements it. Keeping it narrow lets the protocol layer be tested with
// fault-injecting fakes.
type Engine interface {
	// Pool is the shared-memory L1 pool handed to registering workers.
	Pool() engine.PoolInfo
	// RegisterLayout makes (model, world_size) known to lookups, prefetch
	// and the HTTP KV API for good, as --register-model does. Worker
	// registrations of either transfer mode use AcquireLayout instead.
	RegisterLayout(l engine.Layout) error
	// AcquireLayout and ReleaseLayout hold the layout of an engine-driven
	// worker registration: after the last release lookups of the model
	// report no hits (unless --register-model gave it a layout).
	AcquireLayout(l engine.Layout) error
	ReleaseLayout(modelName string, worldSize int) int
	// Layout reports a registered layout: a worker's, or one given with
	// --register-model before any worker arrived.
	Layout(modelName string, worldSize int) (engine.Layout, error)
	// Prefetch, PollPrefetch (consumes a done job), PeekPrefetch (does
	// not) and WaitPrefetch run LOOKUP's job.
	Prefetch(req engine.PrefetchRequest) error
	PollPrefetch(id string) (engine.PrefetchResult, error)
	PeekPrefetch(id string) (engine.PrefetchResult, error)
	WaitPrefetch(ctx context.Context, id string) (engine.PrefetchResult, error)
	// ReserveWrite, CommitWrite and AbortWrite are PREPARE/COMMIT_STORE.
	ReserveWrite(tag string, keys []objkey.Key, sizes []int64) ([]engine.Slot, error)
	CommitWrite(tag string, keys []objkey.Key) (int, error)
	AbortWrite(tag string, keys []objkey.Key)
	// ReadSlots and ReleaseRead are PREPARE/COMMIT_RETRIEVE (and
	// FREE_LOOKUP_LOCKS).
	ReadSlots(keys []objkey.Key) ([]engine.Slot, error)
	ReleaseRead(owner string, keys []objkey.Key, n int) int
	// Touch is END_SESSION's LRU refresh; Clear is CLEAR.
	Touch(keys []objkey.Key)
	Clear() engine.ClearResult
}

var _ Engine = (*engine.Engine)(nil)
