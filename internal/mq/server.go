// Package mq is the vLLM data path of `lmcache server`: LMCache's ZMQ
// ROUTER protocol (positional msgpack frames, RequestType profiles) and its
// request handlers for the engine-driven shared-memory transfer mode.
//
// Concurrency: libzmq sockets are not thread-safe, so one goroutine (the
// router loop in Run) owns the ROUTER socket and the receiving end of an
// inproc PUSH/PULL pair. Cheap requests are answered inline by that
// goroutine; transfer requests run on a per-peer FIFO goroutine (so one
// worker's PREPARE/COMMIT stay ordered and a slow worker delays only
// itself); control requests (LOOKUP and friends) each run on their own
// goroutine under a semaphore. Both waits are bounded (Config.MaxQueued):
// beyond it the router answers with the negative reply itself. Handler
// goroutines hand replies back through the PUSH socket, which a mutex
// serialises.
package mq

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.opentelemetry.io/otel/trace"

	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// pollInterval bounds how long the router loop waits before it notices a
// cancelled context.
const pollInterval = 50 * time.Millisecond

// peerIdleForget is how long an idle peer's profile choice is remembered.
const peerIdleForget = time.Hour

// protocolWarnEvery bounds the protocol warnings (garbage frames, unknown
// ops, refusals) to one per peer and kind in this interval; every message
// is still counted in the metrics.
const protocolWarnEvery = 10 * time.Second

// Server is the ZMQ data-path server. Build it with New and run it with Run.
type Server struct {
	cfg     Config
	eng     Engine
	log     *slog.Logger
	hasher  *tokenhash.Hasher
	profile *wire.Profile // nil = auto

	zctx     *zmq.Context
	router   *zmq.Socket
	pull     *zmq.Socket
	pushMu   sync.Mutex // serialises the handler goroutines' use of push
	push     *zmq.Socket
	endpoint string

	st *state
	// metrics counts dropped work; it is cfg.Metrics, or a private
	// registry when the server runs without one (tests).
	metrics *mpmetrics.Metrics
	// loops is where the reaper and the session sweep register.
	loops *periodic.Registry
	// bootToken is PING's answer to gen3 clients: random per process, so
	// a client that compares successive answers notices a restart.
	bootToken int64
	sem       chan struct{} // control requests being handled
	// admitted counts control requests handled or waiting for sem; the
	// router refuses one when it is full.
	admitted chan struct{}
	wg       sync.WaitGroup // handler goroutines
	runOnce  sync.Once

	// peers is touched only by the router goroutine.
	peers map[string]*peer
	// handlerCtx is cancelled when Run starts shutting down.
	handlerCtx context.Context
	// watch makes the socket goroutine's progress visible as a periodic
	// loop (socketLoopName).
	watch socketWatch
}

// socketLoopName is the periodic-registry name of the socket goroutine's
// watch.
const socketLoopName = "mq-socket-loop"

// socketWatchEvery is the watch's interval: the socket goroutine iterates
// at least every pollInterval when idle, so a cycle that sees no iteration
// for this long (and the loop inactive after three of them) means it is
// wedged in a handler or in libzmq.
const socketWatchEvery = time.Second

// socketWatch reports the router loop to the periodic registry. The loop
// itself cannot be a periodic.Loop without a registry call per iteration
// (a mutex, two clock reads and an allocation on the request path), so it
// only stores its iteration count; the watch is a worker loop whose cycle
// waits until that count moves. A wedged socket goroutine leaves the cycle
// waiting, the loop's last run ages, and /periodic-threads-health lists it
// (level high) after three intervals.
type socketWatch struct {
	beats atomic.Uint64 // router loop iterations so far
	every time.Duration // 0: socketWatchEvery
}

// register adds the watch to reg as socketLoopName.
func (w *socketWatch) register(reg *periodic.Registry) *periodic.Loop {
	every := w.every
	if every <= 0 {
		every = socketWatchEvery
	}
	return reg.RegisterWorker(socketLoopName, periodic.High, every, func(ctx context.Context) (periodic.Summary, error) {
		return w.cycle(ctx, every)
	})
}

