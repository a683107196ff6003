package mq

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/kvcopy"
	"github.com/lmcache-go/lmcache/internal/kvcuda"
	"github.com/lmcache-go/lmcache/internal/kvlayout"
	"github.com/lmcache-go/lmcache/internal/kvwrap"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// The lmcache-driven path (REGISTER_KV_CACHE / STORE / RETRIEVE /
// UNREGISTER_KV_CACHE): the worker registers its paged KV cache as tensor
// wrappers and the server copies between its blocks and L1: CPU
// shared-memory wrappers with internal/kvcopy, CUDA IPC wrappers with
// internal/kvcuda (built and tested on its fake driver; not yet run on a
// GPU). Objects have the engine-driven layout, so the two paths read each
// other's data.
//
// All four requests run on the peer's transfer FIFO, so one worker's
// registration, stores and retrieves stay in order.

// maxLMDLayers bounds the wrappers of one REGISTER_KV_CACHE.
const maxLMDLayers = kvcopy.MaxSegments

// maxBlockIDs bounds the block ids of one STORE or RETRIEVE (all groups).
const maxBlockIDs = 1 << 20

// lmDriven holds the lmcache-driven registrations by instance id. Its
// mutex is never held while st.mu is taken.
type lmDriven struct {
	mu   sync.Mutex
	regs map[int64]*lmdReg

	// commits tracks CUDA stores answered but not yet committed.
	commits pendingCommits

	// The CUDA driver, loaded (and the L1 pool pinned) at the first CUDA
	// registration; the pool is unpinned at stop.
	cudaOnce sync.Once
	cuda     kvcuda.Driver
	cudaErr  error
	pinned   []byte
}

// cudaDriver returns the CUDA driver (Config.CUDA, else libcuda.so.1),
// pinning the whole L1 pool with it the first time.
func (st *state) cudaDriver() (kvcuda.Driver, error) {
	l := &st.lmd
	l.cudaOnce.Do(func() {
		l.cuda = st.s.cfg.CUDA
		if l.cuda == nil {
			d, err := kvcuda.LoadDriver()
			if err != nil {
				l.cudaErr = err
				return
			}
			l.cuda = d
		}
		pb, ok := st.s.eng.(poolBytes)
		if !ok {
			return
		}
		pool := pb.Bytes(engine.Slot{Offset: 0, Size: st.s.eng.Pool().Size})
		if err := kvcuda.Pin(l.cuda, pool); err != nil {
			// Copies from pageable memory still work, staged by the driver.
			st.log.Warn("could not pin the L1 pool for CUDA copies; lmcache-driven GPU transfers run slower", "err", err)
			return
		}
		l.pinned = pool
		st.log.Info("L1 pool pinned for CUDA copies", "bytes", len(pool))
	})
	return l.cuda, l.cudaErr
}

// LMDCommitWait bounds how long a LOOKUP or RETRIEVE waits for the
// commit of a CUDA STORE of its chunks that was already answered: such a
// store commits when its copies complete, after the reply (as upstream's
// host callback does), and without the wait a LOOKUP sent right after
// the reply would miss chunks the worker was told are stored. Copies of
// one request take milliseconds; past the deadline the LOOKUP goes on
// without them (a miss, as upstream), counted in
// lmcache_mp_transfer_commit_waits_total{outcome="deadline"}.
const LMDCommitWait = 2 * time.Second

// pendingCommits maps the chunk keys of answered, uncommitted CUDA stores
// to their store. Waiters take the done channels under mu and wait
// outside it; a store's completion goroutine closes its channel after the
// commit (or abort), so a waiter that wakes sees the final state.
type pendingCommits struct {
	// stores counts the stores in flight: zero keeps LOOKUP on its
	// inline path without taking mu.
	stores atomic.Int64

	mu   sync.Mutex
	keys map[objkey.Key]*pendingStore

	// deadline (ns) overrides LMDCommitWait and onWait is called when a
	// waiter starts waiting (both for tests, lmdriven_export_test.go;
	// deadline may change while the server runs).
	deadline atomic.Int64
	onWait   func(op string)
}

// pendingStore is one CUDA store between its reply and its commit.
type pendingStore struct {
	done chan struct{}
}

// add records a store of keys about to be submitted.
func (p *pendingCommits) add(keys []objkey.Key) *pendingStore {
	ps := &pendingStore{done: make(chan struct{})}
	p.stores.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keys == nil {
		p.keys = map[objkey.Key]*pendingStore{}
	}
	for _, k := range keys {
		p.keys[k] = ps // a later store of the same key is the one to wait for
	}
	return ps
}

// finish ends ps (committed, aborted or never submitted) and wakes its
// waiters.
func (p *pendingCommits) finish(ps *pendingStore, keys []objkey.Key) {
	p.mu.Lock()
	for _, k := range keys {
		if p.keys[k] == ps {
			delete(p.keys, k)
		}
	}
	p.mu.Unlock()
	close(ps.done)
	p.stores.Add(-1)
}

// busy reports whether any store is between its reply and its commit.
func (p *pendingCommits) busy() bool { return p.stores.Load() > 0 }

// of returns the done channels of the pending stores covering keys.
func (p *pendingCommits) of(keys []objkey.Key) []chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []chan struct{}
	seen := map[*pendingStore]bool{}
	for _, k := range keys {
		if ps := p.keys[k]; ps != nil && !seen[ps] {
			seen[ps] = true
			out = append(out, ps.done)
		}
	}
	return out
}

