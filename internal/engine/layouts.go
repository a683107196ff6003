package engine

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
)

// layoutRegistry holds the layouts of (model_name, world_size) pairs from
// two sources. Static layouts (--register-model, RegisterLayout) stay until
// UnregisterLayout. Registration layouts are reference-counted across the
// data path's worker registrations (AcquireLayout / ReleaseLayout): the
// last release forgets one, so lookups for a model no worker serves any
// more report no hits. Where both exist the registration's layout is the
// one in force (it describes the workers actually storing); when its last
// reference goes, the static one is in force again.
//
// mu is a leaf lock: no method calls out while holding it, so the data
// path may call AcquireLayout and ReleaseLayout under its own lock to keep
// the two reference counts in step.
type layoutRegistry struct {
	mu     sync.RWMutex
	static map[layoutKey]Layout
	refd   map[layoutKey]*refLayout
}

type layoutKey struct {
	model string
	world int
}

type refLayout struct {
	l    Layout
	refs int
}

func newLayoutRegistry() layoutRegistry {
	return layoutRegistry{static: map[layoutKey]Layout{}, refd: map[layoutKey]*refLayout{}}
}

func validLayout(l Layout) (Layout, error) {
	if l.ModelName == "" || l.WorldSize <= 0 || l.ObjectBytes <= 0 {
		return Layout{}, fmt.Errorf("%w: layout needs a model name, world size > 0 and object bytes > 0", ErrInvalid)
	}
	for _, g := range l.GroupObjectBytes {
		if g < 0 {
			return Layout{}, fmt.Errorf("%w: negative group object size", ErrInvalid)
		}
	}
	l.GroupObjectBytes = slices.Clone(l.GroupObjectBytes)
	return l, nil
}

// RegisterLayout records (or replaces) the static layout of (ModelName,
// WorldSize): one that stays until UnregisterLayout (--register-model).
func (e *Engine) RegisterLayout(l Layout) error {
	l, err := validLayout(l)
	if err != nil {
		return err
	}
	r := &e.layouts
	r.mu.Lock()
	r.static[layoutKey{l.ModelName, l.WorldSize}] = l
	r.mu.Unlock()
	return nil
}

// UnregisterLayout forgets the static layout of (modelName, worldSize) and
// reports whether it existed. Layouts held by registrations stay until
// released; objects already stored are kept.
func (e *Engine) UnregisterLayout(modelName string, worldSize int) bool {
	r := &e.layouts
	r.mu.Lock()
	defer r.mu.Unlock()
	k := layoutKey{modelName, worldSize}
	_, ok := r.static[k]
	delete(r.static, k)
	return ok
}

// AcquireLayout takes one reference on the layout of (ModelName,
// WorldSize) for a data-path worker registration and makes l the layout in
// force (a later registration's layout replaces an earlier one's; the data
// path refuses one of a different object size while references remain).
// Each successful call must be paired with one ReleaseLayout.
func (e *Engine) AcquireLayout(l Layout) error {
	l, err := validLayout(l)
	if err != nil {
		return err
	}
	r := &e.layouts
	r.mu.Lock()
	defer r.mu.Unlock()
	k := layoutKey{l.ModelName, l.WorldSize}
	if rl := r.refd[k]; rl != nil {
		rl.l = l
		rl.refs++
		return nil
	}
	r.refd[k] = &refLayout{l: l, refs: 1}
	return nil
}

// ReleaseLayout drops one registration reference on (modelName, worldSize)
// and returns how many remain; at zero the registration layout is
// forgotten (a static layout of the pair is in force again). Releasing a
// pair with no references does nothing and returns 0.
func (e *Engine) ReleaseLayout(modelName string, worldSize int) int {
	r := &e.layouts
	r.mu.Lock()
	defer r.mu.Unlock()
	k := layoutKey{modelName, worldSize}
	rl := r.refd[k]
	if rl == nil {
		return 0
	}
	rl.refs--
	if rl.refs > 0 {
		return rl.refs
	}
	delete(r.refd, k)
	return 0
}

// Layout returns the layout in force for (modelName, worldSize) or an
// error wrapping ErrNoLayout.
func (e *Engine) Layout(modelName string, worldSize int) (Layout, error) {
	r := &e.layouts
	k := layoutKey{modelName, worldSize}
	r.mu.RLock()
	l, ok := r.static[k]
	if rl := r.refd[k]; rl != nil {
		l, ok = rl.l, true
	}
	r.mu.RUnlock()
	if !ok {
		return Layout{}, fmt.Errorf("%w for model_name='%s' world_size=%d; the model has not allocated KV cache on this node yet", ErrNoLayout, modelName, worldSize)
	}
	return l, nil
}

// Layouts lists the layouts in force, sorted by model name then world
// size.
func (e *Engine) Layouts() []Layout {
	r := &e.layouts
	r.mu.RLock()
	out := make([]Layout, 0, len(r.static)+len(r.refd))
	for k, l := range r.static {
		if r.refd[k] == nil {
			out = append(out, l)
		}
	}
	for _, rl := range r.refd {
		out = append(out, rl.l)
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b Layout) int {
		return cmp.Or(cmp.Compare(a.ModelName, b.ModelName), cmp.Compare(a.WorldSize, b.WorldSize))
	})
	return out
}
