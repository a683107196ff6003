package bench_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"html"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/bench"
	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/logtest"
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
	// Every request the bench sends is well formed, so the data path has
	// nothing to warn about (a refused request would be logged).
	warnings := &logtest.Buffer{}
	t.Cleanup(func() {
		if w := warnings.String(); w != "" {
			t.Errorf("the data path warned during the bench:\n%s", w)
		}
	})
	srv, err := mq.New(mq.Config{Host: "127.0.0.1", ChunkSize: chunk}, eng, slog.New(slog.NewTextHandler(warnings, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		_ = eng.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = eng.Run(ctx) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait(); closeEngine(t, eng) })
	return srv.Endpoint(), dir
}

// closeEngine closes eng once its Run returned and fails t, naming the
// keys, if the bench's traffic left a read lease, pin or staged write.
func closeEngine(t *testing.T, eng *engine.Engine) {
	t.Helper()
	if err := eng.CloseChecked(); err != nil {
		t.Error(err)
	}
}

func TestBenchSmall(t *testing.T) {
	endpoint, dir := serve(t, 64<<20, 16)
	o := bench.Defaults()
	o.Endpoint, o.ShmDir = endpoint, dir
	o.Workers, o.Requests, o.Warmup = 3, 3, 1
	o.Layers, o.Hidden, o.PromptTokens = 2, 64, 160
	o.LookupTokens, o.LookupSamples = 640, 20
	o.PingClients, o.PingDuration = 8, 100*time.Millisecond
	o.BaselineBytes = 1 << 20
	res, err := bench.Run(context.Background(), o, nil)
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
	counts := map[bench.Kind]int{}
	var storeSum, retrieveSum int64
	for _, x := range res.Samples {
		counts[x.Kind]++
		switch x.Kind {
		case bench.KindStore:
			storeSum += x.Bytes
		case bench.KindRetrieve:
			retrieveSum += x.Bytes
		}
	}
	// 9 measured requests: one store, one retrieve and two timed lookups each.
	if counts[bench.KindStore] != 9 || counts[bench.KindRetrieve] != 9 || counts[bench.KindLookup] != 18 || counts[bench.KindLongLookup] != 20 {
		t.Fatalf("sample counts %v", counts)
	}
	if storeSum != want || retrieveSum != want || res.StoreP50 <= 0 || res.StoreP99 < res.StoreP50 || res.RetrieveP99 < res.RetrieveP50 {
		t.Fatalf("samples: %d/%d bytes, store p50 %v p99 %v", storeSum, retrieveSum, res.StoreP50, res.StoreP99)
	}
	checkSummary(t, o, res)
	checkReports(t, o, res)
}