// lmdAwaitCommits waits, up to LMDCommitWait, for the answered CUDA
// stores of any of keys to commit, so op (lookup, retrieve) sees what
// their replies promised. Without such stores it returns at once. The
// wait is counted in lmcache_mp_transfer_commit_waits_total{op, outcome}
// (committed, deadline; shutdown when the server stops meanwhile).
// mayWait false (a LOOKUP answered on the socket goroutine, which a store
// of another peer began pending after the hand-off check) counts
// not_waited and goes on at once: that goroutine must never block.
func (st *state) lmdAwaitCommits(op string, keys []objkey.Key, mayWait bool) {
	p := &st.lmd.commits
	if !p.busy() {
		return
	}
	waits := p.of(keys)
	if len(waits) == 0 {
		return
	}
	if !mayWait {
		st.s.metrics.TransferCommitWaits.WithLabelValues(op, "not_waited").Inc()
		return
	}
	if p.onWait != nil {
		p.onWait(op)
	}
	d := LMDCommitWait
	if v := p.deadline.Load(); v > 0 {
		d = time.Duration(v)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	outcome := "committed"
wait:
	for _, ch := range waits {
		select {
		case <-ch:
		case <-timer.C:
			outcome = "deadline"
			break wait
		case <-st.s.handlerCtx.Done():
			outcome = "shutdown"
			break wait
		}
	}
	st.s.metrics.TransferCommitWaits.WithLabelValues(op, outcome).Inc()
	if outcome == "deadline" {
		st.warnEvery("lmd/commit-wait/"+op, protocolWarnEvery,
			"a "+op+" covered lmcache-driven CUDA stores still not committed after the wait; it went on without them (logged at most every 10 s; counted in lmcache_mp_transfer_commit_waits_total{outcome=\"deadline\"})",
			"stores", len(waits), "waited", d)
	}
}

// lmdReg is one registered paged KV cache (one vLLM worker).
type lmdReg struct {
	instance int64
	model    string
	world    int
	layout   *kvlayout.Layout
	cpu      *kvcopy.Cache // CPU shared-memory wrappers, or
	gpu      *kvcuda.Cache // CUDA IPC wrappers
	objBytes int64
	tag      string // the engine's write-reservation owner
	lastSeen time.Time
	pinged   bool // a PING named this instance (reaped after WorkerReapTimeout, else after the grace)
}

// close unmaps the registration's KV cache (waiting for its transfers).
func (r *lmdReg) close() error {
	if r.gpu != nil {
		return r.gpu.Close()
	}
	return r.cpu.Close()
}

func (l *lmDriven) get(inst int64) *lmdReg {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.regs[inst]
	if r != nil {
		r.lastSeen = time.Now()
	}
	return r
}

// peek returns the registration of inst without marking it alive (an
// operator's read is no sign of the worker).
func (l *lmDriven) peek(inst int64) *lmdReg {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.regs[inst]
}

// touch marks an instance alive (PING) and reports whether it is known.
func (l *lmDriven) touch(inst int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.regs[inst]
	if r != nil {
		r.lastSeen, r.pinged = time.Now(), true
	}
	return r != nil
}

// takeSilent removes and returns the registrations silent for longer
// than their limit (reapAfter once pinged, grace before; 0 disables).
func (l *lmDriven) takeSilent(now time.Time, reapAfter, grace time.Duration) []*lmdReg {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*lmdReg
	for id, r := range l.regs {
		limit := grace
		if r.pinged {
			limit = reapAfter
		}
		if limit > 0 && now.Sub(r.lastSeen) > limit {
			out = append(out, r)
			delete(l.regs, id)
		}
	}
	return out
}

// closeAll unmaps every registration (server stop). A copy in progress
// finishes first: Cache.Close waits for it.
func (l *lmDriven) closeAll() error {
	l.mu.Lock()
	regs := l.regs
	l.regs = nil
	l.mu.Unlock()
	var errs []error
	for _, r := range regs {
		if err := r.close(); err != nil {
			errs = append(errs, fmt.Errorf("instance %d: %w", r.instance, err))
		}
	}
	if l.pinned != nil {
		if err := kvcuda.Unpin(l.cuda, l.pinned); err != nil {
			errs = append(errs, fmt.Errorf("unpin the L1 pool: %w", err))
		}
		l.pinned = nil
	}
	return errors.Join(errs...)
}

// snapshot lists the registrations for /status, sorted by instance id.
func (l *lmDriven) snapshot() []*lmdReg {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*lmdReg, 0, len(l.regs))
	for _, r := range l.regs {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *lmdReg) int { return cmp.Compare(a.instance, b.instance) })
	return out
}

// reapLMDriven unmaps lmcache-driven registrations whose worker went
// silent; each is counted in lmcache_mp_zmq_reaped_workers_total.
func (st *state) reapLMDriven(now time.Time) int {
	cfg := st.s.cfg
	regs := st.lmd.takeSilent(now, cfg.WorkerReapTimeout, cfg.WorkerRegistrationGrace)
	for _, r := range regs {
		st.s.metrics.ZMQReapedWorkers.Inc()
		err := st.lmdDrop(r)
		st.log.Warn("reaped a silent lmcache-driven worker and unmapped its KV cache (counted in lmcache_mp_zmq_reaped_workers_total)",
			"instance_id", r.instance, "model", r.model, "world_size", r.world, "silent_for", now.Sub(r.lastSeen).Round(time.Millisecond),
			"had_pinged", r.pinged, "unmap_err", err)
	}
	return len(regs)
}

