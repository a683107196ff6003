// Package kvevents tells KV-aware routers (llm-d's kv-cache manager,
// Dynamo's router) what the server's cache tiers hold. It serves the same
// storage events two ways:
//
//   - Log: upstream LMCache's bounded, sequenced server-side log that vLLM
//     workers read with POLL_KV_EVENTS (internal/mq) and republish as
//     BlockStored / BlockRemoved;
//   - Publisher: vLLM's own KV-events stream (msgpack KVEventBatch on a
//     ZMQ PUB socket, with sequence numbers and a replay ROUTER socket), so
//     a router subscribes to this server directly.
//
// The Recorder turns the engine's storage events (L1 stores and removals,
// L2 stores and deletes) into records for both, stamping stored records
// with the chunk's tokens and parent hash from the bindings the data path
// records when it hashes a store request's tokens.
package kvevents

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Record kinds, media and the capability name, as upstream spells them.
const (
	KindStored  = "stored"
	KindRemoved = "removed"
	// MediumCPU is the L1 tier (host memory).
	MediumCPU = "CPU"
	// MediumStorage is any L2 tier (object store, filesystem, DAX).
	MediumStorage = "STORAGE"
	// Capability is the GET_EXPERIMENTAL name that tells a worker the
	// server serves POLL_KV_EVENTS.
	Capability = "kv_events"
	// DefaultLogSize is --kv-event-log-size's default.
	DefaultLogSize = 32768
)

// Record is one log entry: the chunks of one store or one removal.
type Record struct {
	// Seq numbers records consecutively from 1.
	Seq    int64
	Kind   string
	Medium string
	Model  string
	// Hashes are the raw 32-byte chunk hashes (one for a stored record,
	// every removed chunk of one model for a removal).
	Hashes [][]byte
	// Parent is the preceding chunk's hash of a stored record (nil for the
	// first chunk of a sequence).
	Parent []byte
	// Tokens are a stored chunk's token ids.
	Tokens    []uint32
	BlockSize int
}

// ErrBadPoll is a poll with a negative cursor or a non-positive page size.
var ErrBadPoll = errors.New("kvevents: bad poll")

// Log is the bounded, sequenced record log. It is safe for concurrent use:
// the engine's listeners append and the data path reads.
type Log struct {
	incarnation int64

	mu   sync.Mutex
	ring []Record // capacity len(ring); the oldest at head
	head int
	n    int
	next int64 // Seq of the next appended record
}

// NewLog returns a log retaining capacity records. Its incarnation is the
// wall clock in nanoseconds, as upstream's time.time_ns(), so a poller that
// sees a new value knows the server restarted and resyncs.
func NewLog(capacity int) (*Log, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("kvevents: log capacity must be positive (got %d)", capacity)
	}
	return &Log{incarnation: time.Now().UnixNano(), ring: make([]Record, capacity), next: 1}, nil
}

// Incarnation identifies this process's log.
func (l *Log) Incarnation() int64 { return l.incarnation }

// Capacity is the number of records retained.
func (l *Log) Capacity() int { return len(l.ring) }

// Len is the number of records retained now.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// NextSeq is the sequence number the next record gets.
func (l *Log) NextSeq() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next
}

// Append assigns r the next sequence number and stores it, discarding the
// oldest record when full. It reports the sequence number and whether a
// record was discarded.
func (l *Log) Append(r Record) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.Seq = l.next
	l.next++
	if l.n < len(l.ring) {
		l.ring[(l.head+l.n)%len(l.ring)] = r
		l.n++
		return r.Seq, false
	}
	l.ring[l.head] = r
	l.head = (l.head + 1) % len(l.ring)
	return r.Seq, true
}

// ReadAfter returns up to max records of model after cursor (the last
// sequence number the reader consumed, 0 on first contact), the cursor to
// use next, and lost: the reader missed records (its cursor is older than
// the oldest retained record, or newer than any this log issued, as after
// a restart). Records of other models advance the cursor without being
// returned, as upstream.
func (l *Log) ReadAfter(cursor int64, model string, max int) ([]Record, int64, bool, error) {
	if cursor < 0 {
		return nil, 0, false, fmt.Errorf("%w: cursor must be >= 0 (got %d)", ErrBadPoll, cursor)
	}
	if max <= 0 {
		return nil, 0, false, fmt.Errorf("%w: max_events must be positive (got %d)", ErrBadPoll, max)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	last := l.next - 1
	if l.n == 0 || cursor > last {
		return nil, last, cursor > last, nil
	}
	first := l.ring[l.head].Seq
	lost := cursor+1 < first
	skip := int64(0)
	if cursor+1 > first {
		skip = cursor + 1 - first
	}
	var out []Record
	next := cursor
	for i := int(skip); i < l.n; i++ {
		r := &l.ring[(l.head+i)%len(l.ring)]
		next = r.Seq
		if r.Model != model {
			continue
		}
		out = append(out, *r)
		if len(out) >= max {
			break
		}
	}
	return out, next, lost, nil
}
