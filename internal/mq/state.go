package mq

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/logthrottle"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// hintEngineDriven ends every log line about a request this server cannot
// serve: the fix is on the vLLM side.
const hintEngineDriven = "set LMCACHE_MP_TRANSFER_MODE=engine_driven in vLLM's environment (same host, shared /dev/shm, non-hybrid model)"

// state is the server's protocol state: worker registrations, in-flight
// transfers, request sessions and lookups without a job. One mutex guards
// it; engine calls are made outside it.
type state struct {
	s   *Server
	log *slog.Logger

	mu       sync.Mutex
	regs     map[int64]*registration
	layouts  map[layoutKey]*layoutRef
	writes   map[pendingKey]*pendingWrite
	reads    map[pendingKey]*pendingRead
	sessions map[string]*session
	// sessionLRU orders sessions by last use, most recent at the front, so
	// the one to drop past Config.MaxSessions is found at once.
	sessionLRU  list.List
	maxSessions int // Config.MaxSessions, or its default
	// prefixes holds chunk hashes across requests; it has its own lock.
	prefixes *prefixCache
	// noJob holds the request ids (and when) whose LOOKUP started no
	// engine job (no layout, empty range, bad tokens): they answer 0 even
	// if an older, unconsumed job of the same id is still in the engine.
	noJob map[string]time.Time
	warns *logthrottle.Limiter // warnEvery's keys; forgotten after an hour by the sweep
	// lookups remembers what each running LOOKUP job asked for, so its
	// answer can be counted in the metrics when it is consumed. Entries of
	// jobs nobody polls are swept after the session TTL.
	lookups map[string]lookupMeta
	// storeSeq numbers PREPARE_STOREs for their write tags (storeTag).
	storeSeq atomic.Uint64
	// lmd holds the lmcache-driven registrations (lmdriven.go).
	lmd lmDriven
}

type lookupMeta struct {
	model, salt string
	chunks      int
	started     time.Time
}

type layoutKey struct {
	model string
	world int
}

type layoutRef struct {
	refs        int
	objectBytes int64
}

// registration is one engine-driven worker context (one vLLM worker).
type registration struct {
	instanceID int64
	model      string
	world      int
	slotShape  []wire.Int // the chunk object's shape, as slots carry it
	dtype      string
	objBytes   int64
	hybrid     string // non-empty: why this registration is not served
	tag        string // the prefix of the engine write tags of its stores (storeTag)
	lastPing   time.Time
	pinged     bool
}

// slot describes a chunk object of r's layout at a pool offset.
func (r *registration) slot(offset int64) wire.Slot {
	return wire.Slot{Offset: wire.Int(offset), Length: wire.Int(r.objBytes), Shape: r.slotShape, Dtype: r.dtype}
}

// pendingKey identifies an in-flight transfer as upstream does: the
// instance and its key with request_id left out. The token ids enter as a
// fingerprint, so two requests of one worker that cover the same range of
// different prompts do not take each other's reservation.
type pendingKey struct {
	instance   int64
	model      string
	world      int64
	worker     int64
	start, end int64
	salt       string
	tokens     uint64
}

type pendingWrite struct {
	tag     string
	keys    []objkey.Key
	created time.Time
}

type pendingRead struct {
	owner   string
	keys    []objkey.Key
	created time.Time
}

// session caches a request's chunk hashes; every request carries the full
// token prefix, so a lost session only costs rehashing.
//
// nodes and hashes are replaced, never modified in place, so a caller may
// keep sub-slices of them after unlocking.
type session struct {
	nodes    []*chunkNode // the chunks hashed so far, with their token ids
	hashes   [][]byte     // their chunk hashes
	model    string
	world    int
	salt     string
	lastUsed time.Time
	elem     *list.Element // in state.sessionLRU; its Value is the request id
}

func newState(s *Server) *state {
	st := &state{s: s, log: s.log, regs: map[int64]*registration{}, layouts: map[layoutKey]*layoutRef{},
		writes: map[pendingKey]*pendingWrite{}, reads: map[pendingKey]*pendingRead{},
		sessions: map[string]*session{}, noJob: map[string]time.Time{}, warns: logthrottle.New(),
		lookups: map[string]lookupMeta{}, prefixes: newPrefixCache(s.cfg.PrefixHashChunks, s.hasher),
		maxSessions: s.cfg.MaxSessions}
	if st.maxSessions <= 0 { // a Config that did not go through withDefaults
		st.maxSessions = Defaults().MaxSessions
	}
	return st
}

// warnOnce logs msg once per key (a peer and a kind of refusal) and hour,
// so a worker that sends a refused request every step does not flood the
// log. Keys are forgotten by the sweep, so peers that come and go do not
// grow the map.
func (st *state) warnOnce(key, msg string, args ...any) {
	st.warnEvery(key, time.Hour, msg, args...)
}

// warnEvery logs msg at most once per interval (up to an hour) per key
// (conditions that repeat while they last, like a full pool).
func (st *state) warnEvery(key string, every time.Duration, msg string, args ...any) {
	st.logEvery(slog.LevelWarn, key, every, msg, args...)
}

