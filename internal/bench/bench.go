// Package bench is the driver behind `lmcache bench`: it replays the
// request sequence a vLLM instance sends on the engine-driven shared-memory
// path (register, lookup, prepare/commit store, lookup, prepare/commit
// retrieve, end session) with random KV of a real model's shape, from N
// concurrent workers, verifies every retrieved byte, and reports throughput
// against a plain memcpy of the same bytes measured in the same run.
package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// Options configures Run.
type Options struct {
	// Endpoint is the server's ZMQ endpoint.
	Endpoint string
	// ShmDir is where the pool's shared-memory file lives (/dev/shm).
	ShmDir string
	// Workers is the number of concurrent simulated vLLM instances (each a
	// scheduler socket and a TP=1 worker socket).
	Workers int
	// Requests per worker, after Warmup unmeasured ones.
	Requests int
	Warmup   int
	// Model layout: Layers x Hidden of Dtype per token, MLA drops the K/V axis.
	Model  string
	Layers int
	Hidden int
	Dtype  string
	MLA    bool
	// PromptTokens is each request's prompt length.
	PromptTokens int
	// LookupTokens is the prompt length of the lookup-latency phase (whose
	// prompts extend stored ones).
	LookupTokens  int
	LookupSamples int
	// PingClients and PingDuration configure the PING round-trip phase.
	PingClients  int
	PingDuration time.Duration
	// Progress is the period of the progress line (0 = none).
	Progress time.Duration
	// Timeout bounds each request.
	Timeout time.Duration
	// BaselineBytes is the per-worker destination of the memcpy baseline.
	BaselineBytes int64
}

// Defaults: a 32-layer x 1024-hidden fp16 model (32 MiB chunks at 256
// tokens per chunk).
func Defaults() Options {
	return Options{Endpoint: "tcp://127.0.0.1:5555", ShmDir: "/dev/shm", Workers: 2, Requests: 4, Warmup: 1,
		Model: "bench/llama-like", Layers: 32, Hidden: 1024, Dtype: "float16", PromptTokens: 8192,
		LookupTokens: 32768, LookupSamples: 200, PingClients: 64, PingDuration: 3 * time.Second,
		Progress: time.Second, Timeout: 60 * time.Second, BaselineBytes: 256 << 20}
}

// Result is what Run measured.
type Result struct {
	ChunkSize      int
	ChunkBytes     int64
	StoredBytes    int64
	RetrievedBytes int64
	VerifiedBytes  int64
	StoreGBps      float64
	RetrieveGBps   float64
	// MemcpyToShmGBps and MemcpyFromShmGBps are the baseline: a plain
	// memcpy of the same bytes into and out of warm shared memory, done by
	// each worker next to each measured request. Store compares with the
	// first, retrieve with the second.
	MemcpyToShmGBps   float64
	MemcpyFromShmGBps float64
	StoreRefusals     int64
	// StoreRPCShare and RetrieveRPCShare are the fractions of store and
	// retrieve time spent in the PREPARE/COMMIT round trips (the server's
	// part); the rest is the worker's copies.
	StoreRPCShare    float64
	RetrieveRPCShare float64
	// Lookup latency (LOOKUP + QUERY_PREFETCH_STATUS until ready).
	LookupP50, LookupP99         time.Duration
	LongLookupP50, LongLookupP99 time.Duration
	LongLookupHitChunks          int
	// LongLookupHashP50/P99 are the floor of the long lookups: this
	// process hashing the same prompt with internal/tokenhash (blake3,
	// the server's chunk size, the server's default algorithm), once next
	// to every long lookup, so both see the same machine load.
	LongLookupHashP50, LongLookupHashP99 time.Duration
	// LongLookupNewTailP50/P99 time the same lookups with a tail (the
	// tokens after the stored prefix) no earlier request sent, next to each
	// long lookup: the server can reuse no hash of it, so this is what a
	// new prompt that shares only the stored prefix costs. The long lookups
	// above repeat one prompt, whose hashes the server keeps.
	LongLookupNewTailP50, LongLookupNewTailP99 time.Duration
	// LongLookupWireP50/P99 are the wire's floor of the long lookups: two
	// round trips of the same sizes on the same connection next to every
	// long lookup, which the server answers without work (a
	// REPORT_BLOCK_ALLOCATION carrying a frame as large as the encoded
	// LOOKUP key, acknowledged unread, then a NOOP). What a long lookup
	// costs above it is the server's work; the floor itself is the
	// machine's (thread wake-ups, loopback TCP, libzmq on both ends).
	LongLookupWireP50, LongLookupWireP99 time.Duration
	HitRatio                             float64
	PingPerSec                           float64
	// StoreP50/P99 and RetrieveP50/P99 are per-request latencies of the
	// measured stores (PREPARE + copies + COMMIT) and retrieves.
	StoreP50, StoreP99       time.Duration
	RetrieveP50, RetrieveP99 time.Duration
	// Samples is every measured request in the order it finished, the
	// source of the --report charts; left out of --json.
	Samples []Sample `json:"-"`
}

