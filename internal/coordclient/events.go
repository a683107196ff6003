package coordclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
)

// The POST /events wire form is newer upstream's CacheEventBatch
// (LMCache/LMCache lmcache/v1/mp_coordinator/api.py at 08340ea4), the
// kafkaevents types: every field is sent, as a dataclass dumps it.

// eventsRequest is a built /events request with the events it carries.
type eventsRequest struct {
	body   kafkaevents.Envelope
	events []Event
}

// errNotServed is a 404 from an event door: the coordinator does not serve
// that endpoint (an older or newer upstream).
var errNotServed = errors.New("endpoint not served (404)")

// errRefused is a verdict on the request itself: a 4xx other than those
// that say nothing about the body (401, 403, 404, 408, 425, 429), so a
// 400, 413 or 422 (one key the coordinator will not take refuses the
// whole request, nothing applied), or a Publisher's refusal of a batch it
// cannot encode. Resending the same body cannot succeed, and while it
// waited at the head of the stream every later event would wait behind it
// until the queue filled and new events were dropped.
var errRefused = errors.New("request refused")

// statusErr maps a non-2xx coordinator reply to an error.
func statusErr(code int) error {
	switch {
	case code == http.StatusUnauthorized:
		return ErrUnauthorized
	case code == http.StatusNotFound:
		return errNotServed
	case refusedStatus(code):
		return fmt.Errorf("coordinator answered %d: %w", code, errRefused)
	case code/100 != 2:
		return fmt.Errorf("coordinator answered %d", code)
	}
	return nil
}

// refusedStatus reports whether a status refuses the request's content.
func refusedStatus(code int) bool {
	if code/100 != 4 {
		return false
	}
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return true
}

// wireType maps a listener event to the /events vocabulary.
var wireType = map[string]string{"store": kafkaevents.EventStore, "lookup": kafkaevents.EventAccess, "delete": kafkaevents.EventDelete}

// buildEvents groups events into batches, preserving their order:
// consecutive events of one (type, backend, shared) share a batch, any
// change starts a new one (so a store then a delete of one key can never
// be reordered). Each batch takes the next seq of this incarnation.
func (c *Client) buildEvents(events []Event) *eventsRequest {
	req := &eventsRequest{events: events}
	ts := kafkaevents.PyFloat(float64(time.Now().UnixNano()) / 1e9)
	id := c.InstanceID()
	var cur *kafkaevents.Batch
	for _, ev := range events {
		typ := wireType[ev.Type]
		backend := ev.Backend
		if typ == kafkaevents.EventAccess {
			// Upstream's access batches name no placement: the backend is
			// empty (required non-empty for store and delete only).
			backend = ""
		}
		if cur == nil || cur.EventType != typ || cur.Backend != backend || cur.Shared != ev.Shared {
			req.body.Batches = append(req.body.Batches, kafkaevents.Batch{
				InstanceID: id, Incarnation: c.cfg.Incarnation, Seq: c.evSeq.Add(1),
				EventType: typ, Tier: kafkaevents.TierL2, Backend: backend, Entries: []kafkaevents.Entry{}, Shared: ev.Shared, TS: ts,
			})
			cur = &req.body.Batches[len(req.body.Batches)-1]
		}
		// The L2 listener does not know a key's tokens (upstream stamps
		// them from the store path's token bindings): empty ids, unknown
		// offset.
		cur.Entries = append(cur.Entries, kafkaevents.Entry{Key: ev.Key, SizeBytes: ev.Bytes, TokenIDs: []int64{}, TokenOffset: kafkaevents.UnknownTokenOffset})
	}
	for i := range req.body.Batches {
		if req.body.Batches[i].EventType != kafkaevents.EventAccess && req.body.Batches[i].Backend == "" {
			// A listener registered without a backend name (the Client
			// itself): upstream rejects an empty backend on store and
			// delete, so name the tier.
			req.body.Batches[i].Backend = "l2"
		}
	}
	return req
}

