package mq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tinylib/msgp/msgp"
	"go.opentelemetry.io/otel/trace"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/l1"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// maxWait bounds WAIT_PREFETCH_STATUS's timeout argument.
const maxWait = 10 * time.Minute

// lookupKey decodes a scheduler key (and the legacy tp_size frame) and
// returns the number of read locks per object. A key that decodes but does
// not validate is returned with the error, so its request id can still be
// marked as having no job.
func lookupKey(req *request) (*wire.Key, int, error) {
	key, err := req.decodeKey()
	if err != nil {
		return nil, 0, err
	}
	if key.WorldSize < 1 || key.WorldSize > 255 {
		return key, 0, fmt.Errorf("world_size %d out of range", key.WorldSize)
	}
	if err := (objkey.Key{ModelName: key.ModelName, CacheSalt: key.CacheSalt}).Validate(); err != nil {
		return key, 0, err
	}
	readers := key.Readers()
	if key.NumKVReaders < 1 && len(req.payloads) > 1 {
		// Older clients: no num_kv_readers; MLA readers came from tp_size.
		var tp wire.Int
		if err := wire.Unmarshal(req.payloads[1], &tp); err == nil && int64(tp) > int64(key.WorldSize) {
			readers = int(tp)
		}
	}
	// The engine takes at most l1.MaxReaders locks per object and call;
	// bounding the count here as well makes one FREE_LOOKUP_LOCKS release
	// what one LOOKUP of the same count took. (The table itself clamps a
	// release count to its int32 counters, so no count can wrap there.)
	return key, min(readers, l1.MaxReaders), nil
}

// maxRequestRecords bounds the per-request-id records the data path keeps
// besides sessions (lookups without a job, running lookups' metrics
// metadata): each is a few dozen bytes, but a client sending a new request
// id with every LOOKUP and never polling would otherwise add one per id for
// SessionTTL. vLLM polls every lookup at once, so only abandoned ones are
// dropped.
const maxRequestRecords = 65536

// markNoJobLocked records that id's last LOOKUP started no job. Past
// maxRequestRecords an arbitrary older record goes: its id then polls the
// engine, which answers 0 unless an older job of that id is still there.
// st.mu is held.
func (st *state) markNoJobLocked(id string) {
	putBounded(st, st.noJob, id, time.Now(), "no_job")
}

// recordLookupLocked keeps what a started LOOKUP job asked for, for the
// lookup metrics when it is consumed. Jobs nobody polls leave their records
// until the sweep, so past maxRequestRecords an arbitrary one goes (that
// lookup is then not counted). st.mu is held.
func (st *state) recordLookupLocked(id string, m lookupMeta) {
	putBounded(st, st.lookups, id, m, "lookup")
}

// putBounded sets m[id] to v. A new id past maxRequestRecords first drops
// one entry, whichever the map iteration yields first, counted under kind
// in lmcache_mp_zmq_dropped_request_records_total. st.mu is held.
func putBounded[V any](st *state, m map[string]V, id string, v V, kind string) {
	if _, known := m[id]; !known && len(m) >= maxRequestRecords {
		for k := range m {
			delete(m, k)
			break
		}
		st.s.metrics.ZMQDroppedRecords.WithLabelValues(kind).Inc()
	}
	m[id] = v
}

// noJobFor reports whether id's last LOOKUP started no job (its answer is
// 0), forgetting that if consume.
func (st *state) noJobFor(id string, consume bool) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	_, ok := st.noJob[id]
	if ok && consume {
		delete(st.noJob, id)
	}
	return ok
}

func (st *state) lookup(req *request) ([]byte, error) {
	key, readers, err := lookupKey(req)
	if err != nil {
		if key != nil {
			// A refused LOOKUP still replaces the id's unconsumed answer:
			// vLLM polls the id next, and an older job's hits would
			// describe another prompt.
			st.mu.Lock()
			st.markNoJobLocked(key.RequestID)
			st.mu.Unlock()
		}
		return wire.Nil, err
	}
	st.mu.Lock()
	delete(st.noJob, key.RequestID) // a new lookup replaces an unconsumed answer
	st.mu.Unlock()
	if started, err := st.startPrefetch(key, readers, req.span, req.inline); !started {
		st.mu.Lock()
		st.markNoJobLocked(key.RequestID)
		st.mu.Unlock()
		return wire.Nil, err
	}
	return wire.Nil, nil
}

