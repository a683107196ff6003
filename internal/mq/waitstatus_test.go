package mq_test

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestWaitPrefetchStatusKeepsAnswer: WAIT_PREFETCH_STATUS never consumes
// a finished job and answers "still running" (nil): with a timeout of 0
// the job's completion and the deadline are both ready, and whichever the
// wait took, the hit count reaches the client, from the WAIT or from the
// QUERY_PREFETCH_STATUS it sends after a nil. A timeout too large for a
// time.Duration (1e300 s, +Inf) waits up to the server's bound, so a done
// job is answered at once instead of the wrapped, negative timeout
// answering nil.
func TestWaitPrefetchStatusKeepsAnswer(t *testing.T) {
	_, _, sched, tokens := stored(t, 51, 2)
	lookupUntil(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "warm"), 2)
	freeLocks(t, sched, key("m", 1, -1, tokens, 0, 2*testChunk, "warm"))
	for i := range 32 {
		for _, timeout := range []float64{0, 1e300, math.Inf(1)} {
			id := fmt.Sprintf("w%d-%g", i, timeout)
			k := key("m", 1, -1, tokens, 0, 2*testChunk, id)
			// Without an L2 the job finishes inside LOOKUP, before the
			// peer's next request is taken.
			if err := sched.Lookup(k, 1); err != nil {
				t.Fatal(err)
			}
			b, err := sched.Call(wire.OpWaitPrefetchStatus, msgp.AppendString(nil, id), msgp.AppendFloat64(nil, timeout))
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case msgp.IsNil(b) && timeout == 0:
				n, ready, err := sched.QueryPrefetchStatus(id)
				if err != nil || !ready || n != 2 {
					t.Fatalf("%s: WAIT(0) answered nil, then QUERY_PREFETCH_STATUS = %d ready %v, %v; want 2 (the answer was consumed by the WAIT)", id, n, ready, err)
				}
			case !bytes.Equal(b, wire.EncodeInt(2)):
				t.Fatalf("%s: WAIT_PREFETCH_STATUS(%g) = %x, want 02", id, timeout, b)
			}
			freeLocks(t, sched, k)
		}
	}
}
