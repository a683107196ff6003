package l2_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/lmcache-go/lmcache/internal/l2"
)

type dummyOpts struct {
	Path string
	N    int64
}

func init() {
	l2.Register("zz_dummy", l2.Factory{
		Parse: func(f *l2.Fields) (any, error) {
			p, err := f.String("path", "")
			if err != nil {
				return nil, err
			}
			if p == "" {
				return nil, errors.New("path is required")
			}
			n, err := f.PositiveInt("n", 3)
			if err != nil {
				return nil, err
			}
			return dummyOpts{Path: p, N: n}, nil
		},
		Open: func(ctx context.Context, spec l2.Spec) (l2.Adapter, error) {
			return nil, errors.New("dummy cannot open")
		},
	})
}

func TestParseSpecsCommonKeys(t *testing.T) {
	specs, err := l2.ParseSpecs([]string{
		`{"type":"zz_dummy","path":"/a"}`,
		`{"type":"zz_dummy","path":"/b","n":7,"shared":true,"persist_enabled":false,"affinity_tag":"gpu0",
		  "eviction":{"eviction_policy":"IsolatedLRU","trigger_watermark":0.9},"mystery":1}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []l2.Spec{
		{Index: 1, Type: "zz_dummy", PersistEnabled: true, AffinityTag: "_default", Options: dummyOpts{"/a", 3}},
		{Index: 2, Type: "zz_dummy", Shared: true, PersistEnabled: false, AffinityTag: "gpu0",
			Eviction: &l2.EvictionConfig{Policy: "IsolatedLRU", TriggerWatermark: 0.9, EvictionRatio: 0.2},
			Options:  dummyOpts{"/b", 7}, UnknownKeys: []string{"mystery"}},
	}
	if d := cmp.Diff(want, specs); d != "" {
		t.Fatalf("specs (-want +got):\n%s", d)
	}
}

func TestParseSpecErrors(t *testing.T) {
	cases := []struct {
		in, want string
	}{
		{`{"type":`, "invalid JSON for --l2-adapter #1: "},
		{`[1]`, "--l2-adapter #1: expected a JSON object, got array"},
		{`null`, "--l2-adapter #1: expected a JSON object, got null"},
		{`{"path":"/a"}`, "--l2-adapter #1: missing 'type' field"},
		{`{"type":"nixl_store"}`, "--l2-adapter #1: unknown adapter type 'nixl_store'. Known: "},
		{`{"type":"zz_dummy"}`, "--l2-adapter #1 ('zz_dummy'): path is required"},
		{`{"type":"zz_dummy","path":"/a","n":0}`, "--l2-adapter #1 ('zz_dummy'): n must be a positive integer, got 0"},
		{`{"type":"zz_dummy","path":"/a","n":1.5}`, "n must be an integer, got 1.5"},
		{`{"type":"zz_dummy","path":"/a","shared":"yes"}`, "('zz_dummy'): shared must be a boolean, got \"yes\""},
		{`{"type":"zz_dummy","path":"/a","eviction":{"eviction_policy":"FIFO"}}`,
			"eviction.eviction_policy must be 'LRU', 'IsolatedLRU', or 'noop', got \"FIFO\""},
		{`{"type":"zz_dummy","path":"/a","eviction":{"eviction_policy":"LRU","eviction_ratio":2}}`,
			"eviction.eviction_ratio must be in (0, 1], got 2"},
		{`{"type":"zz_dummy","path":"/a","serde":{"type":"fp8"}}`,
			"--l2-adapter #1 ('zz_dummy'): serde type 'fp8' is not supported by lmcache-go"},
		{`{"type":"zz_dummy","path":"/a","serde":"fp8"}`, "'serde' must be a dict"},
		{`{"type":"zz_dummy","path":"/a","serde":{}}`, "'serde' dict must include a 'type' field"},
		{`{"type":"zz_dummy","path":"/a","affinity_tag":3}`, "affinity_tag must be a string, got 3"},
	}
	for _, c := range cases {
		_, err := l2.ParseSpec(1, []byte(c.in))
		if err == nil {
			t.Errorf("%s: no error", c.in)
			continue
		}
		if !errors.Is(err, l2.ErrConfig) {
			t.Errorf("%s: %v does not wrap ErrConfig", c.in, err)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n got %q\nwant substring %q", c.in, err, c.want)
		}
		// Reason is the same text without ErrConfig and the flag's name.
		var se *l2.SpecError
		if !errors.As(err, &se) {
			t.Errorf("%s: %T is not a *SpecError", c.in, err)
		} else if full, reason := err.Error(), se.Reason(); strings.Contains(reason, "l2-adapter") ||
			!strings.HasPrefix(reason, "#1") || !strings.HasSuffix(full, strings.TrimPrefix(reason, "#1: invalid JSON: ")) {
			t.Errorf("%s: Reason %q does not match Error %q", c.in, reason, full)
		}
	}
}

func TestUnknownTypeListsKnownTypes(t *testing.T) {
	_, err := l2.ParseSpecs([]string{`{"type":"zz_dummy","path":"/a"}`, `{"type":"bogus"}`})
	if err == nil {
		t.Fatal("no error")
	}
	if !strings.HasPrefix(err.Error(), "invalid --l2-adapter: --l2-adapter #2: unknown adapter type 'bogus'. Known: ") {
		t.Fatalf("got %q", err)
	}
	for _, name := range l2.RegisteredTypes() {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("known type %q missing from %q", name, err)
		}
	}
}

func TestOpenWrapsIndex(t *testing.T) {
	spec, err := l2.ParseSpec(4, []byte(`{"type":"zz_dummy","path":"/a"}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = l2.OpenAll(context.Background(), []l2.Spec{spec})
	if err == nil || err.Error() != "--l2-adapter #4 ('zz_dummy'): dummy cannot open" {
		t.Fatalf("got %v", err)
	}
}

func TestGiBBytes(t *testing.T) {
	f := l2.NewFields(map[string]json.RawMessage{"a": json.RawMessage(`1.5`), "b": json.RawMessage(`-1`)})
	if v, err := f.GiBBytes("a", 0); err != nil || v != 3<<29 {
		t.Fatalf("a = %d, %v", v, err)
	}
	if _, err := f.GiBBytes("b", 0); err == nil || err.Error() != "b must be >= 0, got -1" {
		t.Fatalf("b: %v", err)
	}
	if v, err := f.GiBBytes("c", 0.5); err != nil || v != 1<<29 {
		t.Fatalf("c = %d, %v", v, err)
	}
}