// cycle returns at the first check, every interval, that finds the router
// loop has iterated since the cycle began; it waits as long as it has not.
func (w *socketWatch) cycle(ctx context.Context, every time.Duration) (periodic.Summary, error) {
	base := w.beats.Load()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return periodic.Summary{Message: "stopping"}, nil
		case <-t.C:
			if n := w.beats.Load(); n != base {
				return periodic.Summary{Message: fmt.Sprintf("iterations=%d", n)}, nil
			}
		}
	}
}

// peer is one ZMQ identity (one client DEALER socket).
type peer struct {
	id       []byte
	profile  *wire.Profile
	lastSeen time.Time
	// refused: the peer's first request fingerprints another profile than
	// the forced one; nothing it sends is executed or answered.
	refused bool

	mu      sync.Mutex // guards queue and running
	queue   []func()
	running bool
}

func (p *peer) idString() string { return hex.EncodeToString(p.id) }

// New validates cfg, binds the ROUTER socket and returns a server that Run
// will serve. eng is usually *engine.Engine.
func New(cfg Config, eng Engine, logger *slog.Logger) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("mq: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var hopts []tokenhash.Option
	if cfg.HashRoot != nil {
		hopts = append(hopts, tokenhash.WithRoot(cfg.HashRoot))
	}
	hasher, err := tokenhash.New(cfg.HashAlgorithm, cfg.ChunkSize, hopts...)
	if err != nil {
		return nil, fmt.Errorf("mq: --hash-algorithm: %w", err)
	}
	// Clipped: several lines quote what a peer sent (clipHandler).
	s := &Server{cfg: cfg, eng: eng, log: slog.New(clipHandler{logger.Handler()}).With("component", "mq"), hasher: hasher,
		sem: make(chan struct{}, cfg.MaxControlInFlight), admitted: make(chan struct{}, cfg.MaxControlInFlight+cfg.MaxQueued),
		peers: map[string]*peer{}, metrics: cfg.Metrics, loops: cfg.Periodic, bootToken: newBootToken()}
	if s.metrics == nil {
		s.metrics = mpmetrics.New("", nil)
	}
	if s.loops == nil {
		s.loops = periodic.NewRegistry()
	}
	if cfg.WireProfile != ProfileAuto {
		s.profile, _ = wire.ProfileByName(cfg.WireProfile)
	}
	s.st = newState(s)
	if err := s.open(); err != nil {
		s.closeSockets()
		return nil, err
	}
	if pool := eng.Pool(); pool.Name == "" {
		s.log.Warn("the L1 pool is not in shared memory (--shm-name is empty): vLLM workers will fall back to the pickle transfer, which this server refuses; set --shm-name")
	}
	return s, nil
}

// newBootToken is a random positive int63 that is never 1 (what a legacy
// True decodes to) or 2 (PING_UNTRACKED).
func newBootToken() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return int64(binary.LittleEndian.Uint64(b[:])>>2) | 1<<32
}

// Metrics is the registry holding the data path's counters: Config.Metrics
// or, without one, the server's own.
func (s *Server) Metrics() *mpmetrics.Metrics { return s.metrics }

// Periodic is the registry of the server's periodic loops: Config.Periodic
// or, without one, the server's own.
func (s *Server) Periodic() *periodic.Registry { return s.loops }

