package l1

import (
	"fmt"
	"sort"

	"github.com/lmcache-go/lmcache/internal/eviction"
)

// order is the L1 eviction order. It links objects intrusively (each
// object embeds its eviction.Elem), so tracking an object costs no node
// allocation and no second key index. Guarded by Table.mu.
//
//   - LRU: one list.
//   - IsolatedLRU: one list per cache_salt.
//   - noop: nothing is tracked.
//
// A committed batch (one request's chunks in token order) is pushed in
// reverse, so the batch's last chunk is the least recent: within a request
// tail chunks are evicted first and cached prefixes survive. Touch follows
// the same rule. Iterating the batch backwards keeps the rule inside every
// salt's list too.
type order struct {
	name  string
	all   eviction.List[*object]
	salts map[string]*eviction.List[*object]
}

func newOrder(name string) (*order, error) {
	switch name {
	case "", eviction.NoopName, eviction.LRUName, eviction.IsolatedLRUName:
	default:
		return nil, fmt.Errorf("unknown eviction policy %q", name)
	}
	if name == "" {
		name = eviction.NoopName
	}
	return &order{name: name, salts: map[string]*eviction.List[*object]{}}, nil
}

func (p *order) list(o *object) *eviction.List[*object] {
	switch p.name {
	case eviction.LRUName:
		return &p.all
	case eviction.IsolatedLRUName:
		l := p.salts[o.key.CacheSalt]
		if l == nil {
			l = &eviction.List[*object]{}
			p.salts[o.key.CacheSalt] = l
		}
		return l
	}
	return nil
}

// add tracks newly resident objects (or refreshes them).
func (p *order) add(objs []*object) {
	for i := len(objs) - 1; i >= 0; i-- {
		if l := p.list(objs[i]); l != nil {
			objs[i].elem.Value = objs[i]
			l.PushBack(&objs[i].elem)
		}
	}
}

// touch refreshes tracked objects.
func (p *order) touch(objs []*object) {
	for i := len(objs) - 1; i >= 0; i-- {
		if l := objs[i].elem.List(); l != nil {
			l.PushBack(&objs[i].elem)
		}
	}
}

func (p *order) remove(o *object) {
	l := o.elem.List()
	if l == nil {
		return
	}
	l.Remove(&o.elem)
	o.elem.Value = nil
	if p.name == eviction.IsolatedLRUName && l.Len() == 0 {
		delete(p.salts, o.key.CacheSalt)
	}
}

// lists returns the lists a cut applies to: every list for a global cut,
// the salt's list for a salt cut (IsolatedLRU only).
func (p *order) lists(c Cut) []*eviction.List[*object] {
	switch p.name {
	case eviction.LRUName:
		if c.Global {
			return []*eviction.List[*object]{&p.all}
		}
	case eviction.IsolatedLRUName:
		if !c.Global {
			if l := p.salts[c.Salt]; l != nil {
				return []*eviction.List[*object]{l}
			}
			return nil
		}
		salts := make([]string, 0, len(p.salts))
		for s := range p.salts {
			salts = append(salts, s)
		}
		sort.Strings(salts)
		out := make([]*eviction.List[*object], len(salts))
		for i, s := range salts {
			out[i] = p.salts[s]
		}
		return out
	}
	return nil
}