// checkSummary asserts the summary table's rows and their values.
func checkSummary(t *testing.T, o bench.Options, res *bench.Result) {
	t.Helper()
	var out bytes.Buffer
	bench.Report(&out, o, res)
	rows := map[string][]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		f := strings.Fields(l)
		if len(f) > 0 {
			rows[f[0]] = f
		}
	}
	if h := strings.Join(rows["phase"], " "); h != "phase rate vs memcpy server share volume p50 p99 notes" {
		t.Errorf("header %q\n%s", h, out.String())
	}
	store := rows["store"]
	wantStore := []string{"store", fmt.Sprintf("%.2f", res.StoreGBps), "GB/s", fmt.Sprintf("%.2f", res.StoreGBps/res.MemcpyToShmGBps),
		fmt.Sprintf("%.1f%%", 100*res.StoreRPCShare), fmt.Sprintf("%.2f", float64(res.StoredBytes)/(1<<30)), "GiB",
		res.StoreP50.Round(time.Microsecond).String(), res.StoreP99.Round(time.Microsecond).String(), "0"}
	if len(store) < len(wantStore) || strings.Join(store[:len(wantStore)], " ") != strings.Join(wantStore, " ") {
		t.Errorf("store row %q, want prefix %q", store, wantStore)
	}
	if r := rows["retrieve"]; len(r) < 3 || r[1] != fmt.Sprintf("%.2f", res.RetrieveGBps) {
		t.Errorf("retrieve row %q", r)
	}
	if p := rows["PING"]; len(p) != 9 || p[1] != fmt.Sprintf("%.0f/s", res.PingPerSec) || p[7] != "8" {
		t.Errorf("PING row %q", p)
	}
	if !strings.Contains(out.String(), "lookup 640 tokens") || !strings.Contains(out.String(), "20 samples") || !strings.Contains(out.String(), "hit ratio 1.000") {
		t.Errorf("lookup rows missing:\n%s", out.String())
	}
	// The hashing floor row: "hash floor 640 tokens - - - 20 samples p50 p99
	// lookup / floor: p50 R, p99 R", the ratios computed from the result.
	if res.LongLookupHashP50 <= 0 || res.LongLookupHashP99 < res.LongLookupHashP50 {
		t.Errorf("hash floor p50 %v p99 %v", res.LongLookupHashP50, res.LongLookupHashP99)
	}
	wantFloor := fmt.Sprintf("hash floor 640 tokens - - - 20 samples %s %s lookup / floor: p50 %.2f, p99 %.2f",
		res.LongLookupHashP50.Round(time.Microsecond), res.LongLookupHashP99.Round(time.Microsecond),
		float64(res.LongLookupP50)/float64(res.LongLookupHashP50), float64(res.LongLookupP99)/float64(res.LongLookupHashP99))
	if f := strings.Join(rows["hash"], " "); f != wantFloor {
		t.Errorf("hash floor row %q, want %q", f, wantFloor)
	}
	// The wire floor row: the same two round trips without server work,
	// its ratios the long lookup's against it.
	if res.LongLookupWireP50 <= 0 || res.LongLookupWireP99 < res.LongLookupWireP50 {
		t.Errorf("wire floor p50 %v p99 %v", res.LongLookupWireP50, res.LongLookupWireP99)
	}
	wantWire := fmt.Sprintf("wire floor 640 tokens - - - 20 samples %s %s lookup / wire: p50 %.2f, p99 %.2f",
		res.LongLookupWireP50.Round(time.Microsecond), res.LongLookupWireP99.Round(time.Microsecond),
		float64(res.LongLookupP50)/float64(res.LongLookupWireP50), float64(res.LongLookupP99)/float64(res.LongLookupWireP99))
	if f := strings.Join(rows["wire"], " "); f != wantWire {
		t.Errorf("wire floor row %q, want %q", f, wantWire)
	}
	// The new-tail row: same shape, its ratios against the same floor.
	if res.LongLookupNewTailP50 <= 0 || res.LongLookupNewTailP99 < res.LongLookupNewTailP50 {
		t.Errorf("new-tail lookup p50 %v p99 %v", res.LongLookupNewTailP50, res.LongLookupNewTailP99)
	}
	wantNew := fmt.Sprintf("lookup 640, new tail - - - 20 samples %s %s lookup / floor: p50 %.2f, p99 %.2f",
		res.LongLookupNewTailP50.Round(time.Microsecond), res.LongLookupNewTailP99.Round(time.Microsecond),
		float64(res.LongLookupNewTailP50)/float64(res.LongLookupHashP50), float64(res.LongLookupNewTailP99)/float64(res.LongLookupHashP99))
	if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), wantNew) {
		t.Errorf("new-tail row missing, want %q in:\n%s", wantNew, out.String())
	}
}

