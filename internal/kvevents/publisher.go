package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/lmcache-go/lmcache/internal/logthrottle"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// PublisherConfig is vLLM's --kv-events-config for the zmq publisher.
type PublisherConfig struct {
	// Endpoint is the PUB address. As vLLM, an address with "*" or "::",
	// or an ipc:// or inproc:// one, is bound; any other is connected to.
	Endpoint string
	// ReplayEndpoint, if set, is bound as the replay ROUTER.
	ReplayEndpoint string
	// Topic is the first frame of every published message.
	Topic string
	// BufferSteps is how many past batches the replay socket can resend
	// (vLLM default 10000).
	BufferSteps int
	// HWM is the PUB socket's send high-water mark (vLLM default 100000).
	HWM int
	// MaxQueueSize bounds the batches waiting to be sent (vLLM default
	// 100000); past it a batch is dropped and counted.
	MaxQueueSize int
	// DataParallelRank is stamped on every batch.
	DataParallelRank int
}

// withDefaults fills vLLM's defaults into zero fields.
func (c PublisherConfig) withDefaults() PublisherConfig {
	if c.BufferSteps == 0 {
		c.BufferSteps = 10000
	}
	if c.HWM == 0 {
		c.HWM = 100000
	}
	if c.MaxQueueSize == 0 {
		c.MaxQueueSize = 100000
	}
	return c
}

// endSeq is vLLM's end-of-replay marker: sequence -1.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// replayWait is how long an idle cycle waits for a replay request before
// it looks at the queue again.
const replayWait = 10 * time.Millisecond

// stopDrain bounds how long a stopping publisher spends sending the
// batches still queued (vLLM's SHUTDOWN_TIMEOUT is 1 s); what it has no
// time for is counted as publish_failed.
const stopDrain = time.Second

// publisherWarnEvery bounds each kind of publisher warning (a failed
// send, a bad replay request) to one per interval; every occurrence is
// still counted through the dropped or replay-failed hook.
const publisherWarnEvery = 10 * time.Second

// DropPublishFailed is the reason the publisher reports through the
// dropped hook (Config.Dropped, lmcache_mp_kv_events_dropped_total
// {reason="publish_failed"}): the PUB socket refused a batch (a closed
// socket or context; PUB itself drops silently at its HWM). n is the
// batch's events: live subscribers never get them, the replay buffer
// keeps them. A batch published after the publisher stopped (or still
// queued when Close releases a publisher that never ran, or that the
// stop's drain had no time for) is counted the same way: its socket is
// closed.
const DropPublishFailed = "publish_failed"

// Reasons the publisher reports through the replay-failed hook
// (Config.ReplayFailed, lmcache_mp_kv_events_replay_requests_failed_total
// {reason}). Each is one replay request not answered in full; they are
// not events, so they have a counter of their own rather than a reason of
// the dropped one.
const (
	// ReplayInvalid: a replay request that is not [identity, empty,
	// 8-byte start sequence], answered with nothing.
	ReplayInvalid = "invalid"
	// ReplayAborted: a replay cut short because a send on the replay
	// socket failed (the client is gone or not reading). The client gets
	// neither the remaining batches nor the end marker.
	ReplayAborted = "aborted"
)

type sent struct {
	seq     uint64
	payload []byte
}

// Publisher is vLLM's ZmqEventPublisher: one goroutine (Run's, through the
// periodic registry) owns the PUB and replay sockets; Publish only puts a
// batch on a bounded channel.
type Publisher struct {
	cfg    PublisherConfig
	log    *slog.Logger
	queue  chan []Record
	loop   *periodic.Loop
	zctx   *zmq.Context
	pub    *zmq.Socket
	replay *zmq.Socket
	poller *zmq.Poller
	// closeOnce: the sockets are closed by Run's end or by Close, once.
	closeOnce sync.Once
	// qmu orders Publish against the stop: once stopped is set no batch
	// enters queue, so what the stop drains from it is all there is.
	qmu     sync.Mutex
	stopped bool

	// Owned by the publishing goroutine.
	seq   uint64
	buf   []sent // ring of the last BufferSteps batches
	bufAt int
	topic []byte

	endpoint, replayEndpoint string
	// mode is "bind" or "connect" (vLLM's rule, see PublisherConfig).
	mode string

	// dropped counts the events of refused batches (the Recorder's hook;
	// never nil once New or NewPublisher returned). Set before Run starts.
	dropped func(reason string, n int)
	// replayFailed counts replay requests not answered in full, once each
	// (Config.ReplayFailed; never nil once New or NewPublisher returned).
	// Set before Run starts.
	replayFailed func(reason string)
	// warns rate-limits warnings per kind (a fixed set of keys).
	warns *logthrottle.Limiter
}