// Kind names what a Sample measured.
type Kind string

// The kinds of Sample.
const (
	KindStore      Kind = "store"
	KindRetrieve   Kind = "retrieve"
	KindLookup     Kind = "lookup"
	KindLongLookup Kind = "long-lookup"
)

// Sample is one measured request: when it finished (since Run started),
// how long it took and how many bytes it moved.
type Sample struct {
	At      time.Duration
	Kind    Kind
	Bytes   int64
	Latency time.Duration
}

type counters struct {
	stored, retrieved, verified, refusals atomic.Int64
	storeNanos, retrieveNanos             atomic.Int64
	storeRPCNanos, retrieveRPCNanos       atomic.Int64
	baseBytes, baseToNanos, baseFromNanos atomic.Int64
	hitChunks, wantChunks                 atomic.Int64
	start                                 time.Time
	mu                                    sync.Mutex
	lookups                               []time.Duration
	samples                               []Sample
}

// sample records a measured request that took d and just finished.
func (c *counters) sample(k Kind, bytes int64, d time.Duration) {
	at := time.Since(c.start)
	c.mu.Lock()
	c.samples = append(c.samples, Sample{At: at, Kind: k, Bytes: bytes, Latency: d})
	c.mu.Unlock()
}

// latencies are the latencies of the samples of kind k.
func latencies(s []Sample, k Kind) []time.Duration {
	var out []time.Duration
	for _, x := range s {
		if x.Kind == k {
			out = append(out, x.Latency)
		}
	}
	return out
}