func (s *Server) open() error {
	var err error
	if s.zctx, err = zmq.NewContext(); err != nil {
		return fmt.Errorf("mq: zmq context: %w", err)
	}
	if s.router, err = s.zctx.NewSocket(zmq.ROUTER); err != nil {
		return fmt.Errorf("mq: router socket: %w", err)
	}
	// Mandatory routing turns a reply to a vanished peer into an error we
	// can log instead of a silent drop; replies are sent with DONTWAIT so
	// a peer whose queue is full never stalls the loop.
	for _, set := range []func() error{
		func() error { return s.router.SetRouterMandatory(1) },
		func() error { return s.router.SetLinger(0) },
		func() error { return s.router.SetSndhwm(s.cfg.SendHWM) },
		func() error { return s.router.SetRcvhwm(s.cfg.SendHWM) },
	} {
		if err := set(); err != nil {
			return fmt.Errorf("mq: router option: %w", err)
		}
	}
	host := s.cfg.Host
	if host == "localhost" {
		host = "127.0.0.1"
	}
	port := "*"
	if s.cfg.Port != 0 {
		port = strconv.Itoa(s.cfg.Port)
	}
	bind := "tcp://" + net.JoinHostPort(host, port)
	if err := s.router.Bind(bind); err != nil {
		return fmt.Errorf("mq: bind %s: %w", bind, err)
	}
	if s.endpoint, err = s.router.GetLastEndpoint(); err != nil {
		return fmt.Errorf("mq: endpoint: %w", err)
	}
	inproc := fmt.Sprintf("inproc://mq-replies-%p", s)
	if s.pull, err = s.zctx.NewSocket(zmq.PULL); err != nil {
		return fmt.Errorf("mq: pull socket: %w", err)
	}
	if s.push, err = s.zctx.NewSocket(zmq.PUSH); err != nil {
		return fmt.Errorf("mq: push socket: %w", err)
	}
	// Unlimited high-water marks: replies are small and a handler must
	// never block on the hand-off while the loop is shutting down.
	for _, sock := range []*zmq.Socket{s.pull, s.push} {
		if err := sock.SetSndhwm(0); err != nil {
			return fmt.Errorf("mq: inproc option: %w", err)
		}
		if err := sock.SetRcvhwm(0); err != nil {
			return fmt.Errorf("mq: inproc option: %w", err)
		}
		if err := sock.SetLinger(0); err != nil {
			return fmt.Errorf("mq: inproc option: %w", err)
		}
	}
	if err := s.pull.Bind(inproc); err != nil {
		return fmt.Errorf("mq: bind %s: %w", inproc, err)
	}
	if err := s.push.Connect(inproc); err != nil {
		return fmt.Errorf("mq: connect %s: %w", inproc, err)
	}
	return nil
}

func (s *Server) closeSockets() {
	for _, sock := range []*zmq.Socket{s.push, s.pull, s.router} {
		if sock != nil {
			_ = sock.Close()
		}
	}
	if s.zctx != nil {
		_ = s.zctx.Term()
	}
}

// Endpoint is the bound endpoint, e.g. "tcp://127.0.0.1:5555" (with the
// real port when Config.Port was 0).
func (s *Server) Endpoint() string { return s.endpoint }

// Run serves until ctx is cancelled, then stops every handler goroutine,
// closes the sockets and returns. It may be called once.
func (s *Server) Run(ctx context.Context) error {
	err := errors.New("mq: Run called twice")
	s.runOnce.Do(func() { err = s.run(ctx) })
	return err
}

func (s *Server) run(ctx context.Context) error {
	hctx, cancel := context.WithCancel(ctx)
	s.handlerCtx = hctx
	defer func() {
		cancel()
		s.wg.Wait() // handlers see hctx cancelled and finish
		// Replies handed off after the loop stopped reading them (a
		// request refused at shutdown while it waited for a slot, one that
		// finished meanwhile) still go out, or count as dropped when they
		// cannot: left in the queue, they would vanish with the sockets
		// and their clients wait for ever.
		s.flushReplies()
		// Transfers whose COMMIT will never come now: abort their staged
		// writes and release their read locks, so the engine holds nothing
		// for this server once Run returns.
		// They share lmcache_mp_zmq_abandoned_transfers_total with the
		// reaper's drops: either way a PREPARE's COMMIT never came.
		if n := s.st.dropTransfers(func(pendingKey, time.Time) bool { return true }); n > 0 {
			s.metrics.ZMQAbandonedTransfers.Add(float64(n))
			s.log.Info("dropped transfers still open at stop (counted in lmcache_mp_zmq_abandoned_transfers_total)", "count", n)
		}
		// No handler runs any more: unmap the lmcache-driven KV caches.
		if err := s.st.lmd.closeAll(); err != nil {
			s.log.Warn("unmapping lmcache-driven KV caches at stop", "err", err)
		}
		s.closeSockets()
	}()
	for _, l := range append(s.st.loops(), s.watch.register(s.loops)) {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			l.Run(hctx)
		}()
	}
	s.log.Info("data path listening", "endpoint", s.endpoint, "wire_profile", s.cfg.WireProfile,
		"transfer_mode", s.cfg.TransferMode, "chunk_size", s.cfg.ChunkSize, "hash_algorithm", s.hasher.Algorithm(),
		"shm_name", s.eng.Pool().Name, "pool_bytes", s.eng.Pool().Size)

	poller := zmq.NewPoller()
	poller.Add(s.router, zmq.POLLIN)
	poller.Add(s.pull, zmq.POLLIN)
	lastSweep := time.Now()
	// While time is before spinUntil the loop polls without blocking
	// (Config.BusyPoll); spun is the time those polls found nothing,
	// added to the metric when the spin ends.
	var spinUntil time.Time
	var spun time.Duration
	var iter uint64
	for ctx.Err() == nil {
		// One atomic store per iteration tells the socket-loop watch
		// (a periodic loop) that this goroutine is not wedged.
		iter++
		s.watch.beats.Store(iter)
		wait := pollInterval
		var t0 time.Time
		if s.cfg.BusyPoll > 0 {
			if t0 = time.Now(); t0.Before(spinUntil) {
				wait = 0
			} else if spun > 0 {
				s.metrics.ZMQBusyPollSeconds.Add(spun.Seconds())
				spun = 0
			}
		}
		polled, err := poller.Poll(wait)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			return fmt.Errorf("mq: poll: %w", err)
		}
		for _, p := range polled {
			switch p.Socket {
			case s.router:
				s.drainRequests()
			case s.pull:
				s.drainReplies()
			}
		}
		if s.cfg.BusyPoll > 0 {
			switch now := time.Now(); {
			case len(polled) > 0:
				// Spin from the last reply sent, not from its request.
				spinUntil = now.Add(s.cfg.BusyPoll)
			case wait == 0:
				spun += now.Sub(t0)
			}
		}
		if now := time.Now(); now.Sub(lastSweep) > time.Minute {
			lastSweep = now
			s.forgetIdlePeers(now)
		}
	}
	s.log.Info("data path stopping")
	return nil
}

