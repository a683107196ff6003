// Package mqclient is a Go client for LMCache's ZMQ data-path protocol as
// `lmcache server` speaks it: a DEALER socket, positional msgpack frames and
// the engine-driven shared-memory transfer. Tests and `lmcache bench` use it
// to play a vLLM scheduler or worker.
//
// A Client is safe for concurrent use but has one request in flight at a
// time (a mutex serialises calls), like one vLLM adapter socket; open more
// clients for concurrency.
package mqclient

import (
	"errors"
	"fmt"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/tinylib/msgp/msgp"

	"github.com/lmcache-go/lmcache/internal/wire"
)

// ErrTimeout is returned when no reply arrives in time.
var ErrTimeout = errors.New("mqclient: timed out waiting for the reply")

// defaultTimeout is Options.Timeout when it is zero.
const defaultTimeout = 30 * time.Second

// Options configures Dial.
type Options struct {
	// Profile is the numbering used for op frames (default wire.Gen3).
	Profile *wire.Profile
	// SendNames sends operation names as strings instead of numbers.
	SendNames bool
	// Timeout bounds each call, counted from the call's start whatever
	// late replies to earlier calls arrive meanwhile (default 30 s); Dial
	// refuses a negative one.
	Timeout time.Duration
}

// Client is one DEALER connection.
type Client struct {
	mu     sync.Mutex // one request at a time; guards everything below
	zctx   *zmq.Context
	sock   *zmq.Socket
	poller *zmq.Poller
	uid    int64
	opts   Options
	closed bool
	// keyBuf is reused for encoding request keys (a 32k-token key is
	// about 150 KiB; zmq_send copies it, so it is free again once sent).
	keyBuf []byte
}

// Dial connects to endpoint, e.g. "tcp://127.0.0.1:5555".
func Dial(endpoint string, opts Options) (*Client, error) {
	if opts.Profile == nil {
		opts.Profile = wire.Gen3
	}
	if opts.Timeout == 0 {
		opts.Timeout = defaultTimeout
	}
	// zmq_poll reads a negative timeout as "wait forever": refused, so
	// every call stays bounded.
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("mqclient: timeout %v: must be >= 0 (0 = %v)", opts.Timeout, defaultTimeout)
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("mqclient: %w", err)
	}
	sock, err := zctx.NewSocket(zmq.DEALER)
	if err == nil {
		err = sock.SetLinger(0)
	}
	if err == nil {
		err = sock.Connect(endpoint)
	}
	if err != nil {
		if sock != nil {
			_ = sock.Close()
		}
		_ = zctx.Term()
		return nil, fmt.Errorf("mqclient: connect %s: %w", endpoint, err)
	}
	p := zmq.NewPoller()
	p.Add(sock, zmq.POLLIN)
	return &Client{zctx: zctx, sock: sock, poller: p, opts: opts}, nil
}

// Close closes the socket.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	err := c.sock.Close()
	return errors.Join(err, c.zctx.Term())
}

// Raw sends frames as they are (uid, op and payloads, or anything else) and
// returns the reply's frames. It does not match uids.
func (c *Client) Raw(frames ...[]byte) ([][]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	deadline := time.Now().Add(c.opts.Timeout)
	if _, err := c.sock.SendMessage(frames); err != nil {
		return nil, fmt.Errorf("mqclient: send: %w", err)
	}
	return c.recv(deadline)
}

