package coordinator

import (
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
)

// eventSeeds are request bodies from the API tests plus edge cases for the
// fast decoder (escapes, lax numbers, duplicates, nulls, huge values).
var eventSeeds = []string{
	`{"instance_id":"i1","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":0,"cache_salt":"a"},"bytes":100}]}`,
	`{"instance_id":"mp-1","seq":2,"tier":"l2","events":[{"type":"lookup","key":{"chunk_hash_hex":"0b","model_name":"m","kv_rank":16777472,"object_group_id":0,"cache_salt":"t"},"bytes":0},{"type":"delete","key":{"chunk_hash_hex":"0b","model_name":"m","kv_rank":1},"bytes":0}]}`,
	`{"instance_id":"i","seq":1,"events":[]}`,
	`{"instance_id":"i","seq":0,"events":[]}`,
	`{"instance_id":"i","seq":-0,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":0,"cache_salt":"a"},"bytes":100}]}`,
	`{"instance_id":"i","seq":-9223372036854775808,"events":[]}`,
	`{"instance_id":"i","seq":0,"seq":1,"events":[]}`,
	`{"instance_id":"i","seq":1,"seq":0,"events":[]}`,
	`{"instance_id":"i","seq":"3","events":[]}`,
	`{"instance_id":"i","seq":4611686018427387905,"events":[]}`,
	`{"instance_id":"i","seq":1.0,"events":[]}`,
	`{"instance_id":"i","seq":1,"tier":"l1","events":[]}`,
	`{"instance_id":"i","seq":1,"tier":"x","events":[]}`,
	`{"instance_id":"i","seq":1,"tier":null,"events":[]}`,
	`{"instance_id":null,"seq":1,"events":[]}`,
	`{"instance_id":"i","seq":1,"events":null}`,
	`{"instance_id":"i","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"0A","model_name":"m","kv_rank":"1"},"bytes":"5"}]}`,
	`{"instance_id":"i","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":1},"bytes":-1}]}`,
	`{"instance_id":"i","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":1},"bytes":1e3}]}`,
	`{"instance_id":"i","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m\u0040x","kv_rank":1},"bytes":1}]}`,
	`{"instance_id":"i\"x","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":1,"object_group_id":-1},"bytes":1}]}`,
	`{"instance_id":"i","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":1,"cache_salt":"a@b"},"bytes":1}]}`,
	`{"instance_id":"i","seq":1,"seq":2,"events":[]}`,
	`{"instance_id":"i","seq":1,"events":[{"type":"store","type":"delete","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":1},"bytes":1}]}`,
	`{"instance_id":"i","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":true},"bytes":1}]}`,
	`{"instance_id":"i","seq":1,"events":[{"type":"store","key":null,"bytes":1}]}`,
	`{"instance_id":"i","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":1},"bytes":1}]} `,
	`{"instance_id":"i","seq":1,"events":[1]}`,
	`{"instance_id":"i","seq":1,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":00},"bytes":1}]}`,
	`{"instance_id":"i","seq":01,"events":[{"type":"store","key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":-01},"bytes":1e-05}]}`,
	`[]`,
	`{}`,
	``,
	`{"events":[{"key":{"mo\`,
	`{"instance_id":"i\`,
	`{"\c"\`,
}

// TestPlainKeysRefusesEscapes: a body with a backslash anywhere, or one
// that ends inside a string, never reaches goccy (which reads past the end
// of its buffer on malformed escapes); the slow validator decides instead:
// a 422 with FastAPI's JSON decode error for the malformed ones, and the
// batch for a well-formed escape.
func TestPlainKeysRefusesEscapes(t *testing.T) {
	req := httptest.NewRequest("POST", "/quota/events", nil)
	req.Header.Set("Content-Type", "application/json")
	for _, c := range []struct {
		body  string
		valid bool
	}{
		{`{"events":[{"key":{"mo\`, false},
		{`{"instance_id":"i\`, false},
		{`{"\c"\`, false},
		{`{"instance_id":"i`, false},
		{`{"instance_id":"i\"x","seq":1,"events":[]}`, true},
	} {
		if plainKeys([]byte(c.body)) {
			t.Errorf("plainKeys(%q) = true, want false", c.body)
		}
		if fb := decodeFast(req, []byte(c.body), nil); fb.ok || fb.err != nil {
			t.Errorf("decodeFast(%q) = ok %v err %v, want a deferral", c.body, fb.ok, fb.err)
		}
		instance, _, _, err := decodeSlow(req, []byte(c.body))
		switch {
		case c.valid && (err != nil || instance != `i"x`):
			t.Errorf("decodeSlow(%q) = %q, %v; want instance i\"x", c.body, instance, err)
		case !c.valid && (!errors.Is(err, ErrValidation) || !strings.Contains(err.Error(), "JSON decode error")):
			t.Errorf("decodeSlow(%q) = %v, want the JSON decode error 422", c.body, err)
		}
	}
}

// FuzzEventDecoders is the differential check of POST /quota/events: the
// fast goccy decoder and the slow Pydantic-style validator must agree on
// every body. When the fast path accepts, the slow one must accept with the
// same instance, seq and events; when the fast path rejects outright, the
// slow one must reject with the same status class. (When the fast path
// defers, the slow path alone decides, which is what ships.)
func FuzzEventDecoders(f *testing.F) {
	for _, s := range eventSeeds {
		f.Add([]byte(s))
	}
	req := httptest.NewRequest("POST", "/quota/events", nil)
	req.Header.Set("Content-Type", "application/json")
	f.Fuzz(func(t *testing.T, body []byte) {
		fb := decodeFast(req, append([]byte(nil), body...), nil)
		instance, seq, events, slowErr := decodeSlow(req, body)
		switch {
		case fb.ok:
			if slowErr != nil {
				t.Fatalf("fast accepted, slow rejected (%v): %s", slowErr, body)
			}
			if fb.instance != instance || fb.seq != seq {
				t.Fatalf("fast (%q, %d) != slow (%q, %d): %s", fb.instance, fb.seq, instance, seq, body)
			}
			if len(fb.events) != len(events) || (len(events) > 0 && !reflect.DeepEqual(fb.events, events)) {
				t.Fatalf("events differ:\nfast %+v\nslow %+v\nbody %s", fb.events, events, body)
			}
		case fb.err != nil:
			if slowErr == nil {
				t.Fatalf("fast rejected (%v), slow accepted: %s", fb.err, body)
			}
			if errors.Is(fb.err, ErrValidation) != errors.Is(slowErr, ErrValidation) || errors.Is(fb.err, ErrBadRequest) != errors.Is(slowErr, ErrBadRequest) {
				t.Fatalf("fast %v and slow %v differ in status: %s", fb.err, slowErr, body)
			}
			// The fast path words its one reject (seq < 1) itself, so the
			// client must get the same answer either way: status and the
			// whole detail body, byte for byte.
			fastCode, fastBody := renderError(fb.err)
			slowCode, slowBody := renderError(slowErr)
			if fastCode != slowCode || fastBody != slowBody {
				t.Fatalf("reply differs:\nfast %d %s\nslow %d %s\nbody %s", fastCode, fastBody, slowCode, slowBody, body)
			}
		}
	})
}

// renderError is the status and body a handler returning err answers.
func renderError(err error) (int, string) {
	rec := httptest.NewRecorder()
	writeError(rec, err)
	return rec.Code, rec.Body.String()
}

var _ = ledger.Event{}
