// Package intentstore keeps the coordinator's operator intent (per-salt
// quotas, the default limit and pins) in etcd when coordinators run
// active/standby, so a new leader has it the moment it is elected and every
// standby mirrors it through a watch.
//
// Every write is one etcd transaction guarded by the writer's fence: the
// election key's create revision must still equal the writer's term token,
// so a deposed leader's write fails (ErrFenced) instead of landing after its
// successor's. A write returns only once etcd has committed it (a quorum
// holds it), which is what lets the HTTP handler answer 200.
//
// Layout under the prefix (config.HA.EtcdPrefix + "intent/"):
//
//	quota/<salt>    decimal bytes (the empty salt is "quota/")
//	default         decimal bytes; absent means no default limit
//	pin/<group id>  JSON PinRecord: one pinned token sequence and its count
//
// Pins are kept per pinned sequence (model, world size, salt, chunk hashes)
// rather than per object key: a pin of a 1M-token prompt is one record, not
// millions of etcd keys. Every coordinator adds each record's count to the
// keys the record fans out to.
package intentstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sentinel errors.
var (
	// ErrFenced is a write refused because the writer's term is over
	// (another coordinator leads, or none does).
	ErrFenced = errors.New("intentstore: fence no longer holds (this coordinator is not the leader)")
	// ErrTooLarge is a pin record over MaxPinRecordBytes.
	ErrTooLarge = errors.New("intentstore: pin record too large")
	// ErrCorrupt is a stored value that does not parse.
	ErrCorrupt = errors.New("intentstore: corrupt value")
	// ErrUnavailable wraps an etcd failure (timeout, no quorum).
	ErrUnavailable = errors.New("intentstore: etcd unavailable")
)

// MaxPinRecordBytes bounds one pin record: etcd refuses requests over
// 1.5 MiB by default. About 16,000 chunk hashes fit.
const MaxPinRecordBytes = 1 << 20

// maxRetries bounds a pin's read-modify-write against concurrent pins of
// the same sequence.
const maxRetries = 32

// Fence is a leadership term: the election key and its create revision.
type Fence struct {
	Key      string
	Revision int64
}

// PinGroup is one pinned token sequence, as the pin request resolved it.
type PinGroup struct {
	Model     string   `json:"model_name"`
	WorldSize int64    `json:"world_size"`
	Salt      string   `json:"cache_salt"`
	Hashes    []string `json:"chunk_hashes_hex"`
}

