package coordinator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lmcache-go/lmcache/internal/coordinator/checkpoint"
	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/coordinator/eventgate"
	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// LoopCheckpoint is the checkpoint loop's name in the periodic registry.
const LoopCheckpoint = "coordinator-checkpoint"

// checkpointer saves derived state to --checkpoint-path on a timer and at a
// clean stop, and restored it at startup.
type checkpointer struct {
	path string
	// Set once in New.
	restoredKeys, restoredStreams int
	restoredFrom                  string // "" when cold
	loadFailures                  int    // 1 when a bad artifact was moved aside
	// Updated by saves (the loop and the final save at stop).
	saves, saveFailures atomic.Int64
	lastDuration        atomic.Int64 // nanoseconds
	lastSize            atomic.Int64
	lastSuccess         atomic.Int64 // unix nanoseconds
}

// setupIngest restores the checkpoint (when configured) and builds the
// Kafka source (in kafka mode), positioned at the checkpoint's stream
// position. Called by New after the state file is loaded.
func (s *Server) setupIngest() error {
	in := s.cfg.Ingest
	var start map[int32]int64
	if in.CheckpointPath != "" {
		s.ckpt = &checkpointer{path: in.CheckpointPath}
		s.removeStaleTemps(in.CheckpointPath)
		pos, err := s.restoreCheckpoint()
		if err != nil {
			return err
		}
		start = pos
	}
	if in.Kafka() {
		// With a checkpoint configured the stream position comes only
		// from it: a partition it does not name is read from the earliest
		// retained record, because the ledger holds nothing from it (the
		// group's commit may be ahead of the state restored). An HA
		// coordinator without one does the same for every partition: it
		// never resyncs (resyncOnStream), so the stream is the only way
		// its empty ledger learns what came before the group's commit.
		return s.newKafkaIngest(start, s.ckpt != nil || s.ha != nil)
	}
	return nil
}