// recv waits for one message until deadline. The deadline is fixed by the
// caller at the start of its call, so the late replies callLocked skips
// do not extend the wait: a server that keeps sending them still times
// the call out after Options.Timeout.
func (c *Client) recv(deadline time.Time) ([][]byte, error) {
	wait := time.Until(deadline)
	if wait <= 0 {
		return nil, ErrTimeout
	}
	// The poller counts whole milliseconds and reads 0 as "do not wait":
	// round up so the wait never ends before the deadline.
	polled, err := c.poller.Poll((wait + time.Millisecond - 1).Truncate(time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("mqclient: poll: %w", err)
	}
	if len(polled) == 0 {
		return nil, ErrTimeout
	}
	msg, err := c.sock.RecvMessageBytes(0)
	if err != nil {
		return nil, fmt.Errorf("mqclient: receive: %w", err)
	}
	return msg, nil
}

// OpFrame encodes op for this client's profile.
func (c *Client) OpFrame(op wire.Op) ([]byte, error) {
	if c.opts.SendNames {
		return msgp.AppendString(nil, op.String()), nil
	}
	id, ok := c.opts.Profile.ID(op)
	if !ok {
		return nil, fmt.Errorf("mqclient: %s has no number in profile %s", op, c.opts.Profile.Name)
	}
	return wire.EncodeInt(id), nil
}

// Call sends one request and returns its single response frame.
func (c *Client) Call(op wire.Op, payloads ...[]byte) ([]byte, error) {
	opf, err := c.OpFrame(op)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.callLocked(op, opf, payloads)
}

// callKey is Call with key, encoded into the client's reused buffer, as
// the first payload.
func (c *Client) callKey(op wire.Op, key *wire.Key, more ...[]byte) ([]byte, error) {
	opf, err := c.OpFrame(op)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keyBuf, err = key.MarshalMsg(c.keyBuf[:0]); err != nil {
		return nil, fmt.Errorf("mqclient: encode %s key: %w", op, err)
	}
	return c.callLocked(op, opf, append([][]byte{c.keyBuf}, more...))
}

func (c *Client) callLocked(op wire.Op, opf []byte, payloads [][]byte) ([]byte, error) {
	if c.closed {
		return nil, errors.New("mqclient: closed")
	}
	deadline := time.Now().Add(c.opts.Timeout)
	uid := wire.EncodeInt(c.uid)
	c.uid++
	frames := append([][]byte{uid, opf}, payloads...)
	if _, err := c.sock.SendMessage(frames); err != nil {
		return nil, fmt.Errorf("mqclient: send %s: %w", op, err)
	}
	for {
		msg, err := c.recv(deadline)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if len(msg) < 2 || string(msg[0]) != string(uid) {
			continue // a late reply to an earlier, timed-out call
		}
		if string(msg[1]) != string(opf) {
			return nil, fmt.Errorf("mqclient: %s: reply echoes op frame %x", op, msg[1])
		}
		if len(msg) != 3 {
			return nil, fmt.Errorf("mqclient: %s: reply has %d frames, want 3", op, len(msg))
		}
		return msg[2], nil
	}
}

func decodeInt(b []byte) (int64, error) {
	var v wire.Int
	err := wire.Unmarshal(b, &v)
	return int64(v), err
}

func decodeBool(b []byte) (bool, error) {
	v, rest, err := msgp.ReadBoolBytes(b)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d trailing bytes", len(rest))
	}
	return v, err
}

func expectNil(b []byte, err error) error {
	if err != nil {
		return err
	}
	if len(b) != 1 || b[0] != 0xc0 {
		return fmt.Errorf("mqclient: want a nil reply, got %x", b)
	}
	return nil
}

// GetChunkSize is GET_CHUNK_SIZE (tokens per chunk).
func (c *Client) GetChunkSize() (int, error) {
	b, err := c.Call(wire.OpGetChunkSize)
	if err != nil {
		return 0, err
	}
	v, err := decodeInt(b)
	return int(v), err
}

// Ping is PING; instance is the worker's id or nil for the scheduler. It
// reports whether the server answered truthy, as the newest clients read
// the reply (bool() of a bool or an int).
func (c *Client) Ping(instance wire.OptInt) (bool, error) {
	r, err := c.PingReply(instance)
	return r.Value != 0, err
}

// PingReply is PING's answer: a bool (Value 0 or 1) or an int (IsInt).
type PingReply struct {
	IsInt bool
	Value int64
}

