package kafkaevents

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// UnknownLag is what Lag reports when the brokers cannot answer: an
// unreachable broker must never read as caught up (upstream's UNKNOWN_LAG).
const UnknownLag = -1

// Lag is how many records of the topic are still to read, summed over
// partitions: end offset minus the Source's position where it has one
// (records handled, or a checkpoint's StartOffsets), else minus the group's
// committed offset, else minus the start offset (consumption starts at the
// earliest offset). A position below the start offset counts from the start
// offset, since the records before it are gone. Because the Source commits
// only past applied records, this is an upper bound on what is still to
// apply, for a readiness gate such as upstream's --max-ready-lag. It may be
// called from any goroutine, before, during or after Run. Between Open and
// Close it asks through the consumer's client, so a readiness loop polling
// it every second opens no connection per call; otherwise it uses a
// short-lived client of its own (a call racing Close fails). On any error
// it returns UnknownLag.
func (s *Source) Lag(ctx context.Context) (int64, error) {
	cl := s.live.Load()
	if cl == nil {
		own, err := kgo.NewClient(kgo.SeedBrokers(s.cfg.Brokers...), kgo.ClientID(sourceClientID))
		if err != nil {
			return UnknownLag, fmt.Errorf("kafkaevents: lag client: %w", err)
		}
		defer own.Close()
		cl = own
	}
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, s.cfg.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return UnknownLag, fmt.Errorf("kafkaevents: end offsets of %s: %w", s.cfg.Topic, err)
	}
	s.partitions.Store(int64(len(ends[s.cfg.Topic])))
	starts, err := adm.ListStartOffsets(ctx, s.cfg.Topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return UnknownLag, fmt.Errorf("kafkaevents: start offsets of %s: %w", s.cfg.Topic, err)
	}
	committed, err := adm.FetchOffsetsForTopics(ctx, s.cfg.GroupID, s.cfg.Topic)
	if err == nil {
		err = committed.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		// A group that never committed: everything is still to read.
		committed, err = nil, nil
	}
	if err != nil {
		return UnknownLag, fmt.Errorf("kafkaevents: committed offsets of group %s: %w", s.cfg.GroupID, err)
	}
	var lag int64
	handled := s.Positions()
	for p, end := range ends[s.cfg.Topic] {
		pos := int64(-1)
		if c, ok := committed.Lookup(s.cfg.Topic, p); ok {
			pos = c.At
		}
		if h, ok := handled[p]; ok {
			// The Source's own position wins: after a seek back to a
			// checkpoint the group's commit is ahead of what is applied.
			pos = h
		}
		// Records below the log start offset were removed (retention,
		// DeleteRecords) and can never be read: the consumer resets
		// past them (AtStart). Counting them would leave an idle
		// partition lagging forever and the readiness gate shut.
		if st, ok := starts.Lookup(s.cfg.Topic, p); ok && pos < st.Offset {
			pos = st.Offset
		}
		if d := end.Offset - max(pos, 0); d > 0 {
			lag += d
		}
	}
	return lag, nil
}