// Run executes the benchmark.
func Run(ctx context.Context, o Options, progress io.Writer) (*Result, error) {
	if o.Workers < 1 || o.Requests < 1 || o.Layers < 1 || o.Hidden < 1 {
		return nil, errors.New("bench: workers, requests, layers and hidden must be >= 1")
	}
	item, ok := wire.DtypeSize(o.Dtype)
	if !ok {
		return nil, fmt.Errorf("bench: unsupported dtype %q", o.Dtype)
	}
	probe, err := mqclient.Dial(o.Endpoint, mqclient.Options{Timeout: o.Timeout})
	if err != nil {
		return nil, err
	}
	defer probe.Close()
	chunk, err := probe.GetChunkSize()
	if err != nil {
		return nil, fmt.Errorf("bench: GET_CHUNK_SIZE: %w (is the server running at %s?)", err, o.Endpoint)
	}
	if o.PromptTokens < chunk {
		return nil, fmt.Errorf("bench: prompt of %d tokens is shorter than one chunk (%d)", o.PromptTokens, chunk)
	}
	objBytes := wire.ObjectBytes(wire.ObjectShape(int64(o.Layers), int64(chunk), int64(o.Hidden), o.MLA), item)
	res := &Result{ChunkSize: chunk, ChunkBytes: objBytes}
	// Random source: every chunk is a window into it at a chunk-specific
	// offset, so chunks differ without generating GiBs of randomness.
	src := make([]byte, 2*objBytes)
	if _, err := rand.Read(src); err != nil {
		return nil, err
	}

	c := counters{start: time.Now()}
	stop := startProgress(ctx, o.Progress, progress, &c)
	defer stop()

	runID := time.Now().UnixNano()
	var wg sync.WaitGroup
	errs := make([]error, o.Workers)
	for w := range o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = runWorker(ctx, o, w, runID, chunk, objBytes, src, &c)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res.MemcpyToShmGBps = gbps(c.baseBytes.Load(), c.baseToNanos.Load(), o.Workers)
	res.MemcpyFromShmGBps = gbps(c.baseBytes.Load(), c.baseFromNanos.Load(), o.Workers)
	res.StoredBytes, res.RetrievedBytes, res.VerifiedBytes = c.stored.Load(), c.retrieved.Load(), c.verified.Load()
	res.StoreRefusals = c.refusals.Load()
	res.StoreGBps = gbps(res.StoredBytes, c.storeNanos.Load(), o.Workers)
	res.RetrieveGBps = gbps(res.RetrievedBytes, c.retrieveNanos.Load(), o.Workers)
	res.StoreRPCShare = ratio(float64(c.storeRPCNanos.Load()), float64(c.storeNanos.Load()))
	res.RetrieveRPCShare = ratio(float64(c.retrieveRPCNanos.Load()), float64(c.retrieveNanos.Load()))
	if w := c.wantChunks.Load(); w > 0 {
		res.HitRatio = float64(c.hitChunks.Load()) / float64(w)
	}
	res.LookupP50, res.LookupP99 = percentiles(c.lookups)

	if o.LookupSamples > 0 && o.LookupTokens > 0 {
		t, err := longLookups(ctx, o, runID, chunk, &c)
		if err != nil {
			return nil, err
		}
		res.LongLookupP50, res.LongLookupP99 = percentiles(t.lat)
		res.LongLookupNewTailP50, res.LongLookupNewTailP99 = percentiles(t.newTail)
		res.LongLookupHashP50, res.LongLookupHashP99 = percentiles(t.hash)
		res.LongLookupWireP50, res.LongLookupWireP99 = percentiles(t.wire)
		res.LongLookupHitChunks = t.hits
	}
	res.Samples = slices.Clone(c.samples)
	res.StoreP50, res.StoreP99 = percentiles(latencies(res.Samples, KindStore))
	res.RetrieveP50, res.RetrieveP99 = percentiles(latencies(res.Samples, KindRetrieve))
	if o.PingClients > 0 && o.PingDuration > 0 {
		if res.PingPerSec, err = pingPhase(ctx, o); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// gbps is aggregate throughput: bytes over the per-worker busy time
// averaged across workers (workers run concurrently).
func gbps(b, nanos int64, workers int) float64 {
	if nanos == 0 {
		return 0
	}
	wall := float64(nanos) / float64(workers) / 1e9
	return float64(b) / wall / 1e9
}

func percentiles(d []time.Duration) (time.Duration, time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)] }
	return at(0.50), at(0.99)
}

func window(src []byte, objBytes int64, seed int64) []byte {
	off := (seed * 4099) % objBytes
	return src[off : off+objBytes]
}

// baseline is a worker's plain-memcpy reference: warm shared memory of the
// pool's kind (shmem, 4 KiB pages), BaselineBytes large so copies leave the
// CPU caches. Each measured request copies the same bytes into and out of
// it right next to the protocol transfer, so both see the same machine
// load.
type baseline struct {
	mem      []byte
	objBytes int64
	slots    int64
	next     int64
}

