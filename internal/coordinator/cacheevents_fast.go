package coordinator

import (
	"bytes"
	"math"
	"net/http"

	gojson "github.com/goccy/go-json"

	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
)

// The POST /events fast path: goccy decodes the body into typed structs
// and, when every field is present and valid, the batches are built from
// them directly. Anything unusual (a missing optional field, a null, a
// lax-mode value such as "5" for an int, any invalid value, non-plain JSON
// keys) sends the whole body to the generic validator (decodeCacheEvents),
// which words the 422 or applies Pydantic's coercions. Emitters (upstream's
// and ours) send every field, so their bodies stay on the fast path.
type wireCacheEntry struct {
	Key         wireKey              `json:"key"`
	SizeBytes   gojson.Number        `json:"size_bytes"`
	TokenIDs    *[]gojson.RawMessage `json:"token_ids"`
	TokenOffset *int64               `json:"token_offset"`
}

type wireCacheBatch struct {
	InstanceID       *string           `json:"instance_id"`
	Incarnation      *int64            `json:"incarnation"`
	Seq              *int64            `json:"seq"`
	EventType        *string           `json:"event_type"`
	Tier             *string           `json:"tier"`
	Backend          *string           `json:"backend"`
	Entries          *[]wireCacheEntry `json:"entries"`
	Shared           *bool             `json:"shared"`
	TS               *float64          `json:"ts"`
	CapacityBytes    *int64            `json:"capacity_bytes"`
	CapacityRevision *int64            `json:"capacity_revision"`
}

type wireCacheEvents struct {
	Batches *[]wireCacheBatch `json:"batches"`
}

// wireOps maps an event_type to the name fastEvent parses (access is a
// lookup in the ledger's vocabulary).
var wireOps = map[string]string{"store": "store", "delete": "delete", "access": "lookup"}

// plainInt reports whether raw is a JSON integer both validators read the
// same way: an optional minus and at most 18 digits.
func plainInt(raw []byte) bool {
	if len(raw) > 0 && raw[0] == '-' {
		raw = raw[1:]
	}
	if len(raw) == 0 || len(raw) > 18 {
		return false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// fastCacheBatch converts one decoded batch; ok is false for anything the
// generic validator must look at.
func fastCacheBatch(w *wireCacheBatch) (cacheBatch, bool) {
	if w.InstanceID == nil || w.Incarnation == nil || w.Seq == nil || w.EventType == nil || w.Tier == nil || w.Backend == nil ||
		w.Entries == nil || w.Shared == nil || w.TS == nil || w.CapacityBytes == nil || w.CapacityRevision == nil {
		return cacheBatch{}, false
	}
	b := cacheBatch{instance: *w.InstanceID, incarnation: *w.Incarnation, seq: *w.Seq, typ: *w.EventType, tier: *w.Tier, backend: *w.Backend, ts: *w.TS}
	entries := *w.Entries
	if _, known := cacheEventOps[b.typ]; !known || b.instance == "" || len(b.instance) > maxInstanceIDBytes || b.backend == "" && b.typ != "access" || b.typ == "config" && len(entries) > 0 ||
		*w.CapacityBytes < 0 || *w.CapacityRevision < 0 || b.incarnation < 0 || b.seq < 1 || b.tier != "l1" && b.tier != "l2" ||
		*w.TS < 0 || math.IsInf(*w.TS, 0) {
		return cacheBatch{}, false
	}
	b.events = make([]ledger.Event, 0, len(entries))
	for i := range entries {
		e := &entries[i]
		if e.TokenIDs == nil || e.TokenOffset == nil || *e.TokenOffset < unknownTokenOffset {
			return cacheBatch{}, false
		}
		for _, t := range *e.TokenIDs {
			if !plainInt(t) {
				return cacheBatch{}, false
			}
		}
		ev, ok := fastEvent(&wireEvent{Type: wireOps[b.typ], Key: e.Key, Bytes: e.SizeBytes})
		if !ok {
			return cacheBatch{}, false
		}
		b.events = append(b.events, ev)
	}
	return b, true
}

// decodeCacheEventsFast is the fast path over body; ok false means "ask
// the generic validator". It never applies anything.
func decodeCacheEventsFast(r *http.Request, body []byte) ([]cacheBatch, bool) {
	// A JSON null reads as "absent" or as a zero value here, where the
	// validator rejects it: such bodies (rare) take the slow path.
	// plainKeys also refuses numbers with a leading zero, which goccy reads
	// and JSON forbids.
	if !jsonContentType(r) || !plainKeys(body) || bytes.Contains(body, []byte("null")) {
		return nil, false
	}
	var w wireCacheEvents
	if gojson.Unmarshal(body, &w) != nil || w.Batches == nil {
		return nil, false
	}
	out := make([]cacheBatch, 0, len(*w.Batches))
	entries := 0
	for i := range *w.Batches {
		b, ok := fastCacheBatch(&(*w.Batches)[i])
		if !ok {
			return nil, false
		}
		out = append(out, b)
		entries += len(b.events)
	}
	// A key given twice in one entry: goccy merges the two objects into
	// one wireKey, where the validator (and upstream's json.loads) keeps
	// only the last. Emitters write `"key":` once per entry, so any other
	// count goes to the validator. Found by FuzzCacheEventDecoders.
	if bytes.Count(body, []byte(`"key":`)) != entries {
		return nil, false
	}
	return out, true
}

// decodeAnyCacheEvents is the fast path, falling back to the generic
// validator (which alone words errors).
func decodeAnyCacheEvents(r *http.Request, body []byte) ([]cacheBatch, error) {
	if out, ok := decodeCacheEventsFast(r, body); ok {
		return out, nil
	}
	return decodeCacheEvents(r, body)
}
