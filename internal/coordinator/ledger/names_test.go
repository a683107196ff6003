package ledger

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// interned is how many model names, salts and long key names the ledger
// holds ids for.
func (l *Ledger) interned() (models, salts, longs int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.models.live(), l.saltNames.live(), l.longs.live()
}

// TestNamesFreedWhenUnused: salts, model names and long key names that no
// key and no pin refers to any more are forgotten. Before, each one ever
// seen stayed interned (and each salt's state stayed in every planning
// pass and usage read), so a reporter storing and deleting under ever new
// salts or models grew the ledger without bound.
func TestNamesFreedWhenUnused(t *testing.T) {
	l := New()
	long := strings.Repeat("ab", 40) // 40 bytes: not inline
	for i := range 1000 {
		salt, model := fmt.Sprintf("s-%d", i), fmt.Sprintf("m-%d", i)
		evs := []Event{
			{Op: OpStore, Key: key(t, "aa", model, salt), Bytes: 10},
			{Op: OpStore, Key: key(t, long, model, salt), Bytes: 20},
		}
		l.Apply(evs)
		evs[0].Op, evs[1].Op = OpDelete, OpDelete
		l.Apply(evs)
	}
	if m, s, lg := l.interned(); m != 0 || s != 0 || lg != 0 {
		t.Fatalf("interned after every key was deleted: %d models, %d salts, %d long names; want 0, 0, 0", m, s, lg)
	}
	if len(l.salts) > 1 || len(l.models.list) > 1 {
		t.Fatalf("tables grew to %d salts, %d models; want ids reused (at most 1)", len(l.salts), len(l.models.list))
	}
	if u, total := l.Usage(); len(u) != 0 || total != 0 {
		t.Fatalf("usage %v total %d, want none", u, total)
	}
}

// TestReusedIDsKeepNames: a freed id given to another name reads as that
// name everywhere: usage, plans, materialized victims, pins and the
// checkpoint.
func TestReusedIDsKeepNames(t *testing.T) {
	l := New()
	l.Apply([]Event{{Op: OpStore, Key: key(t, "aa", "m-old", "old"), Bytes: 5}})
	l.Apply([]Event{{Op: OpDelete, Key: key(t, "aa", "m-old", "old")}})
	l.Apply([]Event{{Op: OpStore, Key: key(t, "bb", "m-new", "new"), Bytes: 7}})
	if m, s, _ := l.interned(); m != 1 || s != 1 {
		t.Fatalf("interned %d models %d salts, want 1 1", m, s)
	}
	if got := l.SaltUsage("old"); got != 0 {
		t.Fatalf("usage of the freed salt = %d, want 0", got)
	}
	if got := l.SaltUsage("new"); got != 7 {
		t.Fatalf("usage of new = %d, want 7", got)
	}
	p := l.ComputePlan(quota.Limits{Explicit: map[string]int64{"new": 0}}, PlanOptions{Ratio: 1, Watermark: 1})
	if len(p.Salts) != 1 || p.Salts[0] != "new" {
		t.Fatalf("plan salts %v, want [new]", p.Salts)
	}
	keys, _ := l.Materialize(p.Flat())
	if len(keys) != 1 || keys[0].ModelName != "m-new" || keys[0].CacheSalt != "new" || keys[0].ChunkHash != "\xbb" {
		t.Fatalf("victims %+v, want bb of m-new in new", keys)
	}
	pin := objkey.Key{ChunkHash: "\xcc", ModelName: "m-pin", CacheSalt: "pinned"}
	l.Pin([]objkey.Key{pin}, 1)
	if pins := l.Pins(); len(pins) != 1 || pins[0].Key != pin || pins[0].Count != 1 {
		t.Fatalf("pins %+v, want %+v once", pins, pin)
	}
	// A pin holds its names even with no key stored under them.
	if m, s, _ := l.interned(); m != 2 || s != 2 {
		t.Fatalf("interned %d models %d salts with a pin, want 2 2", m, s)
	}
	l.Pin([]objkey.Key{pin}, -1)
	if m, s, _ := l.interned(); m != 1 || s != 1 {
		t.Fatalf("interned %d models %d salts after the unpin, want 1 1", m, s)
	}
	l.Pin([]objkey.Key{pin}, 1)
	l.ReplacePins(nil)
	if m, s, _ := l.interned(); m != 1 || s != 1 || len(l.Pins()) != 0 {
		t.Fatalf("interned %d models %d salts, %d pins after ReplacePins(nil), want 1 1 0", m, s, len(l.Pins()))
	}
}

// TestNamesStableWithinBatch: a batch that deletes a salt's last key and
// then stores under it again (or under a salt that takes the freed id)
// applies both: ids a batch resolved before applying stay valid to its end.
func TestNamesStableWithinBatch(t *testing.T) {
	l := New()
	l.Apply([]Event{{Op: OpStore, Key: key(t, "aa", "m", "x"), Bytes: 5}})
	l.Apply([]Event{
		{Op: OpDelete, Key: key(t, "aa", "m", "x")},
		{Op: OpStore, Key: key(t, "bb", "m", "y"), Bytes: 3},
		{Op: OpStore, Key: key(t, "cc", "m", "x"), Bytes: 4},
	})
	if x, y := l.SaltUsage("x"), l.SaltUsage("y"); x != 4 || y != 3 {
		t.Fatalf("usage x %d y %d, want 4 3", x, y)
	}
	if _, s, _ := l.interned(); s != 2 {
		t.Fatalf("%d salts interned, want 2", s)
	}
}