// drainRequests handles every request already queued on the ROUTER, with a
// bound so replies keep flowing under a flood.
func (s *Server) drainRequests() {
	for range 256 {
		msg, err := s.router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
				// Whatever the message was, it is lost: count it with the
				// messages that never became a request.
				s.metrics.ZMQMalformed.WithLabelValues("receive_failed").Inc()
				s.st.warnEvery("recvfail", protocolWarnEvery, "ROUTER receive failed; message lost (logged at most every 10 s; counted in lmcache_mp_zmq_malformed_messages_total{kind=\"receive_failed\"})", "err", err)
			}
			return
		}
		s.handle(msg)
	}
}

func (s *Server) drainReplies() {
	for range 1024 {
		msg, err := s.pull.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return
		}
		s.sendRouter(msg)
	}
}

// flushReplies sends every reply still queued from the handlers; Run calls
// it once no handler runs any more, so the queue only empties.
func (s *Server) flushReplies() {
	for {
		msg, err := s.pull.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return
		}
		s.sendRouter(msg)
	}
}

// sendRouter sends [identity, uid, op, response] from the router goroutine.
// A reply that cannot be sent is counted and logged at most every
// protocolWarnEvery per peer and reason.
func (s *Server) sendRouter(msg [][]byte) {
	if _, err := s.router.SendMessageDontwait(msg); err != nil {
		peer := hex.EncodeToString(msg[0])
		switch zmq.AsErrno(err) {
		case zmq.EHOSTUNREACH:
			s.metrics.ZMQDroppedReplies.WithLabelValues("peer_gone").Inc()
			s.st.logEvery(slog.LevelInfo, "gone/"+peer, protocolWarnEvery, "response destination disconnected; reply dropped (logged at most every 10 s per peer)", "peer", peer)
		case zmq.Errno(syscall.EAGAIN):
			s.metrics.ZMQDroppedReplies.WithLabelValues("peer_not_reading").Inc()
			s.st.warnEvery("slow/"+peer, protocolWarnEvery, "peer is not reading its replies; reply dropped (logged at most every 10 s per peer)", "peer", peer)
		default:
			s.metrics.ZMQDroppedReplies.WithLabelValues("send_failed").Inc()
			s.st.warnEvery("sendfail/"+peer, protocolWarnEvery, "send failed; reply dropped (logged at most every 10 s per peer)", "peer", peer, "err", err)
		}
	}
}

// replyAsync hands a reply from a handler goroutine to the router loop.
func (s *Server) replyAsync(id, uid, op, resp []byte) {
	s.pushMu.Lock()
	_, err := s.push.SendMessage(id, uid, op, resp)
	s.pushMu.Unlock()
	if err != nil {
		s.metrics.ZMQDroppedReplies.WithLabelValues("handoff_failed").Inc()
		s.st.warnEvery("handoff", protocolWarnEvery, "reply hand-off failed; reply dropped (logged at most every 10 s)", "err", err)
	}
}

