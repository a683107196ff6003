package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// eventBatches builds n request bodies of 1,000 events each, shaped like an
// MP reporter's: 64-hex blake3 hashes, a few models, many salts, 90% store
// and 10% lookup, cycling over a bounded key space.
func eventBatches(n int) [][]byte {
	out := make([][]byte, n)
	k := 0
	for i := range out {
		var b bytes.Buffer
		fmt.Fprintf(&b, `{"instance_id":"mp-bench","seq":%d,"tier":"l2","events":[`, i+1)
		for j := 0; j < 1000; j++ {
			if j > 0 {
				b.WriteByte(',')
			}
			typ := "store"
			if j%10 == 9 {
				typ = "lookup"
			}
			k = (k + 7919) % 200000
			fmt.Fprintf(&b, `{"type":%q,"key":{"chunk_hash_hex":"%064x","model_name":"Qwen/Qwen3-8B-%d","kv_rank":16777472,"object_group_id":0,"cache_salt":"tenant-%d"},"bytes":%d}`,
				typ, uint64(k)*0x9E3779B97F4A7C15, k%4, k%1000, 2<<20)
		}
		b.WriteString(`]}`)
		out[i] = b.Bytes()
	}
	return out
}

func benchServe(b *testing.B, h http.Handler) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h, IdleTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Shutdown(context.Background()) }
}

// runIngest posts the batches round-robin from 4 client goroutines and
// reports events/s.
func runIngest(b *testing.B, url string, bodies [][]byte) {
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var next atomic.Int64
	b.SetBytes(int64(len(bodies[0])))
	b.ResetTimer()
	b.SetParallelism(2)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := bodies[int(next.Add(1))%len(bodies)]
			resp, err := client.Post(url, "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)*1000/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkIngestHTTP measures POST /quota/events over loopback HTTP with
// 1,000-event batches against the ceiling: the same http.Server answering
// the same requests with a handler that only reads the body.
func BenchmarkIngestHTTP(b *testing.B) {
	bodies := eventBatches(64)
	b.Run("ceiling_read_body_only", func(b *testing.B) {
		url, stop := benchServe(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := readBody(w, r, eventsBodyLimit); err != nil {
				writeError(w, err)
				return
			}
			writeRecorded(w, 1000)
		}))
		defer stop()
		runIngest(b, url+"/quota/events", bodies)
	})
	b.Run("coordinator", func(b *testing.B) {
		cfg := config.Default()
		cfg.EnableStartupResync = false
		cfg.HealthCheckInterval, cfg.EvictionCheckInterval = 0, 0
		s, err := New(cfg, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			b.Fatal(err)
		}
		url, stop := benchServe(b, s.Handler())
		defer stop()
		runIngest(b, url+"/quota/events", bodies)
	})
}

// stdBatch is the portable wire shape (pointers mark required fields) that
// every decoder can fill; wireBatch is the shipped fast-path shape.
type stdBatch struct {
	InstanceID *string `json:"instance_id"`
	Seq        *int64  `json:"seq"`
	Tier       *string `json:"tier"`
	Events     *[]struct {
		Type string `json:"type"`
		Key  struct {
			ChunkHashHex  *string `json:"chunk_hash_hex"`
			ModelName     *string `json:"model_name"`
			KVRank        *int64  `json:"kv_rank"`
			ObjectGroupID int64   `json:"object_group_id"`
			CacheSalt     string  `json:"cache_salt"`
		} `json:"key"`
		Bytes *int64 `json:"bytes"`
	} `json:"events"`
}

// BenchmarkDecodeBatch compares JSON decoders on the same 1,000-event batch
// (decode only, no HTTP, no ledger).
func BenchmarkDecodeBatch(b *testing.B) {
	body := eventBatches(1)[0]
	for _, d := range []struct {
		name   string
		decode func() error
	}{
		{"encoding_json", func() error { var w stdBatch; return json.Unmarshal(body, &w) }},
		{"goccy_go_json_std_shape", func() error { var w stdBatch; return gojson.UnmarshalNoEscape(body, &w) }},
		{"goccy_go_json_shipped_shape", func() error { var w wireBatch; return gojson.UnmarshalNoEscape(body, &w) }},
		// What decodeFast adds in front of the goccy decode: the plain-key
		// scan that keeps case-folded keys and control characters off the
		// fast path.
		{"plain_keys_scan", func() error {
			if !plainKeys(body) {
				return errors.New("bench body has non-plain keys")
			}
			return nil
		}},
	} {
		b.Run(d.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				if err := d.decode(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)*1000/b.Elapsed().Seconds(), "events/s")
		})
	}
}