// sendEvents posts one built /events request.
func (c *Client) sendEvents(ctx context.Context, req *eventsRequest) error {
	var resp struct {
		Applied    *int `json:"applied"`
		Duplicates int  `json:"duplicates"`
		Stale      int  `json:"stale"`
	}
	code, err := c.do(ctx, http.MethodPost, "/events", req.body, &resp)
	if err == nil {
		err = statusErr(code)
	}
	if err == nil && resp.Applied == nil {
		err = errors.New("coordinator reply lacks applied")
	}
	first := int64(0)
	if len(req.body.Batches) > 0 {
		first = req.body.Batches[0].Seq
	}
	if err != nil {
		if c.cfg.Metrics != nil && !errors.Is(err, errNotServed) {
			c.cfg.Metrics.CoordBatchesFailed.Inc()
		}
		return fmt.Errorf("post /events seq=%d+%d: %w", first, len(req.body.Batches), err)
	}
	if resp.Stale > 0 {
		// The coordinator has seen a newer incarnation of this instance id
		// (another process under the same --instance-id, or a clock that
		// went back): these events were dropped there, so they count as
		// dropped here too (resending cannot help: the verdict stands).
		n := staleEvents(req.body.Batches, resp.Stale)
		c.dropped.Add(int64(n))
		if c.cfg.Metrics != nil {
			c.cfg.Metrics.CoordEventsDropped.Add(float64(n))
		}
		c.log.Warn("coordinator dropped event batches as a stale incarnation", "instance_id", c.InstanceID(), "incarnation", c.cfg.Incarnation, "stale_batches", resp.Stale, "dropped_events", n)
	}
	c.sent.Add(1)
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.CoordBatchesSent.Inc()
	}
	return nil
}

// staleEvents is the number of events in the batches the coordinator
// answered stale. The reply counts batches, not which ones; they are the
// last stale ones of the request: every batch carries this incarnation,
// and once the coordinator has seen a newer one it stays newer, so a stale
// verdict holds for every later batch of the request.
func staleEvents(batches []kafkaevents.Batch, stale int) int {
	n := 0
	for i := max(len(batches)-stale, 0); i < len(batches); i++ {
		n += len(batches[i].Entries)
	}
	return n
}

// setRetry keeps (or clears) the failed /events request; flushMu held.
func (c *Client) setRetry(r *eventsRequest) {
	c.retry = r
	n := 0
	if r != nil {
		n = len(r.events)
	}
	c.retryEvents.Store(int64(n))
}

// switchEndpoint moves EndpointAuto to the other door.
func (c *Client) switchEndpoint(to string) {
	c.endpoint.Store(&to)
	c.log.Info("coordinator does not serve the event endpoint; switching", "now", to)
}

// Publisher takes built cache-event batches to a non-HTTP transport
// (kafkaevents.Sink). Publish queues them without waiting for the broker.
type Publisher interface {
	Publish(ctx context.Context, batches []kafkaevents.Batch) error
}

// publish hands events to the Publisher as /events batches. Unlike the HTTP
// door nothing is kept for a retry: the Kafka producer retries delivery
// itself, and a refused list (buffer full or sink closed) is dropped and
// counted by the sink (lmcache_mp_coordinator_kafka_batches_dropped_total),
// leaving a seq gap the coordinator sees. Any other error is a verdict on
// the batches (errRefused), handled as a coordinator's 422.
func (c *Client) publish(ctx context.Context, events []Event) error {
	req := c.buildEvents(events)
	if err := c.cfg.Publisher.Publish(ctx, req.body.Batches); err != nil {
		if c.cfg.Metrics != nil {
			c.cfg.Metrics.CoordBatchesFailed.Inc()
		}
		if !errors.Is(err, kafkaevents.ErrRefused) && ctx.Err() == nil {
			// Not the buffer (nor the flush's deadline): the sink refused
			// the list for a batch it cannot take (validation, encoding),
			// before queueing any and without counting it; deliver splits
			// out the bad event.
			return fmt.Errorf("publish cache events: %w: %w", errRefused, err)
		}
		return fmt.Errorf("publish cache events: %w", err)
	}
	c.sent.Add(1)
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.CoordBatchesSent.Inc()
	}
	return nil
}
