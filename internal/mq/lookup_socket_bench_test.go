package mq_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// BenchmarkLookupSocket times what `lmcache bench` times for its long
// lookups: LOOKUP + QUERY_PREFETCH_STATUS until ready, over the real ZMQ
// socket, for a 32k-token prompt (chunk 256, 128 chunks, 16 of them
// stored). It reports p50/p99 of that round trip and, as the floor measured
// in the same run, the server's hashing of the same tokens alone
// (hash-p50-ns). FREE_LOOKUP_LOCKS and END_SESSION of each sample are not
// timed.
func BenchmarkLookupSocket(b *testing.B) {
	c, ids := lookupBenchServer(b)
	const chunk, tokens, stored = benchChunk, benchTokens, benchStored
	hasher, err := tokenhash.New(tokenhash.Blake3, chunk)
	if err != nil {
		b.Fatal(err)
	}
	u32 := make([]uint32, tokens)
	for i, t := range ids {
		u32[i] = uint32(t)
	}
	var lat, hash []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		hasher.ChunkHashesU32(u32)
		hash = append(hash, time.Since(t0))
		k := &wire.Key{ModelName: "m", WorldSize: 1, TokenIDs: ids, End: tokens, RequestID: fmt.Sprint("l", i), NumKVReaders: 1}
		t0 = time.Now()
		n, err := c.LookupWait(k, 50*time.Microsecond)
		lat = append(lat, time.Since(t0))
		if err != nil || n != stored {
			b.Fatalf("lookup hit %d, %v", n, err)
		}
		endBenchLookup(b, c, k)
	}
	b.StopTimer()
	pct := func(d []time.Duration, p float64) float64 { return float64(percentile(d, p).Nanoseconds()) }
	b.ReportMetric(pct(lat, 0.5), "p50-ns")
	b.ReportMetric(pct(lat, 0.99), "p99-ns")
	b.ReportMetric(pct(hash, 0.5), "hash-p50-ns")
	b.ReportMetric(pct(lat, 0.5)/pct(hash, 0.5), "p50/hash")
}

// BenchmarkLookupPhases splits BenchmarkLookupSocket's round trip over the
// same socket and prompt: a NOOP round trip (the wire's floor), a PING
// carrying a LOOKUP-sized (160 KiB) extra frame (the transfer), the
// client's key encoding, LOOKUP alone with the key encoded beforehand, and
// QUERY_PREFETCH_STATUS. p50/p99 of each, in µs.
func BenchmarkLookupPhases(b *testing.B) {
	c, ids := lookupBenchServer(b)
	const chunk, tokens, stored = benchChunk, benchTokens, benchStored
	big := make([]byte, 160<<10)
	var buf []byte
	phases := map[string][]time.Duration{}
	timed := func(name string, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		phases[name] = append(phases[name], time.Since(t0))
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := &wire.Key{ModelName: "m", WorldSize: 1, TokenIDs: ids, End: tokens, RequestID: fmt.Sprint("l", i), NumKVReaders: 1}
		timed("noop", func() error { _, err := c.Noop(); return err })
		timed("ping160k", func() error { _, err := c.Call(wire.OpPing, wire.Marshal(wire.OptInt{}), big); return err })
		timed("encode", func() (err error) { buf, err = k.MarshalMsg(buf[:0]); return err })
		timed("lookup", func() error { _, err := c.Call(wire.OpLookup, buf, wire.EncodeInt(1)); return err })
		timed("query", func() error {
			n, ready, err := c.QueryPrefetchStatus(k.RequestID)
			if err == nil && (!ready || n != stored) {
				err = fmt.Errorf("ready=%v hits=%d, want %d", ready, n, stored)
			}
			return err
		})
		endBenchLookup(b, c, k)
	}
	b.StopTimer()
	pct := func(d []time.Duration, p float64) float64 { return float64(percentile(d, p).Nanoseconds()) / 1e3 }
	for name, d := range phases {
		b.ReportMetric(pct(d, 0.5), name+"-p50-us")
		b.ReportMetric(pct(d, 0.99), name+"-p99-us")
	}
}

// The lookup benchmarks' prompt: benchTokens ids in chunks of benchChunk,
// the first benchStored chunks of it stored.
const (
	benchChunk, benchTokens, benchStored = 256, 32768, 16
)

// lookupBenchServer starts a server, registers an engine-driven worker
// with a client and stores the first benchStored chunks of a
// benchTokens-token prompt, which it returns with the client (closed when
// the benchmark ends).
func lookupBenchServer(b *testing.B) (*mqclient.Client, []wire.Int) {
	b.Helper()
	const chunk, stored = benchChunk, benchStored
	h := start(b, opts{mq: func(c *mq.Config) { c.ChunkSize = chunk }, eng: func(c *engine.Config) { c.L1SizeBytes = 64 << 20 }})
	c, err := mqclient.Dial(h.endpoint, mqclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	if _, err := c.GetChunkSize(); err != nil {
		b.Fatal(err)
	}
	reg := &wire.RegisterPayload{InstanceID: 1, ModelName: "m", WorldSize: 1, BlockSize: 16, NumLayers: 1, HiddenDimSize: 8, DtypeStr: "float16",
		NumPhysicalSlots: wire.Nil, EngineGroupInfos: wire.EmptyList, GroupHiddenDimSizes: wire.Nil, GroupLayoutDescs: wire.Nil}
	if _, err := c.Register(reg); err != nil {
		b.Fatal(err)
	}
	ids := prompt(3, benchTokens)
	sk := &wire.Key{ModelName: "m", WorldSize: 1, WorkerID: wire.SomeInt(0), TokenIDs: ids, End: stored * chunk, RequestID: "s", NumKVReaders: 1}
	if plan, err := c.PrepareStore(sk, 1); err != nil || len(plan.Slots) != stored {
		b.Fatalf("PREPARE_STORE %+v %v", plan, err)
	}
	if ok, err := c.CommitStore(sk, 1, nil); err != nil || !ok {
		b.Fatalf("COMMIT_STORE %v %v", ok, err)
	}
	return c, ids
}

// endBenchLookup frees a timed lookup's locks and ends its session, off
// the benchmark's clock.
func endBenchLookup(b *testing.B, c *mqclient.Client, k *wire.Key) {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	if err := c.FreeLookupLocks(k, 1); err != nil {
		b.Fatal(err)
	}
	if err := c.EndSession(k.RequestID); err != nil {
		b.Fatal(err)
	}
}

// percentile is the p-quantile (0..1) of d, nearest rank.
func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}
