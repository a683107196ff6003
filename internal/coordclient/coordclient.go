// Package coordclient is the MP server's side of the fleet coordinator:
// registration and heartbeats under an instance id, re-registration when the
// coordinator forgot us, deregistration on shutdown, and L2 usage events
// (store, lookup, delete) reported in batches to the coordinator: newer
// upstream's POST /events (per-backend CacheEventBatches carrying this
// process's incarnation and a per-incarnation seq), or the spec-era
// POST /quota/events, chosen by Config.EventEndpoint.
//
// Nothing here is fatal: while the coordinator is unreachable the client
// keeps retrying and the server keeps serving. Events wait in a bounded
// queue; when it is full new events are dropped and counted.
package coordclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// Defaults, as upstream.
const (
	DefaultHeartbeatInterval  = 5 * time.Second
	DefaultEventFlushInterval = time.Second
	DefaultQueueSize          = 100_000
	DefaultMaxBatch           = 5_000
	DefaultHTTPTimeout        = 10 * time.Second
)

// Config configures the client. The lead wires the flags
// --coordinator-url, --coordinator-advertise-ip,
// --coordinator-heartbeat-interval, --coordinator-l2-event-reporting,
// --coordinator-l2-event-flush-interval and --instance-id onto it
// (serverconfig reads the flags and their LMCACHE_COORDINATOR_* variables).
type Config struct {
	// URL is the coordinator base URL; empty disables the client.
	URL string
	// AdvertiseIP is the address the coordinator should reach this
	// server's HTTP API at; empty means the outbound IP toward URL.
	AdvertiseIP string
	// HTTPPort is this server's --http-port (required, 1..65535).
	HTTPPort int
	// InstanceID is --instance-id; empty means a random UUID4.
	InstanceID string
	// P2PAdvertisedURL is sent verbatim at registration ("" when P2P is off).
	P2PAdvertisedURL string
	// HeartbeatInterval is --coordinator-heartbeat-interval (default 5 s).
	HeartbeatInterval time.Duration
	// EventReporting is --coordinator-l2-event-reporting.
	EventReporting bool
	// EventFlushInterval is --coordinator-l2-event-flush-interval (1 s).
	EventFlushInterval time.Duration
	// QueueSize bounds the pending events; MaxBatch bounds one POST.
	QueueSize int
	MaxBatch  int
	// AuthToken, when set, is sent as "Authorization: Bearer <token>" on
	// every coordinator request (the coordinator's --auth-token). From
	// --coordinator-auth-token / LMCACHE_COORDINATOR_AUTH_TOKEN; never
	// logged.
	AuthToken string
	// EventEndpoint is --coordinator-event-endpoint: EndpointAuto (the
	// default, also for ""), EndpointEvents or EndpointQuotaEvents.
	EventEndpoint string
	// Incarnation identifies this process's event stream on POST /events;
	// 0 means the start time in Unix nanoseconds (upstream uses Unix
	// seconds, which two starts within one second would share).
	Incarnation int64
	// Publisher, if set, carries the event batches instead of POST /events
	// (--coordinator-event-transport kafka: a kafkaevents.Sink);
	// registration and heartbeats stay HTTP.
	Publisher Publisher
	// HTTPClient defaults to a client with a 10 s timeout.
	HTTPClient *http.Client
	// Periodic, if set, lists the registrar and reporter loops (for
	// /periodic-threads); nil uses a private registry.
	Periodic *periodic.Registry
	// Metrics, if set, receives queue and batch counters.
	Metrics *mpmetrics.Metrics
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Event endpoints (--coordinator-event-endpoint).
const (
	// EndpointAuto posts to /events and, when the coordinator answers 404
	// there, switches to /quota/events (and back on a 404 there), keeping
	// the choice for later flushes.
	EndpointAuto = "auto"
	// EndpointEvents posts only to newer upstream's POST /events.
	EndpointEvents = "events"
	// EndpointQuotaEvents posts only to the spec-era POST /quota/events.
	EndpointQuotaEvents = "quota-events"
)

// Event is one /quota/events entry. Backend and Shared name the adapter
// that reported it (for /events batches); they are not part of the
// /quota/events wire form.
type Event struct {
	Type    string         `json:"type"`
	Key     objkey.Encoded `json:"key"`
	Bytes   int64          `json:"bytes"`
	Backend string         `json:"-"`
	Shared  bool           `json:"-"`
}

// Batch is the POST /quota/events body.
type Batch struct {
	InstanceID string  `json:"instance_id"`
	Seq        int64   `json:"seq"`
	Events     []Event `json:"events"`
	Tier       string  `json:"tier"`
}

// Client registers with the coordinator and reports L2 events. It
// implements l2.Listener; register it with the engine's AddL2Listener.
type Client struct {
	cfg  Config
	base string
	// logURL is base with any userinfo password masked: the only form
	// that goes into log lines.
	logURL string
	hc     *http.Client
	log    *slog.Logger

	id         atomic.Pointer[string] // current instance id (desired, then assigned)
	registered atomic.Bool

	mu    sync.Mutex // guards queue and closed
	queue []Event
	// closed is set once the final flush at the end of Run is done: no
	// flush will run again, so later events are dropped and counted at
	// once instead of waiting in a queue nobody reads.
	closed bool
	// seq numbers /quota/events POSTs. evSeq numbers /events batches
	// within this incarnation.
	seq     atomic.Int64
	evSeq   atomic.Int64
	dropped atomic.Int64
	sent    atomic.Int64

	// flushMu serialises flushes (the reporter loop and the final flush),
	// so retry and the seq order stay one stream.
	flushMu sync.Mutex
	// retry is an /events request that failed, kept with its seqs so a
	// resend the coordinator already applied is dropped as a duplicate.
	// Guarded by flushMu; retryEvents is its event count, for Pending.
	retry       *eventsRequest
	retryEvents atomic.Int64
	// split, while a refused request (errRefused) is bisected, bounds the
	// requests that follow (0: MaxBatch); suspect counts the events of
	// that request at the head of the stream (the retry, then the queue)
	// not yet delivered. Guarded by flushMu.
	split, suspect int
	// endpoint is the door in use: EndpointEvents or EndpointQuotaEvents.
	endpoint atomic.Pointer[string]
}

var _ l2.Listener = (*Client)(nil)

// New validates cfg. A client with an empty URL is valid and inert (Run
// returns at once; listener calls are no-ops).
func New(cfg Config) (*Client, error) {
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.EventFlushInterval <= 0 {
		cfg.EventFlushInterval = DefaultEventFlushInterval
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch cfg.EventEndpoint {
	case "":
		cfg.EventEndpoint = EndpointAuto
	case EndpointAuto, EndpointEvents, EndpointQuotaEvents:
	default:
		return nil, fmt.Errorf("coordinator event endpoint %q: want auto, events or quota-events", cfg.EventEndpoint)
	}
	if cfg.Incarnation <= 0 {
		cfg.Incarnation = nextIncarnation()
	}
	c := &Client{cfg: cfg, log: cfg.Logger, hc: cfg.HTTPClient}
	if c.hc == nil {
		c.hc = &http.Client{Timeout: DefaultHTTPTimeout}
	}
	if cfg.URL != "" {
		u, err := url.Parse(cfg.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("coordinator url %q: want http(s)://host[:port]", cfg.URL)
		}
		if cfg.HTTPPort < 1 || cfg.HTTPPort > 65535 {
			return nil, fmt.Errorf("coordinator client: http port %d out of range", cfg.HTTPPort)
		}
		c.base = strings.TrimRight(cfg.URL, "/")
		c.logURL = strings.TrimRight(u.Redacted(), "/")
	}
	id := cfg.InstanceID
	if id == "" {
		id = NewInstanceID()
	}
	c.id.Store(&id)
	ep := EndpointEvents
	if cfg.EventEndpoint == EndpointQuotaEvents {
		ep = EndpointQuotaEvents
	}
	c.endpoint.Store(&ep)
	return c, nil
}

// lastIncarnation makes incarnations strictly increase within one process
// even where two clients start within one clock tick.
var lastIncarnation atomic.Int64

// nextIncarnation is the start time in Unix nanoseconds, above any earlier
// one handed out in this process.
func nextIncarnation() int64 {
	for {
		last := lastIncarnation.Load()
		n := max(time.Now().UnixNano(), last+1)
		if lastIncarnation.CompareAndSwap(last, n) {
			return n
		}
	}
}

// Incarnation is the incarnation this process's /events batches carry.
func (c *Client) Incarnation() int64 { return c.cfg.Incarnation }

// EventEndpoint is the door events currently go to (EndpointEvents or
// EndpointQuotaEvents); with EndpointAuto it follows the fallbacks.
func (c *Client) EventEndpoint() string { return *c.endpoint.Load() }

// Enabled reports whether a coordinator URL is configured.
func (c *Client) Enabled() bool { return c.base != "" }

// InstanceID is the id the server is (or will be) registered under.
func (c *Client) InstanceID() string { return *c.id.Load() }

// Registered reports whether the last registration or heartbeat succeeded.
func (c *Client) Registered() bool { return c.registered.Load() }

// Dropped is the number of events dropped: queue full, a failed batch with
// no room to requeue it, batches the coordinator answered stale (a newer
// incarnation of this instance id reports there), or an event the
// coordinator (or the Publisher) refused on its own (a 4xx such as 422),
// and events still undelivered when Run ends or enqueued after it did.
func (c *Client) Dropped() int64 { return c.dropped.Load() }

// SentBatches is the number of batches the coordinator accepted.
func (c *Client) SentBatches() int64 { return c.sent.Load() }

// ErrUnauthorized is a 401 from the coordinator: its --auth-token is set and
// this client's AuthToken is missing or different.
var ErrUnauthorized = errors.New("coordinator rejected the auth token (401); check --coordinator-auth-token")

// Loop names in the periodic registry.
const (
	LoopRegistrar = "coordinator-registrar"
	LoopReporter  = "coordinator-event-reporter"
)

// Run registers, heartbeats and flushes events until ctx is cancelled, then
// flushes once more and deregisters. Both loops are periodic loops in
// Config.Periodic (so /periodic-threads shows them); Run owns their
// goroutines and returns after they stop.
func (c *Client) Run(ctx context.Context) error {
	if !c.Enabled() {
		return nil
	}
	reg := c.cfg.Periodic
	if reg == nil {
		reg = periodic.NewRegistry()
	}
	var wg sync.WaitGroup
	if c.cfg.EventReporting {
		rep := reg.Register(LoopReporter, periodic.Medium, c.cfg.EventFlushInterval, 0, c.reportCycle)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep.Run(ctx)
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := c.Flush(fctx); err != nil {
				c.log.Warn("final coordinator event flush failed", "err", err, "pending", c.Pending())
			}
			if n := c.abandon(); n > 0 {
				c.log.Warn("coordinator events undelivered at shutdown, dropped", "events", n)
			}
		}()
	}
	regLoop := reg.Register(LoopRegistrar, periodic.High, c.cfg.HeartbeatInterval, 0, c.registrarCycle)
	regLoop.Run(ctx)
	wg.Wait()
	dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.deregister(dctx)
	return nil
}

// registrarCycle registers when not registered, else heartbeats (and
// re-registers at once when the coordinator answers 404).
func (c *Client) registrarCycle(ctx context.Context) (periodic.Summary, error) {
	var err error
	if c.registered.Load() {
		err = c.heartbeat(ctx)
	} else {
		err = c.register(ctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return periodic.Summary{Message: "stopping"}, nil
		}
		c.log.Warn("coordinator unreachable; will retry", "url", c.logURL, "err", err)
		return periodic.Summary{}, err
	}
	return periodic.Summary{Message: "instance_id=" + c.InstanceID()}, nil
}

func (c *Client) reportCycle(ctx context.Context) (periodic.Summary, error) {
	err := c.Flush(ctx)
	sum := periodic.Summary{Message: fmt.Sprintf("pending=%d dropped=%d sent_batches=%d", c.Pending(), c.Dropped(), c.SentBatches())}
	if err != nil && ctx.Err() == nil {
		c.log.Warn("coordinator event flush failed; will retry", "err", err, "pending", c.Pending())
		return sum, err
	}
	return sum, nil
}

// advertiseIP is the configured address, else the outbound IP toward the
// coordinator, else 127.0.0.1.
func (c *Client) advertiseIP(ctx context.Context) string {
	if c.cfg.AdvertiseIP != "" {
		return c.cfg.AdvertiseIP
	}
	ip, err := outboundIP(ctx, c.base)
	if err != nil {
		c.log.Warn("cannot find the outbound IP toward the coordinator; advertising 127.0.0.1 (set --coordinator-advertise-ip)", "url", c.logURL, "err", err)
		return "127.0.0.1"
	}
	return ip
}

// outboundIP is the local address a UDP socket toward base's host gets (no
// packet is sent). The dial takes ctx, so resolving a hostname is bounded
// by the registrar cycle's deadline and ends when it is cancelled.
func outboundIP(ctx context.Context, base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("coordinator url: %w", err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", host)
	if err != nil {
		return "", fmt.Errorf("dial udp %s: %w", host, err)
	}
	defer conn.Close()
	a, ok := conn.LocalAddr().(*net.UDPAddr)
	if !ok {
		return "", fmt.Errorf("dial udp %s: local address %v is not UDP", host, conn.LocalAddr())
	}
	return a.IP.String(), nil
}

func (c *Client) register(ctx context.Context) error {
	body := map[string]any{
		"instance_id":        c.InstanceID(),
		"ip":                 c.advertiseIP(ctx),
		"http_port":          c.cfg.HTTPPort,
		"metadata":           map[string]string{},
		"p2p_advertised_url": c.cfg.P2PAdvertisedURL,
		"mq_port":            0,
	}
	var resp struct {
		InstanceID   *string `json:"instance_id"`
		ReRegistered bool    `json:"re_registered"`
	}
	code, err := c.do(ctx, http.MethodPost, "/instances", body, &resp)
	switch {
	case err != nil:
		return fmt.Errorf("register: %w", err)
	case code == http.StatusUnauthorized:
		return fmt.Errorf("register: %w", ErrUnauthorized)
	case code/100 != 2:
		return fmt.Errorf("register: coordinator answered %d", code)
	case resp.InstanceID == nil || *resp.InstanceID == "":
		return errors.New("register: reply lacks instance_id")
	}
	id := *resp.InstanceID
	c.id.Store(&id)
	c.registered.Store(true)
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.CoordRegistrations.Inc()
	}
	c.log.Info("registered with coordinator", "url", c.logURL, "instance_id", id, "re_registered", resp.ReRegistered)
	return nil
}

func (c *Client) heartbeat(ctx context.Context) error {
	code, err := c.do(ctx, http.MethodPut, "/instances/"+url.PathEscape(c.InstanceID())+"/heartbeat", nil, nil)
	switch {
	case err != nil:
		return fmt.Errorf("heartbeat: %w", err)
	case code == http.StatusUnauthorized:
		return fmt.Errorf("heartbeat: %w", ErrUnauthorized)
	case code == http.StatusNotFound:
		// The coordinator restarted or expired us: register again at once.
		c.log.Warn("coordinator does not know this instance; re-registering", "instance_id", c.InstanceID())
		c.registered.Store(false)
		return c.register(ctx)
	case code/100 != 2:
		// Keep the id: a transient 5xx must not cause a duplicate registration.
		return fmt.Errorf("heartbeat: coordinator answered %d", code)
	}
	return nil
}

func (c *Client) deregister(ctx context.Context) {
	if !c.registered.Load() {
		return
	}
	code, err := c.do(ctx, http.MethodDelete, "/instances/"+url.PathEscape(c.InstanceID()), nil, nil)
	if err != nil || code/100 != 2 {
		c.log.Warn("coordinator deregistration failed", "status", code, "err", err)
		return
	}
	c.registered.Store(false)
	c.log.Info("deregistered from coordinator", "instance_id", c.InstanceID())
}

// do sends a JSON request and decodes a JSON reply into out (if non-nil and
// the status is 2xx).
func (c *Client) do(ctx context.Context, method, path string, in, out any) (int, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return 0, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.cfg.AuthToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.AuthToken)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode %s %s reply: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// OnStored queues store events (l2.Listener) with no backend name; use
// Listener to name the adapter. It never blocks.
func (c *Client) OnStored(keys []objkey.Key, sizes []int64) {
	c.enqueue("store", "", false, keys, sizes)
}

// OnAccessed queues lookup events (l2.Listener).
func (c *Client) OnAccessed(keys []objkey.Key) { c.enqueue("lookup", "", false, keys, nil) }

// OnDeleted queues delete events (l2.Listener).
func (c *Client) OnDeleted(keys []objkey.Key) { c.enqueue("delete", "", false, keys, nil) }

// Listener returns an l2.Listener for one adapter: its events carry the
// adapter's type name as the /events backend and its shared flag.
func (c *Client) Listener(backend string, shared bool) l2.Listener {
	return &backendListener{c: c, backend: backend, shared: shared}
}

type backendListener struct {
	c       *Client
	backend string
	shared  bool
}

func (l *backendListener) OnStored(keys []objkey.Key, sizes []int64) {
	l.c.enqueue("store", l.backend, l.shared, keys, sizes)
}

func (l *backendListener) OnAccessed(keys []objkey.Key) {
	l.c.enqueue("lookup", l.backend, l.shared, keys, nil)
}

func (l *backendListener) OnDeleted(keys []objkey.Key) {
	l.c.enqueue("delete", l.backend, l.shared, keys, nil)
}

func (c *Client) enqueue(typ, backend string, shared bool, keys []objkey.Key, sizes []int64) {
	if !c.Enabled() || !c.cfg.EventReporting || len(keys) == 0 {
		return
	}
	c.mu.Lock()
	room := c.cfg.QueueSize - len(c.queue)
	if c.closed {
		room = 0
	}
	n := min(room, len(keys))
	for i := 0; i < n; i++ {
		ev := Event{Type: typ, Key: keys[i].Encode(), Backend: backend, Shared: shared}
		if i < len(sizes) && sizes[i] > 0 {
			ev.Bytes = sizes[i]
		}
		c.queue = append(c.queue, ev)
	}
	c.mu.Unlock()
	if drop := len(keys) - max(n, 0); drop > 0 {
		c.dropped.Add(int64(drop))
		if c.cfg.Metrics != nil {
			c.cfg.Metrics.CoordEventsDropped.Add(float64(drop))
		}
	}
	if n > 0 && c.cfg.Metrics != nil {
		c.cfg.Metrics.CoordEventsQueued.Add(float64(n))
	}
}

// Pending is the number of queued events, including those of a failed
// /events request awaiting its resend.
func (c *Client) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue) + int(c.retryEvents.Load())
}