// logEvery is warnEvery at another level. A line after held-back ones
// says how many (suppressed).
func (st *state) logEvery(level slog.Level, key string, every time.Duration, msg string, args ...any) {
	st.warns.Log(st.log, level, key, every, msg, args...)
}

// ---- inline handlers (router goroutine) ----

// ping refreshes a worker's liveness and answers in the type the peer's
// generation declares (wire.PingType): a worker instance id the server
// does not know (reaped, or registered with a server that restarted) is
// "untracked", which gen3 clients are told so they register again.
func (st *state) ping(req *request, bootToken int64) []byte {
	tracked := true
	if len(req.payloads) == 1 {
		var inst wire.OptInt
		if err := wire.Unmarshal(req.payloads[0], &inst); err != nil {
			// Some adapters send an empty list; anything else is a bad frame.
			if n, _, lerr := msgp.ReadArrayHeaderBytes(req.payloads[0]); lerr != nil || n != 0 {
				st.s.malformed(req.peer.idString(), "payload", "PING: undecodable instance_id", "err", err)
				return wire.False
			}
		}
		if inst.Valid {
			st.mu.Lock()
			if r := st.regs[inst.V]; r != nil {
				r.lastPing, r.pinged = time.Now(), true
			} else if !st.lmd.touch(inst.V) {
				tracked = false
			}
			st.mu.Unlock()
		}
	}
	return wire.EncodePing(req.peer.profile.Ping, tracked, bootToken)
}

func (st *state) reportBlockAllocation(req *request) []byte {
	// Observability only upstream; decode to validate, then acknowledge.
	if len(req.payloads) == 3 {
		b := req.payloads[2]
		n, rest, err := msgp.ReadArrayHeaderBytes(b)
		for i := uint32(0); err == nil && i < n; i++ {
			var rec wire.BlockAllocationRecord
			rest, err = rec.UnmarshalMsg(rest)
		}
		if err != nil {
			st.log.Debug("REPORT_BLOCK_ALLOCATION: undecodable records", "err", err)
		}
	}
	return wire.Nil
}

// serve runs the handler of a transfer request (on its peer's FIFO
// goroutine) or a control request (on its own goroutine) and turns a
// failure into the request's negative reply.
func (st *state) serve(ctx context.Context, req *request) []byte {
	defer req.release()
	if engineDrivenOp(req.op) && st.s.cfg.TransferMode == ModeLMCacheDriven {
		return st.refuseTransferMode(req, ModeEngineDriven)
	}
	var resp []byte
	var err error
	_, span := st.traceStart(ctx, req)
	defer func() { st.traceEnd(span, req, err) }() // before release: it may re-read the key
	switch req.op {
	case wire.OpLookup:
		resp, err = st.lookup(req)
	case wire.OpQueryPrefetchStatus:
		resp, err = st.queryStatus(req, true)
	case wire.OpQueryPrefetchLookupHits:
		resp, err = st.queryStatus(req, false)
	case wire.OpWaitPrefetchStatus:
		resp, err = st.waitStatus(ctx, req)
	case wire.OpFreeLookupLocks:
		resp, err = st.freeLookupLocks(req)
	case wire.OpEndSession:
		resp, err = st.endSession(req)
	case wire.OpClear:
		res := st.s.eng.Clear()
		st.log.Info("CLEAR", "objects", res.Objects, "bytes", res.Bytes)
		resp = wire.Nil
	case wire.OpRegisterEngineDriven:
		resp, err = st.register(req)
	case wire.OpUnregisterEngineDriven:
		resp, err = st.unregister(req)
	case wire.OpPrepareStore:
		resp, err = st.prepareStore(req)
	case wire.OpCommitStore:
		resp, err = st.commitStore(req)
	case wire.OpPrepareRetrieve:
		resp, err = st.prepareRetrieve(req)
	case wire.OpCommitRetrieve:
		resp, err = st.commitRetrieve(req)
	default:
		err = fmt.Errorf("no handler for %s", req.op.EnumName()) // a dispatch bug
	}
	if err != nil {
		switch {
		case errors.Is(err, errRefused): // logged where it was decided
		case errors.Is(err, engine.ErrOutOfMemory):
			st.warnEvery("oom", 10*time.Second, "L1 pool full: stores are skipped until eviction frees room (logged at most every 10 s)",
				"op", req.op.EnumName(), "peer", req.peer.idString(), "err", err)
		default:
			// Once per peer, request type and 10 s: a worker whose every
			// step fails the same way (a PREPARE/COMMIT_RETRIEVE pair per
			// request) would otherwise write two lines per request. The
			// client gets the negative reply each time.
			st.warnEvery("failed/"+req.op.EnumName()+"/"+req.peer.idString(), protocolWarnEvery, "request failed (logged at most every 10 s per peer and request type)",
				"op", req.op.EnumName(), "peer", req.peer.idString(), "err", err)
		}
		if resp == nil {
			resp = wire.NegativeReply(req.op)
		}
	}
	return resp
}

// ---- transfer handlers (per-peer FIFO goroutine) ----

