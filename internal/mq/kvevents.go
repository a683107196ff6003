package mq

import (
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/kvevents"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// maxPollEvents caps the records one POLL_KV_EVENTS reply carries, so a
// poller asking for a huge page gets a bounded reply; it pages on with the
// returned cursor, losing nothing.
const maxPollEvents = 4096

// getExperimental answers GET_EXPERIMENTAL: the capability names this
// server serves. "kv_events" is advertised only while the POLL_KV_EVENTS
// log is on (--kv-event-log-size > 0), because a worker polls only a
// server that advertises it.
func (s *Server) getExperimental() []byte {
	if s.cfg.KVEvents.Log() == nil {
		return wire.EmptyList
	}
	b := msgp.AppendArrayHeader(nil, 1)
	return msgp.AppendString(b, kvevents.Capability)
}

// pollKVEvents answers POLL_KV_EVENTS(model_name, cursor, max_events) from
// the log: a KVEventPollResult map. With the log off it answers
// enabled=false, as upstream. A malformed request (wrong frame count,
// wrong types, negative cursor, max_events < 1) is counted and answered
// with nil, the reply a client maps to None, rather than a result it
// could mistake for an empty page.
func (s *Server) pollKVEvents(req *request) []byte {
	model, cursor, max, err := decodePoll(req.payloads)
	if err == nil && (cursor < 0 || max < 1) {
		err = fmt.Errorf("%w: cursor %d, max_events %d", kvevents.ErrBadPoll, cursor, max)
	}
	if err != nil {
		s.malformed(req.peer.idString(), "payload", "malformed POLL_KV_EVENTS; answered with nil", "op", req.op.EnumName(), "err", err)
		return wire.Nil
	}
	lg := s.cfg.KVEvents.Log()
	if lg == nil {
		var incarnation int64
		return kvevents.AppendPollResult(nil, false, incarnation, 0, false, nil)
	}
	recs, next, lost, err := lg.ReadAfter(cursor, model, min(max, maxPollEvents))
	if err != nil { // unreachable: the arguments were checked above
		return wire.Nil
	}
	return kvevents.AppendPollResult(make([]byte, 0, kvevents.SizeHint(recs)), true, lg.Incarnation(), next, lost, recs)
}

func decodePoll(p [][]byte) (string, int64, int, error) {
	if len(p) != 3 {
		return "", 0, 0, fmt.Errorf("want 3 payload frames (model_name, cursor, max_events), got %d", len(p))
	}
	model, rest, err := msgp.ReadStringBytes(p[0])
	if err != nil || len(rest) != 0 {
		return "", 0, 0, fmt.Errorf("model_name: %w", errors.Join(err, errTrailing(rest)))
	}
	cursor, rest, err := msgp.ReadInt64Bytes(p[1])
	if err != nil || len(rest) != 0 {
		return "", 0, 0, fmt.Errorf("cursor: %w", errors.Join(err, errTrailing(rest)))
	}
	max, rest, err := msgp.ReadInt64Bytes(p[2])
	if err != nil || len(rest) != 0 {
		return "", 0, 0, fmt.Errorf("max_events: %w", errors.Join(err, errTrailing(rest)))
	}
	if max > 1<<31 {
		max = 1 << 31
	}
	return model, cursor, int(max), nil
}

// bindKVTokens gives the KV event recorder the tokens and parent hash of
// the chunks [first, last) a PREPARE_STORE or an lmcache-driven STORE is
// about to write, so their
// store records carry what a router indexes by. hashes covers chunks
// [0, last) and the key's token ids were range-checked by chunkHashes.
func (s *Server) bindKVTokens(k *wire.Key, hashes [][]byte, first, last int) {
	rec := s.cfg.KVEvents
	if !rec.Enabled() || first >= last || k.CacheSalt != "" {
		return
	}
	c := s.cfg.ChunkSize
	toks := make([][]uint32, 0, last-first)
	for i := first; i < last; i++ {
		t := make([]uint32, c)
		for j, v := range k.TokenIDs[i*c : (i+1)*c] {
			t[j] = uint32(v)
		}
		toks = append(toks, t)
	}
	var parent []byte
	if first > 0 {
		parent = hashes[first-1]
	}
	rec.Bind(parent, hashes[first:last], toks)
}

// kvEventsStatus is the "kv_events" section of GET /status, upstream's
// KVEventModule.report_status: enabled and incarnation always, the log's
// depth, capacity, next sequence, loss markers (always 0 here: records
// are appended synchronously, there is no event bus to drop them) and the
// stores skipped for want of tokens when enabled; the native publisher's
// endpoints when it runs (an extension).
func (s *Server) kvEventsStatus() httpapi.KVEventsStatus {
	rec := s.cfg.KVEvents
	lg := rec.Log()
	out := httpapi.KVEventsStatus{Enabled: lg != nil}
	if lg != nil {
		depth, capacity, next, lost, unbound := lg.Len(), lg.Capacity(), lg.NextSeq(), 0, rec.Unbound()
		out.Incarnation = lg.Incarnation()
		out.LogDepth, out.LogCapacity, out.NextSeq, out.LostMarkers, out.UnboundStores = &depth, &capacity, &next, &lost, &unbound
	}
	if rec != nil && rec.Publisher() != nil {
		pub, replay := rec.Publisher().Endpoint(), rec.Publisher().ReplayEndpoint()
		out.PublisherEndpoint, out.ReplayEndpoint = &pub, &replay
	}
	return out
}
