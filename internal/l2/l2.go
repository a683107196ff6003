// Package l2 defines the contract between the storage engine and its second
// tier adapters (S3, filesystem, device-DAX, fault injection), plus the
// parsing of upstream's repeatable --l2-adapter JSON.
//
// Upstream adapters are poll-driven (submit a task, poll an event fd). In Go
// the engine gets asynchrony from goroutines, so every method here is a
// blocking call that honours ctx; adapters must be safe for concurrent use.
package l2

import (
	"context"
	"errors"
	"fmt"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// ErrListUnsupported is returned by List on adapters that cannot enumerate
// their keys (upstream raises NotImplementedError; HTTP maps it to 501).
var ErrListUnsupported = errors.New("adapter does not support listing")

// ErrBadPageToken is wrapped by List when pageToken is not a token the
// adapter issued (HTTP maps it to 400).
var ErrBadPageToken = errors.New("malformed page token")

// ErrUnavailable is returned while an adapter is circuit-broken or closed.
var ErrUnavailable = errors.New("adapter unavailable")

// ErrSlow wraps ErrUnavailable: a call made under WithFailSlow ran past
// the adapter's slow-call limit and was abandoned.
var ErrSlow = fmt.Errorf("%w: call abandoned as slow", ErrUnavailable)

type failSlowKey struct{}

// WithFailSlow marks ctx so that an adapter with a slow-call limit (s3)
// abandons a call of this context that runs past it, failing it with
// ErrSlow, instead of waiting its full timeout. The engine sets it on a
// lookup's loads: someone is waiting for the answer, and a stalled S3 must
// not hold it for the op timeout. Write-behind and warm prefetch do not.
func WithFailSlow(ctx context.Context) context.Context {
	return context.WithValue(ctx, failSlowKey{}, true)
}

// FailSlow reports whether ctx was marked by WithFailSlow.
func FailSlow(ctx context.Context) bool {
	v, _ := ctx.Value(failSlowKey{}).(bool)
	return v
}

// Adapter is one L2 tier.
type Adapter interface {
	// TypeName is the registered type ("s3", "fs", "dax", "fault_inject").
	TypeName() string
	// Store writes every object; objs[i] holds the bytes of keys[i]. It
	// fails as a whole if any object fails (upstream reports per task).
	Store(ctx context.Context, keys []objkey.Key, objs [][]byte) error
	// LookupAndLock reports which keys exist and takes an adapter-side lock
	// on each hit so it is not deleted before Load; callers Unlock hits.
	LookupAndLock(ctx context.Context, keys []objkey.Key) ([]bool, error)
	// Unlock releases locks taken by LookupAndLock. It never fails.
	Unlock(keys []objkey.Key)
	// Load reads keys[i] into dst[i] (caller-owned L1 buffers) and reports
	// per key whether it was loaded.
	Load(ctx context.Context, keys []objkey.Key, dst [][]byte) ([]bool, error)
	// Delete removes keys, skipping locked ones, fires OnDeleted for those
	// removed and returns them.
	Delete(ctx context.Context, keys []objkey.Key) ([]objkey.Key, error)
	// List pages through stored keys, optionally only one model's. The page
	// token is opaque; "" starts and an empty NextPageToken ends.
	List(ctx context.Context, modelName string, pageSize int, pageToken string) (Page, error)
	// Usage reports bytes in use, in total and per cache salt.
	Usage() Usage
	// Status is the adapter's report_status() for /status.
	Status() map[string]any
	// AddListener registers a listener for store, access and delete events.
	AddListener(Listener)
	// Close stops background work and releases resources.
	Close() error
}

// Page is one page of List.
type Page struct {
	Entries       []Entry
	NextPageToken string
}

// Entry is one listed object.
type Entry struct {
	Key       objkey.Key
	SizeBytes int64
}

// Usage is upstream's AdapterUsage.
type Usage struct {
	TotalBytesUsed     int64
	TotalCapacityBytes int64 // <= 0 means unbounded
	BytesByCacheSalt   map[string]int64
}

// Fraction is used/capacity, or -1 when capacity is unbounded (no aggregate
// eviction), as upstream.
func (u Usage) Fraction() float64 {
	if u.TotalCapacityBytes <= 0 {
		return -1
	}
	return float64(u.TotalBytesUsed) / float64(u.TotalCapacityBytes)
}

// Listener observes adapter events; the coordinator reporter and L2 eviction
// policies are listeners. Calls are made synchronously from the adapter's
// goroutine and must not block.
type Listener interface {
	OnStored(keys []objkey.Key, sizes []int64)
	OnAccessed(keys []objkey.Key)
	OnDeleted(keys []objkey.Key)
}