func (st *state) register(req *request) ([]byte, error) {
	var p wire.RegisterPayload
	if err := wire.Unmarshal(req.payloads[0], &p); err != nil {
		return registerError("undecodable payload: " + err.Error()), fmt.Errorf("decode payload: %w", err)
	}
	itemSize, ok := wire.DtypeSize(p.DtypeStr)
	switch {
	case !ok:
		return registerError("unsupported dtype_str " + p.DtypeStr), fmt.Errorf("unsupported dtype_str %q", p.DtypeStr)
	case p.WorldSize < 1 || p.WorldSize > 255 || p.NumLayers < 1 || p.HiddenDimSize < 1:
		msg := fmt.Sprintf("invalid layout: world_size=%d num_layers=%d hidden_dim_size=%d", p.WorldSize, p.NumLayers, p.HiddenDimSize)
		return registerError(msg), errors.New(msg)
	}
	if err := (objkey.Key{ModelName: p.ModelName}).Validate(); err != nil {
		return registerError(err.Error()), err
	}
	shape := wire.ObjectShape(int64(p.NumLayers), int64(st.s.cfg.ChunkSize), int64(p.HiddenDimSize), p.UseMLA)
	objBytes := wire.ChunkObjectBytes(int64(p.NumLayers), int64(st.s.cfg.ChunkSize), int64(p.HiddenDimSize), p.UseMLA, itemSize)
	if objBytes < 0 { // refused before it replaces an earlier registration
		msg := fmt.Sprintf("invalid layout: the chunk objects of num_layers=%d hidden_dim_size=%d overflow int64", p.NumLayers, p.HiddenDimSize)
		return registerError(msg), errors.New(msg)
	}
	pool := st.s.eng.Pool()
	if pool.Name == "" {
		st.warnOnce("noshm", "a worker registered but the L1 pool is not shared memory; set --shm-name (it will fall back to the pickle transfer, which is refused)")
	}
	hybrid, why := p.Hybrid()
	now := time.Now()
	lk := layoutKey{p.ModelName, int(p.WorldSize)}

	st.mu.Lock()
	old := st.regs[int64(p.InstanceID)]
	// Only the same layout is a mere refresh: one of another dtype or
	// shape whose objects have the same size still replaces the old, or
	// its slots would carry the old shape and dtype.
	if old != nil && old.model == p.ModelName && old.world == int(p.WorldSize) && old.objBytes == objBytes && (old.hybrid != "") == hybrid &&
		old.dtype == p.DtypeStr && sameShape(old.slotShape, shape) {
		old.lastPing = now // re-registration refreshes liveness
		st.mu.Unlock()
		return registerReply(pool), nil
	}
	if lr := st.layouts[lk]; !hybrid && lr != nil && lr.refs > 0 && lr.objectBytes != objBytes {
		st.mu.Unlock()
		msg := fmt.Sprintf("layout conflict for (%s, world_size %d): registered chunk objects are %d bytes, this worker's are %d", p.ModelName, p.WorldSize, lr.objectBytes, objBytes)
		return registerError(msg), errors.New(msg)
	}
	r := &registration{instanceID: int64(p.InstanceID), model: p.ModelName, world: int(p.WorldSize),
		slotShape: make([]wire.Int, len(shape)), dtype: p.DtypeStr, objBytes: objBytes, tag: fmt.Sprintf("instance-%d", p.InstanceID), lastPing: now}
	for i, d := range shape {
		r.slotShape[i] = wire.Int(d)
	}
	var prev engine.Layout
	var prevErr, layoutErr error
	if hybrid {
		r.hybrid = why
	} else {
		lr := st.layouts[lk]
		if lr == nil {
			lr = &layoutRef{objectBytes: objBytes}
			prev, prevErr = st.s.eng.Layout(r.model, r.world)
		}
		// Under st.mu, so the engine's reference count moves in step with
		// st.layouts (the engine's layout lock is a leaf).
		meta := map[string]any{"shape": shape, "dtype": p.DtypeStr, "chunk_size": st.s.cfg.ChunkSize,
			"num_layers": int64(p.NumLayers), "hidden_dim_size": int64(p.HiddenDimSize), "use_mla": p.UseMLA, "format": kvFormat(p.UseMLA)}
		layoutErr = st.s.eng.AcquireLayout(engine.Layout{ModelName: r.model, WorldSize: r.world, ObjectBytes: objBytes, Meta: meta})
		if layoutErr == nil {
			st.layouts[lk] = lr
			lr.refs++
		}
	}
	// The earlier registration goes only once this one holds its layout:
	// a refused re-registration leaves the worker's registration and its
	// open transfers as they were. Dropped after the acquire, a layout the
	// two share keeps its reference count above zero throughout.
	var dropped transfers
	if layoutErr == nil {
		if old != nil {
			dropped = st.dropLocked(old)
		}
		st.regs[r.instanceID] = r
	}
	st.mu.Unlock()
	dropped.release(st)
	if layoutErr != nil {
		// Nothing was registered: a success reply would send the worker
		// on to transfers that are all refused as unregistered.
		err := fmt.Errorf("register layout: %w", layoutErr)
		return registerError(err.Error()), err
	}

	if hybrid {
		st.log.Warn("hybrid (multi-group) model registered: its stores and retrieves are refused and lookups report 0 hits; "+hintEngineDriven+" with a non-hybrid model, or --disable-hybrid-kv-cache-manager",
			"instance_id", r.instanceID, "model", r.model, "reason", why)
		return registerReply(pool), nil
	}
	if prevErr == nil && prev.ObjectBytes != 0 && prev.ObjectBytes != objBytes {
		st.log.Warn("a worker's layout replaces a different one (from --register-model or an earlier worker); data stored under the old size is not retrievable by this worker",
			"model", r.model, "world_size", r.world, "old_object_bytes", prev.ObjectBytes, "object_bytes", objBytes)
	}
	st.log.Info("worker registered (engine-driven, shared memory)", "instance_id", r.instanceID, "peer", req.peer.idString(),
		"model", r.model, "world_size", r.world, "shape", shape, "dtype", r.dtype, "object_bytes", objBytes, "shm_name", pool.Name)
	return registerReply(pool), nil
}