// startPrefetch starts LOOKUP's engine job; false means no job was started.
func (st *state) startPrefetch(key *wire.Key, readers int, parent trace.SpanContext, inline bool) (bool, error) {
	// The engine knows a layout once a worker registered (model,
	// world_size), or from --register-model before any worker did (a
	// restarted server over a populated L2). Without one nothing can hit.
	if _, err := st.s.eng.Layout(key.ModelName, int(key.WorldSize)); err != nil {
		return false, nil
	}
	first, last, err := st.chunkRange(key)
	if err != nil || first == last {
		return false, err
	}
	hashes, err := st.chunkHashes(key, last)
	if err != nil {
		return false, err
	}
	world := int(key.WorldSize)
	flat := objectKeys(key.ModelName, world, key.CacheSalt, hashes[first:last], -1)
	if len(flat) != (last-first)*world {
		return false, fmt.Errorf("no object keys for (%s, %q)", key.ModelName, key.CacheSalt) // lookupKey validated both; defensive
	}
	// An answered lmcache-driven CUDA store of these chunks may still be
	// committing: wait for it rather than miss them (lmdriven.go).
	st.lmdAwaitCommits("lookup", flat, !inline)
	chunks := make([][]objkey.Key, last-first)
	for i := range chunks {
		chunks[i] = flat[i*world : (i+1)*world : (i+1)*world]
	}
	if err := st.s.eng.Prefetch(engine.PrefetchRequest{ID: key.RequestID, Chunks: chunks, Readers: readers, Trace: parent}); err != nil {
		return false, fmt.Errorf("prefetch: %w", err)
	}
	if st.s.cfg.Metrics != nil {
		st.mu.Lock()
		st.recordLookupLocked(key.RequestID, lookupMeta{model: key.ModelName, salt: key.CacheSalt, chunks: last - first, started: time.Now()})
		st.mu.Unlock()
	}
	return true, nil
}

// consumed is called once per finished job whose answer went to the
// client: it counts the lookup in the metrics.
func (st *state) consumed(id string, res engine.PrefetchResult) {
	st.logJobError(id, res)
	if st.s.cfg.Metrics == nil {
		return
	}
	st.mu.Lock()
	m, ok := st.lookups[id]
	delete(st.lookups, id)
	st.mu.Unlock()
	if ok {
		st.s.cfg.Metrics.RecordLookup(m.model, m.salt, st.s.hasher.ChunkSize(), m.chunks,
			mpmetrics.LookupResult{PrefixChunks: res.PrefixChunks, L1Keys: res.L1Keys, L2Keys: res.L2Keys, Duration: res.Duration})
	}
}

func decodeRequestID(b []byte) (string, error) {
	var id string
	id, rest, err := msgp.ReadStringBytes(b)
	if err == nil && len(rest) != 0 {
		err = errTrailing(rest)
	}
	if err != nil {
		return "", fmt.Errorf("decode request_id: %w", err)
	}
	return id, nil
}

// queryStatus is QUERY_PREFETCH_STATUS (consume) and
// QUERY_PREFETCH_LOOKUP_HITS (peek): nil while running, the hit prefix in
// chunks when done, 0 for an unknown request.
func (st *state) queryStatus(req *request, consume bool) ([]byte, error) {
	id, err := decodeRequestID(req.payloads[0])
	if err != nil {
		return nil, err
	}
	if st.noJobFor(id, consume) {
		return wire.EncodeInt(0), nil
	}
	poll := st.s.eng.PollPrefetch
	if !consume {
		poll = st.s.eng.PeekPrefetch
	}
	res, err := poll(id)
	switch {
	case errors.Is(err, engine.ErrNotFound):
		return wire.EncodeInt(0), nil
	case err != nil:
		return wire.EncodeInt(0), err
	case !res.Done && !consume && res.LookupDone:
		// Every tier has answered; L2 loads may still run. A job that is
		// not done is not consumed by polling.
		return wire.EncodeInt(int64(res.LookupPrefixChunks)), nil
	case !res.Done:
		return wire.Nil, nil
	}
	if consume {
		st.consumed(id, res)
	}
	return wire.EncodeInt(int64(res.PrefixChunks)), nil
}

