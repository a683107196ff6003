package mq

import (
	"fmt"
	"time"

	"github.com/lmcache-go/lmcache/internal/kvcuda"
	"github.com/lmcache-go/lmcache/internal/kvevents"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// Transfer modes accepted by --supported-transfer-mode (upstream spelling).
const (
	ModeAuto          = "auto"
	ModeEngineDriven  = "engine_driven"
	ModeLMCacheDriven = "lmcache_driven"
)

// Wire profiles accepted by --wire-profile.
const (
	ProfileAuto  = "auto"
	ProfileGen2M = "gen2m"
	ProfileGen3  = "gen3"
)

// Config configures the ZMQ data-path server. Zero values take the defaults
// documented on each field (see Defaults), except Port: 0 is a free port.
type Config struct {
	// Host and Port are --host (default "localhost") and --port (default
	// 5555, set by Defaults). The server binds tcp://Host:Port;
	// "localhost" binds loopback; Port 0 picks a free port (see Endpoint).
	Host string
	Port int
	// TransferMode is --supported-transfer-mode: auto (default) serves
	// both paths, engine_driven and lmcache_driven only theirs.
	TransferMode string
	// CUDA is the driver the lmcache-driven path opens CUDA IPC KV caches
	// with; nil loads libcuda.so.1 at the first CUDA registration (tests
	// pass kvcuda.Fake). Without a driver such registrations are refused.
	CUDA kvcuda.Driver
	// WireProfile is --wire-profile: auto (default; decided per connection
	// from its first request), gen2m or gen3.
	WireProfile string
	// ChunkSize is --chunk-size in tokens (default 256).
	ChunkSize int
	// HashAlgorithm is --hash-algorithm (default blake3).
	HashAlgorithm string
	// Metrics, if set, counts every finished LOOKUP under upstream's lookup
	// metric names (shared with the HTTP API's registry) and holds the
	// data path's dropped-work counters; without it the server keeps those
	// counters in a registry of its own (Server.Metrics).
	Metrics *mpmetrics.Metrics
	// Periodic, if set, is where the worker reaper and the session sweep
	// register (GET /periodic-threads); without it the server uses a
	// registry of its own (Server.Periodic).
	Periodic *periodic.Registry
	// HashRoot overrides the root (none) hash (--hash-root-hex); nil keeps
	// upstream's fallback root. The HTTP API must use the same root, or the
	// two front ends would derive different keys for one prompt.
	HashRoot []byte
	// WorkerReapTimeout is --worker-reap-timeout-seconds (upstream default
	// 120 s, in Defaults): a registered worker that pinged once and then
	// stays silent this long is dropped with its pending transfers. Zero
	// (or negative) disables reaping, as the flag's 0 does; it is not
	// replaced by the default.
	WorkerReapTimeout time.Duration
	// WorkerRegistrationGrace is --worker-registration-grace-seconds
	// (upstream default 3600 s, in Defaults): the same for a worker that
	// never pinged. Zero disables it.
	WorkerRegistrationGrace time.Duration
	// SessionTTL is how long an idle request session (token hashes) is kept
	// (default 600 s, as upstream).
	SessionTTL time.Duration
	// MaxSessions bounds the open request sessions (default 16384; upstream
	// bounds them by the TTL only). A client that sends a new request id
	// with every message would otherwise hold a session, and the chunk
	// token ids it pins, per id for SessionTTL. Past it the least recently
	// used session is dropped (counted in
	// lmcache_mp_zmq_evicted_sessions_total); its request only hashes again.
	MaxSessions int
	// MaxControlInFlight bounds control requests (LOOKUP and friends) being
	// handled at once (default 1024); later ones wait for a free handler.
	MaxControlInFlight int
	// MaxQueued bounds the requests waiting for a handler (default 4096):
	// control requests over all peers, transfer requests per peer. A
	// request beyond it is refused at once with its negative reply (LOOKUP
	// then reports 0 hits, PREPARE_STORE no slots), so a flooding client
	// costs bounded memory and other peers keep being served.
	MaxQueued int
	// SendHWM is the ROUTER's per-peer send queue in messages (default
	// 100000). A peer that lets it fill loses replies (logged), others do
	// not wait for it.
	SendHWM int
	// InlineLookupBytes is the largest LOOKUP key payload (default 1 MiB,
	// about a 200k-token prompt) that the socket goroutine answers itself
	// instead of handing it to a control goroutine: LOOKUP never waits
	// (its L2 part runs as a background job), so for one up to this size
	// the hand-off costs more than the work. A negative value hands every
	// LOOKUP off.
	InlineLookupBytes int
	// PrefixHashChunks bounds how many chunk hashes of earlier requests'
	// prompts the server keeps (default 8192, about 10 MiB at chunk size
	// 256: each keeps its token ids to compare), so a LOOKUP or transfer
	// whose prompt shares a prefix with a recent one does not hash that
	// prefix again. A negative value keeps none.
	PrefixHashChunks int
	// BusyPoll is how long the socket goroutine keeps polling its sockets
	// without blocking after it last handled a message (0: it blocks at
	// once). A request that arrives within it is picked up without the
	// thread wake-ups a blocked poll costs (on a VM whose idle vCPUs halt,
	// tens of µs each, twice per round trip); vLLM's LOOKUP is two round
	// trips back to back. The cost is CPU: at most BusyPoll per burst,
	// counted in lmcache_mp_zmq_busy_poll_seconds_total.
	BusyPoll time.Duration
	// KVEvents, if set, records the chunks store requests bind for KV-aware
	// routers and serves POLL_KV_EVENTS and the kv_events capability
	// (kvevents.go); nil serves neither.
	KVEvents *kvevents.Recorder
}

// Defaults returns the upstream defaults.
func Defaults() Config {
	return Config{
		Host:                    "localhost",
		Port:                    5555,
		TransferMode:            ModeAuto,
		WireProfile:             ProfileAuto,
		ChunkSize:               256,
		HashAlgorithm:           tokenhash.Blake3,
		WorkerReapTimeout:       120 * time.Second,
		WorkerRegistrationGrace: 3600 * time.Second,
		SessionTTL:              600 * time.Second,
		MaxSessions:             16384,
		MaxControlInFlight:      1024,
		MaxQueued:               4096,
		SendHWM:                 100000,
		InlineLookupBytes:       1 << 20,
		PrefixHashChunks:        8192,
	}
}

// withDefaults fills zero fields, except the reaping durations whose zero
// means "disabled" as the flags' 0 does.
func (c Config) withDefaults() Config {
	d := Defaults()
	if c.Host == "" {
		c.Host = d.Host
	}
	if c.TransferMode == "" {
		c.TransferMode = d.TransferMode
	}
	if c.WireProfile == "" {
		c.WireProfile = d.WireProfile
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = d.ChunkSize
	}
	if c.HashAlgorithm == "" {
		c.HashAlgorithm = d.HashAlgorithm
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = d.SessionTTL
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = d.MaxSessions
	}
	if c.MaxControlInFlight == 0 {
		c.MaxControlInFlight = d.MaxControlInFlight
	}
	if c.MaxQueued == 0 {
		c.MaxQueued = d.MaxQueued
	}
	if c.SendHWM == 0 {
		c.SendHWM = d.SendHWM
	}
	if c.InlineLookupBytes == 0 {
		c.InlineLookupBytes = d.InlineLookupBytes
	}
	if c.PrefixHashChunks == 0 {
		c.PrefixHashChunks = d.PrefixHashChunks
	}
	return c
}

func (c Config) validate() error {
	switch c.TransferMode {
	case ModeAuto, ModeEngineDriven, ModeLMCacheDriven:
	default:
		return fmt.Errorf("--supported-transfer-mode %q: want auto, engine_driven or lmcache_driven", c.TransferMode)
	}
	if c.WireProfile != ProfileAuto {
		if _, ok := wire.ProfileByName(c.WireProfile); !ok {
			return fmt.Errorf("--wire-profile %q: want auto, gen2m or gen3", c.WireProfile)
		}
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("--port %d out of range", c.Port)
	}
	if c.ChunkSize < 1 {
		return fmt.Errorf("--chunk-size must be >= 1 (got %d)", c.ChunkSize)
	}
	return nil
}
