package intentstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/intentstore"
	"github.com/lmcache-go/lmcache/internal/etcdtest"
)

// TestHugeForeignValuesAreBounded: values someone else wrote under the
// prefix, as large as etcd takes, are skipped with an error of bounded
// size (it is logged on every coordinator at every reload), not one that
// quotes them whole; a pin record over MaxPinRecordBytes, which this store
// never writes, is refused as corrupt rather than fanned out. The valid
// rest loads, and a watch reports the same bounded errors.
func TestHugeForeignValuesAreBounded(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := etcdtest.NewClient(t, c.Endpoints)
	s := intentstore.New(cli, prefix)
	f := term(t, cli, "/test/leader/a")
	if _, err := s.PutQuota(ctx(t), f, "ok", 5); err != nil {
		t.Fatal(err)
	}
	st0, err := s.Load(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	wch := s.Watch(wctx, st0.Revision+1)

	hashes := make([]string, 20000) // 64 hex digits each: about 1.4 MB of JSON
	for i := range hashes {
		hashes[i] = strings.Repeat("ab", 32)
	}
	bigPin, err := json.Marshal(intentstore.PinRecord{PinGroup: intentstore.PinGroup{Model: "m", WorldSize: 1, Hashes: hashes}, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(bigPin) <= intentstore.MaxPinRecordBytes {
		t.Fatalf("test pin record %d bytes, want over %d", len(bigPin), intentstore.MaxPinRecordBytes)
	}
	writes := map[string]string{
		prefix + "quota/huge":                          strings.Repeat("9x", 512<<10), // 1 MiB, not a number
		prefix + "junk/" + strings.Repeat("k", 64<<10): "1",                           // 64 KiB unknown key
		prefix + "pin/big":                             string(bigPin),
	}
	for k, v := range writes {
		if _, err := cli.Put(ctx(t), k, v); err != nil {
			t.Fatal(err)
		}
	}

	const maxErr = 2048 // three skipped values, each reported in well under this
	st, err := s.Load(ctx(t))
	if !errors.Is(err, intentstore.ErrCorrupt) || len(err.Error()) > maxErr {
		t.Fatalf("load error (%d bytes, want ErrCorrupt in at most %d): %.300q", errLen(err), maxErr, errText(err))
	}
	if !maps.Equal(st.Quotas, map[string]int64{"ok": 5}) || len(st.Pins) != 0 || len(st.Changes) != 1 {
		t.Fatalf("load: quotas %v, pins %d, changes %d", st.Quotas, len(st.Pins), len(st.Changes))
	}

	var errs []error
	for n := 0; n < len(writes); {
		select {
		case wr := <-wch:
			cs, err := s.Decode(wr)
			if len(cs) != 0 {
				t.Fatalf("watch applied %+v", cs)
			}
			n += len(wr.Events)
			errs = append(errs, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("watch delivered %d of %d writes", n, len(writes))
		}
	}
	werr := errors.Join(errs...)
	if !errors.Is(werr, intentstore.ErrCorrupt) || len(werr.Error()) > maxErr {
		t.Fatalf("watch error (%d bytes, want ErrCorrupt in at most %d): %.300q", errLen(werr), maxErr, errText(werr))
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func errLen(err error) int { return len(errText(err)) }