// logJobError logs a consumed job's error at most every protocolWarnEvery:
// while an adapter fails (an L2 outage), every LOOKUP's job carries its
// error, and a line per request would flood the log from the socket
// goroutine, which answers QUERY_PREFETCH_STATUS inline. The line after
// held-back ones says how many (suppressed); each job still answers with
// the chunks it had.
func (st *state) logJobError(id string, res engine.PrefetchResult) {
	if res.Err != nil {
		st.warnEvery("prefetch-failed", protocolWarnEvery, "prefetch job failed; it answered with the chunks it had (logged at most every 10 s)",
			"request_id", id, "prefix_chunks", res.PrefixChunks, "err", res.Err)
	}
}

func (st *state) waitStatus(ctx context.Context, req *request) ([]byte, error) {
	id, err := decodeRequestID(req.payloads[0])
	if err != nil {
		return nil, err
	}
	wait := maxWait
	if len(req.payloads) > 1 {
		f, rest, err := msgp.ReadFloat64Bytes(req.payloads[1])
		if err != nil { // an int timeout is fine too
			var i int64
			i, rest, err = msgp.ReadInt64Bytes(req.payloads[1])
			f = float64(i)
		}
		if err != nil || len(rest) != 0 || math.IsNaN(f) || f < 0 {
			return nil, fmt.Errorf("decode timeout: %w", errors.Join(err, errTrailing(rest)))
		}
		// Compared as a float: a timeout past a time.Duration's range
		// (1e300, +Inf) would convert to a negative one and time out at
		// once.
		if secs := f * float64(time.Second); secs < float64(wait) {
			wait = time.Duration(secs)
		}
	}
	if st.noJobFor(id, true) {
		return wire.EncodeInt(0), nil
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	res, err := st.s.eng.WaitPrefetch(wctx, id)
	switch {
	case errors.Is(err, engine.ErrNotFound):
		return wire.EncodeInt(0), nil
	case err == nil:
		// Done and consumed, whether or not the deadline passed too
		// meanwhile: answering nil now would lose the answer (the next
		// poll finds no job and reads 0).
	case wctx.Err() != nil:
		return wire.Nil, nil // timed out: still running
	default:
		return wire.EncodeInt(0), err
	}
	st.consumed(id, res)
	return wire.EncodeInt(int64(res.PrefixChunks)), nil
}

func (st *state) freeLookupLocks(req *request) ([]byte, error) {
	key, readers, err := lookupKey(req)
	if err != nil {
		return wire.Nil, err
	}
	if key.Start >= key.End {
		return wire.Nil, nil
	}
	first, last, err := st.chunkRange(key)
	if err != nil || first == last {
		return wire.Nil, err
	}
	hashes, err := st.chunkHashes(key, last)
	if err != nil {
		return wire.Nil, err
	}
	// The engine releases only locks this request's lookup holds, so a
	// duplicate or late free cannot take a lock from another reader.
	st.s.eng.ReleaseRead(key.RequestID, objectKeys(key.ModelName, int(key.WorldSize), key.CacheSalt, hashes[first:last], -1), readers)
	return wire.Nil, nil
}

func (st *state) endSession(req *request) ([]byte, error) {
	id, err := decodeRequestID(req.payloads[0])
	if err != nil {
		return wire.Nil, err
	}
	// A second frame (SessionEndInfo) is accepted and ignored.
	st.mu.Lock()
	sess := st.dropSessionLocked(id)
	delete(st.noJob, id)
	st.mu.Unlock()
	if sess == nil || len(sess.hashes) == 0 || sess.world < 1 {
		return wire.Nil, nil
	}
	st.s.eng.Touch(objectKeys(sess.model, sess.world, sess.salt, sess.hashes, -1))
	return wire.Nil, nil
}