// sameShape reports whether a registration's slot shape is shape.
func sameShape(slot []wire.Int, shape []int64) bool {
	return slices.EqualFunc(slot, shape, func(a wire.Int, b int64) bool { return int64(a) == b })
}

func kvFormat(mla bool) string {
	if mla {
		return "KV_MLA_LTD"
	}
	return "KV_2LTD"
}

func registerReply(pool engine.PoolInfo) []byte {
	return wire.Marshal(&wire.RegisterResponse{ShmName: pool.Name, PoolSize: wire.Int(pool.Size), Error: wire.Nil})
}

// registerError refuses a registration. shm_name "" is the only refusal a
// client understands (it then tries the pickle path, which is refused too).
func registerError(msg string) []byte {
	return wire.Marshal(&wire.RegisterResponse{Error: wire.AppendOptString(nil, msg, true)})
}

// dropLocked removes r and its layout reference, here and in the engine
// (whose layout lock is a leaf, so this is safe under st.mu): after the
// last one lookups of the model report no hits, unless --register-model
// gave it a layout. It takes r's transfers in the same critical section,
// so that a registration of the same instance made once st.mu is free
// keeps its own; the caller releases them (engine calls) after unlocking.
func (st *state) dropLocked(r *registration) transfers {
	delete(st.regs, r.instanceID)
	taken := st.takeTransfersLocked(func(k pendingKey, _ time.Time) bool { return k.instance == r.instanceID })
	if r.hybrid != "" {
		return taken
	}
	lk := layoutKey{r.model, r.world}
	if lr := st.layouts[lk]; lr != nil {
		st.s.eng.ReleaseLayout(r.model, r.world)
		lr.refs--
		if lr.refs <= 0 {
			delete(st.layouts, lk)
		}
	}
	return taken
}

// transfers are pending transfers taken out of the state, to be released
// in the engine once st.mu is unlocked.
type transfers struct {
	writes []*pendingWrite
	reads  []*pendingRead
}

// takeTransfersLocked removes the transfers for which drop is true.
func (st *state) takeTransfersLocked(drop func(k pendingKey, created time.Time) bool) transfers {
	var t transfers
	for k, w := range st.writes {
		if drop(k, w.created) {
			t.writes = append(t.writes, w)
			delete(st.writes, k)
		}
	}
	for k, r := range st.reads {
		if drop(k, r.created) {
			t.reads = append(t.reads, r)
			delete(st.reads, k)
		}
	}
	return t
}

// release aborts the staged writes and releases the pending reads, and
// returns how many transfers there were.
func (t transfers) release(st *state) int {
	for _, w := range t.writes {
		st.s.eng.AbortWrite(w.tag, w.keys)
	}
	for _, r := range t.reads {
		st.s.eng.ReleaseRead(r.owner, r.keys, 1)
	}
	return len(t.writes) + len(t.reads)
}

// dropTransfers aborts the staged writes and releases the pending reads for
// which drop is true, and returns how many it dropped.
func (st *state) dropTransfers(drop func(k pendingKey, created time.Time) bool) int {
	st.mu.Lock()
	t := st.takeTransfersLocked(drop)
	st.mu.Unlock()
	return t.release(st)
}

func (st *state) unregister(req *request) ([]byte, error) {
	var inst wire.Int
	if err := wire.Unmarshal(req.payloads[0], &inst); err != nil {
		return wire.Nil, fmt.Errorf("decode instance_id: %w", err)
	}
	st.mu.Lock()
	r := st.regs[int64(inst)]
	var taken transfers
	if r != nil {
		taken = st.dropLocked(r)
	}
	st.mu.Unlock()
	if r == nil {
		st.log.Info("UNREGISTER for an unknown instance", "instance_id", int64(inst))
		return wire.Nil, nil
	}
	taken.release(st)
	st.log.Info("worker unregistered", "instance_id", r.instanceID, "model", r.model, "world_size", r.world)
	return wire.Nil, nil
}

