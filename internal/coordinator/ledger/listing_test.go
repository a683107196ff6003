package ledger

import "testing"

// TestStoreListedRefusesDeletedSinceBegin: during a listing, a key whose
// delete was applied (held or not) is not stored from the listing; other
// keys are; once the last listing ends, nothing is refused.
func TestStoreListedRefusesDeletedSinceBegin(t *testing.T) {
	l := New()
	held, missed, other := key(t, "aa", "m", "s"), key(t, "bb", "m", "s"), key(t, "cc", "m", "s")
	l.Apply([]Event{{Op: OpStore, Key: held, Bytes: 10}})
	l.BeginListing()
	l.BeginListing()
	l.Apply([]Event{{Op: OpDelete, Key: held}, {Op: OpDelete, Key: missed}})
	if stored(l.StoreListed(held, 10, false)) || stored(l.StoreListed(missed, 20, false)) {
		t.Fatal("a key deleted during the listing was stored from it")
	}
	if !stored(l.StoreListed(other, 30, false)) {
		t.Fatal("a key not deleted was refused")
	}
	l.EndListing()
	if stored(l.StoreListed(missed, 20, false)) {
		t.Fatal("refusals ended with the first of two listings")
	}
	l.EndListing()
	if !stored(l.StoreListed(missed, 20, false)) {
		t.Fatal("a key was refused after every listing ended")
	}
	if got := l.SaltUsage("s"); got != 50 {
		t.Fatalf("usage %d, want 50 (cc and bb)", got)
	}
}

// stored is StoreListed's first result.
func stored(ok, _ bool) bool { return ok }