// ID is the group's stable name: a digest of its fields.
func (g PinGroup) ID() string {
	h := sha256.New()
	fmt.Fprintf(h, "%q\x00%d\x00%q", g.Model, g.WorldSize, g.Salt)
	for _, x := range g.Hashes {
		h.Write([]byte{0})
		h.Write([]byte(x))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// HashBytes decodes Hashes.
func (g PinGroup) HashBytes() ([][]byte, error) {
	out := make([][]byte, len(g.Hashes))
	for i, x := range g.Hashes {
		b, err := hex.DecodeString(x)
		if err != nil {
			return nil, fmt.Errorf("%w: chunk hash %d: %w", ErrCorrupt, i, err)
		}
		out[i] = b
	}
	return out, nil
}

// NewPinGroup builds a group from raw chunk hashes.
func NewPinGroup(model string, worldSize int64, salt string, hashes [][]byte) PinGroup {
	g := PinGroup{Model: model, WorldSize: worldSize, Salt: salt, Hashes: make([]string, len(hashes))}
	for i, h := range hashes {
		g.Hashes[i] = hex.EncodeToString(h)
	}
	return g
}

// PinRecord is a stored group with its pin count (always positive: a group
// unpinned to zero is deleted).
type PinRecord struct {
	PinGroup
	Count int64 `json:"count"`
}

// State is the whole intent at one etcd revision.
type State struct {
	Quotas   map[string]int64
	Default  *int64
	Pins     map[string]PinRecord // by group ID
	Revision int64
	// Changes lists every stored value as a Change (at its ModRevision),
	// for a mirror replacing its state.
	Changes []Change
}

// Store reads and writes intent under one prefix.
type Store struct {
	cli    *clientv3.Client
	prefix string
}

// New returns a Store over cli (owned by the caller) rooted at prefix,
// which should end in "/".
func New(cli *clientv3.Client, prefix string) *Store { return &Store{cli: cli, prefix: prefix} }

func (s *Store) quotaKey(salt string) string { return s.prefix + "quota/" + salt }
func (s *Store) defaultKey() string          { return s.prefix + "default" }
func (s *Store) pinKey(id string) string     { return s.prefix + "pin/" + id }

// fenced runs ops if the fence holds (and the extra comparisons pass). It
// reports whether the ops ran; a failed fence is ErrFenced, a failed extra
// comparison is (false, nil).
func (s *Store) fenced(ctx context.Context, f Fence, extra []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, bool, error) {
	cmps := append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Revision)}, extra...)
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(f.Key)).Commit()
	if err != nil {
		return nil, false, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if resp.Succeeded {
		return resp, true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 || kvs[0].CreateRevision != f.Revision {
		return nil, false, ErrFenced
	}
	return resp, false, nil
}

// Every write returns the etcd revision it committed at: the Revision of
// the Change a watch delivers for it, so a mirror that applied the write
// itself can ignore the older changes still in flight.

// PutQuota sets salt's limit in bytes.
func (s *Store) PutQuota(ctx context.Context, f Fence, salt string, limit int64) (int64, error) {
	resp, _, err := s.fenced(ctx, f, nil, clientv3.OpPut(s.quotaKey(salt), strconv.FormatInt(limit, 10)))
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// DeleteQuota removes salt's entry and reports whether one existed.
func (s *Store) DeleteQuota(ctx context.Context, f Fence, salt string) (bool, int64, error) {
	resp, _, err := s.fenced(ctx, f, nil, clientv3.OpDelete(s.quotaKey(salt)))
	if err != nil {
		return false, 0, err
	}
	return resp.Responses[0].GetResponseDeleteRange().Deleted > 0, resp.Header.Revision, nil
}

// SetDefault sets the default limit; nil removes it.
func (s *Store) SetDefault(ctx context.Context, f Fence, limit *int64) (int64, error) {
	op := clientv3.OpDelete(s.defaultKey())
	if limit != nil {
		op = clientv3.OpPut(s.defaultKey(), strconv.FormatInt(*limit, 10))
	}
	resp, _, err := s.fenced(ctx, f, nil, op)
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// Pin adds delta to g's count and returns the new count and the revision.
// A count that reaches zero or below deletes the record; unpinning a
// sequence that is not pinned changes nothing and returns 0 at revision 0.
func (s *Store) Pin(ctx context.Context, f Fence, g PinGroup, delta int64) (int64, int64, error) {
	id := g.ID()
	key := s.pinKey(id)
	for range maxRetries {
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return 0, 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		var cur PinRecord
		var mod int64
		if len(resp.Kvs) > 0 {
			if cur, err = decodePin(resp.Kvs[0].Value); err != nil {
				return 0, 0, fmt.Errorf("pin %s: %w", id, err)
			}
			mod = resp.Kvs[0].ModRevision
		}
		next := cur.Count + delta
		var op clientv3.Op
		switch {
		case next > 0:
			b, err := json.Marshal(PinRecord{PinGroup: g, Count: next})
			if err != nil {
				return 0, 0, fmt.Errorf("pin %s: %w", id, err)
			}
			if len(b) > MaxPinRecordBytes {
				return 0, 0, fmt.Errorf("%w: %d bytes for %d chunks (limit %d bytes)", ErrTooLarge, len(b), len(g.Hashes), MaxPinRecordBytes)
			}
			op = clientv3.OpPut(key, string(b))
		case mod == 0:
			// Nothing pinned: still prove leadership, so a standby's
			// no-op unpin is refused like any other write.
			_, _, err := s.fenced(ctx, f, nil)
			return 0, 0, err
		default:
			next = 0
			op = clientv3.OpDelete(key)
		}
		tr, ran, err := s.fenced(ctx, f, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", mod)}, op)
		if err != nil {
			return 0, 0, err
		}
		if ran {
			return next, tr.Header.Revision, nil
		}
	}
	return 0, 0, fmt.Errorf("%w: pin %s: %d concurrent updates in a row", ErrUnavailable, id, maxRetries)
}

func decodePin(b []byte) (PinRecord, error) {
	var r PinRecord
	// Nothing this store writes is larger; a bigger record is someone
	// else's, and every coordinator would fan out and pin all of it.
	if len(b) > MaxPinRecordBytes {
		return r, fmt.Errorf("%w: pin record of %d bytes over the %d-byte limit", ErrCorrupt, len(b), MaxPinRecordBytes)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: pin record: %w", ErrCorrupt, err)
	}
	if r.Count <= 0 || r.WorldSize < 1 {
		return r, fmt.Errorf("%w: pin record count %d world_size %d", ErrCorrupt, r.Count, r.WorldSize)
	}
	return r, nil
}

// maxQuoted is how much of a key or value read from etcd an error quotes.
const maxQuoted = 128

// clip quotes at most maxQuoted bytes of s, noting the full length: keys and
// values under the prefix may be anyone's, up to etcd's request limit, and
// their errors are logged on every coordinator at every reload.
func clip(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:maxQuoted], len(s))
}

func decodeBytes(b []byte) (int64, error) {
	v, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%w: limit %s", ErrCorrupt, clip(string(b)))
	}
	return v, nil
}

// Load reads the whole intent. Values that do not parse are skipped and
// returned, joined, as the error next to the valid state.
func (s *Store) Load(ctx context.Context) (State, error) {
	resp, err := s.cli.Get(ctx, s.prefix, clientv3.WithPrefix())
	if err != nil {
		return State{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	st := State{Quotas: map[string]int64{}, Pins: map[string]PinRecord{}, Revision: resp.Header.Revision}
	var errs []error
	for _, kv := range resp.Kvs {
		c, err := s.decode(string(kv.Key), kv.Value, false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.Revision = kv.ModRevision
		c.applyTo(&st)
		st.Changes = append(st.Changes, c)
	}
	return st, errors.Join(errs...)
}

// ChangeKind says what a Change is about.
type ChangeKind int

// The kinds of change.
const (
	KindQuota ChangeKind = iota + 1
	KindDefault
	KindPin
)

// Change is one watched key's new value.
type Change struct {
	Kind ChangeKind
	// Deleted: the quota, default or pin record is gone.
	Deleted bool
	Salt    string    // KindQuota
	Bytes   int64     // KindQuota, KindDefault
	PinID   string    // KindPin
	Pin     PinRecord // KindPin, not Deleted
	// Revision is the etcd revision of the change.
	Revision int64
}

// Name identifies what the change is about ("quota/<salt>", "default",
// "pin/<id>"), for a mirror's per-item revision bookkeeping.
func (c Change) Name() string {
	switch c.Kind {
	case KindQuota:
		return "quota/" + c.Salt
	case KindDefault:
		return "default"
	}
	return "pin/" + c.PinID
}

func (c Change) applyTo(st *State) {
	switch c.Kind {
	case KindQuota:
		if c.Deleted {
			delete(st.Quotas, c.Salt)
		} else {
			st.Quotas[c.Salt] = c.Bytes
		}
	case KindDefault:
		if c.Deleted {
			st.Default = nil
		} else {
			v := c.Bytes
			st.Default = &v
		}
	case KindPin:
		if c.Deleted {
			delete(st.Pins, c.PinID)
		} else {
			st.Pins[c.PinID] = c.Pin
		}
	}
}

func (s *Store) decode(key string, val []byte, deleted bool) (Change, error) {
	rest, ok := strings.CutPrefix(key, s.prefix)
	if !ok {
		return Change{}, fmt.Errorf("%w: key %s outside %q", ErrCorrupt, clip(key), s.prefix)
	}
	var c Change
	var err error
	switch {
	case rest == "default":
		c.Kind = KindDefault
		if !deleted {
			c.Bytes, err = decodeBytes(val)
		}
	case strings.HasPrefix(rest, "quota/"):
		c.Kind, c.Salt = KindQuota, strings.TrimPrefix(rest, "quota/")
		if !deleted {
			c.Bytes, err = decodeBytes(val)
		}
	case strings.HasPrefix(rest, "pin/"):
		c.Kind, c.PinID = KindPin, strings.TrimPrefix(rest, "pin/")
		if !deleted {
			c.Pin, err = decodePin(val)
		}
	default:
		return Change{}, fmt.Errorf("%w: unknown key %s", ErrCorrupt, clip(key))
	}
	if err != nil {
		return Change{}, fmt.Errorf("%s: %w", clip(key), err)
	}
	c.Deleted = deleted
	return c, nil
}

// Watch watches the intent from revision rev (Load's Revision + 1). The
// channel closes when ctx ends; a response with Err() (compaction, lost
// connection) means the caller reloads.
func (s *Store) Watch(ctx context.Context, rev int64) clientv3.WatchChan {
	return s.cli.Watch(clientv3.WithRequireLeader(ctx), s.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
}

// Decode turns one watch response into changes, in order; events whose
// values do not parse are skipped and returned, joined, as the error.
func (s *Store) Decode(wr clientv3.WatchResponse) ([]Change, error) {
	var out []Change
	var errs []error
	for _, ev := range wr.Events {
		c, err := s.decode(string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.Revision = ev.Kv.ModRevision
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}