func newBaseline(o Options, objBytes int64, src []byte) (*baseline, error) {
	slots := max(1, o.BaselineBytes/objBytes)
	mem, err := unix.Mmap(-1, 0, int(slots*objBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("bench: baseline mmap: %w", err)
	}
	b := &baseline{mem: mem, objBytes: objBytes, slots: slots}
	for range 3 * slots { // warm the pages, as the pool is after its first rounds
		copy(b.slot(), window(src, objBytes, b.next))
	}
	return b, nil
}

func (b *baseline) slot() []byte {
	off := b.next % b.slots * b.objBytes
	b.next++
	return b.mem[off : off+b.objBytes]
}

// copyIn times copying chunks into the baseline memory.
func (b *baseline) copyIn(chunks [][]byte) time.Duration {
	t0 := time.Now()
	for _, c := range chunks {
		copy(b.slot(), c)
	}
	return time.Since(t0)
}

// copyOut times copying n chunks out of the baseline memory into dst.
func (b *baseline) copyOut(n int, dst []byte) time.Duration {
	t0 := time.Now()
	for range n {
		copy(dst, b.slot())
	}
	return time.Since(t0)
}

func (b *baseline) close() { _ = unix.Munmap(b.mem) }

// ProgressWriter is where `lmcache bench` draws its progress line: f when
// it is a terminal, else nil (no progress), so logs and CI output keep only
// the summary.
func ProgressWriter(f *os.File) io.Writer {
	if f == nil || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return f
}

// startProgress redraws one progress line on w every period ("\r" and
// erase-line, as terminals expect) and ends it with a newline when the
// run finishes. The goroutine is owned by the returned stop function.
func startProgress(ctx context.Context, every time.Duration, w io.Writer, c *counters) func() {
	if every <= 0 || w == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		drawn := false
		defer func() {
			if drawn {
				fmt.Fprintln(w)
			}
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.mu.Lock()
				n := len(c.lookups)
				c.mu.Unlock()
				fmt.Fprintf(w, "\r\x1b[Kbench: %5.1fs stored %.2f GiB, retrieved+verified %.2f GiB, lookups %d, store refusals %d",
					time.Since(c.start).Seconds(), float64(c.stored.Load())/(1<<30), float64(c.verified.Load())/(1<<30), n, c.refusals.Load())
				drawn = true
			}
		}
	}()
	return func() { cancel(); <-done }
}

func tokensFor(seed int64, n int) []wire.Int {
	out := make([]wire.Int, n)
	fillTokens(out, seed)
	return out
}

// fillTokens writes tokensFor(seed, len(out)) into out.
func fillTokens(out []wire.Int, seed int64) {
	x := uint64(seed)*0x9E3779B97F4A7C15 + 1
	for i := range out {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		out[i] = wire.Int(x % 128000)
	}
}

func mkKey(model string, worker int, tokens []wire.Int, start, end int, reqID string) *wire.Key {
	k := &wire.Key{ModelName: model, WorldSize: 1, TokenIDs: tokens, Start: wire.Int(start), End: wire.Int(end), RequestID: reqID, NumKVReaders: 1}
	if worker >= 0 {
		k.WorkerID = wire.SomeInt(int64(worker))
	}
	return k
}

