package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/bench"
	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/mq"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve runs the real engine and data-path server in-process.
func serve(t *testing.T, l1 int64, chunk int) (endpoint, shmDir string) {
	t.Helper()
	dir := t.TempDir()
	eng, err := engine.New(engine.Config{L1SizeBytes: l1, ShmName: fmt.Sprintf("benchtest_%d", os.Getpid()), ShmDir: dir, EvictionInterval: 5 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mq.New(mq.Config{Host: "127.0.0.1", ChunkSize: chunk}, eng, nil)
	if err != nil {
		_ = eng.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = eng.Run(ctx) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait(); _ = eng.Close() })
	return srv.Endpoint(), dir
}

func TestBenchSmall(t *testing.T) {
	endpoint, dir := serve(t, 64<<20, 16)
	o := bench.Defaults()
	o.Endpoint, o.ShmDir = endpoint, dir
	o.Workers, o.Requests, o.Warmup = 3, 3, 1
	o.Layers, o.Hidden, o.PromptTokens = 2, 64, 160
	o.LookupTokens, o.LookupSamples = 640, 20
	o.PingClients, o.PingDuration = 8, 100*time.Millisecond
	o.Progress = 10 * time.Millisecond
	o.BaselineBytes = 1 << 20
	var progress bytes.Buffer
	res, err := bench.Run(context.Background(), o, &progress)
	if err != nil {
		t.Fatal(err)
	}
	const obj = 2 * 2 * 16 * 64 * 2
	want := int64(3*3*10) * obj // workers x requests x chunks
	if res.ChunkBytes != obj || res.StoredBytes != want || res.RetrievedBytes != want {
		t.Fatalf("result %+v, want %d bytes stored and retrieved", res, want)
	}
	if res.VerifiedBytes != int64(3*4*10)*obj || res.HitRatio != 1 || res.LongLookupHitChunks != 10 {
		t.Fatalf("result %+v", res)
	}
	if res.StoreGBps <= 0 || res.RetrieveGBps <= 0 || res.MemcpyToShmGBps <= 0 || res.MemcpyFromShmGBps <= 0 || res.PingPerSec <= 0 || res.LookupP99 < res.LookupP50 {
		t.Fatalf("result %+v", res)
	}
	if res.StoreRPCShare <= 0 || res.StoreRPCShare > 1 || res.RetrieveRPCShare <= 0 || res.RetrieveRPCShare > 1 {
		t.Fatalf("round-trip shares %v %v", res.StoreRPCShare, res.RetrieveRPCShare)
	}
	var out bytes.Buffer
	bench.Report(&out, o, res)
	for _, s := range []string{"store:", "retrieve:", "memcpy into shm", "p99", "PING"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("report lacks %q:\n%s", s, out.String())
		}
	}
	_ = progress // progress lines are best-effort; the run may finish first
}
