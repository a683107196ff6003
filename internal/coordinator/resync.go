package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/coordinator/mpclient"
	"github.com/lmcache-go/lmcache/internal/coordinator/registry"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// resyncLoop is the one-shot startup resync as a periodic loop: each cycle
// checks for a registered server (every RESYNC_POLL_INTERVAL, for at most
// RESYNC_MAX_WAIT) and, once there is one, seeds the trackers from its L2
// listing and ends the loop. It is best-effort: failures are logged and
// whatever was recorded is kept. The loop runs under its own child of ctx,
// cancelled by its last cycle, so Loop.Run returns when the resync is done.
func (s *Server) resyncLoop(ctx context.Context) func() {
	rctx, done := context.WithCancel(ctx)
	deadline := time.Now().Add(config.Seconds(s.cfg.ResyncMaxWait))
	first := true
	cycle := func(context.Context) (periodic.Summary, error) {
		if !s.mayLead() {
			// The wait for a first server starts when this coordinator leads.
			deadline = time.Now().Add(config.Seconds(s.cfg.ResyncMaxWait))
			if s.resyncOnStream() {
				return periodic.Summary{Message: "standby: on kafka this coordinator will not resync when it leads (its ledger is the stream's)"}, nil
			}
			return periodic.Summary{Message: "standby: resync runs once this coordinator leads"}, nil
		}
		if s.resyncOnStream() {
			s.resyncSkipped.Store(1)
			s.log.Info("startup resync skipped: leading in HA mode on kafka; this coordinator's own consumer group fed its ledger from the stream (keys, sizes and LRU order kept)",
				"group_id", s.cfg.Ingest.KafkaGroupID, "keys", s.ledger.Stats().Keys)
			done()
			return periodic.Summary{Message: "skipped: leading on the kafka stream's ledger"}, nil
		}
		if inst, ok := s.reg.Random(); ok {
			n := s.ResyncFrom(rctx, inst)
			s.log.Info("startup resync finished", "instance_id", inst.InstanceID, "keys", n)
			done()
			return periodic.Summary{Message: fmt.Sprintf("finished: %d keys from %s", n, inst.InstanceID)}, nil
		}
		if !time.Now().Before(deadline) {
			s.log.Info("startup resync giving up: no MP server registered", "waited_s", s.cfg.ResyncMaxWait)
			done()
			return periodic.Summary{Message: "gave up: no MP server registered"}, nil
		}
		if first {
			first = false
			s.log.Info("startup resync waiting for the first MP server to register", "max_wait_s", s.cfg.ResyncMaxWait)
		}
		return periodic.Summary{Message: "waiting for the first MP server"}, nil
	}
	l := s.loops.Register(LoopResync, periodic.Medium, config.Seconds(s.cfg.ResyncPollInterval), 0, cycle)
	return func() { defer done(); l.Run(rctx) }
}

// maxResyncEntries bounds one startup resync: it reads at most this many
// entries' worth of pages (ceil(maxResyncEntries / page size) pages, so an
// empty page counts as a full one). A listing only repeats tokens when it
// cycles, which the resync detects; a server that hands out a new token
// with every page forever (a bug, or a listing that grows as fast as it is
// read) would otherwise keep the resync, its loop and its memory of the
// tokens growing until shutdown. 2^26 keys is three times the largest
// ledger measured (BENCHMARKS.md, 20M keys). A variable for tests.
var maxResyncEntries = 1 << 26

// The reasons of resync_stopped_total.
const (
	resyncStopTokenRepeated = "token_repeated"
	resyncStopPageLimit     = "page_limit"
)

// resyncEntry is one GET /cache/objects entry; pointers tell missing fields
// from zero values.
type resyncEntry struct {
	Key *struct {
		ChunkHashHex  *string `json:"chunk_hash_hex"`
		ModelName     *string `json:"model_name"`
		KVRank        *int64  `json:"kv_rank"`
		ObjectGroupID *int64  `json:"object_group_id"`
		CacheSalt     *string `json:"cache_salt"`
	} `json:"key"`
	SizeBytes json.RawMessage `json:"size_bytes"`
}

// pyInt converts a JSON value the way Python's int() does for the values a
// server can send: ints, floats (truncated) and numeric strings.
func pyInt(raw json.RawMessage) (int64, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, false
	}
	switch x := v.(type) {
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) || math.Abs(x) > 9e18 {
			return 0, false
		}
		if i, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
			return i, true
		}
		return int64(x), true
	case string:
		i, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		return i, err == nil
	}
	return 0, false
}

