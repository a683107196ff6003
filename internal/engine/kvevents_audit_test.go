package engine

import (
	"slices"
	"strings"
	"testing"
)

// TestKVEventSinkL2LoadAndTemporaries: objects a LOOKUP loads from L2 into
// L1 are reported as stored/CPU, and when their last reader releases them
// the freed temporaries are reported as removed/CPU; nothing else is
// reported (loaded objects are not re-stored to L2).
func TestKVEventSinkL2LoadAndTemporaries(t *testing.T) {
	a := newFake("a")
	h := start(t, Config{}, a)
	defer h.stop(t)
	sink := &sinkRec{}
	h.AddKVEventSink(sink)
	cs := chunks("", 0, 2, 1)
	for _, k := range flat(cs) {
		a.put(k, pattern(k, objSize))
	}
	if r := h.lookup(t, "req", cs); r.PrefixChunks != 2 || r.L2Keys != 2 {
		t.Fatalf("lookup: %+v", r)
	}
	if c := h.Counters(); c.L1Temporary != 2 {
		t.Fatalf("L1Temporary %d, want 2", c.L1Temporary)
	}
	loaded := union(t, sink.events(), "stored/CPU")
	if !slices.Equal(loaded, []string{"chunk-000000", "chunk-000001"}) {
		t.Fatalf("stored/CPU chunks %v (events %v)", loaded, sink.events())
	}
	h.ReleaseRead("req", flat(cs), 1)
	if c := h.Counters(); c.L1Temporary != 0 || c.L1Objects != 0 {
		t.Fatalf("temporaries left: %+v", c)
	}
	ev := sink.events()
	if freed := union(t, ev, "removed/CPU"); !slices.Equal(freed, []string{"chunk-000000", "chunk-000001"}) {
		t.Fatalf("removed/CPU chunks %v (events %v)", freed, ev)
	}
	for _, e := range ev {
		if !strings.HasPrefix(e, "stored/CPU:") && !strings.HasPrefix(e, "removed/CPU:") {
			t.Errorf("unexpected event %q", e)
		}
	}
}

// union collects the sorted chunk names of the sinkRec events with prefix
// (for example "stored/CPU"), failing on a chunk reported twice.
func union(t *testing.T, events []string, prefix string) []string {
	t.Helper()
	var out []string
	for _, e := range events {
		rest, ok := strings.CutPrefix(e, prefix+":[")
		if !ok {
			continue
		}
		for _, c := range strings.Fields(strings.TrimSuffix(rest, "]")) {
			if slices.Contains(out, c) {
				t.Fatalf("chunk %s reported twice as %s: %v", c, prefix, events)
			}
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}
