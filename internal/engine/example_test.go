package engine_test

import (
	"fmt"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Example walks the engine-driven data path without Run (no L2 adapters,
// so every call completes synchronously).
func Example() {
	e, err := engine.New(engine.Config{L1SizeBytes: 1 << 20}, nil, nil)
	if err != nil {
		panic(err)
	}
	keys := []objkey.Key{
		{ChunkHash: "c0", ModelName: "m", KVRank: objkey.RankFor(1, 0)},
		{ChunkHash: "c1", ModelName: "m", KVRank: objkey.RankFor(1, 0)},
	}
	// PREPARE_STORE: slots for keys not yet resident; the worker copies
	// into them; COMMIT_STORE publishes (and queues write-behind).
	slots, _ := e.ReserveWrite("instance-0", keys, []int64{4096, 4096})
	for i, s := range slots {
		copy(e.Bytes(s), fmt.Sprintf("chunk %d", i))
	}
	n, _ := e.CommitWrite("instance-0", keys)
	// LOOKUP: read-lock the longest complete prefix for the request.
	_ = e.Prefetch(engine.PrefetchRequest{ID: "req-1", Chunks: [][]objkey.Key{{keys[0]}, {keys[1]}}, Readers: 1})
	res, _ := e.PollPrefetch("req-1")
	// PREPARE_RETRIEVE, copy out, COMMIT_RETRIEVE.
	rs, _ := e.ReadSlots(keys)
	first := string(e.Bytes(rs[0])[:7])
	released := e.ReleaseRead("req-1", keys, 1)
	fmt.Println(n, res.Done, res.PrefixChunks, first, released)
	// Every read lock was released: CloseChecked finds nothing left
	// referenced (it would name each leaked key in its error).
	if err := e.CloseChecked(); err != nil {
		panic(err)
	}
	// Output:
	// 2 true 2 chunk 0 2
}
