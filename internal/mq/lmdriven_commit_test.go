package mq_test

import (
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/kvcuda"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// TestLMDCUDALookupWaitsForCommit: a CUDA STORE is answered before its
// copies complete and commits after them (kvcuda.Fake's Gate holds the
// completion). A LOOKUP sent right after the reply waits for that commit
// instead of missing the chunks: it is seen waiting, the socket goroutine
// still answers other requests meanwhile, and once the gate opens the
// LOOKUP hits both chunks, counted as
// lmcache_mp_transfer_commit_waits_total{op="lookup",outcome="committed"}.
// A LOOKUP whose store stays uncommitted past the deadline goes on
// without it (0 hits, counted outcome="deadline"); the chunks appear once
// that commit lands. A RETRIEVE of chunks a pending store covers (made
// resident meanwhile by an engine-driven store, so a LOOKUP could lock
// them) waits for that store too, counted op="retrieve". A LOOKUP of
// chunks no pending store covers does not wait. All synchronisation is by
// channel: no sleeps.
func TestLMDCUDALookupWaitsForCommit(t *testing.T) {
	f := kvcuda.NewFake()
	f.Gate = make(chan struct{})
	h := start(t, opts{mq: func(c *mq.Config) { c.CUDA = f }})
	// Runs before the server stops (which waits for held completions),
	// so a failing test still ends.
	t.Cleanup(func() { close(f.Gate) })
	waiting := make(chan string, 4)
	mq.SetCommitWait(h.srv, 10*time.Second, func(op string) { waiting <- op })
	c := h.dial(mqclient.Options{})
	sched := h.dial(mqclient.Options{})
	other := h.dial(mqclient.Options{})
	registerFakeCUDA(t, c, f, 7)
	ev, _ := f.WorkerEvent()
	store := func(tokens []wire.Int, reqID string, ids ...int) {
		t.Helper()
		k := wire.Marshal(key("m", 1, 0, tokens, 0, len(tokens), reqID))
		b, err := c.Call(wire.OpStore, k, wire.EncodeInt(7), blockIDs(ids...), msgp.AppendBytes(nil, ev[:]))
		if r := transferReply(t, b, err); !r.OK || len(r.Handle) != 64 {
			t.Fatalf("STORE reply %+v", r)
		}
	}
	// lookup sends LOOKUP and returns the hit prefix once the job is done
	// (WAIT_PREFETCH_STATUS waits in the server).
	lookup := func(k *wire.Key) int {
		if err := sched.Lookup(k, 1); err != nil {
			t.Error(err)
			return -1
		}
		n, ready, err := sched.WaitPrefetchStatus(k.RequestID, 10*time.Second)
		if err != nil || !ready {
			t.Errorf("WAIT_PREFETCH_STATUS %s = %d, %v, %v", k.RequestID, n, ready, err)
		}
		return n
	}
	waits := h.srv.Metrics().TransferCommitWaits
	// waiter is the op of the next request seen waiting for a commit (the
	// 10 s bound only ends a failing test).
	waiter := func() string {
		t.Helper()
		select {
		case op := <-waiting:
			return op
		case <-time.After(10 * time.Second):
			t.Fatal("no request waited for the pending commit")
			return ""
		}
	}

	tokens := prompt(11, 2*testChunk)
	store(tokens, "s1", 5, 6, 1, 2)
	k1 := key("m", 1, -1, tokens, 0, len(tokens), "l1")
	hits := make(chan int, 1)
	go func() { hits <- lookup(k1) }()
	if op := waiter(); op != "lookup" {
		t.Fatalf("waiter %q, want the lookup", op)
	}
	// The LOOKUP waits off the socket goroutine: other requests go on.
	if n, err := other.GetChunkSize(); err != nil || n != testChunk {
		t.Fatalf("GET_CHUNK_SIZE while a LOOKUP waits = %d, %v", n, err)
	}
	f.Gate <- struct{}{} // the store's copies complete; it commits
	if n := <-hits; n != 2 {
		t.Fatalf("LOOKUP sent right after the STORE reply hit %d chunks, want 2", n)
	}
	if err := sched.FreeLookupLocks(k1, 1); err != nil {
		t.Fatal(err)
	}
	if n := counterValue(waits.WithLabelValues("lookup", "committed")); n != 1 {
		t.Fatalf("commit waits {lookup, committed} = %v, want 1", n)
	}

	// The deadline: the second store's completion is held past it (a
	// short one here; the other waits get 10 s, so that a loaded machine
	// cannot make them miss).
	mq.SetCommitDeadline(h.srv, 300*time.Millisecond)
	tokens2 := prompt(12, 2*testChunk)
	store(tokens2, "s2", 3, 4, 7, 8)
	k2 := key("m", 1, -1, tokens2, 0, len(tokens2), "l2")
	if n := lookup(k2); n != 0 {
		t.Fatalf("LOOKUP past the deadline hit %d chunks, want 0 (the store is not committed)", n)
	}
	if op := waiter(); op != "lookup" {
		t.Fatalf("waiter %q, want the lookup", op)
	}
	if n := counterValue(waits.WithLabelValues("lookup", "deadline")); n != 1 {
		t.Fatalf("commit waits {lookup, deadline} = %v, want 1", n)
	}
	f.Gate <- struct{}{}
	mq.SetCommitDeadline(h.srv, 10*time.Second)
	// The late commit lands: the next LOOKUP hits (waiting for it if the
	// commit is still finishing).
	k3 := key("m", 1, -1, tokens2, 0, len(tokens2), "l3")
	if n := lookup(k3); n != 2 {
		t.Fatalf("LOOKUP after the late commit hit %d chunks, want 2", n)
	}
	if err := sched.FreeLookupLocks(k3, 1); err != nil {
		t.Fatal(err)
	}
	for len(waiting) > 0 {
		<-waiting
	}

	// RETRIEVE: the chunks of a pending CUDA store became resident through
	// an engine-driven worker's store meanwhile, so a LOOKUP (past its
	// wait) locks them; the CUDA worker's RETRIEVE still finds the store
	// pending and waits for it before reading.
	tokens3 := prompt(14, 2*testChunk)
	store(tokens3, "s3", 9, 10, 11, 12)
	if n := h.worker(8, "m", 1, 0).store(tokens3, 0, 2*testChunk, "e3", chunkData{}.of(14, 0)); n != 2 {
		t.Fatalf("engine-driven store beside the pending one asked for %d chunks, want 2", n)
	}
	k5 := key("m", 1, -1, tokens3, 0, len(tokens3), "l5")
	mq.SetCommitDeadline(h.srv, 300*time.Millisecond) // the LOOKUP's wait ends at it
	if n := lookup(k5); n != 2 {
		t.Fatalf("LOOKUP of engine-driven stored chunks hit %d, want 2", n)
	}
	if op := waiter(); op != "lookup" {
		t.Fatalf("waiter %q, want the lookup", op)
	}
	mq.SetCommitDeadline(h.srv, 10*time.Second) // the RETRIEVE's wait must not end before the gate opens
	retrieved := make(chan wire.TransferReply, 1)
	go func() {
		k := wire.Marshal(key("m", 1, 0, tokens3, 0, len(tokens3), "l5"))
		b, err := c.Call(wire.OpRetrieve, k, wire.EncodeInt(7), blockIDs(13, 14, 15, 0), msgp.AppendBytes(nil, ev[:]), wire.EncodeInt(0))
		var r wire.TransferReply
		if err == nil {
			err = wire.Unmarshal(b, &r)
		}
		if err != nil {
			t.Error(err)
		}
		retrieved <- r
	}()
	if op := waiter(); op != "retrieve" {
		t.Fatalf("waiter %q, want the retrieve", op)
	}
	f.Gate <- struct{}{} // the third store completes (its copy is dropped: the chunks are resident)
	if r := <-retrieved; !r.OK || len(r.Handle) != 64 {
		t.Fatalf("RETRIEVE after its wait = %+v", r)
	}
	f.Gate <- struct{}{} // the retrieve's copies complete; its locks go
	if n := counterValue(waits.WithLabelValues("retrieve", "committed")); n != 1 {
		t.Fatalf("commit waits {retrieve, committed} = %v, want 1", n)
	}

	// Nothing pending: a LOOKUP of other chunks does not wait.
	before := counterValue(waits.WithLabelValues("lookup", "committed"))
	deadlines := counterValue(waits.WithLabelValues("lookup", "deadline"))
	if n := lookup(key("m", 1, -1, prompt(13, testChunk), 0, testChunk, "l4")); n != 0 {
		t.Fatalf("LOOKUP of never-stored chunks hit %d", n)
	}
	if len(waiting) != 0 || counterValue(waits.WithLabelValues("lookup", "committed")) != before ||
		counterValue(waits.WithLabelValues("lookup", "deadline")) != deadlines {
		t.Fatal("a LOOKUP waited with no store of its chunks pending")
	}
}
