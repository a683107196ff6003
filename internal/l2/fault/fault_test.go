package fault_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fault"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openFlag(t *testing.T, js string) *fault.Adapter {
	t.Helper()
	spec, err := l2.ParseSpec(1, []byte(js))
	if err != nil {
		t.Fatal(err)
	}
	a, err := l2.Open(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return a.(*fault.Adapter)
}

func fsFlag(t *testing.T, extra string) string {
	return `{"type":"fault_inject","inner":{"type":"fs","base_path":"` + t.TempDir() + `"}` + extra + `}`
}

// With no faults configured the wrapper is transparent.
func TestConformancePassThrough(t *testing.T) {
	l2test.Run(t, func(t *testing.T) l2.Adapter { return openFlag(t, fsFlag(t, "")) })
}

func TestOutageAndRecovery(t *testing.T) {
	a := openFlag(t, fsFlag(t, ""))
	defer a.Close()
	ctx := context.Background()
	keys := l2test.Keys(t, 2, "")
	objs := l2test.Objects(t, 2)
	if err := a.Store(ctx, keys, objs); err != nil {
		t.Fatal(err)
	}
	a.SetFailing(true)
	if err := a.Store(ctx, keys, objs); !errors.Is(err, fault.ErrInjected) || !errors.Is(err, l2.ErrUnavailable) {
		t.Fatalf("Store while failing = %v", err)
	}
	hits, err := a.LookupAndLock(ctx, keys)
	if !errors.Is(err, l2.ErrUnavailable) || slices.Contains(hits, true) {
		t.Fatalf("LookupAndLock while failing = %v %v", hits, err)
	}
	if _, err := a.Load(ctx, keys, [][]byte{make([]byte, len(objs[0])), make([]byte, len(objs[1]))}); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("Load while failing = %v", err)
	}
	if _, err := a.Delete(ctx, keys); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("Delete while failing = %v", err)
	}
	if _, err := a.List(ctx, "", 10, ""); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("List while failing = %v", err)
	}
	st := a.Status()
	if st["is_healthy"] != false || st["fault_inject"].(map[string]any)["injected_calls"] != int64(5) {
		t.Fatalf("status while failing = %v", st)
	}
	a.SetFailing(false)
	hits, err = a.LookupAndLock(ctx, keys)
	if err != nil || !slices.Equal(hits, []bool{true, true}) {
		t.Fatalf("after recovery: %v %v", hits, err)
	}
	l2test.LoadAll(t, a, keys, objs)
	a.Unlock(keys)
}

func TestErrorRateExtremes(t *testing.T) {
	a := openFlag(t, fsFlag(t, `,"error_rate":1`))
	defer a.Close()
	keys := l2test.Keys(t, 1, "")
	if err := a.Store(context.Background(), keys, l2test.Objects(t, 1)); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("error_rate 1: %v", err)
	}
	a.SetErrorRate(0)
	if err := a.Store(context.Background(), keys, l2test.Objects(t, 1)); err != nil {
		t.Fatalf("error_rate 0: %v", err)
	}
}

func TestLoadDrops(t *testing.T) {
	a := openFlag(t, fsFlag(t, `,"gap_indices":[1],"gap_tail_ratios":[0.0]`))
	defer a.Close()
	ctx := context.Background()
	keys := l2test.Keys(t, 5, "")
	objs := l2test.Objects(t, 5)
	if err := a.Store(ctx, keys, objs); err != nil {
		t.Fatal(err)
	}
	hits, err := a.LookupAndLock(ctx, keys)
	if err != nil || slices.Contains(hits, false) {
		t.Fatalf("lookup is not faulted: %v %v", hits, err)
	}
	dst := make([][]byte, 5)
	for i := range dst {
		dst[i] = make([]byte, len(objs[i]))
	}
	ok, err := a.Load(ctx, keys, dst)
	if err != nil {
		t.Fatal(err)
	}
	// Position 1 (gap index) and the last (tail ratio 0.0) are dropped.
	if want := []bool{true, false, true, true, false}; !slices.Equal(ok, want) {
		t.Fatalf("load = %v, want %v", ok, want)
	}
	a.Unlock(keys)
}

