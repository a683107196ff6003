package coordload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Fleet plays N MP servers against one or more coordinators for failover
// tests: each instance registers and heartbeats with every coordinator,
// serves DELETE /cache/objects (the eviction dispatch) and an empty
// GET /cache/objects on a real loopback listener, and streams cache-event
// batches in upstream's format (store, and delete for what it was told to
// evict): published to Kafka through a kafkaevents.Sink (one record per
// batch keyed by instance_id, as `lmcache server` does), or, without a
// Sink, posted to every coordinator's POST /events in order, retrying each
// until it takes the batch (the event gate drops a retried duplicate). The instances share
// one bucket, as MP servers behind one S3 bucket do: a key evicted through
// any instance is deleted, and its delete event goes into the stream of
// the instance that stored it, so every coordinator sees a key's store
// before its delete.
type Fleet struct {
	cfg     FleetConfig
	client  *http.Client
	inst    []*fleetInstance
	mu      sync.Mutex // guards live, dropped, retries, pubErr
	live    map[string]liveKey
	dropped map[string]bool  // targets no longer fed (killed)
	retries map[string]int64 // per target: POST /events sent again
	// registered is, per target, how many instances its last heartbeat
	// pass left registered.
	registered map[string]int
	pubErr     error // the first Sink.Publish failure
	ctx        context.Context
	g          *errgroup.Group
	cancel     context.CancelFunc
}

// FleetConfig is one simulated fleet.
type FleetConfig struct {
	// Targets are the coordinators' base URLs.
	Targets []string
	// Instances is the number of simulated MP servers.
	Instances int
	// KeysPerInstance is how many distinct keys each instance stores.
	KeysPerInstance int
	// Batch is the number of entries per event batch.
	Batch int
	// Salts is the number of cache_salt values keys are spread over.
	Salts int
	// Bytes is the base object size; key i is Bytes+i bytes, so every key
	// has a distinct size and per-salt byte sums identify the key set.
	Bytes int64
	// Window bounds how many batches an instance runs ahead of its
	// slowest live coordinator.
	Window int
	// Pace is the least time between one instance's store batches (0:
	// as fast as the coordinators take them).
	Pace time.Duration
	// Heartbeat is the registration/heartbeat interval.
	Heartbeat time.Duration
	// Timeout bounds each request.
	Timeout time.Duration
	// Sink, when set, carries the events (Kafka) instead of POST /events;
	// the caller owns and closes it.
	Sink *kafkaevents.Sink
}

type liveKey struct {
	owner int
	key   objkey.Encoded
	size  int64
}

type fleetInstance struct {
	id   string
	ln   net.Listener
	srv  *http.Server
	port int

	mu      sync.Mutex
	cond    *sync.Cond
	stream  [][]byte       // encoded POST /events bodies, in seq order
	cursors map[string]int // per target: batches it took
	seq     int64
	stores  int // store batches appended
	closed  bool
}