func parseResyncEntry(raw json.RawMessage) (ledger.Key, int64, bool) {
	var e resyncEntry
	if err := json.Unmarshal(raw, &e); err != nil || e.Key == nil {
		return ledger.Key{}, 0, false
	}
	k := e.Key
	if k.ChunkHashHex == nil || k.ModelName == nil || k.KVRank == nil {
		return ledger.Key{}, 0, false
	}
	enc := objkey.Encoded{ChunkHashHex: *k.ChunkHashHex, ModelName: *k.ModelName, KVRank: *k.KVRank}
	if k.ObjectGroupID != nil {
		enc.ObjectGroupID = *k.ObjectGroupID
	}
	if k.CacheSalt != nil {
		enc.CacheSalt = *k.CacheSalt
	}
	size, ok := pyInt(e.SizeBytes)
	if !ok || size < 0 {
		return ledger.Key{}, 0, false
	}
	lk, err := ledger.Prepare(&enc)
	if err != nil {
		return ledger.Key{}, 0, false
	}
	return lk, size, true
}

// resyncOnStream reports whether a coordinator that comes to lead skips the
// startup resync because its ledger is the event stream's: in HA mode on
// Kafka every coordinator, standbys included, consumes the whole topic in
// its own consumer group, so the new leader's ledger already holds what a
// listing would (and, from the stream, the fleet's LRU order, which a
// resync would re-sort into listing order). Over HTTP an MP server reports
// to whichever coordinator it reaches, so a standby's ledger is partial and
// the new leader still resyncs. Newer upstream replays a durable stream
// instead of scanning (ingest.md "Sources").
func (s *Server) resyncOnStream() bool { return s.ha != nil && s.kafka != nil }

// ResyncFrom pages through inst's GET /cache/objects and records every
// well-formed entry; listing order becomes LRU order. Over a ledger
// restored from a checkpoint with HTTP ingest it only adds the keys the
// ledger lacks (resyncMerges). It returns the number of keys recorded and
// stops at the first failed page, keeping what it had.
func (s *Server) ResyncFrom(ctx context.Context, inst registry.Instance) int {
	pageSize := s.cfg.ResyncPageSize
	if pageSize > config.MaxResyncPageSize {
		s.log.Warn("RESYNC_PAGE_SIZE above the MP server's maximum; clamped", "configured", pageSize, "used", config.MaxResyncPageSize)
		pageSize = config.MaxResyncPageSize
	}
	base := mpclient.BaseURL(inst.IP, inst.HTTPPort)
	maxPages := (maxResyncEntries + pageSize - 1) / pageSize
	var token *string
	// seen holds a digest of every token handed out so far: a server that
	// cycles through tokens (A, B, A, ...) would otherwise keep the resync,
	// and its loop, running until shutdown, storing the same keys again.
	// Digests, because a token is the server's and may be long.
	seen := map[[sha256.Size]byte]bool{}
	pages := 0
	merge := s.resyncMerges()
	if merge {
		s.log.Info("startup resync merging into the ledger restored from a checkpoint: adding the keys it lacks (events acknowledged after it was written are lost over HTTP); restored keys keep their sizes and LRU order",
			"instance_id", inst.InstanceID, "path", s.ckpt.restoredFrom)
	}
	s.ledger.BeginListing()
	defer s.ledger.EndListing()
	total := 0
	for {
		page, err := s.mp.ListObjects(ctx, base, pageSize, token)
		if err != nil {
			s.log.Warn("startup resync stopped; keeping what was recorded", "instance_id", inst.InstanceID, "keys", total, "err", s.scrub(err))
			return total
		}
		s.metrics.resyncPages.Inc()
		pages++
		skipped := 0
		for _, raw := range page.Entries {
			k, size, ok := parseResyncEntry(raw)
			if !ok {
				skipped++
				continue
			}
			stored, superseded := s.ledger.StoreListed(k, size, merge)
			if superseded {
				// Deleted since the resync began: the page is older.
				s.metrics.resyncSuperseded.Inc()
			}
			if !stored {
				continue
			}
			total++
			s.metrics.resyncKeys.Inc()
		}
		if skipped > 0 {
			s.metrics.resyncSkipped.Add(float64(skipped))
			s.log.Warn("startup resync skipped malformed entries", "count", skipped, "instance_id", inst.InstanceID)
		}
		if page.NextPageToken == nil {
			return total
		}
		d := sha256.Sum256([]byte(*page.NextPageToken))
		if seen[d] {
			s.metrics.resyncStopped.WithLabelValues(resyncStopTokenRepeated).Inc()
			s.log.Warn("startup resync stopped: server repeated its page token", "token", *page.NextPageToken)
			return total
		}
		if pages >= maxPages {
			s.metrics.resyncStopped.WithLabelValues(resyncStopPageLimit).Inc()
			s.log.Warn("startup resync stopped at its page bound; keeping what was recorded (the server's listing did not end)",
				"instance_id", inst.InstanceID, "pages", pages, "max_pages", maxPages, "page_size", pageSize, "keys", total)
			return total
		}
		seen[d] = true
		token = page.NextPageToken
	}
}