// workerRequest decodes the (key, instance_id) head of a transfer request
// and checks it against the instance's registration.
func (st *state) workerRequest(req *request) (*wire.Key, *registration, error) {
	key, err := req.decodeKey()
	if err != nil {
		return nil, nil, err
	}
	// objkey.FanOut refuses keys with a bad salt; refuse the request
	// before any key is built.
	if err := objkey.ValidateSalt(key.CacheSalt); err != nil {
		return nil, nil, err
	}
	var inst wire.Int
	if err := wire.Unmarshal(req.payloads[1], &inst); err != nil {
		return nil, nil, fmt.Errorf("decode instance_id: %w", err)
	}
	st.mu.Lock()
	r := st.regs[int64(inst)]
	if r != nil {
		r.lastPing = time.Now() // a working worker is alive
	}
	st.mu.Unlock()
	switch {
	case r == nil:
		st.warnEvery(fmt.Sprintf("unregistered/%d", int64(inst)), protocolWarnEvery,
			"transfer request from an instance that is not registered (reaped or never registered); its transfers are refused until it registers again",
			"op", req.op.EnumName(), "instance_id", int64(inst), "peer", req.peer.idString())
		return key, nil, errRefused
	case r.hybrid != "":
		st.warnOnce(fmt.Sprintf("hybrid/%d", r.instanceID), "refused transfer for a hybrid (multi-group) model registration; "+hintEngineDriven+" with a non-hybrid model",
			"instance_id", r.instanceID, "reason", r.hybrid)
		return key, nil, errRefused
	case key.ModelName != r.model || int(key.WorldSize) != r.world:
		return key, nil, fmt.Errorf("key (%s, world_size %d) does not match the registration (%s, %d)", key.ModelName, key.WorldSize, r.model, r.world)
	case !key.WorkerID.Valid || key.WorkerID.V < 0 || key.WorkerID.V >= int64(r.world):
		return key, nil, fmt.Errorf("worker_id %s out of range for world_size %d", key.WorkerID, r.world)
	}
	return key, r, nil
}

// errRefused marks a refusal that was already logged.
var errRefused = errors.New("refused")

func pkOf(inst int64, k *wire.Key) pendingKey {
	return pendingKey{instance: inst, model: k.ModelName, world: int64(k.WorldSize), worker: k.WorkerID.V,
		start: int64(k.Start), end: int64(k.End), salt: k.CacheSalt, tokens: tokenFingerprint(k.TokenIDs)}
}

var fingerprintSeed = maphash.MakeSeed()

// tokenFingerprint hashes token ids without allocating.
func tokenFingerprint(ids []wire.Int) uint64 {
	var h maphash.Hash
	h.SetSeed(fingerprintSeed)
	var buf [512]byte
	n := 0
	for _, t := range ids {
		binary.LittleEndian.PutUint64(buf[n:], uint64(t))
		if n += 8; n == len(buf) {
			_, _ = h.Write(buf[:])
			n = 0
		}
	}
	_, _ = h.Write(buf[:n])
	return h.Sum64()
}

// takePending removes and returns the transfer pending under pk (nil if
// none).
func takePending[T any](st *state, m map[pendingKey]*T, pk pendingKey) *T {
	st.mu.Lock()
	defer st.mu.Unlock()
	v := m[pk]
	delete(m, pk)
	return v
}

// chunkRange is the chunk index range [first, last) that a key's [start,
// end) covers: full chunks only.
func (st *state) chunkRange(k *wire.Key) (int, int, error) {
	c := int64(st.s.cfg.ChunkSize)
	start, end := int64(k.Start), int64(k.End)
	if start < 0 || end < start || start%c != 0 {
		return 0, 0, fmt.Errorf("range [%d, %d) is not chunk-aligned (chunk size %d)", start, end, c)
	}
	if end > int64(len(k.TokenIDs)) {
		return 0, 0, fmt.Errorf("range end %d beyond the %d token ids sent", end, len(k.TokenIDs))
	}
	return int(start / c), int(end / c), nil
}

// chunkHashes returns the hashes of chunks [0, last) of the key's tokens.
// It hashes only what it cannot reuse: first the chunks of the request's
// session (its earlier LOOKUP or transfer), then the chunks other requests
// hashed behind the same prefix (prefixCache), both compared token by
// token; the rest is hashed and cached.
func (st *state) chunkHashes(k *wire.Key, last int) ([][]byte, error) {
	c := st.s.cfg.ChunkSize
	ids := k.TokenIDs[:last*c]
	nodes := make([]*chunkNode, 0, last)
	st.mu.Lock()
	if sess := st.sessions[k.RequestID]; sess != nil {
		reuse := 0
		for reuse < len(sess.nodes) && reuse < last && sameTokens(sess.nodes[reuse].tokens, ids[reuse*c:(reuse+1)*c]) {
			reuse++
		}
		nodes = append(nodes, sess.nodes[:reuse]...)
	}
	st.mu.Unlock()
	nodes = st.prefixes.extend(nodes, k.CacheSalt, ids, c)

	if reuse := len(nodes); reuse < last {
		// Only the ids no session or cached chunk matched are checked (a
		// third of the reuse path's time when every chunk matches): a
		// matched id equals a uint32 the cache holds, so it is in range,
		// and the first bad id is at the index a check of all would find.
		tokens := make([]uint32, 0, (last-reuse)*c)
		for i, t := range ids[reuse*c:] {
			if t < 0 || t > math.MaxUint32 {
				return nil, fmt.Errorf("%w: token_ids[%d]=%d", tokenhash.ErrTokenRange, reuse*c+i, t)
			}
			tokens = append(tokens, uint32(t))
		}
		h := st.s.hasher
		if reuse > 0 {
			var err error
			if h, err = tokenhash.New(h.Algorithm(), c, tokenhash.WithRoot(nodes[reuse-1].hash)); err != nil {
				return nil, err
			}
		}
		for i, sum := range h.ChunkHashesU32(tokens) {
			// Each node owns its tokens, so a cached chunk pins 1 KiB
			// (at chunk size 256), never the whole prompt.
			var parent *chunkNode
			if j := reuse + i; j > 0 {
				parent = nodes[j-1]
			}
			nodes = append(nodes, &chunkNode{id: st.prefixes.idOf(parent, k.CacheSalt, ids[(reuse+i)*c:(reuse+i+1)*c]),
				salt: k.CacheSalt, tokens: slices.Clone(tokens[i*c : (i+1)*c]), hash: sum})
		}
		st.prefixes.add(nodes, reuse)
	}
	hashes := make([][]byte, len(nodes))
	for i, n := range nodes {
		hashes[i] = n.hash
	}

	st.mu.Lock()
	sess := st.sessions[k.RequestID]
	if sess == nil {
		sess = st.newSessionLocked(k.RequestID)
	} else {
		st.sessionLRU.MoveToFront(sess.elem)
	}
	if len(nodes) >= len(sess.nodes) {
		sess.nodes, sess.hashes = nodes, hashes
	}
	sess.model, sess.world, sess.salt, sess.lastUsed = k.ModelName, int(k.WorldSize), k.CacheSalt, time.Now()
	st.mu.Unlock()
	return hashes, nil
}