// Flush posts every queued event now, in requests of at most MaxBatch
// events. A failed /events request is resent first, with its seqs. A
// refused request is split in halves until the refused event stands alone;
// that event is dropped and counted, the others are delivered.
func (c *Client) Flush(ctx context.Context) error {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	if r := c.retry; r != nil {
		c.setRetry(nil)
		if err := c.deliver(ctx, r.events, r); err != nil {
			return err
		}
	}
	for {
		c.mu.Lock()
		n := min(len(c.queue), c.cfg.MaxBatch)
		if c.split > 0 {
			n = min(n, c.split)
		}
		if n == 0 {
			c.mu.Unlock()
			return nil
		}
		events := append([]Event(nil), c.queue[:n]...)
		c.queue = c.queue[n:]
		c.mu.Unlock()
		if err := c.deliver(ctx, events, nil); err != nil {
			return err
		}
	}
}

// deliver posts events (the head of the stream) and, when they are
// refused, starts or continues their bisection: it requeues them at the
// head and halves the next requests, or drops and counts a refused event
// that stands alone. Either way it returns nil, so the flush goes on.
// flushMu held.
func (c *Client) deliver(ctx context.Context, events []Event, prepared *eventsRequest) error {
	err := c.post(ctx, events, prepared)
	switch {
	case err == nil:
		if c.suspect > 0 {
			if c.suspect -= len(events); c.suspect <= 0 {
				c.split, c.suspect = 0, 0
			}
		}
		return nil
	case !errors.Is(err, errRefused):
		return err
	case len(events) == 1:
		c.split, c.suspect = 0, 0
		c.countDropped(1)
		ev := events[0]
		c.log.Warn("coordinator refused an event; dropped", "event_type", ev.Type, "chunk_hash_hex", ev.Key.ChunkHashHex,
			"model_name_bytes", len(ev.Key.ModelName), "err", err)
		return nil
	}
	kept := c.requeue(events)
	c.split, c.suspect = (kept+1)/2, kept
	c.log.Debug("coordinator refused an event request; splitting it", "events", len(events), "err", err)
	return nil
}