func runWorker(ctx context.Context, o Options, w int, runID int64, chunk int, objBytes int64, src []byte, c *counters) error {
	sched, err := mqclient.Dial(o.Endpoint, mqclient.Options{Timeout: o.Timeout})
	if err != nil {
		return err
	}
	defer sched.Close()
	wk, err := mqclient.Dial(o.Endpoint, mqclient.Options{Timeout: o.Timeout})
	if err != nil {
		return err
	}
	defer wk.Close()
	if _, err := sched.GetChunkSize(); err != nil {
		return err
	}
	if _, err := wk.GetChunkSize(); err != nil {
		return err
	}
	inst := int64(os.Getpid())<<16 | int64(w)
	reg, err := wk.Register(registration(o, inst))
	if err != nil {
		return err
	}
	pool, err := mqclient.OpenPool(o.ShmDir, reg.ShmName, int64(reg.PoolSize))
	if err != nil {
		return err
	}
	defer pool.Close()
	defer func() { _ = wk.Unregister(inst) }()

	nChunks := o.PromptTokens / chunk
	end := nChunks * chunk
	dst := make([]byte, objBytes) // the "GPU" the worker scatters into
	base, err := newBaseline(o, objBytes, src)
	if err != nil {
		return err
	}
	defer base.close()
	for r := range o.Warmup + o.Requests {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		measured := r >= o.Warmup
		seed := runID ^ int64(w)<<40 ^ int64(r)<<20
		tokens := tokensFor(seed, o.PromptTokens)
		reqID := fmt.Sprintf("bench-%d-%d-%d", runID, w, r)
		chunkSrc := func(i int) []byte { return window(src, objBytes, seed+int64(i)) }

		// 1. Scheduler lookup (a miss for a fresh prompt).
		if _, err := c.lookup(sched, mkKey(o.Model, -1, tokens, 0, end, reqID), measured); err != nil {
			return err
		}
		if err := sched.FreeLookupLocks(mkKey(o.Model, -1, tokens, 0, end, reqID), 1); err != nil {
			return err
		}

		if measured {
			chunks := make([][]byte, nChunks)
			for i := range chunks {
				chunks[i] = chunkSrc(i)
			}
			c.baseToNanos.Add(int64(base.copyIn(chunks)))
			c.baseFromNanos.Add(int64(base.copyOut(nChunks, dst)))
			c.baseBytes.Add(int64(nChunks) * objBytes)
		}

		// 2. Store: prepare, gather into the slots, commit.
		wkey := mkKey(o.Model, 0, tokens, 0, end, reqID)
		var t0 time.Time
		var plan *mqclient.StorePlan
		for attempt := 0; ; attempt++ {
			t0 = time.Now() // waits for eviction are counted as refusals, not store time
			if plan, err = wk.PrepareStore(wkey, inst); err != nil {
				return err
			}
			if plan.Refused {
				return errors.New("bench: PREPARE_STORE answered without a shared-memory context")
			}
			if len(plan.Slots) > 0 {
				break
			}
			// A fresh prompt is never cached: no slots means the pool is
			// full until eviction catches up.
			c.refusals.Add(1)
			if attempt > 1000 {
				return errors.New("bench: PREPARE_STORE refused 1000 times; is the L1 pool big enough for the workers' prompts?")
			}
			time.Sleep(10 * time.Millisecond)
		}
		rpc := time.Since(t0)
		for i, s := range plan.Slots {
			mem, err := pool.Slot(s)
			if err != nil {
				return err
			}
			copy(mem, chunkSrc(plan.ChunkIndices[i]))
		}
		tc := time.Now()
		if ok, err := wk.CommitStore(wkey, inst, nil); err != nil || !ok {
			return fmt.Errorf("bench: COMMIT_STORE = %v, %v", ok, err)
		}
		rpc += time.Since(tc)
		if measured {
			d := time.Since(t0)
			c.storeRPCNanos.Add(int64(rpc))
			c.storeNanos.Add(int64(d))
			c.stored.Add(int64(len(plan.Slots)) * objBytes)
			c.sample(KindStore, int64(len(plan.Slots))*objBytes, d)
		}

		// 3. Second lookup: should hit every chunk (poll briefly: a store
		// may become visible just after its commit is acknowledged).
		lreq := reqID + "-hit"
		var hits int
		for attempt := 0; attempt < 100; attempt++ {
			if hits, err = c.lookup(sched, mkKey(o.Model, -1, tokens, 0, end, lreq), measured && attempt == 0); err != nil {
				return err
			}
			if hits == nChunks {
				break
			}
			if err := sched.FreeLookupLocks(mkKey(o.Model, -1, tokens, 0, end, lreq), 1); err != nil {
				return err
			}
			time.Sleep(time.Millisecond)
		}
		if measured {
			c.hitChunks.Add(int64(hits))
			c.wantChunks.Add(int64(nChunks))
		}
		if hits == 0 {
			continue
		}
		// 4. Retrieve the hit prefix, scatter it out, verify every byte.
		rkey := mkKey(o.Model, 0, tokens, 0, hits*chunk, lreq)
		t1 := time.Now()
		ok, slots, err := wk.PrepareRetrieve(rkey, inst)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("bench: PREPARE_RETRIEVE failed after a %d-chunk hit", hits)
		}
		rpc = time.Since(t1)
		var verifyNanos time.Duration
		for i, s := range slots {
			mem, err := pool.Slot(s)
			if err != nil {
				return err
			}
			copy(dst, mem)
			tv := time.Now()
			if !bytes.Equal(dst, chunkSrc(i)) {
				return fmt.Errorf("bench: worker %d request %d chunk %d: retrieved bytes differ from the stored ones", w, r, i)
			}
			verifyNanos += time.Since(tv)
			c.verified.Add(objBytes)
		}
		tc = time.Now()
		if ok, err := wk.CommitRetrieve(rkey, inst); err != nil || !ok {
			return fmt.Errorf("bench: COMMIT_RETRIEVE = %v, %v", ok, err)
		}
		rpc += time.Since(tc)
		if measured {
			d := time.Since(t1) - verifyNanos
			c.retrieveRPCNanos.Add(int64(rpc))
			c.retrieveNanos.Add(int64(d))
			c.retrieved.Add(int64(len(slots)) * objBytes)
			c.sample(KindRetrieve, int64(len(slots))*objBytes, d)
		}
		// 5. Request done.
		if err := sched.EndSession(lreq); err != nil {
			return err
		}
		if err := sched.EndSession(reqID); err != nil {
			return err
		}
	}
	return nil
}