// restoreCheckpoint loads the artifact into a fresh ledger and gate and
// swaps them in only when every section decoded. A bad artifact is moved
// aside, logged at ERROR and counted; the coordinator then starts cold. It
// returns the stream position to resume from (nil when none applies).
func (s *Server) restoreCheckpoint() (map[int32]int64, error) {
	c := s.ckpt
	began := time.Now()
	d, err := checkpoint.Load(c.path)
	if errors.Is(err, os.ErrNotExist) {
		s.log.Info("no checkpoint yet; starting cold", "path", c.path)
		return nil, nil
	}
	var pos map[int32]int64
	if err == nil {
		nl, ng, nt := ledger.New(), eventgate.New(maxSeqTracked), newTombstones()
		// Pins first: the load parks the pinned keys at each salt's
		// least recent end, so the first plan does not walk them.
		nl.RestorePins(s.ledger.Pins())
		var topic string
		var keys, streams int
		err = d.Sections(map[string]func(*checkpoint.Decoder){
			"gate":       func(d *checkpoint.Decoder) { streams = ng.Restore(d) },
			"ledger":     func(d *checkpoint.Decoder) { keys = nl.LoadCheckpoint(d) },
			"stream":     func(d *checkpoint.Decoder) { topic, pos = readStream(d) },
			"tombstones": func(d *checkpoint.Decoder) { nt.loadCheckpoint(d) }, // absent before 2026-12-02: none
		})
		if err == nil {
			s.ledger, s.gate, s.tombs = nl, ng, nt
			c.restoredKeys, c.restoredStreams, c.restoredFrom = keys, streams, c.path
			if in := s.cfg.Ingest; pos != nil && (!in.Kafka() || topic != in.KafkaTopic) {
				s.log.Warn("checkpoint's stream position is for another topic; reading the configured one from its start", "checkpoint_topic", topic, "topic", in.KafkaTopic)
				pos = nil
			}
			s.log.Info("checkpoint restored", "path", c.path, "keys", keys, "streams", streams, "partitions", len(pos), "took", time.Since(began))
			return pos, nil
		}
		err = fmt.Errorf("%w %s: %w", checkpoint.ErrCorrupt, c.path, err)
	}
	if !errors.Is(err, checkpoint.ErrCorrupt) {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	aside, merr := checkpoint.MoveAside(c.path, time.Now())
	if merr != nil {
		return nil, fmt.Errorf("%w; %w", err, merr)
	}
	c.loadFailures = 1
	s.log.Error("CHECKPOINT UNUSABLE: moved aside, starting cold (usage and LRU order are empty until the stream is replayed or resync runs)", "path", c.path, "moved_to", aside, "err", err)
	return nil, nil
}

// resyncSkippedForCheckpoint reports whether the startup resync is left
// out because a checkpoint was restored, and logs and counts it when so.
// On Kafka the restored ledger already holds the keys, sizes and LRU order
// the resync would list, and the stream, read from the checkpoint's
// position, carries what changed since: a resync would only move every
// listed key to the MRU end in listing order, throwing the restored order
// away, and re-read a whole L2 listing for nothing. Newer upstream dropped
// its startup scan for the same reason (ingest.md: a scan has no stream
// position; event replay from a durable transport needs none). Over HTTP
// nothing replays the events acknowledged after the checkpoint was
// written, so the resync runs, merging (resyncMerges). A cold start (no
// checkpoint, or a bad one moved aside) still resyncs.
func (s *Server) resyncSkippedForCheckpoint() bool {
	c := s.ckpt
	if c == nil || c.restoredFrom == "" || s.resyncMerges() {
		return false
	}
	s.resyncSkipped.Store(1)
	s.log.Info("startup resync skipped: the ledger was restored from a checkpoint (keys, sizes and LRU order kept; remove the checkpoint to resync instead)", "path", c.restoredFrom, "keys", c.restoredKeys)
	return true
}

// resyncMerges reports whether the startup resync merges its listing into
// a ledger restored from a checkpoint (ledger.StoreListed with keepKnown) instead of
// recording every entry: with HTTP ingest and a restored checkpoint. The
// events a server had acknowledged (200) after the last checkpoint are
// gone with the process (kill -9) and no stream replays them, so the keys
// they stored are added from the listing; the restored keys keep their
// sizes and LRU order. Keys deleted after the checkpoint stay in the
// ledger until eviction drops them as phantoms (phantomDispatches).
func (s *Server) resyncMerges() bool {
	return s.ckpt != nil && s.ckpt.restoredFrom != "" && !s.cfg.Ingest.Kafka()
}

func readStream(d *checkpoint.Decoder) (string, map[int32]int64) {
	topic := d.String()
	n := d.Count(2)
	pos := make(map[int32]int64, n)
	for i := 0; i < n && d.Err() == nil; i++ {
		p, off := d.Varint(), d.Varint()
		if p < 0 || p > 1<<31-1 || off < 0 {
			d.Failf("stream position %d@%d", p, off)
			break
		}
		pos[int32(p)] = off
	}
	return topic, pos
}

// captureCheckpoint encodes the gate's cursors, the ledger and the stream
// position while the gate's lock holds ingest still (HTTP /events and Kafka
// alike), so they describe one instant. The stream position is read last:
// a position only advances after its record applied, so it never runs ahead
// of the ledger captured with it.
func (s *Server) captureCheckpoint() *checkpoint.Encoder {
	var e checkpoint.Encoder
	s.gate.Capture(&e, func(e *checkpoint.Encoder) {
		e.Section("ledger", s.ledger.AppendCheckpoint)
		e.Section("tombstones", s.tombs.appendCheckpoint)
		if s.kafka != nil {
			pos := s.kafka.src.Positions()
			parts := make([]int32, 0, len(pos))
			for p := range pos {
				parts = append(parts, p)
			}
			sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
			e.Section("stream", func(e *checkpoint.Encoder) {
				e.String(s.kafka.src.Topic())
				e.Uvarint(uint64(len(parts)))
				for _, p := range parts {
					e.Varint(int64(p))
					e.Varint(pos[p])
				}
			})
		}
	})
	return &e
}

// SaveCheckpoint captures and writes a checkpoint now (the loop, the final
// save at a clean stop, tests and benchmarks). Without --checkpoint-path it
// does nothing.
func (s *Server) SaveCheckpoint() error {
	c := s.ckpt
	if c == nil {
		return nil
	}
	began := time.Now()
	e := s.captureCheckpoint()
	err := checkpoint.Save(c.path, e)
	c.lastDuration.Store(int64(time.Since(began)))
	if err != nil {
		c.saveFailures.Add(1)
		return err
	}
	c.saves.Add(1)
	c.lastSize.Store(int64(e.Len()))
	c.lastSuccess.Store(time.Now().UnixNano())
	return nil
}

// checkpointLoop is the timer; nil when --checkpoint-interval is 0.
func (s *Server) checkpointLoop(ctx context.Context) func() {
	if s.ckpt == nil || s.cfg.Ingest.CheckpointInterval <= 0 {
		return nil
	}
	d := config.Seconds(s.cfg.Ingest.CheckpointInterval)
	l := s.loops.Register(LoopCheckpoint, periodic.Medium, d, d, func(context.Context) (periodic.Summary, error) {
		if err := s.SaveCheckpoint(); err != nil {
			s.log.Error("checkpoint failed; the previous one stays", "path", s.ckpt.path, "err", err)
			return periodic.Summary{}, err
		}
		return periodic.Summary{Message: fmt.Sprintf("bytes=%d took=%s", s.ckpt.lastSize.Load(), time.Duration(s.ckpt.lastDuration.Load()))}, nil
	})
	return func() { l.Run(ctx) }
}

// finalCheckpoint is the save at a clean stop, after ingest has stopped.
// SaveCheckpoint counts a failure in checkpoint_save_failures_total, as
// for the loop's saves; the process is about to exit, so nothing may
// scrape that count, and the ERROR line is the record an operator sees
// (the next start restores the previous artifact and replays from its
// position).
func (s *Server) finalCheckpoint() {
	if s.ckpt == nil {
		return
	}
	if err := s.SaveCheckpoint(); err != nil {
		s.log.Error("final checkpoint failed; the previous one stays (counted in lmcache_coordinator_checkpoint_save_failures_total)", "path", s.ckpt.path, "err", err)
		return
	}
	s.log.Info("checkpoint saved at stop", "path", s.ckpt.path, "bytes", s.ckpt.lastSize.Load())
}

// ingestLoops are the loops this file and kafkaingest.go add to Run.
func (s *Server) ingestLoops(ctx context.Context) []func() {
	var out []func()
	if s.kafka != nil {
		out = append(out, s.kafkaLoops(ctx)...)
	}
	if l := s.checkpointLoop(ctx); l != nil {
		out = append(out, l)
	}
	return out
}

// ingestCollectors are the checkpoint and Kafka metrics.
func (s *Server) ingestCollectors() []prometheus.Collector {
	var out []prometheus.Collector
	if s.kafka != nil {
		out = append(out, s.kafkaCollectors()...)
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metricPrefix + name, Help: help}, f)
	}
	// Exported where a skip can happen: with a checkpoint, or in HA mode
	// on Kafka.
	if s.ckpt != nil || s.resyncOnStream() {
		out = append(out, counter("startup_resync_skipped_total",
			"Startup resyncs not run (0 or 1 per process): with Kafka ingest, the ledger was restored from a checkpoint, or, in HA mode, this coordinator came to lead with the ledger its own consumer group fed. With HTTP ingest a restored ledger is resynced by merging (only keys it lacks are added), so this stays 0. ENABLE_STARTUP_RESYNC still applies to a cold start otherwise.",
			func() float64 { return float64(s.resyncSkipped.Load()) }))
	}
	c := s.ckpt
	if c == nil {
		return out
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrefix + name, Help: help}, f)
	}
	return append(out,
		counter("checkpoint_saves_total", "Checkpoints written to --checkpoint-path.", func() float64 { return float64(c.saves.Load()) }),
		counter("checkpoint_save_failures_total", "Checkpoint writes that failed (the previous artifact stays).", func() float64 { return float64(c.saveFailures.Load()) }),
		counter("checkpoint_load_failures_total", "Checkpoints found unusable at startup (truncated, bad checksum, other version), moved aside; the coordinator started cold.", func() float64 { return float64(c.loadFailures) }),
		gauge("checkpoint_restored_keys", "Ledger keys restored from the checkpoint at startup.", func() float64 { return float64(c.restoredKeys) }),
		gauge("checkpoint_last_duration_seconds", "Time the last checkpoint took (capture under the ingest lock plus the write).", func() float64 { return time.Duration(c.lastDuration.Load()).Seconds() }),
		gauge("checkpoint_last_size_bytes", "Payload size of the last checkpoint written.", func() float64 { return float64(c.lastSize.Load()) }),
		gauge("checkpoint_last_success_timestamp_seconds", "Unix time of the last checkpoint written (0: none yet).", func() float64 { return float64(c.lastSuccess.Load()) / 1e9 }),
	)
}