func (s *Server) forgetIdlePeers(now time.Time) {
	for k, p := range s.peers {
		p.mu.Lock()
		busy := p.running || len(p.queue) > 0
		p.mu.Unlock()
		if !busy && now.Sub(p.lastSeen) > peerIdleForget {
			delete(s.peers, k)
		}
	}
}

// handle parses one request and answers it inline or dispatches it. Every
// request that names a known operation gets exactly one reply (clients
// wait forever otherwise). A message that is not a request at all, or
// names no operation the client's numbering (or another one) knows, gets
// none: the only reply such a client could receive is a value of a type it
// never asked for, which kills the shared poll thread of some client
// versions (research datapath.md 10.3).
func (s *Server) handle(msg [][]byte) {
	id := msg[0]
	if len(msg) < 3 {
		s.malformed(hex.EncodeToString(id), "frames", "malformed message dropped: want uid, op and payload frames", "frames", len(msg)-1)
		return
	}
	uid, opFrame, payloads := msg[1], msg[2], msg[3:]
	reply := func(resp []byte) { s.sendRouter([][]byte{id, uid, opFrame, resp}) }

	p := s.peers[string(id)]
	if p == nil {
		p = &peer{id: append([]byte(nil), id...)}
		s.peers[string(id)] = p
	}
	p.lastSeen = time.Now()

	f, err := wire.DecodeOpFrame(opFrame)
	if err != nil {
		s.malformed(p.idString(), "op_frame", "undecodable op frame; message dropped", "op_frame", hex.EncodeToString(opFrame), "err", err)
		return
	}
	if p.profile == nil {
		p.profile = s.chooseProfile(p, f, len(payloads))
	}
	if p.refused {
		s.metrics.ZMQRefused.WithLabelValues("wrong_wire_profile").Inc()
		return
	}
	op, ok := f.Resolve(p.profile)
	if !ok {
		s.unknownOp(p, f, reply)
		return
	}
	if a := wire.ArityOf(op); len(payloads) < a.Min || len(payloads) > a.Max {
		s.malformed(p.idString(), "payload_count", "wrong number of payload frames; refused", "op", op.EnumName(), "frames", len(payloads), "min", a.Min, "max", a.Max)
		reply(wire.NegativeReply(op))
		return
	}
	req := &request{op: op, peer: p, payloads: payloads}
	switch op {
	case wire.OpGetChunkSize:
		reply(wire.EncodeInt(int64(s.cfg.ChunkSize)))
	case wire.OpNoop:
		reply(wire.OK)
	case wire.OpGetExperimental:
		reply(s.getExperimental())
	case wire.OpPollKVEvents:
		reply(s.pollKVEvents(req))
	case wire.OpPing:
		reply(s.st.ping(req, s.bootToken))
	case wire.OpReportBlockAllocation:
		reply(s.st.reportBlockAllocation(req))
	case wire.OpQueryPrefetchStatus, wire.OpQueryPrefetchLookupHits:
		// A map lookup in the engine that never waits: answered inline,
		// which saves LOOKUP's second round trip a goroutine hand-off.
		reply(s.st.serve(s.handlerCtx, req))
	case wire.OpRegisterKVCache, wire.OpUnregisterKVCache, wire.OpStore, wire.OpRetrieve:
		// lmcache-driven transfers (lmdriven.go) share the peer's FIFO.
		if !s.enqueue(p, func() { s.replyAsync(id, uid, opFrame, s.st.serveLMDriven(req)) }) {
			s.refuseOverload(p, op, "transfer_queue_full", "transfer requests queued by this peer")
			reply(wire.NegativeReply(op))
		}
	case wire.OpRegisterEngineDriven, wire.OpUnregisterEngineDriven, wire.OpPrepareStore,
		wire.OpCommitStore, wire.OpPrepareRetrieve, wire.OpCommitRetrieve:
		if !s.enqueue(p, func() { s.replyAsync(id, uid, opFrame, s.st.serve(s.handlerCtx, req)) }) {
			s.refuseOverload(p, op, "transfer_queue_full", "transfer requests queued by this peer")
			reply(wire.NegativeReply(op))
		}
	case wire.OpLookup, wire.OpWaitPrefetchStatus, wire.OpFreeLookupLocks, wire.OpEndSession, wire.OpClear:
		if op == wire.OpLookup && s.inlineLookup(payloads) {
			// LOOKUP hashes, locks the L1 hits and queues any L2 part as
			// a background job: it never waits, so serving it here saves
			// the goroutine hand-off and the inproc round trip. Its reply
			// is None whatever the outcome (QUERY_PREFETCH_STATUS reads
			// that), so it goes out before the work: the client's half of
			// the round trip overlaps the hashing, and the status query
			// it sends next is already queued when drainRequests comes
			// back to the socket, so it is taken without a wake-up. This
			// goroutine serves a peer's requests in order, so that query
			// still finds the job this LOOKUP starts.
			req.inline = true
			reply(wire.Nil)
			s.st.serve(s.handlerCtx, req)
			return
		}
		select {
		case s.admitted <- struct{}{}:
		default:
			s.refuseOverload(p, op, "control_queue_full", "control requests waiting over all peers")
			reply(wire.NegativeReply(op))
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.admitted }()
			select {
			case s.sem <- struct{}{}:
			case <-s.handlerCtx.Done():
				s.replyAsync(id, uid, opFrame, wire.NegativeReply(op))
				return
			}
			defer func() { <-s.sem }()
			s.replyAsync(id, uid, opFrame, s.st.serve(s.handlerCtx, req))
		}()
	default:
		s.st.warnEvery("unsupported/"+p.idString()+"/"+op.String(), protocolWarnEvery, "operation not supported by this server; answered with its void reply",
			"peer", p.idString(), "op", op.EnumName())
		reply(wire.NegativeReply(op))
	}
}