// lmdAcquireLayout takes a layout reference for an lmcache-driven
// registration, counted with the engine-driven ones of the same (model,
// world_size) in st.layouts and the engine: while any registration of
// either path holds the pair, a registration whose chunk objects have
// another size is refused (the stored objects would not fit it). Under
// st.mu, so the two counts move in step (the engine's layout lock is a
// leaf); st.lmd.mu is not held here.
func (st *state) lmdAcquireLayout(l engine.Layout) error {
	lk := layoutKey{l.ModelName, l.WorldSize}
	st.mu.Lock()
	defer st.mu.Unlock()
	lr := st.layouts[lk]
	if lr != nil && lr.refs > 0 && lr.objectBytes != l.ObjectBytes {
		return fmt.Errorf("%w: layout conflict for (%s, world_size %d): registered chunk objects are %d bytes, this worker's are %d",
			kvlayout.ErrBadRequest, l.ModelName, l.WorldSize, lr.objectBytes, l.ObjectBytes)
	}
	if err := st.s.eng.AcquireLayout(l); err != nil {
		return fmt.Errorf("register layout: %w", err)
	}
	if lr == nil {
		lr = &layoutRef{objectBytes: l.ObjectBytes}
		st.layouts[lk] = lr
	}
	lr.refs++
	return nil
}

// lmdDrop unmaps a registration already taken out of st.lmd (waiting for
// its transfers) and drops its layout reference: after the last
// registration of its (model, world_size), of either path, lookups report
// no hits, unless --register-model gave the pair a layout.
func (st *state) lmdDrop(r *lmdReg) error {
	err := r.close()
	if r.objBytes == 0 { // never acquired (a registration that failed half way)
		return err
	}
	lk := layoutKey{r.model, r.world}
	st.mu.Lock()
	if lr := st.layouts[lk]; lr != nil {
		st.s.eng.ReleaseLayout(r.model, r.world)
		if lr.refs--; lr.refs <= 0 {
			delete(st.layouts, lk)
		}
	}
	st.mu.Unlock()
	return err
}

func (l *lmDriven) put(r *lmdReg) (old *lmdReg) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.regs == nil {
		l.regs = map[int64]*lmdReg{}
	}
	old = l.regs[r.instance]
	l.regs[r.instance] = r
	return old
}

func (l *lmDriven) take(inst int64) *lmdReg {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.regs[inst]
	delete(l.regs, inst)
	return r
}

// slotBytes is the n bytes of L1 memory behind a slot.
func slotBytes(pool poolBytes, sl engine.Slot, n int64) ([]byte, error) {
	b := pool.Bytes(sl)
	if int64(len(b)) < n {
		return nil, fmt.Errorf("L1 object is %d bytes, this layout's are %d (stored under another layout?)", len(b), n)
	}
	return b[:n], nil
}

// poolBytes is the part of the engine that hands out L1 memory by slot;
// *engine.Engine has it. The engine-driven path never needs it (the worker
// copies), so it is not in the Engine interface.
type poolBytes interface {
	Bytes(s engine.Slot) []byte
}

// serveLMDriven answers one lmcache-driven request; failures become the
// request's negative reply ([b"", false] for STORE/RETRIEVE, nil for the
// registrations) with a rate-limited log line.
func (st *state) serveLMDriven(req *request) []byte {
	if st.s.cfg.TransferMode == ModeEngineDriven {
		return st.refuseTransferMode(req, ModeLMCacheDriven)
	}
	var resp []byte
	var err error
	switch req.op {
	case wire.OpRegisterKVCache:
		resp, err = st.lmdRegister(req)
	case wire.OpUnregisterKVCache:
		resp, err = st.lmdUnregister(req)
	case wire.OpStore:
		resp, err = st.lmdStore(req)
	case wire.OpRetrieve:
		resp, err = st.lmdRetrieve(req)
	default:
		err = fmt.Errorf("no lmcache-driven handler for %s", req.op.EnumName())
	}
	if err != nil {
		// Every refused or failed request is dropped work: counted under
		// lmcache_mp_zmq_refused_requests_total{reason="lmcache_driven_*"}.
		switch {
		case errors.Is(err, errRefused): // logged where it was decided
			st.s.metrics.ZMQRefused.WithLabelValues("lmcache_driven_unregistered").Inc()
		case req.op == wire.OpRegisterKVCache:
			st.s.metrics.ZMQRefused.WithLabelValues("lmcache_driven_registration").Inc()
			st.warnEvery("lmd/register/"+req.peer.idString(), protocolWarnEvery,
				"refused REGISTER_KV_CACHE; its stores and retrieves are refused. The lmcache-driven path serves CPU shared-memory KV caches, and CUDA ones where libcuda.so.1 loads and a device has the wrapper's UUID (not yet run on a GPU); otherwise "+hintEngineDriven,
				"peer", req.peer.idString(), "err", err)
		default:
			st.s.metrics.ZMQRefused.WithLabelValues("lmcache_driven_transfer").Inc()
			st.warnEvery("lmd/"+req.op.String()+"/"+req.peer.idString(), protocolWarnEvery,
				"lmcache-driven "+req.op.EnumName()+" failed (logged at most every 10 s per peer)", "peer", req.peer.idString(), "err", err)
		}
		if resp == nil {
			resp = wire.NegativeReply(req.op)
		}
	}
	return resp
}