func TestRateIsDeterministic(t *testing.T) {
	ctx := context.Background()
	keys := l2test.Keys(t, 200, "")
	objs := make([][]byte, len(keys))
	for i := range objs {
		objs[i] = []byte{byte(i), 7}
	}
	run := func(seed string) []bool {
		a := openFlag(t, fsFlag(t, `,"rate":0.5,"seed":`+seed))
		defer a.Close()
		if err := a.Store(ctx, keys, objs); err != nil {
			t.Fatal(err)
		}
		dst := make([][]byte, len(keys))
		for i := range dst {
			dst[i] = make([]byte, 2)
		}
		ok, err := a.Load(ctx, keys, dst)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	first, again, other := run("7"), run("7"), run("8")
	if !slices.Equal(first, again) {
		t.Fatal("same seed dropped different keys")
	}
	if slices.Equal(first, other) {
		t.Fatal("different seeds dropped the same keys")
	}
	dropped := 0
	for _, b := range first {
		if !b {
			dropped++
		}
	}
	if dropped == 0 || dropped == len(keys) {
		t.Fatalf("rate 0.5 dropped %d of %d", dropped, len(keys))
	}
}

func TestLatencyHonoursContext(t *testing.T) {
	a := openFlag(t, fsFlag(t, `,"latency_ms":600000`))
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := a.Store(ctx, l2test.Keys(t, 1, ""), l2test.Objects(t, 1))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Store with latency and a cancelled ctx = %v", err)
	}
	a.SetLatency(time.Millisecond)
	if err := a.Store(context.Background(), l2test.Keys(t, 1, ""), l2test.Objects(t, 1)); err != nil {
		t.Fatal(err)
	}
}

func TestParseErrors(t *testing.T) {
	dir := t.TempDir()
	for in, msg := range map[string]string{
		`{"type":"fault_inject"}`:                                                                         "--l2-adapter #1 ('fault_inject'): 'inner' must be an adapter spec dict",
		`{"type":"fault_inject","inner":{"base_path":"/x"}}`:                                              "('fault_inject'): inner adapter: missing 'type' field",
		`{"type":"fault_inject","inner":{"type":"fs"}}`:                                                   "('fault_inject'): inner adapter ('fs'): base_path is required",
		`{"type":"fault_inject","inner":{"type":"nope"}}`:                                                 "inner adapter: unknown adapter type 'nope'. Known: ",
		`{"type":"fault_inject","inner":{"type":"fs","base_path":"` + dir + `"},"rate":2}`:                "rate must be a number in [0, 1]",
		`{"type":"fault_inject","inner":{"type":"fs","base_path":"` + dir + `"},"gap_indices":[-1]}`:      "gap_indices must be a list of non-negative integers",
		`{"type":"fault_inject","inner":{"type":"fs","base_path":"` + dir + `"},"gap_tail_ratios":[1.5]}`: "gap_tail_ratios must be a list of floats in [0, 1]",
		`{"type":"fault_inject","inner":{"type":"fs","base_path":"` + dir + `","serde":{"type":"fp8"}}}`:  "inner adapter ('fs'): serde type 'fp8' is not supported",
	} {
		_, err := l2.ParseSpec(1, []byte(in))
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s:\n got %v\nwant %q", in, err, msg)
		}
	}
	spec, err := l2.ParseSpec(3, []byte(`{"type":"fault_inject","inner":{"type":"fs","base_path":"`+dir+`","shared":true},"seed":4,"failing":true}`))
	if err != nil {
		t.Fatal(err)
	}
	c := spec.Options.(fault.Config)
	if c.Inner.Type != "fs" || !c.Inner.Shared || c.Seed != 4 || !c.Failing {
		t.Fatalf("config = %+v", c)
	}
	a, err := l2.Open(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.TypeName() != "fault_inject" || a.(*fault.Adapter).Inner().TypeName() != "fs" {
		t.Fatal("types")
	}
	if err := a.Store(context.Background(), []objkey.Key{}, nil); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("failing from config: %v", err)
	}
	var _ = fs.TypeName
}

// TestRecoveredPassesThrough: the wrapper reports what the inner fs adapter
// recovered at start.
func TestRecoveredPassesThrough(t *testing.T) {
	dir := t.TempDir()
	earlier, err := fs.New(fs.Config{BasePath: dir, PersistEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	keys := l2test.Keys(t, 3, "")
	if err := earlier.Store(context.Background(), keys, l2test.Objects(t, 3)); err != nil {
		t.Fatal(err)
	}
	if err := earlier.Close(); err != nil {
		t.Fatal(err)
	}
	a := openFlag(t, `{"type":"fault_inject","inner":{"type":"fs","base_path":"`+dir+`"}}`)
	defer a.Close()
	got, sizes := a.Recovered()
	if len(got) != 3 || len(sizes) != 3 {
		t.Fatalf("recovered %v %v, want the 3 stored keys", got, sizes)
	}
	for _, k := range keys {
		if !slices.Contains(got, k) {
			t.Fatalf("key %v not recovered", k)
		}
	}
}