// NewPublisher opens the sockets and registers the publishing loop in
// loops as "kv_events_publisher"; Run drives it.
func NewPublisher(cfg PublisherConfig, loops *periodic.Registry, logger *slog.Logger) (*Publisher, error) {
	cfg = cfg.withDefaults()
	if cfg.Endpoint == "" {
		return nil, errors.New("kvevents: publisher endpoint is empty")
	}
	if cfg.BufferSteps < 1 || cfg.HWM < 0 || cfg.MaxQueueSize < 1 {
		return nil, fmt.Errorf("kvevents: buffer_steps %d, hwm %d, max_queue_size %d: want >= 1, >= 0, >= 1", cfg.BufferSteps, cfg.HWM, cfg.MaxQueueSize)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Publisher{cfg: cfg, log: logger, queue: make(chan []Record, cfg.MaxQueueSize), topic: []byte(cfg.Topic),
		dropped: func(string, int) {}, replayFailed: func(string) {}, warns: logthrottle.New()}
	if err := p.open(); err != nil {
		p.close()
		return nil, err
	}
	p.loop = loops.RegisterWorker("kv_events_publisher", periodic.Medium, time.Second, p.cycle)
	return p, nil
}

func (p *Publisher) open() error {
	var err error
	if p.zctx, err = zmq.NewContext(); err != nil {
		return fmt.Errorf("kvevents: zmq context: %w", err)
	}
	if p.pub, err = p.zctx.NewSocket(zmq.PUB); err != nil {
		return fmt.Errorf("kvevents: pub socket: %w", err)
	}
	// At this mark PUB drops for the one subscriber whose queue is full,
	// with no error (libzmq's lossy distribution reports nothing), so the
	// loss cannot be counted; the subscriber sees a sequence gap and
	// replays. ZMQ_XPUB_NODROP would report it (EAGAIN on a DONTWAIT send)
	// but refuse the batch to every subscriber at once: one stopped reader
	// would halt the live stream for all (TestXPubNodropHaltsEverySubscriber).
	if err := p.pub.SetSndhwm(p.cfg.HWM); err != nil {
		return fmt.Errorf("kvevents: pub hwm: %w", err)
	}
	if err := p.pub.SetLinger(0); err != nil {
		return fmt.Errorf("kvevents: pub linger: %w", err)
	}
	ep := p.cfg.Endpoint
	if strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://") {
		p.mode = "bind"
		if err := p.pub.Bind(ep); err != nil {
			return fmt.Errorf("kvevents: bind %s: %w", ep, err)
		}
		if p.endpoint, err = p.pub.GetLastEndpoint(); err != nil {
			return fmt.Errorf("kvevents: endpoint: %w", err)
		}
	} else {
		if err := p.pub.Connect(ep); err != nil {
			return fmt.Errorf("kvevents: connect %s: %w", ep, err)
		}
		p.endpoint, p.mode = ep, "connect"
	}
	p.poller = zmq.NewPoller()
	if p.cfg.ReplayEndpoint != "" {
		if p.replay, err = p.zctx.NewSocket(zmq.ROUTER); err != nil {
			return fmt.Errorf("kvevents: replay socket: %w", err)
		}
		if err := p.replay.SetLinger(0); err != nil {
			return fmt.Errorf("kvevents: replay linger: %w", err)
		}
		// Mandatory routing: a replay to a vanished client, or one whose
		// queue is full, fails (and is counted as aborted) instead of
		// losing batches silently in the middle of the stream.
		if err := p.replay.SetRouterMandatory(1); err != nil {
			return fmt.Errorf("kvevents: replay mandatory routing: %w", err)
		}
		// A replay answers with up to BufferSteps messages at once; the
		// default HWM (1000) would cut a long one short.
		if err := p.replay.SetSndhwm(p.cfg.BufferSteps + 16); err != nil {
			return fmt.Errorf("kvevents: replay hwm: %w", err)
		}
		if err := p.replay.Bind(p.cfg.ReplayEndpoint); err != nil {
			return fmt.Errorf("kvevents: bind %s: %w", p.cfg.ReplayEndpoint, err)
		}
		if p.replayEndpoint, err = p.replay.GetLastEndpoint(); err != nil {
			return fmt.Errorf("kvevents: replay endpoint: %w", err)
		}
		p.poller.Add(p.replay, zmq.POLLIN)
	}
	return nil
}

