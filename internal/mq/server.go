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
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// pollInterval bounds how long the router loop waits before it notices a
// cancelled context.
const pollInterval = 50 * time.Millisecond

// peerIdleForget is how long an idle peer's profile choice is remembered.
const peerIdleForget = time.Hour

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

	st  *state
	sem chan struct{} // control requests being handled
	// admitted counts control requests handled or waiting for sem; the
	// router refuses one when it is full.
	admitted chan struct{}
	wg       sync.WaitGroup // handler goroutines
	runOnce  sync.Once

	// peers is touched only by the router goroutine.
	peers map[string]*peer
	// handlerCtx is cancelled when Run starts shutting down.
	handlerCtx context.Context
}

// peer is one ZMQ identity (one client DEALER socket).
type peer struct {
	id       []byte
	profile  *wire.Profile
	lastSeen time.Time

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
	s := &Server{cfg: cfg, eng: eng, log: logger.With("component", "mq"), hasher: hasher,
		sem: make(chan struct{}, cfg.MaxControlInFlight), admitted: make(chan struct{}, cfg.MaxControlInFlight+cfg.MaxQueued),
		peers: map[string]*peer{}}
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
		s.closeSockets()
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.st.sweepLoop(hctx)
	}()
	s.log.Info("data path listening", "endpoint", s.endpoint, "wire_profile", s.cfg.WireProfile,
		"transfer_mode", s.cfg.TransferMode, "chunk_size", s.cfg.ChunkSize, "hash_algorithm", s.hasher.Algorithm(),
		"shm_name", s.eng.Pool().Name, "pool_bytes", s.eng.Pool().Size)

	poller := zmq.NewPoller()
	poller.Add(s.router, zmq.POLLIN)
	poller.Add(s.pull, zmq.POLLIN)
	lastSweep := time.Now()
	for ctx.Err() == nil {
		polled, err := poller.Poll(pollInterval)
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
				s.log.Warn("receive failed", "err", err)
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

// sendRouter sends [identity, uid, op, response] from the router goroutine.
func (s *Server) sendRouter(msg [][]byte) {
	if _, err := s.router.SendMessageDontwait(msg); err != nil {
		switch zmq.AsErrno(err) {
		case zmq.EHOSTUNREACH:
			s.log.Info("response destination disconnected", "peer", hex.EncodeToString(msg[0]))
		case zmq.Errno(syscall.EAGAIN):
			s.log.Warn("peer is not reading its replies; reply dropped", "peer", hex.EncodeToString(msg[0]))
		default:
			s.log.Warn("send failed", "peer", hex.EncodeToString(msg[0]), "err", err)
		}
	}
}

// replyAsync hands a reply from a handler goroutine to the router loop.
func (s *Server) replyAsync(id, uid, op, resp []byte) {
	s.pushMu.Lock()
	_, err := s.push.SendMessage(id, uid, op, resp)
	s.pushMu.Unlock()
	if err != nil {
		s.log.Warn("reply hand-off failed", "err", err)
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
// path ends in exactly one reply: clients wait forever otherwise.
func (s *Server) handle(msg [][]byte) {
	id := msg[0]
	if len(msg) < 3 {
		uid, op := []byte{}, []byte{}
		if len(msg) > 1 {
			uid = msg[1]
		}
		s.log.Warn("malformed request: want at least uid and op frames", "peer", hex.EncodeToString(id), "frames", len(msg)-1)
		s.sendRouter([][]byte{id, uid, op, wire.EncodeError("MalformedRequest", fmt.Sprintf("request has %d frames; want uid, op and payloads", len(msg)-1))})
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
		s.log.Warn("undecodable op frame", "peer", p.idString(), "op_frame", hex.EncodeToString(opFrame), "err", err)
		reply(wire.EncodeError("UnknownOperation", err.Error()))
		return
	}
	if p.profile == nil {
		p.profile = s.chooseProfile(p, f)
	}
	op, ok := f.Resolve(p.profile)
	if !ok {
		s.log.Warn("unknown operation", "peer", p.idString(), "op", f.String(), "wire_profile", p.profile.Name)
		reply(wire.EncodeError("UnknownOperation", fmt.Sprintf("unknown operation %s under wire profile %s", f, p.profile.Name)))
		return
	}
	if a := wire.ArityOf(op); len(payloads) < a.Min || len(payloads) > a.Max {
		s.log.Warn("wrong number of payload frames", "peer", p.idString(), "op", op.EnumName(), "frames", len(payloads), "min", a.Min, "max", a.Max)
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
		reply(wire.EmptyList)
	case wire.OpPing:
		reply(s.st.ping(req))
	case wire.OpReportBlockAllocation:
		reply(s.st.reportBlockAllocation(req))
	case wire.OpRegisterKVCache, wire.OpUnregisterKVCache, wire.OpStore, wire.OpRetrieve:
		reply(s.st.rejectLMCacheDriven(req))
	case wire.OpRegisterEngineDriven, wire.OpUnregisterEngineDriven, wire.OpPrepareStore,
		wire.OpCommitStore, wire.OpPrepareRetrieve, wire.OpCommitRetrieve:
		if !s.enqueue(p, func() { s.replyAsync(id, uid, opFrame, s.st.serve(s.handlerCtx, req)) }) {
			s.refuseOverload(p, op, "transfer requests queued by this peer")
			reply(wire.NegativeReply(op))
		}
	case wire.OpLookup, wire.OpQueryPrefetchStatus, wire.OpQueryPrefetchLookupHits,
		wire.OpWaitPrefetchStatus, wire.OpFreeLookupLocks, wire.OpEndSession, wire.OpClear:
		select {
		case s.admitted <- struct{}{}:
		default:
			s.refuseOverload(p, op, "control requests waiting over all peers")
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
		s.log.Warn("operation not supported by this server", "peer", p.idString(), "op", op.EnumName())
		reply(wire.NegativeReply(op))
	}
}

// chooseProfile pins a peer's numbering from its first request.
func (s *Server) chooseProfile(p *peer, f wire.OpFrame) *wire.Profile {
	if s.profile != nil {
		if !f.IsName && f.ID != s.profile.ChunkSizeID {
			if other, ok := wire.ProfileByChunkSizeID(f.ID); ok {
				s.log.Warn("first request looks like another wire profile; check --wire-profile", "peer", p.idString(),
					"op", f.ID, "configured", s.profile.Name, "looks_like", other.Name)
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

// refuseOverload logs (at most every 10 s per peer) a request refused
// because too many are queued.
func (s *Server) refuseOverload(p *peer, op wire.Op, what string) {
	s.st.warnEvery("overload/"+p.idString(), 10*time.Second, "request refused: too many "+what+" (logged at most every 10 s per peer)",
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
}