func sameTokens(a []uint32, b []wire.Int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if int64(a[i]) != int64(b[i]) {
			return false
		}
	}
	return true
}

// objectKeys builds the object keys of chunks with objkey.FanOut: every
// rank of each chunk, chunk-major (worker < 0: what LOOKUP locks), or one
// worker's rank, object group 0. The model name and salt are the
// request's, validated where it was decoded, so FanOut cannot fail here;
// if it did, no key is returned and the request simply misses.
func objectKeys(model string, world int, salt string, hashes [][]byte, worker int) []objkey.Key {
	keys, err := objkey.FanOut(hashes, model, world, worker, nil, salt)
	if err != nil || len(keys) != 1 {
		return nil
	}
	return keys[0]
}

// workerKeys is objectKeys for a worker request's chunks [first, last).
func workerKeys(k *wire.Key, hashes [][]byte, first, last int) []objkey.Key {
	return objectKeys(k.ModelName, int(k.WorldSize), k.CacheSalt, hashes[first:last], int(k.WorkerID.V))
}

// storeTag is the engine write tag of one PREPARE_STORE of r: its own, so
// that no two transfers share a staging buffer. The engine hands a tag's
// expired buffer to that tag's next reservation of the key; under one tag
// per worker a second request sharing a chunk with a first whose lease ran
// out took over the first's buffer, and the first's late COMMIT or abort
// then published or freed it while the second worker was writing into it.
// Two transfers of one chunk now write two buffers; the second commit
// finds the chunk resident and frees its copy.
func (st *state) storeTag(r *registration) string {
	return r.tag + "/" + strconv.FormatUint(st.storeSeq.Add(1), 10)
}

func (st *state) prepareStore(req *request) ([]byte, error) {
	key, r, err := st.workerRequest(req)
	if err != nil {
		return nil, err
	}
	if err := objkey.ValidateSalt(key.CacheSalt); err != nil {
		return nil, err
	}
	first, last, err := st.chunkRange(key)
	if err != nil {
		return nil, err
	}
	mask, err := key.NullChunks()
	if err != nil {
		return nil, err
	}
	hashes, err := st.chunkHashes(key, last)
	if err != nil {
		return nil, err
	}
	st.s.bindKVTokens(key, hashes, first, last)
	// Chunks backed only by vLLM's null block are not stored.
	var null []bool
	if len(mask) > 0 {
		null = mask[0]
	}
	keys := workerKeys(key, hashes, first, last)
	idx := make([]int, 0, len(keys))
	kept := keys[:0]
	for i, k := range keys {
		if i < len(null) && null[i] {
			continue
		}
		kept, idx = append(kept, k), append(idx, i)
	}
	keys = kept

	pk := pkOf(r.instanceID, key)
	if old := takePending(st, st.writes, pk); old != nil { // a retried PREPARE replaces the earlier reservation
		st.s.eng.AbortWrite(old.tag, old.keys)
	}
	sizes := make([]int64, len(keys))
	for i := range sizes {
		sizes[i] = r.objBytes
	}
	tag := st.storeTag(r)
	slots, err := st.s.eng.ReserveWrite(tag, keys, sizes)
	if err != nil {
		return nil, fmt.Errorf("reserve %d chunks of %d bytes: %w", len(keys), r.objBytes, err)
	}
	outSlots := make([]wire.Slot, 0, len(slots))
	outIdx := make([]wire.Int, 0, len(slots))
	reserved := make([]objkey.Key, 0, len(slots))
	for i, sl := range slots {
		if !sl.Valid() {
			continue
		}
		outSlots = append(outSlots, r.slot(sl.Offset))
		outIdx = append(outIdx, wire.Int(idx[i]))
		reserved = append(reserved, keys[i])
	}
	if len(reserved) > 0 {
		st.mu.Lock()
		st.writes[pk] = &pendingWrite{tag: tag, keys: reserved, created: time.Now()}
		st.mu.Unlock()
	}
	return wire.EncodeStoreReply(outSlots, outIdx), nil
}