// Untracked reports the server's "instance not registered, register again"
// answer (wire.PingUntracked).
func (r PingReply) Untracked() bool { return r.IsInt && r.Value == wire.PingUntracked }

// PingReply is PING, returning the reply as sent.
func (c *Client) PingReply(instance wire.OptInt) (PingReply, error) {
	b, err := c.Call(wire.OpPing, wire.Marshal(instance))
	if err != nil {
		return PingReply{}, err
	}
	if msgp.NextType(b) == msgp.BoolType {
		v, err := decodeBool(b)
		if v {
			return PingReply{Value: 1}, err
		}
		return PingReply{}, err
	}
	v, err := decodeInt(b)
	if err != nil {
		return PingReply{}, fmt.Errorf("mqclient: PING reply %x is neither bool nor int: %w", b, err)
	}
	return PingReply{IsInt: true, Value: v}, nil
}

// Noop is NOOP; the server answers "OK".
func (c *Client) Noop() (string, error) {
	b, err := c.Call(wire.OpNoop)
	if err != nil {
		return "", err
	}
	s, _, err := msgp.ReadStringBytes(b)
	return s, err
}

// Clear is CLEAR with the newest client's force argument.
func (c *Client) Clear(force bool) error {
	return expectNil(c.Call(wire.OpClear, wire.EncodeBool(force)))
}

// Lookup is LOOKUP (scheduler key: WorkerID unset) with the legacy tp_size.
func (c *Client) Lookup(key *wire.Key, tpSize int) error {
	return expectNil(c.callKey(wire.OpLookup, key, wire.EncodeInt(int64(tpSize))))
}

func decodeOptCount(b []byte, err error) (int, bool, error) {
	if err != nil {
		return 0, false, err
	}
	if msgp.IsNil(b) {
		return 0, false, nil
	}
	v, err := decodeInt(b)
	return int(v), true, err
}

// QueryPrefetchStatus is QUERY_PREFETCH_STATUS: ready=false while the job
// runs, else the hit prefix in chunks.
func (c *Client) QueryPrefetchStatus(requestID string) (chunks int, ready bool, err error) {
	return decodeOptCount(c.Call(wire.OpQueryPrefetchStatus, msgp.AppendString(nil, requestID)))
}

// QueryPrefetchLookupHits is QUERY_PREFETCH_LOOKUP_HITS.
func (c *Client) QueryPrefetchLookupHits(requestID string) (chunks int, ready bool, err error) {
	return decodeOptCount(c.Call(wire.OpQueryPrefetchLookupHits, msgp.AppendString(nil, requestID)))
}

// WaitPrefetchStatus is WAIT_PREFETCH_STATUS (gen3).
func (c *Client) WaitPrefetchStatus(requestID string, timeout time.Duration) (chunks int, ready bool, err error) {
	return decodeOptCount(c.Call(wire.OpWaitPrefetchStatus, msgp.AppendString(nil, requestID), msgp.AppendFloat64(nil, timeout.Seconds())))
}

// LookupWait sends LOOKUP and polls QUERY_PREFETCH_STATUS until the result
// is ready, as the vLLM scheduler does over its steps.
func (c *Client) LookupWait(key *wire.Key, poll time.Duration) (int, error) {
	if err := c.Lookup(key, int(key.WorldSize)); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(c.opts.Timeout)
	for {
		n, ready, err := c.QueryPrefetchStatus(key.RequestID)
		if err != nil || ready {
			return n, err
		}
		if time.Now().After(deadline) {
			return 0, ErrTimeout
		}
		time.Sleep(poll)
	}
}

// FreeLookupLocks is FREE_LOOKUP_LOCKS.
func (c *Client) FreeLookupLocks(key *wire.Key, tpSize int) error {
	return expectNil(c.callKey(wire.OpFreeLookupLocks, key, wire.EncodeInt(int64(tpSize))))
}