func registration(o Options, inst int64) *wire.RegisterPayload {
	return &wire.RegisterPayload{InstanceID: wire.Int(inst), ModelName: o.Model, WorldSize: 1, BlockSize: 16,
		NumLayers: wire.Int(o.Layers), HiddenDimSize: wire.Int(o.Hidden), DtypeStr: o.Dtype, UseMLA: o.MLA,
		NumPhysicalSlots: wire.Nil, EngineGroupInfos: wire.EmptyList, GroupHiddenDimSizes: wire.Nil, GroupLayoutDescs: wire.Nil}
}

// timedLookup is LOOKUP + QUERY_PREFETCH_STATUS until ready, timed.
func timedLookup(c *mqclient.Client, k *wire.Key) (int, time.Duration, error) {
	t0 := time.Now()
	n, err := c.LookupWait(k, 50*time.Microsecond)
	return n, time.Since(t0), err
}

// lookup runs timedLookup and, if record, adds its latency to the counters.
func (cnt *counters) lookup(c *mqclient.Client, k *wire.Key, record bool) (int, error) {
	n, d, err := timedLookup(c, k)
	if err == nil && record {
		cnt.mu.Lock()
		cnt.lookups = append(cnt.lookups, d)
		cnt.mu.Unlock()
		cnt.sample(KindLookup, 0, d)
	}
	return n, err
}

// longLookupTimes are longLookups' samples, one of each per iteration.
type longLookupTimes struct {
	lat, newTail, hash, wire []time.Duration
	hits                     int
}