func (st *state) commitStore(req *request) ([]byte, error) {
	key, r, err := st.workerRequest(req)
	if err != nil {
		return nil, err
	}
	data, rest, err := msgp.ReadBytesZC(req.payloads[2])
	if err != nil || len(rest) != 0 {
		return nil, fmt.Errorf("decode data: %w", errors.Join(err, errTrailing(rest)))
	}
	w := takePending(st, st.writes, pkOf(r.instanceID, key))
	if len(data) > 0 {
		if w != nil {
			st.s.eng.AbortWrite(w.tag, w.keys)
		}
		st.warnOnce(fmt.Sprintf("pickle/%d", r.instanceID), "refused a pickle-mode COMMIT_STORE: the worker could not use the shared-memory pool; check that it can open /dev/shm/"+st.s.eng.Pool().Name+" and "+hintEngineDriven,
			"instance_id", r.instanceID, "bytes", len(data))
		return wire.False, nil
	}
	if w == nil {
		return wire.False, fmt.Errorf("COMMIT_STORE without a pending PREPARE_STORE for [%d, %d)", key.Start, key.End)
	}
	n, err := st.commitWrite(req, w.tag, w.keys)
	if err != nil {
		return wire.False, fmt.Errorf("commit %d chunks (%d published): %w", len(w.keys), n, err)
	}
	st.countEngineDriven("store", len(w.keys), r.objBytes)
	return wire.True, nil
}

func errTrailing(rest []byte) error {
	if len(rest) == 0 {
		return nil
	}
	return fmt.Errorf("%d trailing bytes", len(rest))
}

func (st *state) prepareRetrieve(req *request) ([]byte, error) {
	key, r, err := st.workerRequest(req)
	if err != nil {
		return nil, err
	}
	first, last, err := st.chunkRange(key)
	if err != nil {
		return nil, err
	}
	if first == last {
		return nil, fmt.Errorf("empty retrieve range [%d, %d)", key.Start, key.End)
	}
	hashes, err := st.chunkHashes(key, last)
	if err != nil {
		return nil, err
	}
	keys := workerKeys(key, hashes, first, last)
	pk := pkOf(r.instanceID, key)
	// The same range of another request (the key leaves request_id out)
	// abandons that request's pending read: its lock goes before the
	// chunks are checked, so this read is served only under locks of its
	// own. A retried PREPARE of the same request keeps its pending read
	// until the retry's replaces it: the one lock it holds is released by
	// the one COMMIT to come (released here, the retry found the chunks
	// unlocked and failed).
	st.mu.Lock()
	abandoned := st.reads[pk]
	if abandoned != nil && abandoned.owner != key.RequestID {
		delete(st.reads, pk)
	} else {
		abandoned = nil
	}
	st.mu.Unlock()
	if abandoned != nil {
		st.s.eng.ReleaseRead(abandoned.owner, abandoned.keys, 1)
	}
	slots, err := st.s.eng.ReadSlots(keys)
	if err != nil {
		// Nothing is handed out; the chunks' locks stay with the lookup and
		// are freed by FREE_LOOKUP_LOCKS or their TTL.
		return nil, fmt.Errorf("retrieve %d chunks: %w", len(keys), err)
	}
	out := make([]wire.Slot, len(slots))
	for i, sl := range slots {
		out[i] = r.slot(sl.Offset)
	}
	st.mu.Lock()
	st.reads[pk] = &pendingRead{owner: key.RequestID, keys: keys, created: time.Now()}
	st.mu.Unlock()
	return wire.EncodeRetrieveReply(out), nil
}

func (st *state) commitRetrieve(req *request) ([]byte, error) {
	key, r, err := st.workerRequest(req)
	if err != nil {
		return nil, err
	}
	rd := takePending(st, st.reads, pkOf(r.instanceID, key))
	if rd == nil {
		return wire.False, fmt.Errorf("COMMIT_RETRIEVE without a pending PREPARE_RETRIEVE for [%d, %d)", key.Start, key.End)
	}
	st.s.eng.ReleaseRead(rd.owner, rd.keys, 1)
	st.countEngineDriven("retrieve", len(rd.keys), r.objBytes)
	return wire.True, nil
}

// ---- sweeping: sessions, lookups without a job, stale transfers, reaping ----

// Upstream's names for the two loops (research mp_server.md 8.1).
const (
	reaperLoopName  = "lmcache-mp-worker-reaper"
	sessionLoopName = "SessionManager-cleanup-thread-mq"
)