// checkReports writes both report formats and checks the charts' series.
func checkReports(t *testing.T, o bench.Options, res *bench.Result) {
	t.Helper()
	dir := t.TempDir()
	write := func(name string) []byte {
		path := filepath.Join(dir, name)
		if err := bench.WriteReport(path, o, res); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	checkSVG(t, write("r.svg"))
	page := write("r.html")
	m := regexp.MustCompile(`<img [^>]*src="([^"]+)"`).FindSubmatch(page)
	const dataURI = "data:image/svg+xml;base64,"
	if m == nil || !strings.HasPrefix(html.UnescapeString(string(m[1])), dataURI) || bytes.Contains(page, []byte("http://")) ||
		bytes.Contains(page, []byte("https://")) || !bytes.Contains(page, []byte("retrieve")) {
		t.Fatalf("html report lacks an inline chart or fetches from the network:\n%.2000s", page)
	}
	inline, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(html.UnescapeString(string(m[1])), dataURI))
	if err != nil {
		t.Fatal(err)
	}
	checkSVG(t, inline)
	if err := bench.WriteReport(filepath.Join(dir, "r.png"), o, res); err == nil {
		t.Error("a .png report was accepted")
	}
	tl := bench.NewTimeline(res.Samples, 0)
	var sum float64
	for _, p := range tl.StoreGBps {
		sum += p.Y * tl.Bucket.Seconds() * 1e9
	}
	if math.Abs(sum-float64(res.StoredBytes)) > 1 {
		t.Errorf("store throughput series integrates to %.0f bytes, stored %d", sum, res.StoredBytes)
	}
}

// checkSVG parses the chart and checks every series is in the legend.
func checkSVG(t *testing.T, svg []byte) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	var texts []string
	paths := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("chart is not valid XML: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if e.Name.Local == "path" {
				paths++
			}
		case xml.CharData:
			if s := strings.TrimSpace(string(e)); s != "" {
				texts = append(texts, s)
			}
		}
	}
	all := strings.Join(texts, "|")
	for _, s := range []string{bench.SeriesStoreGBps, bench.SeriesRetrieveGBps, bench.SeriesLookupP50, bench.SeriesLookupP99, bench.SeriesStoreP50, bench.SeriesRetrieveP50, "GB/s", "ms", "seconds"} {
		if !slices.Contains(texts, s) {
			t.Errorf("chart lacks the text %q (texts: %s)", s, all)
		}
	}
	if paths < 20 {
		t.Errorf("chart has %d paths", paths)
	}
}

func TestTimeline(t *testing.T) {
	ms := time.Millisecond
	s := []bench.Sample{
		{At: 5 * ms, Kind: bench.KindStore, Bytes: 1e6, Latency: 2 * ms},
		{At: 8 * ms, Kind: bench.KindLookup, Latency: 1 * ms},
		{At: 15 * ms, Kind: bench.KindStore, Bytes: 3e6, Latency: 4 * ms},
		{At: 16 * ms, Kind: bench.KindRetrieve, Bytes: 2e6, Latency: 3 * ms},
		{At: 17 * ms, Kind: bench.KindLookup, Latency: 5 * ms},
		{At: 18 * ms, Kind: bench.KindLongLookup, Latency: 9 * ms},
	}
	tl := bench.NewTimeline(s, 10*ms)
	want := bench.Timeline{Bucket: 10 * ms,
		StoreGBps:     []bench.Point{{X: 0.01, Y: 0.1}, {X: 0.02, Y: 0.3}},
		RetrieveGBps:  []bench.Point{{X: 0.01, Y: 0}, {X: 0.02, Y: 0.2}},
		LookupP50Ms:   []bench.Point{{X: 0.01, Y: 1}, {X: 0.02, Y: 5}},
		LookupP99Ms:   []bench.Point{{X: 0.01, Y: 1}, {X: 0.02, Y: 9}},
		StoreP50Ms:    []bench.Point{{X: 0.01, Y: 2}, {X: 0.02, Y: 4}},
		RetrieveP50Ms: []bench.Point{{X: 0.02, Y: 3}},
	}
	if diff := cmp.Diff(want, tl, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Fatalf("timeline (-want +got):\n%s", diff)
	}
}
