package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/lmcache-go/lmcache/internal/l1"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/quota"
)

var errNotImplemented = errors.New("engine: not implemented yet")

// Engine is the storage manager. Build it with New.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	pool     *l1.Pool
	quotas   *quota.Manager
	adapters []l2.Adapter
	ready    atomic.Bool
	st       stats
}

func newEngine(cfg Config, adapters []l2.Adapter, logger *slog.Logger) (*Engine, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	pool, err := l1.NewPool(l1.PoolConfig{Size: cfg.L1SizeBytes, Align: cfg.L1AlignBytes, ShmName: cfg.ShmName, ShmDir: cfg.ShmDir, ShmMode: cfg.ShmMode})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	return &Engine{cfg: cfg, log: logger, pool: pool, quotas: quota.New(), adapters: adapters}, nil
}

func (e *Engine) run(ctx context.Context) error {
	e.ready.Store(true)
	<-ctx.Done()
	e.ready.Store(false)
	return nil
}

func (e *Engine) close() error { return e.pool.Close() }

func (e *Engine) poolInfo() PoolInfo {
	return PoolInfo{Name: e.pool.Name(), Path: e.pool.Path(), Size: e.pool.Size()}
}

func (e *Engine) registerLayout(Layout) error        { return errNotImplemented }
func (e *Engine) layout(string, int) (Layout, error) { return Layout{}, errNotImplemented }
func (e *Engine) layouts() []Layout                  { return nil }
func (e *Engine) prefetch(PrefetchRequest) error     { return errNotImplemented }
func (e *Engine) pollPrefetch(string) (PrefetchResult, error) {
	return PrefetchResult{}, errNotImplemented
}
func (e *Engine) waitPrefetch(context.Context, string) (PrefetchResult, error) {
	return PrefetchResult{}, errNotImplemented
}
func (e *Engine) reserveWrite(string, []objkey.Key, []int64) ([]Slot, error) {
	return nil, errNotImplemented
}
func (e *Engine) commitWrite(string, []objkey.Key) (int, error) { return 0, errNotImplemented }
func (e *Engine) abortWrite(string, []objkey.Key)               {}
func (e *Engine) readSlots([]objkey.Key) ([]Slot, error)        { return nil, errNotImplemented }
func (e *Engine) releaseRead(string, []objkey.Key, int) int     { return 0 }
func (e *Engine) touch([]objkey.Key)                            {}
func (e *Engine) clear() ClearResult                            { return ClearResult{} }
func (e *Engine) put([]objkey.Key, [][]byte) (int, error)       { return 0, errNotImplemented }
func (e *Engine) get([]objkey.Key) ([][]byte, error)            { return nil, errNotImplemented }
func (e *Engine) deleteL1([]objkey.Key, bool) (int, int)        { return 0, 0 }
func (e *Engine) adapterInfos() []AdapterInfo                   { return nil }
func (e *Engine) listL2(context.Context, int, string, int, string) (l2.Page, error) {
	return l2.Page{}, errNotImplemented
}
func (e *Engine) deleteL2(context.Context, int, []objkey.Key) ([]objkey.Key, error) {
	return nil, errNotImplemented
}
func (e *Engine) reconfigure(context.Context, int, string, map[string]any) (map[string]any, error) {
	return nil, errNotImplemented
}
func (e *Engine) reconfigureStatus(int) (map[string]any, error) { return nil, errNotImplemented }
func (e *Engine) quotaUsage(string) int64                       { return 0 }
func (e *Engine) l1UsageBySalt() map[string]int64               { return nil }
func (e *Engine) status() map[string]any                        { return nil }
func (e *Engine) counters() Counters                            { return Counters{} }
func (e *Engine) addL1Listener(L1Listener)                      {}
