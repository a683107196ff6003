package coordinator

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// seqWidth is the room left for a right-aligned seq in a template body
// (JSON allows the leading spaces, not leading zeros).
const seqWidth = 12

// cacheEventsTemplate is one POST /events request of 1,000 entries shaped
// like eventBatches' (same keys, sizes and 90/10 store/access split), as
// two upstream-shaped batches; both seq fields and the instance id are
// placeholders runEvents fills per request.
func cacheEventsTemplate() (body []byte, seqAt, idAt [2]int) {
	var b bytes.Buffer
	b.WriteString(`{"batches":[`)
	k := 0
	for bi, part := range []struct {
		typ, backend string
		n            int
	}{{"store", "s3", 900}, {"access", "", 100}} {
		if bi > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"instance_id":"`)
		idAt[bi] = b.Len()
		b.WriteString(`mp-bench-00","incarnation":1767225600,"seq":`)
		seqAt[bi] = b.Len()
		b.Write(bytes.Repeat([]byte{' '}, seqWidth))
		fmt.Fprintf(&b, `,"event_type":%q,"tier":"l2","backend":%q,"entries":[`, part.typ, part.backend)
		for j := 0; j < part.n; j++ {
			if j > 0 {
				b.WriteByte(',')
			}
			k = (k + 7919) % 200000
			size := 2 << 20
			if part.typ == "access" {
				size = 0
			}
			fmt.Fprintf(&b, `{"key":{"chunk_hash_hex":"%064x","model_name":"Qwen/Qwen3-8B-%d","kv_rank":16777472,"object_group_id":0,"cache_salt":"tenant-%d"},"size_bytes":%d,"token_ids":[],"token_offset":-1}`,
				uint64(k)*0x9E3779B97F4A7C15, k%4, k%1000, size)
		}
		b.WriteString(`],"shared":true,"ts":1767225600.5,"capacity_bytes":0,"capacity_revision":0}`)
	}
	b.WriteString(`]}`)
	return b.Bytes(), seqAt, idAt
}

// runEvents posts the template from parallel clients, each its own emitter
// (instance mp-bench-NN) with its own in-order seqs, so every batch is
// admitted and applied rather than dropped as a duplicate.
func runEvents(b *testing.B, url string) {
	tmpl, seqAt, idAt := cacheEventsTemplate()
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var workers atomic.Int64
	b.SetBytes(int64(len(tmpl)))
	b.ResetTimer()
	b.SetParallelism(2)
	b.RunParallel(func(pb *testing.PB) {
		body := append([]byte(nil), tmpl...)
		w := workers.Add(1)
		for _, at := range idAt {
			body[at+9], body[at+10] = byte('0'+w/10%10), byte('0'+w%10)
		}
		seq := int64(0)
		for pb.Next() {
			for _, at := range seqAt {
				seq++
				d := strconv.AppendInt(nil, seq, 10)
				copy(body[at:at+seqWidth], bytes.Repeat([]byte{' '}, seqWidth))
				copy(body[at+seqWidth-len(d):], d)
			}
			resp, err := client.Post(url, "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !bytes.HasPrefix(raw, []byte(`{"applied":2,`)) {
				b.Errorf("status %d %s", resp.StatusCode, raw)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)*1000/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkIngestDoors measures the real coordinator's two event doors in
// the same run: POST /quota/events (goccy fast path) against POST /events
// (generic validator, then the event gate), 1,000 events per request.
func BenchmarkIngestDoors(b *testing.B) {
	newSrv := func(b *testing.B) (string, func()) {
		cfg := config.Default()
		cfg.EnableStartupResync = false
		cfg.HealthCheckInterval, cfg.EvictionCheckInterval = 0, 0
		s, err := New(cfg, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			b.Fatal(err)
		}
		return benchServe(b, s.Handler())
	}
	b.Run("quota_events", func(b *testing.B) {
		url, stop := newSrv(b)
		defer stop()
		runIngest(b, url+"/quota/events", eventBatches(64))
	})
	b.Run("events", func(b *testing.B) {
		url, stop := newSrv(b)
		defer stop()
		runEvents(b, url+"/events")
	})
}