// longLookups times LOOKUP for LookupTokens-token prompts: a stored
// PromptTokens prefix (hit) followed by new tokens (miss). Before each
// lookup it hashes the same prompt itself and times the same two round
// trips with no server work (the hash and wire floors of what the server
// must do); after it, it times a lookup of the prompt with a tail no
// request sent before (newTail).
func longLookups(ctx context.Context, o Options, runID int64, chunk int, cnt *counters) (*longLookupTimes, error) {
	c, err := mqclient.Dial(o.Endpoint, mqclient.Options{Timeout: o.Timeout})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := c.GetChunkSize(); err != nil {
		return nil, err
	}
	// Lookups hit only while a worker of the model is registered (as in a
	// live vLLM instance), so keep one registered for this phase.
	inst := int64(os.Getpid())<<16 | 0xffff
	if _, err := c.Register(registration(o, inst)); err != nil {
		return nil, err
	}
	defer func() { _ = c.Unregister(inst) }()
	// The last measured prompt of worker 0 is the stored prefix.
	r := o.Warmup + o.Requests - 1
	prefix := tokensFor(runID^int64(r)<<20, o.PromptTokens)
	tail := tokensFor(runID+12345, o.LookupTokens)
	tokens := append(slices.Clone(prefix), tail[:max(0, o.LookupTokens-len(prefix))]...)
	end := len(tokens) / chunk * chunk
	hasher, err := tokenhash.New(tokenhash.Blake3, chunk)
	if err != nil {
		return nil, err
	}
	fresh := slices.Clone(tokens)
	u32 := make([]uint32, end)
	for i, t := range tokens[:end] {
		u32[i] = uint32(t)
	}
	// The wire floor's first request carries a frame as large as the
	// LOOKUP's key (request ids differ by a few bytes, which is noise):
	// REPORT_BLOCK_ALLOCATION with one payload frame, which the server
	// acknowledges without reading it (only a three-frame report carries
	// records, and those are observability only).
	floorFrame := make([]byte, len(wire.Marshal(mkKey(o.Model, -1, tokens, 0, end, fmt.Sprintf("bench-long-%d-0", runID)))))
	t := &longLookupTimes{}
	for i := range o.LookupSamples {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		id := fmt.Sprintf("bench-long-%d-%d", runID, i)
		t0 := time.Now()
		hasher.ChunkHashesU32(u32)
		t.hash = append(t.hash, time.Since(t0))
		t0 = time.Now()
		if _, err := c.Call(wire.OpReportBlockAllocation, floorFrame); err != nil {
			return nil, fmt.Errorf("wire floor: %w", err)
		}
		if _, err := c.Noop(); err != nil {
			return nil, fmt.Errorf("wire floor: %w", err)
		}
		t.wire = append(t.wire, time.Since(t0))
		k := mkKey(o.Model, -1, tokens, 0, end, id)
		n, d, err := timedLookup(c, k)
		if err != nil {
			return nil, err
		}
		t.hits = n
		t.lat = append(t.lat, d)
		cnt.sample(KindLongLookup, 0, d)
		if err := endLookup(c, k); err != nil {
			return nil, err
		}
		// The same prompt with a new tail after the stored prefix.
		if len(prefix) < len(fresh) {
			fillTokens(fresh[len(prefix):], runID^int64(i+1)<<32)
		}
		k = mkKey(o.Model, -1, fresh, 0, end, id+"-new")
		if _, d, err = timedLookup(c, k); err != nil {
			return nil, err
		}
		t.newTail = append(t.newTail, d)
		if err := endLookup(c, k); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// endLookup frees a timed lookup's locks and ends its session.
func endLookup(c *mqclient.Client, k *wire.Key) error {
	if err := c.FreeLookupLocks(k, 1); err != nil {
		return err
	}
	return c.EndSession(k.RequestID)
}

func pingPhase(ctx context.Context, o Options) (float64, error) {
	clients := make([]*mqclient.Client, o.PingClients)
	defer func() {
		for _, c := range clients {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	for i := range clients {
		c, err := mqclient.Dial(o.Endpoint, mqclient.Options{Timeout: o.Timeout})
		if err != nil {
			return 0, err
		}
		clients[i] = c
		if _, err := c.GetChunkSize(); err != nil {
			return 0, err
		}
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, len(clients))
	t0 := time.Now()
	deadline := t0.Add(o.PingDuration)
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				ok, err := c.Ping(wire.OptInt{})
				if err != nil || !ok {
					errs[i] = fmt.Errorf("bench: PING = %v, %v", ok, err)
					return
				}
				total.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return float64(total.Load()) / time.Since(t0).Seconds(), nil
}
