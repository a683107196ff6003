package mq_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/logtest"
	"github.com/lmcache-go/lmcache/internal/mq"
	"github.com/lmcache-go/lmcache/internal/mqclient"
	"github.com/lmcache-go/lmcache/internal/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Test layout: 2 layers x 64 hidden x fp16 with 16-token chunks, so one
// chunk object is 2*2*16*64*2 = 8 KiB.
const (
	testChunk  = 16
	testLayers = 2
	testHidden = 64
	testObj    = 2 * testLayers * testChunk * testHidden * 2
)

type harness struct {
	t        testing.TB
	srv      *mq.Server
	eng      *engine.Engine
	endpoint string
	shmDir   string
	logs     *logtest.Buffer
	// clientOpts are the options worker dials with (default: gen3).
	clientOpts mqclient.Options
	// stop ends the server's Run and waits for it (idempotent).
	stop func()
}

var shmSeq atomic.Int64

type opts struct {
	mq      func(*mq.Config)
	eng     func(*engine.Config)
	realShm bool // the pool lives in /dev/shm (for the Python client)
	l2      []l2.Adapter
}

func start(t testing.TB, o opts) *harness {
	t.Helper()
	logs := &logtest.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ecfg := engine.Config{L1SizeBytes: 4 << 20, ShmName: fmt.Sprintf("mqtest_%d_%d", os.Getpid(), shmSeq.Add(1)), ShmDir: t.TempDir()}
	if o.realShm {
		ecfg.ShmDir = ""
	}
	if o.eng != nil {
		o.eng(&ecfg)
	}
	eng, err := engine.New(ecfg, o.l2, logger)
	if err != nil {
		t.Fatalf("engine.New: %v", err)
	}
	cfg := mq.Config{Host: "127.0.0.1", Port: 0, ChunkSize: testChunk}
	if o.mq != nil {
		o.mq(&cfg)
	}
	srv, err := mq.New(cfg, eng, logger)
	if err != nil {
		_ = eng.Close()
		t.Fatalf("mq.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = eng.Run(ctx) }()
	go func() {
		defer wg.Done()
		if err := srv.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	stop := sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(func() {
		stop()
		// Every read lease, upload pin and staged write a test took must be
		// gone once the server has stopped; name the keys that are not.
		if err := eng.CloseChecked(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	dir := ecfg.ShmDir
	if dir == "" {
		dir = "/dev/shm"
	}
	return &harness{t: t, srv: srv, eng: eng, endpoint: srv.Endpoint(), shmDir: dir, logs: logs, stop: stop}
}

func (h *harness) dial(o mqclient.Options) *mqclient.Client {
	h.t.Helper()
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	c, err := mqclient.Dial(h.endpoint, o)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = c.Close() })
	if n, err := c.GetChunkSize(); err != nil || n != testChunk {
		h.t.Fatalf("GET_CHUNK_SIZE = %d, %v", n, err)
	}
	return c
}

// worker is a simulated vLLM worker: a client, a registration and the
// mapped pool.
type worker struct {
	h     *harness
	c     *mqclient.Client
	inst  int64
	rank  int
	world int
	pool  *mqclient.Pool
	model string
}

func (h *harness) worker(inst int64, model string, world, rank int) *worker {
	h.t.Helper()
	c := h.dial(h.clientOpts)
	resp, err := c.Register(regPayload(inst, model, world))
	if err != nil {
		h.t.Fatal(err)
	}
	if !strings.HasPrefix(resp.ShmName, "lmcache_l1_pool_") || int64(resp.PoolSize) != h.eng.Pool().Size {
		h.t.Fatalf("registration reply %+v, pool %+v", resp, h.eng.Pool())
	}
	pool, err := mqclient.OpenPool(h.shmDir, resp.ShmName, int64(resp.PoolSize))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = pool.Close() })
	return &worker{h: h, c: c, inst: inst, rank: rank, world: world, pool: pool, model: model}
}

func regPayload(inst int64, model string, world int) *wire.RegisterPayload {
	return &wire.RegisterPayload{InstanceID: wire.Int(inst), ModelName: model, WorldSize: wire.Int(world), BlockSize: 16,
		NumLayers: testLayers, HiddenDimSize: testHidden, DtypeStr: "float16",
		NumPhysicalSlots: wire.Nil, EngineGroupInfos: wire.EmptyList, GroupHiddenDimSizes: wire.Nil, GroupLayoutDescs: wire.Nil}
}

// prompt returns n distinct tokens seeded by seed.
func prompt(seed, n int) []wire.Int {
	out := make([]wire.Int, n)
	for i := range out {
		out[i] = wire.Int((seed*1_000_003 + i*7919) % 150000)
	}
	return out
}

func key(model string, world int, worker int, tokens []wire.Int, start, end int, reqID string) *wire.Key {
	k := &wire.Key{ModelName: model, WorldSize: wire.Int(world), TokenIDs: tokens, Start: wire.Int(start), End: wire.Int(end), RequestID: reqID, NumKVReaders: 1}
	if worker >= 0 {
		k.WorkerID = wire.SomeInt(int64(worker))
	}
	return k
}

// chunkData is deterministic random content per (seed, rank, chunk).
type chunkData map[[3]int][]byte

func (d chunkData) get(seed, rank, chunk int) []byte {
	k := [3]int{seed, rank, chunk}
	if b, ok := d[k]; ok {
		return b
	}
	b := make([]byte, testObj)
	_, _ = rand.Read(b)
	d[k] = b
	return b
}

// of is the content function of one prompt and rank, by chunk index.
func (d chunkData) of(seed, rank int) func(chunk int) []byte {
	return func(chunk int) []byte { return d.get(seed, rank, chunk) }
}

// store runs PREPARE_STORE, fills the slots and COMMIT_STOREs; it returns
// how many chunks the server asked for.
func (w *worker) store(tokens []wire.Int, start, end int, reqID string, data func(chunk int) []byte) int {
	w.h.t.Helper()
	k := key(w.model, w.world, w.rank, tokens, start, end, reqID)
	plan, err := w.c.PrepareStore(k, w.inst)
	if err != nil {
		w.h.t.Fatal(err)
	}
	if plan.Refused {
		w.h.t.Fatalf("PREPARE_STORE sent no SHM context")
	}
	if len(plan.Slots) == 0 {
		return 0
	}
	for i, s := range plan.Slots {
		if int(s.Length) != testObj || len(s.Shape) != 4 || s.Shape[0] != 2 || s.Shape[1] != testLayers || s.Shape[2] != testChunk || s.Shape[3] != testHidden || s.Dtype != "float16" {
			w.h.t.Fatalf("slot %+v does not have the KV_2LTD shape", s)
		}
		mem, err := w.pool.Slot(s)
		if err != nil {
			w.h.t.Fatal(err)
		}
		copy(mem, data(start/testChunk+plan.ChunkIndices[i]))
	}
	ok, err := w.c.CommitStore(k, w.inst, nil)
	if err != nil || !ok {
		w.h.t.Fatalf("COMMIT_STORE = %v, %v", ok, err)
	}
	return len(plan.Slots)
}

// retrieve runs PREPARE_RETRIEVE, compares every byte and COMMIT_RETRIEVEs.
func (w *worker) retrieve(tokens []wire.Int, start, end int, reqID string, data func(chunk int) []byte) bool {
	w.h.t.Helper()
	k := key(w.model, w.world, w.rank, tokens, start, end, reqID)
	ok, slots, err := w.c.PrepareRetrieve(k, w.inst)
	if err != nil {
		w.h.t.Fatal(err)
	}
	if ok {
		if len(slots) != (end-start)/testChunk {
			w.h.t.Fatalf("%d slots for %d chunks", len(slots), (end-start)/testChunk)
		}
		for i, s := range slots {
			mem, err := w.pool.Slot(s)
			if err != nil {
				w.h.t.Fatal(err)
			}
			if want := data(start/testChunk + i); !bytes.Equal(mem, want) {
				w.h.t.Fatalf("rank %d chunk %d: retrieved bytes differ", w.rank, start/testChunk+i)
			}
		}
	}
	committed, err := w.c.CommitRetrieve(k, w.inst)
	if err != nil {
		w.h.t.Fatal(err)
	}
	if committed != ok {
		w.h.t.Fatalf("COMMIT_RETRIEVE = %v after PREPARE_RETRIEVE ok=%v", committed, ok)
	}
	return ok
}

// lookupUntil polls LOOKUP+QUERY until the hit count is want (a store may
// become visible slightly after its commit is acknowledged).
func lookupUntil(t *testing.T, c *mqclient.Client, k *wire.Key, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := c.LookupWait(k, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lookup hit %d chunks, want %d", n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func lookupOnce(t *testing.T, c *mqclient.Client, k *wire.Key) int {
	t.Helper()
	n, err := c.LookupWait(k, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// freeLocks drops the read locks a LOOKUP of k took (FREE_LOOKUP_LOCKS),
// for tests that look up without retrieving.
func freeLocks(t *testing.T, c *mqclient.Client, k *wire.Key) {
	t.Helper()
	if err := c.FreeLookupLocks(k, 1); err != nil {
		t.Fatalf("FREE_LOOKUP_LOCKS %s: %v", k.RequestID, err)
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// counterValue reads a counter (a *mpmetrics.Counter or one child of a
// counter vector) the way a scrape would.
func counterValue(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	go func() { c.Collect(ch); close(ch) }()
	var total float64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err == nil && d.Counter != nil {
			total += d.Counter.GetValue()
		}
	}
	return total
}

// stored starts a server, stores chunks chunks of prompt seed through
// worker 1 of model "m" (world size 1) and returns the harness, the
// worker, a scheduler client and the prompt.
func stored(t *testing.T, seed, chunks int) (*harness, *worker, *mqclient.Client, []wire.Int) {
	t.Helper()
	h := start(t, opts{})
	w := h.worker(1, "m", 1, 0)
	sched := h.dial(mqclient.Options{})
	tokens := prompt(seed, chunks*testChunk)
	w.store(tokens, 0, chunks*testChunk, "s", chunkData{}.of(seed, 0))
	return h, w, sched, tokens
}