// loops registers the reaper and the session sweep in the server's
// periodic registry and returns them for Run to start. The reaper is High
// (upstream: medium) so that a stuck reaper, which keeps dead workers'
// reservations and read locks, shows in /periodic-threads-health.
func (st *state) loops() []*periodic.Loop {
	cfg := st.s.cfg
	reapEvery := time.Second
	if reap := cfg.WorkerReapTimeout; reap > 0 && reap/4 < reapEvery {
		reapEvery = max(reap/4, 10*time.Millisecond)
	}
	sweepEvery := time.Second
	if ttl := cfg.SessionTTL; ttl > 0 && ttl/4 < sweepEvery {
		sweepEvery = max(ttl/4, 10*time.Millisecond)
	}
	reg := st.s.loops
	return []*periodic.Loop{
		reg.Register(reaperLoopName, periodic.High, reapEvery, reapEvery, func(context.Context) (periodic.Summary, error) {
			reaped, dropped := st.reap(time.Now())
			return periodic.Summary{Message: fmt.Sprintf("reaped=%d abandoned_transfers=%d", reaped, dropped)}, nil
		}),
		reg.Register(sessionLoopName, periodic.Medium, sweepEvery, sweepEvery, func(context.Context) (periodic.Summary, error) {
			n := st.sweepSessions(time.Now())
			return periodic.Summary{Message: fmt.Sprintf("expired_sessions=%d", n)}, nil
		}),
	}
}

// newSessionLocked opens id's session, dropping the least recently used
// one when MaxSessions are open. st.mu is held.
func (st *state) newSessionLocked(id string) *session {
	for len(st.sessions) >= st.maxSessions {
		oldest := st.sessionLRU.Back()
		if oldest == nil {
			break
		}
		st.dropSessionLocked(oldest.Value.(string))
		st.s.metrics.ZMQEvictedSessions.Inc()
	}
	sess := &session{}
	sess.elem = st.sessionLRU.PushFront(id)
	st.sessions[id] = sess
	return sess
}

// dropSessionLocked forgets id's session, if any. st.mu is held.
func (st *state) dropSessionLocked(id string) *session {
	sess := st.sessions[id]
	if sess != nil {
		st.sessionLRU.Remove(sess.elem)
		delete(st.sessions, id)
	}
	return sess
}

// sweepSessions forgets idle sessions, old warnings and lookup records
// nobody polled, and returns how many sessions expired.
func (st *state) sweepSessions(now time.Time) int {
	ttl := st.s.cfg.SessionTTL
	n := 0
	st.mu.Lock()
	defer st.mu.Unlock()
	for id, s := range st.sessions {
		if now.Sub(s.lastUsed) > ttl {
			st.dropSessionLocked(id)
			n++
		}
	}
	st.warns.Forget(time.Hour)
	for id, t := range st.noJob {
		if now.Sub(t) > ttl {
			delete(st.noJob, id)
		}
	}
	for id, m := range st.lookups {
		if now.Sub(m.started) > ttl {
			delete(st.lookups, id)
		}
	}
	return n
}

// reap drops silent worker registrations with their transfers, and
// transfers whose COMMIT never came; both are counted in the metrics.
func (st *state) reap(now time.Time) (reapedN, abandoned int) {
	cfg := st.s.cfg
	var reaped []*registration
	var taken []transfers
	st.mu.Lock()
	for _, r := range st.regs {
		limit := cfg.WorkerRegistrationGrace
		if r.pinged {
			limit = cfg.WorkerReapTimeout
		}
		if limit > 0 && now.Sub(r.lastPing) > limit {
			reaped = append(reaped, r)
			taken = append(taken, st.dropLocked(r))
		}
	}
	st.mu.Unlock()
	for i, r := range reaped {
		st.s.metrics.ZMQReapedWorkers.Inc()
		n := taken[i].release(st)
		st.s.metrics.ZMQAbandonedTransfers.Add(float64(n))
		abandoned += n
		st.log.Warn("reaped a silent worker registration (counted in lmcache_mp_zmq_reaped_workers_total)", "instance_id", r.instanceID, "model", r.model,
			"world_size", r.world, "silent_for", now.Sub(r.lastPing).Round(time.Millisecond), "had_pinged", r.pinged, "dropped_transfers", n)
	}
	lmd := st.reapLMDriven(now)
	// A PREPARE whose COMMIT never came (a worker that failed between the
	// two but stays registered) would otherwise stay pending, and keep its
	// reservation or read lock, until the worker unregisters.
	if n := st.dropTransfers(func(_ pendingKey, created time.Time) bool { return now.Sub(created) > cfg.SessionTTL }); n > 0 {
		st.s.metrics.ZMQAbandonedTransfers.Add(float64(n))
		abandoned += n
		st.log.Warn("dropped transfers whose COMMIT never came (counted in lmcache_mp_zmq_abandoned_transfers_total)", "count", n, "older_than", cfg.SessionTTL)
	}
	return len(reaped) + lmd, abandoned
}

// Status is the data path's part of GET /status: upstream's
// active_sessions, registered_gpu_ids (here: the instance ids of the
// registered workers of both paths) and cache_context_meta (the
// lmcache-driven contexts), plus transfers and lookups in flight.
func (s *Server) Status() httpapi.DataPathStatus {
	st := s.st
	st.mu.Lock()
	defer st.mu.Unlock()
	ids := make([]int64, 0, len(st.regs))
	for id := range st.regs {
		ids = append(ids, id)
	}
	meta, ids := st.lmdStatus(ids)
	return httpapi.DataPathStatus{
		ActiveSessions:   len(st.sessions),
		PendingTransfers: len(st.writes) + len(st.reads),
		PendingLookups:   len(st.lookups),
		RegisteredGPUIDs: ids,
		CacheContextMeta: meta,
		KVEvents:         s.kvEventsStatus(),
	}
}
