package kvevents

import (
	"reflect"
	"testing"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestBindTokens: a sequence bound from its first token (an HTTP store)
// gives each chunk its block of tokens and chains the parents from nil;
// a sequence shorter than its hashes claim binds nothing (the store is
// then counted unbound).
func TestBindTokens(t *testing.T) {
	lg, _ := NewLog(16)
	var d drops
	r := NewRecorder(lg, nil, 2, d.add)
	r.BindTokens([][]byte{hash(1), hash(2)}, []int64{10, 11, 20, 21, 99})
	r.BindTokens([][]byte{hash(3), hash(4)}, []int64{30, 31, 40})
	r.Stored(MediumCPU, []objkey.Key{key(1, "m", 0, ""), key(2, "m", 0, ""), key(3, "m", 0, "")})
	recs, _, _, _ := lg.ReadAfter(0, "m", 10)
	want := []Record{
		{Seq: 1, Kind: KindStored, Medium: MediumCPU, Model: "m", Hashes: [][]byte{hash(1)}, Tokens: []uint32{10, 11}, BlockSize: 2},
		{Seq: 2, Kind: KindStored, Medium: MediumCPU, Model: "m", Hashes: [][]byte{hash(2)}, Parent: hash(1), Tokens: []uint32{20, 21}, BlockSize: 2},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("records\n%+v\nwant\n%+v", recs, want)
	}
	if r.Unbound() != 1 || d.n[DropUnbound] != 1 {
		t.Errorf("unbound %d drops %v; want the short sequence's chunk unbound", r.Unbound(), d.n)
	}
	var off *Recorder
	off.BindTokens([][]byte{hash(1)}, []int64{1, 2}) // a nil recorder ignores bindings
}