// post sends events through the current door. With EndpointAuto a 404
// (the coordinator does not serve that door) switches to the other door and
// tries again at once; the switch is kept for later flushes. prepared, when
// set, is the /events form of events built by an earlier attempt (its seqs
// are reused). On failure the events are kept for the next flush: as the
// /events request with its seqs (so a resend the coordinator already
// applied is a duplicate there), or back at the head of the queue for
// /quota/events; except on errRefused, where deliver decides.
func (c *Client) post(ctx context.Context, events []Event, prepared *eventsRequest) error {
	var err error
	for range 2 {
		if c.cfg.Publisher != nil {
			return c.publish(ctx, events)
		}
		if c.EventEndpoint() == EndpointEvents {
			req := prepared
			if req == nil {
				req = c.buildEvents(events)
			}
			err = c.sendEvents(ctx, req)
			if err == nil {
				return nil
			}
			if errors.Is(err, errNotServed) && c.cfg.EventEndpoint == EndpointAuto {
				c.switchEndpoint(EndpointQuotaEvents)
				continue
			}
			if !errors.Is(err, errRefused) {
				c.setRetry(req)
			}
			return err
		}
		err = c.sendQuota(ctx, events)
		if err == nil {
			return nil
		}
		if errors.Is(err, errNotServed) && c.cfg.EventEndpoint == EndpointAuto {
			c.switchEndpoint(EndpointEvents)
			prepared = nil
			continue
		}
		if errors.Is(err, errRefused) {
			return err
		}
		break
	}
	c.requeue(events)
	return err
}