// engineDrivenOp reports whether op belongs to the engine-driven path.
func engineDrivenOp(op wire.Op) bool {
	switch op {
	case wire.OpRegisterEngineDriven, wire.OpUnregisterEngineDriven, wire.OpPrepareStore,
		wire.OpCommitStore, wire.OpPrepareRetrieve, wire.OpCommitRetrieve:
		return true
	}
	return false
}

// refuseTransferMode answers an operation of the path that
// --supported-transfer-mode leaves out (the worker's mode, workerMode,
// disagrees with the server's): its negative reply, one WARN line per
// peer, and lmcache_mp_zmq_refused_requests_total{reason="transfer_mode"}
// per request. Upstream raises in the handler, so the worker gets no
// reply and its start-up times out; a negative reply fails it at once.
func (st *state) refuseTransferMode(req *request, workerMode string) []byte {
	st.s.metrics.ZMQRefused.WithLabelValues("transfer_mode").Inc()
	st.warnOnce(req.peer.idString()+"/transfer_mode",
		"refused "+req.op.EnumName()+": the worker uses the "+workerMode+" transfer mode but this server runs --supported-transfer-mode "+
			st.s.cfg.TransferMode+"; every such request is refused (counted in lmcache_mp_zmq_refused_requests_total{reason=\"transfer_mode\"}). "+
			"Start the server with --supported-transfer-mode auto (serves both) or "+workerMode+", or set LMCACHE_MP_TRANSFER_MODE="+st.s.cfg.TransferMode+" in vLLM's environment",
		"peer", req.peer.idString(), "op", req.op.EnumName(), "server_mode", st.s.cfg.TransferMode, "worker_mode", workerMode)
	return wire.NegativeReply(req.op)
}

// lmdRegistration is REGISTER_KV_CACHE's decoded payload: instance_id,
// KVCache (ext-1 wrapper pickles), model_name, world_size, then the
// optional engine_type, layout_hints and engine_group_infos.
type lmdRegistration struct {
	instance int64
	wrappers []kvwrap.Wrapper
	model    string
	world    int
	reg      kvcopy.Registration
}

// cuda reports whether the wrappers are CUDA IPC ones (the first decides;
// a mix is refused by the backend's Open).
func (d *lmdRegistration) cuda() bool {
	k := d.wrappers[0].Kind
	return k == kvwrap.KindCUDAIPC || k == kvwrap.KindRawCUDAIPC
}

func decodeLMDRegister(p [][]byte) (*lmdRegistration, error) {
	if len(p) < 4 {
		return nil, fmt.Errorf("REGISTER_KV_CACHE with %d frames; instance_id, kv_caches, model_name and world_size are required", len(p))
	}
	out := &lmdRegistration{}
	var inst, world wire.Int
	if err := wire.Unmarshal(p[0], &inst); err != nil {
		return nil, fmt.Errorf("decode instance_id: %w", err)
	}
	out.instance = int64(inst)
	n, b, err := msgp.ReadArrayHeaderBytes(p[1])
	if err != nil {
		return nil, fmt.Errorf("decode kv_caches: %w", err)
	}
	if n == 0 || n > maxLMDLayers {
		return nil, fmt.Errorf("kv_caches holds %d tensors (want 1..%d)", n, maxLMDLayers)
	}
	for i := range n {
		ext := msgp.RawExtension{Type: 1}
		if b, err = msgp.ReadExtensionBytes(b, &ext); err != nil {
			return nil, fmt.Errorf("kv_caches[%d] is not a tensor wrapper (msgpack ext 1): %w", i, err)
		}
		w, err := kvwrap.Decode(ext.Data)
		if err != nil {
			return nil, fmt.Errorf("kv_caches[%d]: %w", i, err)
		}
		out.wrappers = append(out.wrappers, w)
	}
	if out.model, _, err = msgp.ReadStringBytes(p[2]); err != nil {
		return nil, fmt.Errorf("decode model_name: %w", err)
	}
	if err := (objkey.Key{ModelName: out.model}).Validate(); err != nil {
		return nil, err
	}
	if err := wire.Unmarshal(p[3], &world); err != nil {
		return nil, fmt.Errorf("decode world_size: %w", err)
	}
	if world < 1 || world > 255 {
		return nil, fmt.Errorf("world_size %d out of range", world)
	}
	out.world = int(world)
	if len(p) > 4 {
		// EngineType's wire form was not pinned (research datapath.md
		// 3.3): whatever it is, its printed value names the engine.
		v, _, err := msgp.ReadIntfBytes(p[4])
		if err != nil {
			return nil, fmt.Errorf("decode engine_type: %w", err)
		}
		if v != nil {
			out.reg.Engine = fmt.Sprint(v)
		}
	}
	if len(p) > 5 {
		if out.reg.Hints, err = decodeLayoutHints(p[5]); err != nil {
			return nil, err
		}
	}
	if len(p) > 6 && msgp.NextType(p[6]) != msgp.NilType {
		g, _, err := msgp.ReadArrayHeaderBytes(p[6])
		if err != nil {
			return nil, fmt.Errorf("decode engine_group_infos: %w", err)
		}
		out.reg.Groups = int(g)
	}
	return out, nil
}

// decodeLayoutHints reads the LayoutHints TypedDict (all keys optional).
func decodeLayoutHints(b []byte) (kvlayout.Hints, error) {
	var h kvlayout.Hints
	if msgp.NextType(b) == msgp.NilType {
		return h, nil
	}
	v, _, err := msgp.ReadIntfBytes(b)
	if err != nil {
		return h, fmt.Errorf("decode layout_hints: %w", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return h, fmt.Errorf("layout_hints is %T, want a map", v)
	}
	if s, ok := m["kv_layout"].(string); ok {
		h.KVLayout = s
	}
	h.TokensPerBlock = hintInt(m["tokens_per_block"])
	h.NumKVHeads = hintInt(m["num_kv_heads"])
	return h, nil
}

func hintInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return max(x, 0)
	case uint64:
		if x < 1<<31 {
			return int64(x)
		}
	}
	return 0
}