// EndSession is END_SESSION in the newest two-frame form.
func (c *Client) EndSession(requestID string) error {
	return expectNil(c.Call(wire.OpEndSession, msgp.AppendString(nil, requestID), wire.Marshal(&wire.SessionEndInfo{StopTokenID: -1})))
}

// Register is REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT.
func (c *Client) Register(p *wire.RegisterPayload) (*wire.RegisterResponse, error) {
	b, err := c.Call(wire.OpRegisterEngineDriven, wire.Marshal(p))
	if err != nil {
		return nil, err
	}
	var r wire.RegisterResponse
	if err := wire.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Unregister is UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT.
func (c *Client) Unregister(instance int64) error {
	return expectNil(c.Call(wire.OpUnregisterEngineDriven, wire.EncodeInt(instance)))
}

// StorePlan is a PREPARE_STORE answer: Slots[i] receives chunk
// ChunkIndices[i] of the key's range. No slots means nothing to write:
// everything is cached, or the server refused the store (pool full, unknown
// or hybrid registration); `lmcache server` refuses that way because it is
// what the SHM client handles cheapest. Refused means the context was an
// empty map (no SHM context at all), which `lmcache server` never sends.
type StorePlan struct {
	Refused      bool
	Slots        []wire.Slot
	ChunkIndices []int
}

// PrepareStore is PREPARE_STORE.
func (c *Client) PrepareStore(key *wire.Key, instance int64) (*StorePlan, error) {
	b, err := c.callKey(wire.OpPrepareStore, key, wire.EncodeInt(instance))
	if err != nil {
		return nil, err
	}
	var r wire.PrepareStoreResponse
	if err := wire.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if n, err := wire.MapLen(r.Context); err != nil || n == 0 {
		return &StorePlan{Refused: true}, err
	}
	var sc wire.StoreContext
	if err := wire.Unmarshal(r.Context, &sc); err != nil {
		return nil, err
	}
	if len(sc.Slots) != len(sc.ChunkIndices) {
		return nil, fmt.Errorf("mqclient: %d slots but %d chunk indices", len(sc.Slots), len(sc.ChunkIndices))
	}
	p := &StorePlan{Slots: sc.Slots, ChunkIndices: make([]int, len(sc.ChunkIndices))}
	for i, x := range sc.ChunkIndices {
		p.ChunkIndices[i] = int(x)
	}
	return p, nil
}

// CommitStore is COMMIT_STORE; data is empty in shared-memory mode.
func (c *Client) CommitStore(key *wire.Key, instance int64, data []byte) (bool, error) {
	if data == nil {
		data = []byte{}
	}
	b, err := c.callKey(wire.OpCommitStore, key, wire.EncodeInt(instance), msgp.AppendBytes(nil, data))
	if err != nil {
		return false, err
	}
	return decodeBool(b)
}

// PrepareRetrieve is PREPARE_RETRIEVE: ok=false (or no slots) means the
// retrieve failed and the engine must recompute.
func (c *Client) PrepareRetrieve(key *wire.Key, instance int64) (ok bool, slots []wire.Slot, err error) {
	b, err := c.callKey(wire.OpPrepareRetrieve, key, wire.EncodeInt(instance))
	if err != nil {
		return false, nil, err
	}
	var r wire.PrepareRetrieveResponse
	if err := wire.Unmarshal(b, &r); err != nil {
		return false, nil, err
	}
	if n, err := wire.MapLen(r.Context); err != nil || n == 0 {
		return false, nil, err
	}
	var rc wire.RetrieveContext
	if err := wire.Unmarshal(r.Context, &rc); err != nil {
		return false, nil, err
	}
	return r.Success && len(rc.Slots) > 0, rc.Slots, nil
}

// CommitRetrieve is COMMIT_RETRIEVE.
func (c *Client) CommitRetrieve(key *wire.Key, instance int64) (bool, error) {
	b, err := c.callKey(wire.OpCommitRetrieve, key, wire.EncodeInt(instance))
	if err != nil {
		return false, err
	}
	return decodeBool(b)
}