func (c *Client) sendQuota(ctx context.Context, events []Event) error {
	b := Batch{InstanceID: c.InstanceID(), Seq: c.seq.Add(1), Events: events, Tier: "l2"}
	var resp struct {
		Recorded *int `json:"recorded"`
	}
	code, err := c.do(ctx, http.MethodPost, "/quota/events", b, &resp)
	if err == nil {
		err = statusErr(code)
	}
	if err == nil && resp.Recorded == nil {
		err = errors.New("coordinator reply lacks recorded")
	}
	if err != nil {
		if c.cfg.Metrics != nil {
			c.cfg.Metrics.CoordBatchesFailed.Inc()
		}
		return fmt.Errorf("post /quota/events seq=%d: %w", b.Seq, err)
	}
	c.sent.Add(1)
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.CoordBatchesSent.Inc()
	}
	return nil
}

// requeue puts a failed batch back at the head of the queue so a later
// flush retries it (the coordinator treats replays idempotently; each
// attempt gets a fresh seq). What no longer fits is dropped and counted;
// it returns how many it kept.
func (c *Client) requeue(events []Event) int {
	c.mu.Lock()
	room := c.cfg.QueueSize - len(c.queue)
	keep := min(max(room, 0), len(events))
	q := make([]Event, 0, keep+len(c.queue))
	q = append(q, events[:keep]...)
	c.queue = append(q, c.queue...)
	c.mu.Unlock()
	c.countDropped(len(events) - keep)
	return keep
}

// abandon ends event delivery after Run's final flush: what is still queued
// or awaiting a resend is dropped and counted (a flush that failed at
// shutdown loses these events; counting them keeps Dropped the whole
// loss), and later events are refused (see closed). It returns the number
// dropped.
func (c *Client) abandon() int {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	n := 0
	if r := c.retry; r != nil {
		n += len(r.events)
		c.setRetry(nil)
	}
	c.mu.Lock()
	n += len(c.queue)
	c.queue, c.closed = nil, true
	c.mu.Unlock()
	c.split, c.suspect = 0, 0
	c.countDropped(n)
	return n
}

// countDropped counts n lost events in Dropped and the metric.
func (c *Client) countDropped(n int) {
	if n <= 0 {
		return
	}
	c.dropped.Add(int64(n))
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.CoordEventsDropped.Add(float64(n))
	}
}

// NewInstanceID returns a random RFC 4122 version 4 UUID in canonical form,
// upstream's default --instance-id.
func NewInstanceID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