func (st *state) lmdRegister(req *request) ([]byte, error) {
	d, err := decodeLMDRegister(req.payloads)
	if err != nil {
		return wire.Nil, err
	}
	chunk := int64(st.s.cfg.ChunkSize)
	// A re-registration replaces the old mapping; the old one is closed
	// (and its layout reference dropped) before the new one is opened, so
	// a re-registration of the same segments never maps them twice.
	if old := st.lmd.take(d.instance); old != nil {
		st.lmdDrop(old)
	}
	r := &lmdReg{instance: d.instance, model: d.model, world: d.world,
		tag: fmt.Sprintf("lmd-instance-%d", d.instance), lastSeen: time.Now()}
	backend := "CPU shared memory"
	if d.cuda() {
		drv, err := st.cudaDriver()
		if err != nil {
			return wire.Nil, fmt.Errorf("instance %d registers CUDA IPC KV caches: %w", d.instance, err)
		}
		if r.gpu, err = kvcuda.Open(drv, d.wrappers, kvcuda.Registration(d.reg)); err != nil {
			return wire.Nil, fmt.Errorf("instance %d: %w", d.instance, err)
		}
		r.layout, backend = r.gpu.Layout, fmt.Sprintf("CUDA IPC, device %d", r.gpu.Device())
	} else {
		if r.cpu, err = kvcopy.Open("", d.wrappers, d.reg); err != nil {
			return wire.Nil, fmt.Errorf("instance %d: %w", d.instance, err)
		}
		r.layout = r.cpu.Layout
	}
	if _, err := r.layout.BlocksPerChunk(chunk); err != nil {
		_ = r.close()
		return wire.Nil, fmt.Errorf("instance %d: %w", d.instance, err)
	}
	if _, ok := st.s.eng.(poolBytes); !ok {
		_ = r.close()
		return wire.Nil, errors.New("the storage engine does not expose L1 memory; lmcache-driven transfers are not available")
	}
	l := r.layout
	objBytes := l.ObjectBytes(chunk)
	shape := l.ObjectShape(chunk)
	meta := map[string]any{"shape": shape, "dtype": l.Dtype, "chunk_size": st.s.cfg.ChunkSize, "num_layers": l.NumLayers,
		"hidden_dim_size": l.Hidden(), "use_mla": l.MLA(), "format": kvFormat(l.MLA()), "transfer": "lmcache_driven", "paged_format": l.Format.String()}
	prev, prevErr := st.s.eng.Layout(d.model, d.world)
	if err := st.lmdAcquireLayout(engine.Layout{ModelName: d.model, WorldSize: d.world, ObjectBytes: objBytes, Meta: meta}); err != nil {
		_ = r.close()
		return wire.Nil, fmt.Errorf("instance %d: %w", d.instance, err)
	}
	if prevErr == nil && prev.ObjectBytes != objBytes {
		st.log.Warn("an lmcache-driven worker's layout replaces a different one (from --register-model or an earlier worker); data stored under the old size is not retrievable by this worker",
			"model", d.model, "world_size", d.world, "old_object_bytes", prev.ObjectBytes, "object_bytes", objBytes)
	}
	r.objBytes = objBytes
	if old := st.lmd.put(r); old != nil { // a concurrent registration from another peer
		st.lmdDrop(old)
	}
	st.log.Info("worker registered (lmcache-driven, "+backend+")", "instance_id", d.instance, "peer", req.peer.idString(),
		"model", d.model, "world_size", d.world, "paged_format", l.Format.String(), "layers", l.NumLayers, "blocks", l.NumBlocks,
		"block_size", l.BlockSize, "dtype", l.Dtype, "object_bytes", objBytes)
	return wire.Nil, nil
}

func (st *state) lmdUnregister(req *request) ([]byte, error) {
	var inst wire.Int
	if err := wire.Unmarshal(req.payloads[0], &inst); err != nil {
		return wire.Nil, fmt.Errorf("decode instance_id: %w", err)
	}
	r := st.lmd.take(int64(inst))
	if r == nil {
		st.log.Info("UNREGISTER_KV_CACHE for an unknown instance", "instance_id", int64(inst))
		return wire.Nil, nil
	}
	err := st.lmdDrop(r)
	st.log.Info("worker unregistered (lmcache-driven)", "instance_id", r.instance, "model", r.model, "world_size", r.world)
	return wire.Nil, err
}

// lmdTransfer is the decoded head of STORE and RETRIEVE: key, instance_id,
// gpu_block_ids, event_ipc_handle.
type lmdTransfer struct {
	key    wire.Key
	reg    *lmdReg
	blocks []int64
	first  int
	last   int
	hashes [][]byte
	event  []byte // the worker's CUDA IPC event handle (empty on CPU)
}