func (p *Publisher) close() {
	for _, s := range []*zmq.Socket{p.pub, p.replay} {
		if s != nil {
			_ = s.Close()
		}
	}
	if p.zctx != nil {
		_ = p.zctx.Term()
	}
}

// Endpoint is the PUB address (the bound one, with the real port).
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint is the bound replay address ("" without one).
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Publish queues one batch without blocking; false when the queue is full
// or the publisher has stopped (the caller counts the drop). The records
// must not be changed after.
func (p *Publisher) Publish(events []Record) bool {
	return p.enqueue(events) == ""
}

// enqueue queues one batch without blocking and returns "" or the reason
// it was refused (DropQueueFull, DropPublishFailed after the stop).
func (p *Publisher) enqueue(events []Record) string {
	p.qmu.Lock()
	defer p.qmu.Unlock()
	if p.stopped {
		return DropPublishFailed
	}
	select {
	case p.queue <- events:
		return ""
	default:
		return DropQueueFull
	}
}

// Run publishes until ctx is cancelled, then sends what is still queued
// (for at most stopDrain) and closes the sockets. The goroutine that
// calls Run owns them.
func (p *Publisher) Run(ctx context.Context) {
	defer p.closeOnce.Do(p.stop)
	p.log.Info("KV events publisher running", "endpoint", p.endpoint, "mode", p.mode, "replay_endpoint", p.replayEndpoint, "topic", p.cfg.Topic)
	p.loop.Run(ctx)
}

// stop refuses further batches, sends the queued ones (counting as
// publish_failed those it has no time for) and closes the sockets. Called
// once, by the goroutine that owns the sockets.
func (p *Publisher) stop() { p.shutdown(time.Now().Add(stopDrain)) }

// release refuses further batches, counts the queued ones as
// publish_failed and closes the sockets: Close of a publisher whose Run
// never ran, so no goroutine owns the sockets to send with.
func (p *Publisher) release() { p.shutdown(time.Time{}) }

// shutdown marks the publisher stopped, so no batch enters the queue
// after, then empties the queue: batches are sent until sendUntil (the
// zero time sends none) and counted as publish_failed after it.
func (p *Publisher) shutdown(sendUntil time.Time) {
	p.qmu.Lock()
	p.stopped = true
	p.qmu.Unlock()
	for {
		select {
		case ev := <-p.queue:
			if time.Now().Before(sendUntil) {
				p.send(ev)
			} else {
				p.dropped(DropPublishFailed, len(ev))
			}
			continue
		default:
		}
		break
	}
	p.close()
}