// StartFleet opens the instances' listeners and starts registering,
// heartbeating, producing and streaming; Wait returns when every stored
// key has reached every live target (deletes may still follow).
func StartFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	switch {
	case len(cfg.Targets) == 0 || cfg.Instances < 1 || cfg.KeysPerInstance < 1 || cfg.Batch < 1 || cfg.Salts < 1:
		return nil, errors.New("coordload: fleet needs targets, instances, keys, batch and salts")
	case cfg.Window < 1:
		cfg.Window = 4
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	f := &Fleet{cfg: cfg, client: NewClient(cfg.Instances * len(cfg.Targets)), live: map[string]liveKey{}, dropped: map[string]bool{}, retries: map[string]int64{}, registered: map[string]int{}}
	for j := range cfg.Instances {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			f.closeListeners()
			return nil, fmt.Errorf("coordload: listen: %w", err)
		}
		in := &fleetInstance{id: InstanceName(j), ln: ln, port: ln.Addr().(*net.TCPAddr).Port, cursors: map[string]int{}}
		in.cond = sync.NewCond(&in.mu)
		mux := http.NewServeMux()
		mux.HandleFunc("DELETE /cache/objects", f.handleDelete)
		mux.HandleFunc("GET /cache/objects", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"adapter":"s3","entries":[],"next_page_token":null}`)
		})
		in.srv = &http.Server{Handler: mux, ReadHeaderTimeout: cfg.Timeout}
		f.inst = append(f.inst, in)
	}
	ctx, f.cancel = context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(ctx)
	f.g, f.ctx = g, gctx
	for _, in := range f.inst {
		g.Go(func() error { // owned by the fleet; ends when Close shuts the server
			if err := in.srv.Serve(in.ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		for _, tgt := range cfg.Targets {
			if cfg.Sink == nil {
				g.Go(func() error { f.stream(gctx, in, tgt); return nil })
			}
		}
	}
	for _, tgt := range cfg.Targets {
		g.Go(func() error { f.heartbeats(gctx, tgt); return nil })
	}
	for j, in := range f.inst {
		g.Go(func() error { f.produce(gctx, j, in); return nil })
	}
	g.Go(func() error { <-gctx.Done(); f.shutdown(); return nil })
	return f, nil
}

func (f *Fleet) closeListeners() {
	for _, in := range f.inst {
		_ = in.ln.Close()
	}
}

func (f *Fleet) shutdown() {
	for _, in := range f.inst {
		in.mu.Lock()
		in.closed = true
		in.cond.Broadcast()
		in.mu.Unlock()
		sctx, cancel := context.WithTimeout(context.Background(), f.cfg.Timeout)
		_ = in.srv.Shutdown(sctx)
		cancel()
	}
}

// Close stops everything and waits for it.
func (f *Fleet) Close() error {
	f.cancel()
	err := f.g.Wait()
	f.client.CloseIdleConnections()
	return err
}

// Drop stops feeding a target (a coordinator that was killed), so it no
// longer holds the producers back.
func (f *Fleet) Drop(target string) {
	f.mu.Lock()
	f.dropped[target] = true
	f.mu.Unlock()
	for _, in := range f.inst {
		in.mu.Lock()
		in.cond.Broadcast()
		in.mu.Unlock()
	}
}

func (f *Fleet) isDropped(t string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dropped[t]
}

// PublishErr is the first failed Kafka publish (nil without a Sink).
func (f *Fleet) PublishErr() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pubErr
}

// Caught reports whether every batch streamed so far reached target (over
// HTTP; with a Sink the coordinators' Kafka lag says it).
func (f *Fleet) Caught(target string) bool {
	if f.cfg.Sink != nil {
		return true
	}
	for _, in := range f.inst {
		in.mu.Lock()
		ok := in.cursors[target] == len(in.stream)
		in.mu.Unlock()
		if !ok {
			return false
		}
	}
	return true
}

// Produced is how many keys the producers have appended so far, and
// whether that is all of them.
func (f *Fleet) Produced() (int, bool) {
	n := 0
	for _, in := range f.inst {
		in.mu.Lock()
		n += in.stores
		in.mu.Unlock()
	}
	n *= f.cfg.Batch
	return min(n, f.cfg.Instances*f.cfg.KeysPerInstance), n >= f.cfg.Instances*f.cfg.KeysPerInstance
}

// Live is the fleet's own view: bytes and keys per salt still stored.
func (f *Fleet) Live() (map[string]int64, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int64{}
	for _, k := range f.live {
		out[k.key.CacheSalt] += k.size
	}
	return out, len(f.live)
}

// LiveKeys is every key the fleet still stores, with its size: the exact
// ledger a coordinator that applied every event once must hold.
func (f *Fleet) LiveKeys() map[objkey.Encoded]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[objkey.Encoded]int64, len(f.live))
	for _, k := range f.live {
		out[k.key] = k.size
	}
	return out
}

// Seqs is each instance's last seq so far (store and delete batches
// alike, counted from 1): what a coordinator's event-gate cursor for the
// instance reads once it has applied every batch.
func (f *Fleet) Seqs() map[string]int64 {
	out := make(map[string]int64, len(f.inst))
	for _, in := range f.inst {
		in.mu.Lock()
		out[in.id] = in.seq
		in.mu.Unlock()
	}
	return out
}

// Registered is how many instances are registered with target, as of the
// last heartbeat pass over them.
func (f *Fleet) Registered(target string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.registered[target]
}

// Retries is how many POST /events to target failed and were sent again
// (over HTTP): a batch the coordinator applied but whose reply was lost is
// then a duplicate its gate drops, so a gate's duplicate count is at most
// this.
func (f *Fleet) Retries(target string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.retries[target]
}

// append adds one batch to in's stream and wakes its senders, or
// publishes it (under in.mu, so the instance's records keep seq order).
func (f *Fleet) append(in *fleetInstance, typ string, entries []kafkaevents.Entry) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.seq++
	b := kafkaevents.Batch{InstanceID: in.id, Incarnation: 1, Seq: in.seq, EventType: typ, Tier: kafkaevents.TierL2, Backend: "s3",
		TS: kafkaevents.PyFloat(time.Now().Unix()), Entries: entries}
	if f.cfg.Sink != nil {
		if err := f.cfg.Sink.Publish(f.ctx, []kafkaevents.Batch{b}); err != nil {
			f.mu.Lock()
			if f.pubErr == nil {
				f.pubErr = fmt.Errorf("coordload: publish %s seq %d: %w", in.id, in.seq, err)
			}
			f.mu.Unlock()
			return err
		}
		return nil
	}
	body, err := kafkaevents.Encode(b)
	if err != nil {
		return fmt.Errorf("coordload: encode batch: %w", err)
	}
	in.stream = append(in.stream, body)
	in.cond.Broadcast()
	return nil
}

// produce stores instance j's keys batch by batch, never more than Window
// batches ahead of its slowest live target.
func (f *Fleet) produce(ctx context.Context, j int, in *fleetInstance) {
	for first := 0; first < f.cfg.KeysPerInstance; first += f.cfg.Batch {
		in.mu.Lock()
		for !in.closed && f.behind(in) >= f.cfg.Window {
			in.cond.Wait()
		}
		closed := in.closed
		in.mu.Unlock()
		if closed || ctx.Err() != nil {
			return
		}
		var entries []kafkaevents.Entry
		f.mu.Lock()
		for k := first; k < min(first+f.cfg.Batch, f.cfg.KeysPerInstance); k++ {
			g := j*f.cfg.KeysPerInstance + k
			key := objkey.Encoded{ChunkHashHex: ChunkHash(g), ModelName: models[g%len(models)], KVRank: kvRank, CacheSalt: SaltName(g % f.cfg.Salts)}
			size := f.cfg.Bytes + int64(g)
			f.live[key.ChunkHashHex] = liveKey{owner: j, key: key, size: size}
			entries = append(entries, kafkaevents.Entry{Key: key, SizeBytes: size, TokenIDs: []int64{}, TokenOffset: kafkaevents.UnknownTokenOffset})
		}
		f.mu.Unlock()
		if err := f.append(in, kafkaevents.EventStore, entries); err != nil {
			return
		}
		in.mu.Lock()
		in.stores++
		in.mu.Unlock()
		if f.cfg.Pace > 0 {
			t := time.NewTimer(f.cfg.Pace) // rate limit
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// behind is how many batches in's slowest live target lacks (in.mu held).
func (f *Fleet) behind(in *fleetInstance) int {
	worst := 0
	for _, t := range f.cfg.Targets {
		if f.isDropped(t) {
			continue
		}
		worst = max(worst, len(in.stream)-in.cursors[t])
	}
	return worst
}

// stream sends in's batches to target in order, retrying each until it is
// taken, until the fleet stops or the target is dropped.
func (f *Fleet) stream(ctx context.Context, in *fleetInstance, target string) {
	url := strings.TrimSuffix(target, "/") + "/events"
	for {
		in.mu.Lock()
		for !in.closed && in.cursors[target] >= len(in.stream) {
			in.cond.Wait()
		}
		if in.closed {
			in.mu.Unlock()
			return
		}
		body := in.stream[in.cursors[target]]
		in.mu.Unlock()
		for {
			if ctx.Err() != nil || f.isDropped(target) {
				return
			}
			err := f.postEvents(ctx, url, body)
			if err == nil {
				break
			}
			f.mu.Lock()
			f.retries[target]++
			f.mu.Unlock()
			t := time.NewTimer(50 * time.Millisecond) // retry backoff
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		in.mu.Lock()
		in.cursors[target]++
		in.cond.Broadcast()
		in.mu.Unlock()
	}
}

func (f *Fleet) postEvents(ctx context.Context, url string, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(io.LimitReader(resp.Body, maxReply))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /events: %d %.200s", resp.StatusCode, reply)
	}
	return nil
}

// heartbeats registers every instance with target and keeps it
// registered: a heartbeat answered 404 (a restarted coordinator) registers
// again.
func (f *Fleet) heartbeats(ctx context.Context, target string) {
	base := strings.TrimSuffix(target, "/")
	registered := make([]bool, len(f.inst))
	t := time.NewTicker(f.cfg.Heartbeat)
	defer t.Stop()
	for {
		if f.isDropped(target) {
			return
		}
		for i, in := range f.inst {
			if registered[i] {
				code, err := f.do(ctx, http.MethodPut, base+"/instances/"+in.id+"/heartbeat", nil)
				if err != nil || code == http.StatusOK {
					registered[i] = err == nil
					continue
				}
			}
			reg, _ := json.Marshal(map[string]any{"instance_id": in.id, "ip": "127.0.0.1", "http_port": in.port})
			code, err := f.do(ctx, http.MethodPost, base+"/instances", reg)
			registered[i] = err == nil && code == http.StatusOK
		}
		n := 0
		for _, r := range registered {
			if r {
				n++
			}
		}
		f.mu.Lock()
		f.registered[target] = n
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (f *Fleet) do(ctx context.Context, method, url string, body []byte) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxReply))
	resp.Body.Close()
	return resp.StatusCode, nil
}

// handleDelete is an MP server's DELETE /cache/objects on the shared
// bucket: keys still stored are deleted and their delete events queued on
// their owners' streams.
func (f *Fleet) handleDelete(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Keys []objkey.Encoded `json:"keys"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&body); err != nil {
		http.Error(w, `{"detail":"bad body"}`, http.StatusUnprocessableEntity)
		return
	}
	byOwner := map[int][]kafkaevents.Entry{}
	f.mu.Lock()
	for _, k := range body.Keys {
		lk, ok := f.live[k.ChunkHashHex]
		if !ok || lk.key != k {
			continue
		}
		delete(f.live, k.ChunkHashHex)
		byOwner[lk.owner] = append(byOwner[lk.owner], kafkaevents.Entry{Key: lk.key, TokenIDs: []int64{}, TokenOffset: kafkaevents.UnknownTokenOffset})
	}
	f.mu.Unlock()
	deleted := 0
	for owner, entries := range byOwner {
		deleted += len(entries)
		if err := f.append(f.inst[owner], kafkaevents.EventDelete, entries); err != nil {
			http.Error(w, `{"detail":"encode"}`, http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"deleted":`+strconv.Itoa(deleted)+`,"skipped":`+strconv.Itoa(len(body.Keys)-deleted)+`,"ok":true}`)
}
