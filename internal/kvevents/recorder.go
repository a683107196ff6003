package kvevents

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// bindingCacheSize bounds the chunk hash -> tokens bindings kept between a
// store request being hashed and its chunks landing in L1 or L2 (the L2
// write-behind may land long after).
const bindingCacheSize = 65536

// binding is one chunk's content and chain position.
type binding struct {
	hash   string
	tokens []uint32
	parent []byte
}

// Drops names the reasons a recorder drops an event, for the
// lmcache_mp_kv_events_dropped_total counter.
const (
	// DropUnbound: a stored chunk whose tokens the recorder never saw (an
	// L2 load of a chunk stored before a restart, or a binding trimmed
	// from the bounded cache): a router indexes
	// stored blocks by their tokens, so none is published.
	DropUnbound = "unbound_store"
	// DropSalted: a chunk of a request with a cache_salt. vLLM folds the
	// salt into its block hashes, so a router can never match such a
	// chunk; publishing it would only mislead (two tenants' chunks share
	// one hash here).
	DropSalted = "salted"
	// DropQueueFull: the publisher's queue was full; the batch is lost to
	// subscribers (the POLL_KV_EVENTS log still has it).
	DropQueueFull = "publisher_queue_full"
	// DropLogOverflow: the full log discarded its oldest record to make
	// room (normal once the log has filled; a poller that had not read it
	// is told lost, so a rate well above the poll rate means pollers fall
	// behind).
	DropLogOverflow = "log_overflow"
)

// Recorder turns storage events into log records and published batches.
// It implements the engine's KV event sink; every method is safe for
// concurrent use and never blocks on I/O.
type Recorder struct {
	log       *Log       // nil: POLL_KV_EVENTS disabled
	pub       *Publisher // nil: no native publisher
	blockSize int
	dropped   func(reason string, n int)

	// mu orders the log and the publisher: records get their sequence
	// numbers and batches their place in the queue in the same order.
	mu sync.Mutex
	// binds indexes order's elements (each a binding) by chunk hash;
	// order runs from the least recently bound to the most, so a chunk
	// bound again moves to the back and trimming drops the oldest first,
	// as upstream's OrderedDict with move_to_end.
	binds   map[string]*list.Element
	order   *list.List
	unbound int64
}

// NewRecorder builds a recorder feeding log and pub (either may be nil).
// blockSize is the chunk size in tokens; dropped counts dropped events by
// reason (nil: not counted), the events of batches pub's socket refused
// included, so pub must not be running yet. pub's failed replays are not
// events and go to New's Config.ReplayFailed instead.
func NewRecorder(log *Log, pub *Publisher, blockSize int, dropped func(reason string, n int)) *Recorder {
	if dropped == nil {
		dropped = func(string, int) {}
	} else if pub != nil {
		// The events of batches the publisher's socket refused go to
		// the same counter. pub's Run has not started: the Recorder's
		// Run starts it.
		pub.dropped = dropped
	}
	return &Recorder{log: log, pub: pub, blockSize: blockSize, dropped: dropped, binds: map[string]*list.Element{}, order: list.New()}
}

// Log is the POLL_KV_EVENTS log, nil when disabled.
func (r *Recorder) Log() *Log {
	if r == nil {
		return nil
	}
	return r.log
}

// Enabled reports whether anything consumes the events (bindings are only
// worth recording then).
func (r *Recorder) Enabled() bool { return r != nil && (r.log != nil || r.pub != nil) }

// Unbound is the number of stored chunks skipped for want of a binding.
func (r *Recorder) Unbound() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unbound
}

// Bind records the tokens and parent hash of chunks a store request is
// about to write: hashes[i] covers tokens[i]; parent is the hash of the
// chunk before hashes[0] (nil when hashes[0] starts the sequence). The
// hashes are copied; the token slices are kept (records share them), so
// the caller hands over slices it never changes again.
func (r *Recorder) Bind(parent []byte, hashes [][]byte, tokens [][]uint32) {
	if !r.Enabled() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, h := range hashes {
		b := binding{hash: string(h), tokens: tokens[i]}
		if i == 0 {
			if parent != nil {
				b.parent = append([]byte(nil), parent...)
			}
		} else {
			b.parent = append([]byte(nil), hashes[i-1]...)
		}
		if e, ok := r.binds[b.hash]; ok {
			e.Value = b
			r.order.MoveToBack(e)
		} else {
			r.binds[b.hash] = r.order.PushBack(b)
		}
	}
	if len(r.binds) <= bindingCacheSize {
		return
	}
	// Trim to half in one go so trimming stays rare; the oldest go first.
	for len(r.binds) > bindingCacheSize/2 {
		e := r.order.Front()
		delete(r.binds, r.order.Remove(e).(binding).hash)
	}
}

// BindTokens binds the chunks of a token sequence addressed from its
// first token (an HTTP /api/kv store): hashes[i] covers tokens
// [i*blockSize, (i+1)*blockSize). Token ids are vLLM's (they fit in 32
// bits; the hasher range-checked them). A sequence shorter than its
// hashes claim binds nothing.
func (r *Recorder) BindTokens(hashes [][]byte, tokens []int64) {
	if !r.Enabled() || len(hashes) == 0 || len(tokens) < len(hashes)*r.blockSize {
		return
	}
	toks := make([][]uint32, len(hashes))
	for i := range hashes {
		t := make([]uint32, r.blockSize)
		for j, v := range tokens[i*r.blockSize : (i+1)*r.blockSize] {
			t[j] = uint32(v)
		}
		toks[i] = t
	}
	r.Bind(nil, hashes, toks)
}

