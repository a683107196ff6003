package fs_test

import (
	"context"
	"os"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2/fs"
	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestListReadsDirectoryOncePerListing: a listing of 50 objects in pages of
// 5 reads base_path once, at its first page, not once per page (which made
// a listing quadratic in the directory's size); every object comes back
// once, in name order; an object deleted between pages is left out; and
// the next listing reads the directory again, seeing a file written since.
func TestListReadsDirectoryOncePerListing(t *testing.T) {
	a := newAdapter(t, nil)
	defer a.Close()
	reads := 0
	fs.SetDirRead(a, func() { reads++ })
	ctx := context.Background()
	keys, objs := l2test.Keys(t, 50, ""), l2test.Objects(t, 50)
	if err := a.Store(ctx, keys, objs); err != nil {
		t.Fatal(err)
	}
	list := func(pageSize int, between func()) []objkey.Key {
		t.Helper()
		var got []objkey.Key
		token := ""
		for pages := 0; ; pages++ {
			if pages > 100 {
				t.Fatal("listing did not end within 100 pages")
			}
			p, err := a.List(ctx, "", pageSize, token)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range p.Entries {
				got = append(got, e.Key)
			}
			if p.NextPageToken == "" {
				return got
			}
			token = p.NextPageToken
			if pages == 0 && between != nil {
				between()
			}
		}
	}
	var gone objkey.Key
	got := list(5, func() {
		// Delete the last object by name: it is in the names read, and on
		// a later page.
		last := keys[0]
		for _, k := range keys {
			if k.FSName() > last.FSName() {
				last = k
			}
		}
		gone = last
		if err := os.Remove(a.Path(last)); err != nil {
			t.Fatal(err)
		}
	})
	if reads != 1 {
		t.Fatalf("a 10-page listing read base_path %d times, want 1", reads)
	}
	if len(got) != 49 {
		t.Fatalf("listed %d objects, want 49 (50 less the one deleted during the listing)", len(got))
	}
	for i, k := range got {
		if k == gone {
			t.Fatalf("the object deleted during the listing was listed at %d", i)
		}
		if i > 0 && got[i-1].FSName() >= k.FSName() {
			t.Fatalf("entries %d and %d out of name order: %s, %s", i-1, i, got[i-1].FSName(), k.FSName())
		}
	}
	more, moreObjs := l2test.Keys(t, 51, "")[50:], l2test.Objects(t, 1)
	if err := a.Store(ctx, more, moreObjs); err != nil {
		t.Fatal(err)
	}
	if got := list(1000, nil); len(got) != 50 || reads != 2 {
		t.Fatalf("next listing: %d objects after %d directory reads, want 50 after 2", len(got), reads)
	}
}