// inlineLookup reports whether a LOOKUP with these payloads is answered
// on the socket goroutine: its key is at most Config.InlineLookupBytes,
// which bounds how long other peers wait behind its hashing.
func (s *Server) inlineLookup(payloads [][]byte) bool {
	// While lmcache-driven CUDA stores commit, a LOOKUP may wait for one
	// (lmdAwaitCommits): never on the socket goroutine.
	return len(payloads) > 0 && len(payloads[0]) <= s.cfg.InlineLookupBytes && !s.st.lmd.commits.busy()
}

// malformed counts a message that is not a well-formed request and logs
// it at most every protocolWarnEvery per peer and kind.
func (s *Server) malformed(peer, kind, msg string, args ...any) {
	s.metrics.ZMQMalformed.WithLabelValues(kind).Inc()
	s.st.warnEvery("malformed/"+kind+"/"+peer, protocolWarnEvery, msg+" (logged at most every 10 s per peer; counted in lmcache_mp_zmq_malformed_messages_total)",
		append([]any{"peer", peer}, args...)...)
}

// unknownOp answers an op number the peer's numbering lacks with the
// negative reply of the operation holding that number in another
// numbering (a client of that generation can decode it), and anything
// else (an unknown number or name) with no reply.
func (s *Server) unknownOp(p *peer, f wire.OpFrame, reply func([]byte)) {
	if !f.IsName {
		for _, other := range p.profile.Others() {
			if op, ok := other.Op(f.ID); ok {
				s.malformed(p.idString(), "unknown_op", "operation number unknown in the peer's wire profile; answered with the negative reply it has in another profile",
					"op", f.String(), "wire_profile", p.profile.Name, "as", other.Name+"/"+op.EnumName())
				reply(wire.NegativeReply(op))
				return
			}
		}
	}
	s.malformed(p.idString(), "unknown_op", "unknown operation; no reply sent", "op", f.String(), "wire_profile", p.profile.Name)
}

