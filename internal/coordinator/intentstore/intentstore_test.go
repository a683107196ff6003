package intentstore_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/intentstore"
	"github.com/lmcache-go/lmcache/internal/etcdtest"
	"github.com/lmcache-go/lmcache/internal/polltest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const prefix = "/test/intent/"

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// term makes a fence the way an election does: a key and its create
// revision.
func term(t *testing.T, cli *clientv3.Client, key string) intentstore.Fence {
	t.Helper()
	resp, err := cli.Put(ctx(t), key, "coord")
	if err != nil {
		t.Fatal(err)
	}
	return intentstore.Fence{Key: key, Revision: resp.Header.Revision}
}

func group(salt string, n int) intentstore.PinGroup {
	hashes := make([][]byte, n)
	for i := range hashes {
		hashes[i] = []byte{byte(i), byte(i >> 8), 0xab, 0xcd}
	}
	return intentstore.NewPinGroup("org/m", 2, salt, hashes)
}

// TestIntentRoundTripFencedAndWatched: on a real three-member etcd
// cluster, fenced writes land and Load and a watch see them in order; a
// stale fence's writes are refused with ErrFenced and change nothing; pin
// counts add up and a record unpinned to zero is gone; a corrupt value is
// skipped loudly; a record over the size limit is refused; losing one etcd
// member changes nothing.
func TestIntentRoundTripFencedAndWatched(t *testing.T) {
	c := etcdtest.Start(t, 3)
	cli := etcdtest.NewClient(t, c.Endpoints)
	s := intentstore.New(cli, prefix)
	f := term(t, cli, "/test/leader/a")

	st0, err := s.Load(ctx(t))
	if err != nil || len(st0.Quotas) != 0 || st0.Default != nil || len(st0.Pins) != 0 {
		t.Fatalf("empty load: %+v %v", st0, err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	wch := s.Watch(wctx, st0.Revision+1)

	var wrote []int64 // commit revisions, in order
	for _, salt := range []string{"tenant-a", ""} {
		limit := map[string]int64{"tenant-a": 1 << 30, "": 5}[salt]
		rev, err := s.PutQuota(ctx(t), f, salt, limit)
		if err != nil {
			t.Fatal(err)
		}
		wrote = append(wrote, rev)
	}
	lim := int64(7 << 20)
	rev, err := s.SetDefault(ctx(t), f, &lim)
	if err != nil {
		t.Fatal(err)
	}
	wrote = append(wrote, rev)
	g := group("tenant-a", 3)
	for want := int64(1); want <= 2; want++ {
		n, rev, err := s.Pin(ctx(t), f, g, 1)
		if err != nil || n != want {
			t.Fatalf("pin: %d %v, want %d", n, err, want)
		}
		wrote = append(wrote, rev)
	}
	if ok, _, err := s.DeleteQuota(ctx(t), f, "tenant-missing"); err != nil || ok {
		t.Fatalf("delete missing: %v %v", ok, err)
	}

	st, err := s.Load(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(st.Quotas, map[string]int64{"tenant-a": 1 << 30, "": 5}) || st.Default == nil || *st.Default != lim {
		t.Fatalf("load: %+v default %v", st.Quotas, st.Default)
	}
	rec, ok := st.Pins[g.ID()]
	if len(st.Pins) != 1 || !ok || rec.Count != 2 || rec.Model != "org/m" || rec.WorldSize != 2 || len(rec.Hashes) != 3 || rec.Hashes[2] != "0200abcd" {
		t.Fatalf("pins: %+v", st.Pins)
	}
	if hb, err := rec.HashBytes(); err != nil || len(hb) != 3 || hb[1][0] != 1 {
		t.Fatalf("hash bytes %v %v", hb, err)
	}

	// The watch saw the same writes, in order.
	var kinds []intentstore.ChangeKind
	var pinCounts, revs []int64
	for len(kinds) < 5 {
		select {
		case wr := <-wch:
			cs, err := s.Decode(wr)
			if err != nil || wr.Err() != nil {
				t.Fatalf("watch: %v %v", err, wr.Err())
			}
			for _, c := range cs {
				kinds = append(kinds, c.Kind)
				revs = append(revs, c.Revision)
				if c.Kind == intentstore.KindPin {
					pinCounts = append(pinCounts, c.Pin.Count)
				}
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("watch delivered %v only", kinds)
		}
	}
	want := []intentstore.ChangeKind{intentstore.KindQuota, intentstore.KindQuota, intentstore.KindDefault, intentstore.KindPin, intentstore.KindPin}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("watch kinds %v, want %v", kinds, want)
		}
	}
	if len(pinCounts) != 2 || pinCounts[0] != 1 || pinCounts[1] != 2 {
		t.Fatalf("watched pin counts %v", pinCounts)
	}
	if !slices.Equal(revs, wrote) {
		t.Fatalf("watched revisions %v, writes committed at %v", revs, wrote)
	}

	// A new term (the key re-created: a new create revision) fences the
	// old one out.
	if _, err := cli.Delete(ctx(t), f.Key); err != nil {
		t.Fatal(err)
	}
	f2 := term(t, cli, f.Key)
	if _, err := s.PutQuota(ctx(t), f, "tenant-a", 1); !errors.Is(err, intentstore.ErrFenced) {
		t.Fatalf("stale PutQuota: %v", err)
	}
	if _, _, err := s.Pin(ctx(t), f, g, -1); !errors.Is(err, intentstore.ErrFenced) {
		t.Fatalf("stale Pin: %v", err)
	}
	if _, _, err := s.Pin(ctx(t), f, group("other", 1), -1); !errors.Is(err, intentstore.ErrFenced) {
		t.Fatalf("stale no-op unpin: %v", err)
	}
	if _, err := s.SetDefault(ctx(t), f, nil); !errors.Is(err, intentstore.ErrFenced) {
		t.Fatalf("stale SetDefault: %v", err)
	}
	if st, _ := s.Load(ctx(t)); st.Quotas["tenant-a"] != 1<<30 || st.Pins[g.ID()].Count != 2 || st.Default == nil {
		t.Fatalf("a stale write changed state: %+v", st)
	}

	// Unpin to zero deletes; one more unpin is a no-op.
	for _, want := range []int64{1, 0, 0} {
		if n, _, err := s.Pin(ctx(t), f2, g, -1); err != nil || n != want {
			t.Fatalf("unpin: %d %v, want %d", n, err, want)
		}
	}
	if ok, _, err := s.DeleteQuota(ctx(t), f2, "tenant-a"); err != nil || !ok {
		t.Fatalf("delete: %v %v", ok, err)
	}
	if _, err := s.SetDefault(ctx(t), f2, nil); err != nil {
		t.Fatal(err)
	}

	// Too large a record is refused before etcd sees it.
	big := make([][]byte, 20000) // 32-byte hashes: about 1.3 MB of JSON
	for i := range big {
		big[i] = make([]byte, 32)
	}
	if _, _, err := s.Pin(ctx(t), f2, intentstore.NewPinGroup("org/m", 1, "big", big), 1); !errors.Is(err, intentstore.ErrTooLarge) {
		t.Fatalf("big pin: %v", err)
	}

	// A corrupt value is reported and skipped; the rest loads.
	if _, err := cli.Put(ctx(t), prefix+"quota/bad", "12x"); err != nil {
		t.Fatal(err)
	}
	st, err = s.Load(ctx(t))
	if !errors.Is(err, intentstore.ErrCorrupt) || !maps.Equal(st.Quotas, map[string]int64{"": 5}) || st.Default != nil || len(st.Pins) != 0 {
		t.Fatalf("load with a corrupt value: %+v %v", st, err)
	}

	// One etcd member down: writes still commit on the quorum. The
	// client's connection to the killed member can fail the first write
	// as unavailable (EOF before the client notices the member is gone;
	// etcd's client does not resend a write it may have sent): the
	// caller sees a 503 and retries, as this does, the put being
	// idempotent. Any other error, or none within 10 s, fails.
	c.Follower(t, cli).Kill(t)
	polltest.Until(t, 10*time.Second, "a write with one member down", func() bool {
		_, err := s.PutQuota(ctx(t), f2, "after-loss", 9)
		if err != nil && !errors.Is(err, intentstore.ErrUnavailable) {
			t.Fatalf("write with one member down: %v", err)
		}
		if err != nil {
			t.Logf("write as the member died: %v; retrying", err)
		}
		return err == nil
	})
	if st, _ := s.Load(ctx(t)); st.Quotas["after-loss"] != 9 {
		t.Fatalf("after member loss: %+v", st.Quotas)
	}
}