func (st *state) lmdTransferHead(req *request) (*lmdTransfer, error) {
	t := &lmdTransfer{}
	if err := wire.Unmarshal(req.payloads[0], &t.key); err != nil {
		return nil, fmt.Errorf("decode key: %w", err)
	}
	var inst wire.Int
	if err := wire.Unmarshal(req.payloads[1], &inst); err != nil {
		return nil, fmt.Errorf("decode instance_id: %w", err)
	}
	var err error
	if t.blocks, err = decodeBlockIDs(req.payloads[2]); err != nil {
		return nil, err
	}
	// The event handle is empty on CPU; on CUDA the copies wait on it.
	if t.event, _, err = msgp.ReadBytesZC(req.payloads[3]); err != nil {
		return nil, fmt.Errorf("decode event_ipc_handle: %w", err)
	}
	if t.reg = st.lmd.get(int64(inst)); t.reg == nil {
		st.warnOnce(req.peer.idString()+"/lmd/"+req.op.String(),
			"refused "+req.op.EnumName()+": the instance has no usable REGISTER_KV_CACHE (see the registration's log line; if it cannot be served, "+hintEngineDriven+")",
			"instance_id", int64(inst), "peer", req.peer.idString())
		return nil, errRefused
	}
	k := &t.key
	switch {
	case k.ModelName != t.reg.model || int(k.WorldSize) != t.reg.world:
		return nil, fmt.Errorf("key (%s, world_size %d) does not match the registration (%s, %d)", k.ModelName, k.WorldSize, t.reg.model, t.reg.world)
	case !k.WorkerID.Valid || k.WorkerID.V < 0 || k.WorkerID.V >= int64(t.reg.world):
		return nil, fmt.Errorf("worker_id %s out of range for world_size %d", k.WorkerID, t.reg.world)
	}
	if err := objkey.ValidateSalt(k.CacheSalt); err != nil {
		return nil, err
	}
	if t.first, t.last, err = st.chunkRange(k); err != nil {
		return nil, err
	}
	// All-or-nothing: every chunk of the range needs its blocks, or
	// nothing is copied (upstream stores nothing either).
	bpc, err := t.reg.layout.BlocksPerChunk(int64(st.s.cfg.ChunkSize))
	if err != nil {
		return nil, err
	}
	if need := int64(t.last-t.first) * bpc; int64(len(t.blocks)) < need {
		return nil, fmt.Errorf("%d block ids for %d chunks of %d blocks", len(t.blocks), t.last-t.first, bpc)
	}
	if t.hashes, err = st.chunkHashes(k, t.last); err != nil {
		return nil, err
	}
	return t, nil
}