// chooseProfile pins a peer's numbering from its first request. Under a
// forced --wire-profile, a first request that is GET_CHUNK_SIZE (no
// payload frames) of another numbering marks the peer refused: executing
// its requests would run the wrong operations (a gen2m NOOP is gen3's
// CLEAR) and answer them with the wrong types.
func (s *Server) chooseProfile(p *peer, f wire.OpFrame, payloads int) *wire.Profile {
	if s.profile != nil {
		if !f.IsName && payloads == 0 && f.ID != s.profile.ChunkSizeID {
			if other, ok := wire.ProfileByChunkSizeID(f.ID); ok {
				p.refused = true
				s.metrics.ZMQProfileRefusedPeers.Inc()
				s.log.Error("client refused: its first request is GET_CHUNK_SIZE of another wire profile than --wire-profile; nothing it sends is executed or answered (its start-up times out). Run with --wire-profile auto or "+other.Name,
					"peer", p.idString(), "op", f.ID, "configured", s.profile.Name, "client_profile", other.Name)
			}
		}
		return s.profile
	}
	if f.IsName {
		s.log.Info("wire profile chosen", "peer", p.idString(), "profile", wire.Gen3.Name, "reason", "first op sent by name")
		return wire.Gen3
	}
	if prof, ok := wire.ProfileByChunkSizeID(f.ID); ok {
		s.log.Info("wire profile chosen", "peer", p.idString(), "profile", prof.Name, "reason", fmt.Sprintf("first request GET_CHUNK_SIZE=%d", f.ID))
		return prof
	}
	s.log.Warn("wire profile chosen by default: first request is not GET_CHUNK_SIZE of a known profile; set --wire-profile if this client is not gen3",
		"peer", p.idString(), "profile", wire.Gen3.Name, "first_op", f.ID)
	return wire.Gen3
}

// refuseOverload counts a request refused because too many are queued and
// logs it at most every protocolWarnEvery per peer.
func (s *Server) refuseOverload(p *peer, op wire.Op, reason, what string) {
	s.metrics.ZMQRefused.WithLabelValues(reason).Inc()
	s.st.warnEvery("overload/"+p.idString(), protocolWarnEvery, "request refused: too many "+what+" (logged at most every 10 s per peer; counted in lmcache_mp_zmq_refused_requests_total)",
		"peer", p.idString(), "op", op.EnumName(), "max_queued", s.cfg.MaxQueued)
}

// enqueue runs fn on p's FIFO goroutine, starting one if none runs. It
// returns false, and does nothing, when p already has MaxQueued requests
// waiting.
func (s *Server) enqueue(p *peer, fn func()) bool {
	p.mu.Lock()
	if len(p.queue) >= s.cfg.MaxQueued {
		p.mu.Unlock()
		return false
	}
	p.queue = append(p.queue, fn)
	start := !p.running
	p.running = true
	p.mu.Unlock()
	if !start {
		return true
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			p.mu.Lock()
			if len(p.queue) == 0 {
				p.running = false
				p.mu.Unlock()
				return
			}
			next := p.queue[0]
			p.queue[0] = nil
			p.queue = p.queue[1:]
			p.mu.Unlock()
			next()
		}
	}()
	return true
}

// request is one decoded request on its way to a handler.
type request struct {
	op       wire.Op
	peer     *peer
	payloads [][]byte
	// tokens is the pooled token-id buffer the request's key was decoded
	// into; release returns it. No handler keeps a key's TokenIDs past
	// its request (sessions hold their own uint32 copy).
	tokens *[]wire.Int
	// span is the request's trace span when it is traced (tracing.go):
	// the parent of the L2 work it starts.
	span trace.SpanContext
	// inline: the socket goroutine serves it, so it must not wait.
	inline bool
}

// tokenBufs recycles key token-id buffers: a 32k-token key is 256 KiB of
// them, decoded for every LOOKUP, FREE_LOOKUP_LOCKS, PREPARE and COMMIT.
var tokenBufs = sync.Pool{New: func() any { return new([]wire.Int) }}

// decodeKey decodes the request's first payload, an IPCCacheServerKey,
// into a pooled token buffer.
func (r *request) decodeKey() (*wire.Key, error) {
	if r.tokens == nil {
		r.tokens = tokenBufs.Get().(*[]wire.Int)
	}
	key := &wire.Key{TokenIDs: (*r.tokens)[:0]}
	if err := wire.Unmarshal(r.payloads[0], key); err != nil {
		return nil, fmt.Errorf("decode key: %w", err)
	}
	if cap(key.TokenIDs) > cap(*r.tokens) {
		*r.tokens = key.TokenIDs[:0] // keep the grown buffer
	}
	return key, nil
}

// release returns the request's token buffer to the pool.
func (r *request) release() {
	if r.tokens != nil {
		tokenBufs.Put(r.tokens)
		r.tokens = nil
	}
}