// cycle sends what is queued and answers replay requests; idle, it waits
// up to replayWait for a replay request (or, without a replay socket, up
// to one second for a batch).
func (p *Publisher) cycle(ctx context.Context) (periodic.Summary, error) {
	n := 0
	for n < 1024 {
		select {
		case ev := <-p.queue:
			p.send(ev)
			n++
			continue
		default:
		}
		break
	}
	if p.replay == nil {
		if n == 0 {
			t := time.NewTimer(time.Second)
			defer t.Stop()
			select {
			case ev := <-p.queue:
				p.send(ev)
			case <-t.C:
			case <-ctx.Done():
			}
		}
		return periodic.Summary{}, nil
	}
	wait := time.Duration(0)
	if n == 0 {
		wait = replayWait
	}
	polled, err := p.poller.Poll(wait)
	if err != nil && zmq.AsErrno(err) != zmq.Errno(syscall.EINTR) {
		return periodic.Summary{}, fmt.Errorf("kvevents: poll replay: %w", err)
	}
	if len(polled) > 0 {
		p.serveReplay()
	}
	return periodic.Summary{}, nil
}

// send encodes and publishes one batch as (topic, seq, payload) and keeps
// it for replay. vLLM numbers batches from 0.
func (p *Publisher) send(events []Record) {
	payload := AppendBatch(make([]byte, 0, SizeHint(events)), time.Now(), p.cfg.DataParallelRank, events)
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], p.seq)
	if _, err := p.pub.SendMessage(p.topic, seqb[:], payload); err != nil {
		// PUB never blocks (it drops at its HWM); an error here is a
		// closed socket or context.
		p.dropped(DropPublishFailed, len(events))
		p.warnEvery(DropPublishFailed, "KV events publish failed; batch lost to live subscribers, kept for replay (logged at most every 10 s; counted in lmcache_mp_kv_events_dropped_total{reason=\"publish_failed\"})", "seq", p.seq, "events", len(events), "err", err)
	}
	if len(p.buf) < p.cfg.BufferSteps {
		p.buf = append(p.buf, sent{p.seq, payload})
	} else {
		p.buf[p.bufAt] = sent{p.seq, payload}
		p.bufAt = (p.bufAt + 1) % len(p.buf)
	}
	p.seq++
}

// serveReplay answers the replay requests waiting: [client, "", start]
// gets (seq, payload) for every retained batch from start, then the end
// marker (seq -1, empty payload), as vLLM's _service_replay.
func (p *Publisher) serveReplay() {
	for range 64 {
		msg, err := p.replay.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return
		}
		if len(msg) != 3 || len(msg[2]) != 8 {
			p.replayFailed(ReplayInvalid)
			p.warnEvery("replay_"+ReplayInvalid, "invalid KV events replay request: want [identity, empty, 8-byte start sequence]; ignored (logged at most every 10 s; counted in lmcache_mp_kv_events_replay_requests_failed_total{reason=\"invalid\"})", "frames", len(msg))
			continue
		}
		start := binary.BigEndian.Uint64(msg[2])
		n := len(p.buf)
		for i := range n {
			s := p.buf[(p.bufAt+i)%n]
			if s.seq < start {
				continue
			}
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], s.seq)
			if _, err := p.replay.SendMessageDontwait(msg[0], []byte{}, seqb[:], s.payload); err != nil {
				p.replayAborted("batch", s.seq, err)
				return
			}
		}
		if _, err := p.replay.SendMessageDontwait(msg[0], []byte{}, endSeq, []byte{}); err != nil {
			p.replayAborted("end marker", 0, err)
		}
	}
}

// replayAborted counts a replay cut short by a failed send of what (a
// batch with its sequence, or the end marker).
func (p *Publisher) replayAborted(what string, seq uint64, err error) {
	p.replayFailed(ReplayAborted)
	p.warnEvery("replay_"+ReplayAborted, "KV events replay aborted: send failed (logged at most every 10 s; counted in lmcache_mp_kv_events_replay_requests_failed_total{reason=\"aborted\"})", "sending", what, "seq", seq, "err", err)
}

// warnEvery logs msg at most once per publisherWarnEvery per key; a line
// after held-back ones says how many (suppressed).
func (p *Publisher) warnEvery(key, msg string, args ...any) {
	p.warns.Log(p.log, slog.LevelWarn, key, publisherWarnEvery, msg, args...)
}