// decodeBlockIDs reads gpu_block_ids: one list per KV group, or (older
// clients) one flat list. Only a single group is served. What it
// allocates follows the ids the frame holds: a count is checked against
// the bytes left (an id takes at least one) before it sizes a slice, and
// the groups after the first are checked empty, not kept.
func decodeBlockIDs(b []byte) ([]int64, error) {
	n, rest, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, fmt.Errorf("decode gpu_block_ids: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	flat := msgp.NextType(rest) != msgp.ArrayType
	read := func(cnt uint32) ([]int64, error) {
		if cnt > maxBlockIDs {
			return nil, fmt.Errorf("gpu_block_ids: %d ids (limit %d)", cnt, maxBlockIDs)
		}
		if uint64(cnt) > uint64(len(rest)) {
			return nil, fmt.Errorf("decode gpu_block_ids: %d ids in %d bytes: %w", cnt, len(rest), msgp.ErrShortBytes)
		}
		out := make([]int64, 0, cnt)
		for range cnt {
			var v int64
			if v, rest, err = msgp.ReadInt64Bytes(rest); err != nil {
				return nil, fmt.Errorf("decode gpu_block_ids: %w", err)
			}
			out = append(out, v)
		}
		return out, nil
	}
	if flat {
		return read(n)
	}
	var first []int64
	for g := range n {
		var cnt uint32
		if cnt, rest, err = msgp.ReadArrayHeaderBytes(rest); err != nil {
			return nil, fmt.Errorf("decode gpu_block_ids: %w", err)
		}
		if g > 0 && cnt > 0 {
			return nil, fmt.Errorf("%w: gpu_block_ids for %d groups", kvlayout.ErrHybrid, n)
		}
		ids, err := read(cnt)
		if err != nil {
			return nil, err
		}
		if g == 0 {
			first = ids
		}
	}
	return first, nil
}

func (st *state) lmdStore(req *request) ([]byte, error) {
	t, err := st.lmdTransferHead(req)
	if err != nil {
		return nil, err
	}
	k, r := &t.key, t.reg
	mask, err := k.NullChunks()
	if err != nil {
		return nil, err
	}
	var null []bool
	if len(mask) > 0 {
		null = mask[0]
	}
	keys := workerKeys(k, t.hashes, t.first, t.last)
	st.s.bindKVTokens(k, t.hashes, t.first, t.last) // so BlockStored carries the tokens
	idx := make([]int, 0, len(keys))
	kept := keys[:0]
	for i, key := range keys {
		if i < len(null) && null[i] {
			continue // backed only by vLLM's null block: not stored
		}
		kept, idx = append(kept, key), append(idx, i)
	}
	keys = kept
	sizes := make([]int64, len(keys))
	for i := range sizes {
		sizes[i] = r.objBytes
	}
	slots, err := st.s.eng.ReserveWrite(r.tag, keys, sizes)
	if err != nil {
		return nil, fmt.Errorf("reserve %d chunks of %d bytes: %w", len(keys), r.objBytes, err)
	}
	pool := st.s.eng.(poolBytes)
	var chunks []kvlayout.Chunk
	var objs [][]byte
	var reserved []objkey.Key
	var fail error
	for i, sl := range slots {
		if !sl.Valid() {
			continue // already stored
		}
		reserved = append(reserved, keys[i])
		b, err := slotBytes(pool, sl, r.objBytes)
		if err != nil {
			fail = err
		}
		chunks = append(chunks, kvlayout.Chunk{Index: idx[i], Obj: len(objs)})
		objs = append(objs, b)
	}
	if fail != nil {
		st.s.eng.AbortWrite(r.tag, reserved)
		return nil, fail
	}
	if len(reserved) == 0 {
		return wire.Marshal(&wire.TransferReply{Handle: []byte{}, OK: true}), nil
	}
	plan, err := r.layout.Plan(int64(st.s.cfg.ChunkSize), t.blocks, chunks, 0)
	began := time.Now()
	if err == nil && r.gpu != nil {
		// Commit (or abort) once the copies completed, off this FIFO; the
		// worker waits on the returned event before reusing its blocks.
		// Until the commit, a LOOKUP or RETRIEVE of these chunks waits
		// for it (lmdAwaitCommits) instead of missing them.
		pending := st.lmd.commits.add(reserved)
		var h kvcuda.IPCHandle
		h, err = r.gpu.Submit(plan, objs, kvcuda.Store, t.event, func(err error) {
			defer st.lmd.commits.finish(pending, reserved)
			if err != nil {
				st.s.eng.AbortWrite(r.tag, reserved)
				st.lmdAsyncFailed(r, "STORE", err)
				return
			}
			if n, err := st.s.eng.CommitWrite(r.tag, reserved); err != nil {
				st.lmdAsyncFailed(r, "STORE", fmt.Errorf("commit %d chunks (%d published): %w", len(reserved), n, err))
				return
			}
			st.countTransfer(r, "store", plan, len(reserved), time.Since(began))
		})
		if err == nil {
			return wire.Marshal(&wire.TransferReply{Handle: h[:], OK: true}), nil
		}
		st.lmd.commits.finish(pending, reserved) // not submitted: done never runs
	} else if err == nil {
		err = r.cpu.Gather(plan, objs)
	}
	if err != nil {
		st.s.eng.AbortWrite(r.tag, reserved)
		return nil, fmt.Errorf("copy %d chunks: %w", len(reserved), err)
	}
	copied := time.Since(began)
	if n, err := st.s.eng.CommitWrite(r.tag, reserved); err != nil {
		return nil, fmt.Errorf("commit %d chunks (%d published): %w", len(reserved), n, err)
	}
	st.countTransfer(r, "store", plan, len(reserved), copied)
	return wire.Marshal(&wire.TransferReply{Handle: []byte{}, OK: true}), nil
}

func (st *state) lmdRetrieve(req *request) ([]byte, error) {
	var skip wire.Int
	if err := wire.Unmarshal(req.payloads[4], &skip); err != nil {
		return nil, fmt.Errorf("decode skip_first_n_tokens: %w", err)
	}
	if skip < 0 {
		return nil, fmt.Errorf("skip_first_n_tokens %d", skip)
	}
	t, err := st.lmdTransferHead(req)
	if err != nil {
		return nil, err
	}
	k, r := &t.key, t.reg
	if t.first == t.last {
		return nil, fmt.Errorf("empty retrieve range [%d, %d)", k.Start, k.End)
	}
	keys := workerKeys(k, t.hashes, t.first, t.last)
	st.lmdAwaitCommits("retrieve", keys, true)
	slots, err := st.s.eng.ReadSlots(keys)
	if err != nil {
		// Nothing was read; the lookup's locks stay until FREE_LOOKUP_LOCKS
		// or their TTL, as on the engine-driven path.
		return nil, fmt.Errorf("retrieve %d chunks: %w", len(keys), err)
	}
	pool := st.s.eng.(poolBytes)
	chunks := make([]kvlayout.Chunk, len(slots))
	objs := make([][]byte, len(slots))
	for i, sl := range slots {
		chunks[i] = kvlayout.Chunk{Index: i, Obj: i}
		if objs[i], err = slotBytes(pool, sl, r.objBytes); err != nil {
			break
		}
	}
	var plan *kvlayout.Plan
	if err == nil {
		plan, err = r.layout.Plan(int64(st.s.cfg.ChunkSize), t.blocks, chunks, int64(skip))
	}
	began := time.Now()
	if err == nil && r.gpu != nil {
		// The read locks go once the copies completed.
		var h kvcuda.IPCHandle
		reqID := k.RequestID
		h, err = r.gpu.Submit(plan, objs, kvcuda.Retrieve, t.event, func(err error) {
			st.s.eng.ReleaseRead(reqID, keys, 1)
			if err != nil {
				st.lmdAsyncFailed(r, "RETRIEVE", err)
				return
			}
			st.countTransfer(r, "retrieve", plan, len(keys), time.Since(began))
		})
		if err == nil {
			return wire.Marshal(&wire.TransferReply{Handle: h[:], OK: true}), nil
		}
	} else if err == nil {
		if err = r.cpu.Scatter(plan, objs); err == nil {
			st.countTransfer(r, "retrieve", plan, len(keys), time.Since(began))
		}
	}
	// The read is over either way: this rank's lock on each object goes,
	// as COMMIT_RETRIEVE releases it on the engine-driven path.
	st.s.eng.ReleaseRead(k.RequestID, keys, 1)
	if err != nil {
		return nil, fmt.Errorf("copy %d chunks: %w", len(keys), err)
	}
	return wire.Marshal(&wire.TransferReply{Handle: []byte{}, OK: true}), nil
}

// countTransfer records a completed lmcache-driven copy in
// lmcache_mp_transfer_{bytes,chunks,copy_seconds}_total{direction, path}:
// the plan's bytes (a retrieve's skipped tokens are not moved, so not
// counted) and the chunks the request moved.
func (st *state) countTransfer(r *lmdReg, direction string, plan *kvlayout.Plan, chunks int, took time.Duration) {
	path := "lmcache_driven_cpu"
	if r.gpu != nil {
		path = "lmcache_driven_cuda"
	}
	m := st.s.metrics
	m.TransferBytes.WithLabelValues(direction, path).Add(float64(plan.Bytes))
	m.TransferChunks.WithLabelValues(direction, path).Add(float64(chunks))
	m.TransferCopySeconds.WithLabelValues(direction, path).Add(took.Seconds())
}

// countEngineDriven records an engine-driven transfer the worker
// finished (COMMIT_STORE after its copies into the slots, COMMIT_RETRIEVE
// after its copies out of them) under path="engine_driven": whole
// objects, no copy time (the worker's).
func (st *state) countEngineDriven(direction string, chunks int, objBytes int64) {
	m := st.s.metrics
	m.TransferBytes.WithLabelValues(direction, "engine_driven").Add(float64(int64(chunks) * objBytes))
	m.TransferChunks.WithLabelValues(direction, "engine_driven").Add(float64(chunks))
}

// lmdAsyncFailed reports a CUDA transfer that failed after its reply
// (the copies or the commit): the store's chunks are dropped, counted in
// lmcache_mp_zmq_refused_requests_total{reason="lmcache_driven_transfer"}.
func (st *state) lmdAsyncFailed(r *lmdReg, op string, err error) {
	st.s.metrics.ZMQRefused.WithLabelValues("lmcache_driven_transfer").Inc()
	st.warnEvery(fmt.Sprintf("lmd/async/%d", r.instance), protocolWarnEvery,
		"lmcache-driven "+op+" failed on the GPU after its reply (logged at most every 10 s per instance)", "instance_id", r.instance, "err", err)
}

// lmdStatus is the lmcache-driven registrations' part of GET /status, as
// upstream's transfer module reports its cache contexts: each instance id
// joins ids (returned sorted) and gets a cache_context_meta entry (keyed
// by the id as a string) with its model, world size and kv_cache_layout.
func (st *state) lmdStatus(ids []int64) (map[string]httpapi.CacheContext, []int64) {
	meta := map[string]httpapi.CacheContext{}
	transfer := ModeLMCacheDriven
	for _, r := range st.lmd.snapshot() {
		ids = append(ids, r.instance)
		l := r.layout
		layers := make([]int64, l.NumLayers)
		for i := range layers {
			layers[i] = int64(i)
		}
		meta[fmt.Sprint(r.instance)] = httpapi.CacheContext{
			ModelName: r.model,
			WorldSize: r.world,
			Transfer:  &transfer,
			KVCacheLayout: httpapi.KVCacheLayout{
				NumLayers: l.NumLayers,
				NumBlocks: l.NumBlocks,
				// One token's slice of a chunk object: the chunk formula
				// at one token.
				CacheSizePerToken: l.ObjectBytes(1),
				KernelGroups: []httpapi.KernelGroup{{
					NumLayers: l.NumLayers, LayerIndices: layers,
					TokensPerBlock: l.BlockSize, SlotsPerBlock: l.BlockSize,
					Dtype: "torch." + l.Dtype, IsMLA: l.MLA(), EngineKVFormat: l.Format.String(),
					NumKVHeads: l.NumHeads, HeadSize: l.HeadSize,
				}},
			},
		}
	}
	slices.Sort(ids)
	return meta, ids
}

// KVBlockLayer is one layer of an lmcache-driven worker's registered KV
// cache, read block by block for POST /cache/checksums.
type KVBlockLayer struct {
	cache *kvcopy.Cache
	layer int
}

// Block returns a copy of block id (K rows then V rows, as stored).
func (l KVBlockLayer) Block(id int) ([]byte, error) { return l.cache.Block(l.layer, int64(id)) }

// KVLayers returns the layers of the lmcache-driven registration
// instanceID (httpapi.KVBlockReader, for POST /cache/checksums). As that
// interface documents, an unknown instance wraps httpapi.ErrNotFound and a
// cache that cannot be read block-wise httpapi.ErrUnsupported: httpapi's
// status table is the one place that turns them into 404 and 501.
func (s *Server) KVLayers(instanceID int) ([]httpapi.KVLayer, error) {
	r := s.st.lmd.peek(int64(instanceID))
	if r == nil {
		return nil, fmt.Errorf("%w: instance_id %d has no lmcache-driven registration", httpapi.ErrNotFound, instanceID)
	}
	if r.cpu == nil {
		return nil, fmt.Errorf("%w: instance_id %d is a CUDA KV cache; checksums read CPU shared-memory caches only", httpapi.ErrUnsupported, instanceID)
	}
	if _, err := r.layout.BlockExtents(0, 0); err != nil && errors.Is(err, kvlayout.ErrUnsupported) {
		return nil, fmt.Errorf("%w: %w", httpapi.ErrUnsupported, err)
	}
	out := make([]httpapi.KVLayer, r.layout.NumLayers)
	for i := range out {
		out[i] = KVBlockLayer{cache: r.cpu, layer: i}
	}
	return out, nil
}

var _ httpapi.KVBlockReader = (*Server)(nil)