// Stored records that keys now reside in medium: one record per distinct
// (model, chunk) however many ranks and object groups carry it, since a
// router tracks chunks, not shards.
func (r *Recorder) Stored(medium string, keys []objkey.Key) {
	if !r.Enabled() || len(keys) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[[3]string]bool{}
	var events []Record
	for _, k := range keys {
		id := [3]string{k.ModelName, k.ChunkHash, k.CacheSalt}
		if seen[id] {
			continue
		}
		seen[id] = true
		if k.CacheSalt != "" {
			r.dropped(DropSalted, 1)
			continue
		}
		e, ok := r.binds[k.ChunkHash]
		if !ok {
			r.unbound++
			r.dropped(DropUnbound, 1)
			continue
		}
		b := e.Value.(binding)
		rec := Record{Kind: KindStored, Medium: medium, Model: k.ModelName, Hashes: [][]byte{[]byte(k.ChunkHash)},
			Parent: b.parent, Tokens: b.tokens, BlockSize: r.blockSize}
		events = append(events, r.append(rec))
	}
	r.publish(events)
}

// Removed records that keys left medium: one record per model. A clear is
// announced this way too, never as AllBlocksCleared, which a router would
// apply to the GPU tier as well.
func (r *Recorder) Removed(medium string, keys []objkey.Key) {
	if !r.Enabled() || len(keys) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[[3]string]bool{}
	byModel := map[string][][]byte{}
	var models []string
	for _, k := range keys {
		id := [3]string{k.ModelName, k.ChunkHash, k.CacheSalt}
		if seen[id] {
			continue
		}
		seen[id] = true
		if k.CacheSalt != "" {
			r.dropped(DropSalted, 1)
			continue
		}
		if _, ok := byModel[k.ModelName]; !ok {
			models = append(models, k.ModelName)
		}
		byModel[k.ModelName] = append(byModel[k.ModelName], []byte(k.ChunkHash))
	}
	events := make([]Record, 0, len(models))
	for _, m := range models {
		events = append(events, r.append(Record{Kind: KindRemoved, Medium: medium, Model: m, Hashes: byModel[m], BlockSize: r.blockSize}))
	}
	r.publish(events)
}

// append adds rec to the log (if any) and returns it with its sequence
// number. Called with mu held.
func (r *Recorder) append(rec Record) Record {
	if r.log != nil {
		var discarded bool
		rec.Seq, discarded = r.log.Append(rec)
		if discarded {
			r.dropped(DropLogOverflow, 1)
		}
	}
	return rec
}

// publish queues one batch of events. Called with mu held, so batches
// queue in sequence order.
func (r *Recorder) publish(events []Record) {
	if r.pub == nil || len(events) == 0 {
		return
	}
	if reason := r.pub.enqueue(events); reason != "" {
		r.dropped(reason, len(events))
	}
}

// Config configures New.
type Config struct {
	// LogSize is --kv-event-log-size: records kept for POLL_KV_EVENTS; 0
	// disables the log (and the kv_events capability).
	LogSize int
	// BlockSize is the chunk size in tokens, stamped on every record.
	BlockSize int
	// Publisher configures the native vLLM-format publisher; an empty
	// Endpoint disables it.
	Publisher PublisherConfig
	// Loops is where the publisher's loop registers (required with a
	// publisher).
	Loops *periodic.Registry
	// Dropped counts dropped events by reason (nil: not counted).
	Dropped func(reason string, n int)
	// ReplayFailed counts the publisher's replay requests not answered in
	// full, once per request, by reason (ReplayInvalid, ReplayAborted;
	// nil: not counted). A request is not an event, so these are kept
	// apart from Dropped.
	ReplayFailed func(reason string)
	Logger       *slog.Logger
}

// New builds the recorder of the server's KV events: the log when
// LogSize > 0, the publisher (sockets open) when Publisher.Endpoint is set.
// Run drives the publisher; Close releases it if Run never ran.
func New(cfg Config) (*Recorder, error) {
	if cfg.LogSize < 0 {
		return nil, fmt.Errorf("kvevents: --kv-event-log-size must be >= 0 (got %d)", cfg.LogSize)
	}
	var lg *Log
	if cfg.LogSize > 0 {
		var err error
		if lg, err = NewLog(cfg.LogSize); err != nil {
			return nil, err
		}
	}
	var pub *Publisher
	if cfg.Publisher.Endpoint != "" {
		if cfg.Loops == nil {
			return nil, errors.New("kvevents: a publisher needs a periodic registry")
		}
		var err error
		if pub, err = NewPublisher(cfg.Publisher, cfg.Loops, cfg.Logger); err != nil {
			return nil, err
		}
		if cfg.ReplayFailed != nil {
			pub.replayFailed = cfg.ReplayFailed
		}
	}
	return NewRecorder(lg, pub, cfg.BlockSize, cfg.Dropped), nil
}

// Publisher is the native publisher, nil when off.
func (r *Recorder) Publisher() *Publisher { return r.pub }

// Run runs the publisher until ctx is cancelled (returns at once without
// one). It always returns nil.
func (r *Recorder) Run(ctx context.Context) error {
	if r.pub != nil {
		r.pub.Run(ctx)
	}
	return nil
}

// Close releases the publisher's sockets if Run never ran, counting the
// batches still queued as publish_failed; after Run it does nothing.
// Batches published after either are refused and counted the same way.
func (r *Recorder) Close() {
	if r.pub != nil {
		r.pub.closeOnce.Do(r.pub.release)
	}
}
