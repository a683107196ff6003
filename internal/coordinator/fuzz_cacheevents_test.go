package coordinator

import (
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// upstreamBatch is one CacheEventBatch as upstream's HttpCacheEventSink
// dumps it (every field present).
const upstreamBatch = `{"instance_id":"mp-1","incarnation":1767225600,"seq":3,"event_type":"store","tier":"l2","backend":"s3","entries":[{"key":{"chunk_hash_hex":"0a1b","model_name":"org/m","kv_rank":16777472,"object_group_id":0,"cache_salt":"t"},"size_bytes":4096,"token_ids":[1,2,3],"token_offset":256},{"key":{"chunk_hash_hex":"0c","model_name":"org/m","kv_rank":1},"size_bytes":0,"token_ids":[],"token_offset":-1}],"shared":true,"ts":1767225600.25,"capacity_bytes":0,"capacity_revision":0}`

// cacheEventSeeds: bodies the fast path must take, and edge cases it must
// hand to the validator (nulls, lax values, missing optional fields,
// invalid values, odd keys).
var cacheEventSeeds = []string{
	`{"batches":[` + upstreamBatch + `]}`,
	`{"batches":[` + upstreamBatch + `,` + strings.Replace(upstreamBatch, `"seq":3`, `"seq":4`, 1) + `]}`,
	`{"batches":[{"instance_id":"a","incarnation":0,"seq":1,"event_type":"access","tier":"l1","backend":"","entries":[],"shared":false,"ts":0,"capacity_bytes":0,"capacity_revision":0}]}`,
	`{"batches":[{"instance_id":"a","incarnation":0,"seq":1,"event_type":"config","tier":"l1","backend":"dram","entries":[],"shared":false,"ts":0,"capacity_bytes":1073741824,"capacity_revision":2}]}`,
	`{"batches":[]}`,
	`{}`,
	`{"batches":null}`,
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"shared":true`, `"shared":null`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"shared":true,`, ``, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"seq":3`, `"seq":"3"`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"seq":3`, `"seq":0`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"seq":3`, `"seq":3.0`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"tier":"l2"`, `"tier":"all"`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"backend":"s3"`, `"backend":""`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"token_offset":256`, `"token_offset":-2`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `[1,2,3]`, `[1,2.5,3]`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `[1,2,3]`, `[1,"2",3]`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"size_bytes":4096`, `"size_bytes":-1`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"chunk_hash_hex":"0a1b"`, `"chunk_hash_hex":"zz"`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"instance_id":"mp-1"`, `"Instance_id":"mp-1"`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"ts":1767225600.25`, `"ts":-1`, 1),
	strings.Replace(`{"batches":[`+upstreamBatch+`]}`, `"shared":true`, `"shared":1`, 1),
	`{"batches":[1]}`,
	`[]`,
	``,
}

// FuzzCacheEventDecoders is the differential check of POST /events: when
// the fast decoder accepts a body, the generic validator must accept it
// with the same batches. (When the fast path defers, the validator alone
// decides, which is what ships.)
func FuzzCacheEventDecoders(f *testing.F) {
	for _, s := range cacheEventSeeds {
		f.Add([]byte(s))
	}
	req := httptest.NewRequest("POST", "/events", nil)
	req.Header.Set("Content-Type", "application/json")
	f.Fuzz(func(t *testing.T, body []byte) {
		fast, ok := decodeCacheEventsFast(req, append([]byte(nil), body...))
		slow, err := decodeCacheEvents(req, body)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("fast accepted, validator rejected (%v): %s", err, body)
		}
		if len(fast) != len(slow) || (len(fast) > 0 && !reflect.DeepEqual(fast, slow)) {
			t.Fatalf("batches differ:\nfast %+v\nslow %+v\nbody %s", fast, slow, body)
		}
	})
}

// TestCacheEventsFastPathTakesUpstreamShapes: the bodies emitters send
// stay on the fast path (the figures in BENCHMARKS.md depend on it), and
// each edge case is handed to the validator.
func TestCacheEventsFastPathTakesUpstreamShapes(t *testing.T) {
	req := httptest.NewRequest("POST", "/events", nil)
	for i, s := range cacheEventSeeds {
		_, ok := decodeCacheEventsFast(req, []byte(s))
		if want := i < 5; ok != want {
			t.Errorf("seed %d: fast path ok=%v, want %v: %s", i, ok, want, s)
		}
	}
	body, _, _ := cacheEventsTemplate()
	if _, ok := decodeCacheEventsFast(req, []byte(strings.ReplaceAll(string(body), "            ", "           1"))); !ok {
		t.Fatal("the benchmark's body is not on the fast path")
	}
}
