// Package coordload is a load generator for the coordinator's
// POST /quota/events: it plays a fleet of MP servers reporting stores of N
// distinct keys over HTTP and measures ingest throughput and request
// latency (max, p99, p50). It runs as its own process
// (cmd/lmcache-coordload) so that its encoding and the coordinator's
// decoding do not share a Go runtime, a heap or a GC.
package coordload

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gojson "github.com/goccy/go-json"
	"golang.org/x/sync/errgroup"
)

// Config is one load run.
type Config struct {
	// URL is the coordinator's base URL, e.g. http://127.0.0.1:9300.
	URL string
	// Keys is the number of distinct keys stored, each exactly once.
	Keys int
	// Batch is the number of events per request.
	Batch int
	// Concurrency is the number of requests in flight (one connection
	// each).
	Concurrency int
	// Salts is the number of distinct cache_salt values (key i has salt
	// i mod Salts).
	Salts int
	// Instances is the number of simulated MP servers (instance_id
	// values). Worker w reports for instances w, w+Concurrency, ... in
	// turn, so each instance's seq numbers arrive in order, as from one
	// reporter, whenever Instances >= Concurrency; with fewer instances,
	// workers share them and their seq may arrive out of order (the
	// coordinator counts that; it does not change the ledger).
	Instances int
	// Bytes is the size_bytes of every store.
	Bytes int64
	// Timeout bounds each request.
	Timeout time.Duration
	// Offset shifts the key space, so a second run can add keys distinct
	// from the first's.
	Offset int
	// Slow, when positive, lists every request that took at least this
	// long in Result.Slow (to line them up with the server's GC trace).
	Slow time.Duration
	// ServerPID, when set (Linux), is the coordinator's process id: every
	// slow request then also reports how long the coordinator and this
	// client waited for a CPU meanwhile (run-queue wait, from
	// /proc/PID/task/*/schedstat), to tell a busy machine from slow code.
	ServerPID int
}

// DefaultConfig is the flag defaults.
func DefaultConfig() Config {
	return Config{URL: "http://127.0.0.1:9300", Keys: 1_000_000, Batch: 1000, Concurrency: 4, Salts: 100, Instances: 20, Bytes: 2 << 20, Timeout: 30 * time.Second}
}

// ParseFlags reads a Config from command-line arguments.
func ParseFlags(args []string, out io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("lmcache-coordload", flag.ContinueOnError)
	fs.SetOutput(out)
	registerHTTPFlags(fs, &c)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return c, c.Validate()
}

// registerHTTPFlags adds the flags of Config (the http mode's, and the
// key space every mode shares) to fs.
func registerHTTPFlags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.URL, "url", c.URL, "coordinator base URL")
	fs.IntVar(&c.Keys, "keys", c.Keys, "distinct keys to store (each exactly once)")
	fs.IntVar(&c.Batch, "batch", c.Batch, "events per request")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "requests in flight")
	fs.IntVar(&c.Salts, "salts", c.Salts, "distinct cache_salt values")
	fs.IntVar(&c.Instances, "instances", c.Instances, "simulated MP servers (instance_id values)")
	fs.Int64Var(&c.Bytes, "bytes", c.Bytes, "bytes of every stored key")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "per-request timeout")
	fs.IntVar(&c.Offset, "offset", c.Offset, "first key index (to add keys distinct from an earlier run)")
	fs.DurationVar(&c.Slow, "slow", c.Slow, "list every request at least this slow (0: none)")
	fs.IntVar(&c.ServerPID, "server-pid", c.ServerPID, "coordinator process id: report its run-queue wait during slow requests (Linux)")
}

// Validate checks the ranges.
func (c Config) Validate() error {
	switch {
	case c.Keys < 1:
		return errors.New("--keys must be at least 1")
	case c.Batch < 1:
		return errors.New("--batch must be at least 1")
	case c.Concurrency < 1:
		return errors.New("--concurrency must be at least 1")
	case c.Salts < 1:
		return errors.New("--salts must be at least 1")
	case c.Instances < 1:
		return errors.New("--instances must be at least 1")
	case c.Bytes < 0:
		return errors.New("--bytes must not be negative")
	case c.Timeout <= 0:
		return errors.New("--timeout must be positive")
	case c.Offset < 0:
		return errors.New("--offset must not be negative")
	case c.Slow < 0:
		return errors.New("--slow must not be negative")
	case c.ServerPID < 0:
		return errors.New("--server-pid must not be negative")
	case !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://"):
		return fmt.Errorf("--url %q: want http:// or https://", c.URL)
	}
	return nil
}

// Result is what a run measured.
type Result struct {
	Events   int64         `json:"events"`
	Requests int64         `json:"requests"`
	Elapsed  time.Duration `json:"elapsed_ns"`
	Max      time.Duration `json:"max_ns"`
	P99      time.Duration `json:"p99_ns"`
	P50      time.Duration `json:"p50_ns"`
	// Slow lists the requests of at least Config.Slow, in completion
	// order.
	Slow []SlowRequest `json:"slow,omitempty"`
}

// SlowRequest is one request of at least Config.Slow.
type SlowRequest struct {
	// Start is when it was sent, since the run began.
	Start time.Duration `json:"start_ns"`
	// Took is its latency.
	Took time.Duration `json:"took_ns"`
	// FirstKey is the index of its first key (keys stored before it, at
	// most, give or take the requests in flight).
	FirstKey int `json:"first_key"`
	// ServerWait and ClientWait are how long the coordinator's and this
	// process's threads waited for a CPU while the request was out,
	// summed over threads (with Config.ServerPID only).
	ServerWait time.Duration `json:"server_wait_ns,omitempty"`
	// ServerCPU is the CPU time the coordinator's threads used meanwhile
	// (for every request in flight, and its GC).
	ServerCPU  time.Duration `json:"server_cpu_ns,omitempty"`
	ClientWait time.Duration `json:"client_wait_ns,omitempty"`
	// ServerFaults is the coordinator's minor page faults meanwhile
	// (pages the kernel mapped on first touch), with Config.ServerPID.
	ServerFaults int64 `json:"server_faults,omitempty"`
}

// EventsPerSecond is the ingest throughput.
func (r Result) EventsPerSecond() float64 { return float64(r.Events) / r.Elapsed.Seconds() }

// String is the one-line report.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "events=%d requests=%d elapsed=%.2fs events/s=%.0f max=%.2fms p99=%.2fms p50=%.2fms",
		r.Events, r.Requests, r.Elapsed.Seconds(), r.EventsPerSecond(), ms(r.Max), ms(r.P99), ms(r.P50))
	for _, s := range r.Slow {
		fmt.Fprintf(&b, "\nslow: start=%.3fs took=%.2fms first_key=%d server_cpu=%.2fms server_wait=%.2fms client_wait=%.2fms server_faults=%d",
			s.Start.Seconds(), ms(s.Took), s.FirstKey, ms(s.ServerCPU), ms(s.ServerWait), ms(s.ClientWait), s.ServerFaults)
	}
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// The wire shape of POST /quota/events (coordinator-api.rst).
type wireKey struct {
	ChunkHashHex string `json:"chunk_hash_hex"`
	ModelName    string `json:"model_name"`
	KVRank       int64  `json:"kv_rank"`
	CacheSalt    string `json:"cache_salt"`
}

type wireEvent struct {
	Type  string  `json:"type"`
	Key   wireKey `json:"key"`
	Bytes int64   `json:"bytes"`
}

type wireBatch struct {
	InstanceID string      `json:"instance_id"`
	Seq        int64       `json:"seq"`
	Tier       string      `json:"tier"`
	Events     []wireEvent `json:"events"`
}

// models are the model names keys are spread over.
var models = []string{"Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B", "mistralai/Mistral-7B", "google/gemma-2-9b"}

// kvRank is a realistic packed kv_rank (world size 1, rank 0, tp 1, pp 1).
const kvRank = 16777472

// ChunkHash is key i's 32-byte chunk hash in hex: a bijective mix of i, so
// keys are distinct and spread like real content hashes.
func ChunkHash(i int) string {
	var raw [32]byte
	x := uint64(i)
	for w := 0; w < 4; w++ {
		x += 0x9E3779B97F4A7C15
		z := x
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		binary.LittleEndian.PutUint64(raw[8*w:], z^z>>31)
	}
	return hex.EncodeToString(raw[:])
}

// SaltName is salt j's cache_salt.
func SaltName(j int) string { return "tenant-" + strconv.Itoa(j) }

// InstanceName is instance j's instance_id.
func InstanceName(j int) string { return "mp-" + strconv.Itoa(j) }

// Run stores cfg.Keys distinct keys through cfg.Concurrency workers and
// returns the measurements. It stops at the first failed request (a
// transport error, a non-200 status or a wrong "recorded" count) and
// returns that error.
func Run(ctx context.Context, cfg Config, client *http.Client) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	salts := make([]string, cfg.Salts)
	for j := range salts {
		salts[j] = SaltName(j)
	}
	url := strings.TrimSuffix(cfg.URL, "/") + "/quota/events"
	seqs := make([]atomic.Int64, cfg.Instances)
	var next atomic.Int64 // next batch's first key, relative to Offset
	var events atomic.Int64
	var mu sync.Mutex
	lat := make([]time.Duration, 0, cfg.Keys/cfg.Batch+1)
	var slow []SlowRequest
	g, gctx := errgroup.WithContext(ctx)
	start := time.Now()
	var sampler waitSampler
	sampleCtx, stopSampling := context.WithCancel(gctx)
	defer stopSampling()
	sampled := make(chan error, 1)
	if cfg.ServerPID > 0 {
		go func() { sampled <- sampler.run(sampleCtx, start, cfg.ServerPID) }()
	} else {
		sampled <- nil
	}
	for w := 0; w < cfg.Concurrency; w++ {
		g.Go(func() error {
			var own []time.Duration
			defer func() { mu.Lock(); lat = append(lat, own...); mu.Unlock() }()
			var body bytes.Buffer
			b := wireBatch{Tier: "l2", Events: make([]wireEvent, 0, cfg.Batch)}
			mine := []int{w % cfg.Instances}
			for j := w + cfg.Concurrency; j < cfg.Instances; j += cfg.Concurrency {
				mine = append(mine, j)
			}
			for turn := 0; ; turn++ {
				first := int(next.Add(int64(cfg.Batch))) - cfg.Batch
				if first >= cfg.Keys || gctx.Err() != nil {
					return nil
				}
				inst := mine[turn%len(mine)]
				b.InstanceID, b.Seq = InstanceName(inst), seqs[inst].Add(1)
				b.Events = b.Events[:0]
				for i := first; i < min(first+cfg.Batch, cfg.Keys); i++ {
					k := cfg.Offset + i
					b.Events = append(b.Events, wireEvent{Type: "store", Bytes: cfg.Bytes,
						Key: wireKey{ChunkHashHex: ChunkHash(k), ModelName: models[k%len(models)], KVRank: kvRank, CacheSalt: salts[k%len(salts)]}})
				}
				body.Reset()
				if err := gojson.NewEncoder(&body).Encode(&b); err != nil {
					return fmt.Errorf("encode batch: %w", err)
				}
				sent := time.Since(start)
				d, err := post(gctx, client, url, body.Bytes(), len(b.Events), cfg.Timeout)
				if err != nil {
					return fmt.Errorf("%s seq %d: %w", b.InstanceID, b.Seq, err)
				}
				own = append(own, d)
				if cfg.Slow > 0 && d >= cfg.Slow {
					mu.Lock()
					slow = append(slow, SlowRequest{Start: sent, Took: d, FirstKey: cfg.Offset + first})
					mu.Unlock()
				}
				events.Add(int64(len(b.Events)))
			}
		})
	}
	err := g.Wait()
	res := Result{Elapsed: time.Since(start), Events: events.Load(), Slow: slow}
	stopSampling()
	if serr := <-sampled; err == nil {
		err = serr
	}
	for i := range res.Slow {
		s := &res.Slow[i]
		s.ServerCPU, s.ServerWait, s.ClientWait, s.ServerFaults = sampler.between(s.Start, s.Start+s.Took)
	}
	slices.Sort(lat)
	res.Requests = int64(len(lat))
	if n := len(lat); n > 0 {
		res.Max, res.P99, res.P50 = lat[n-1], lat[(n-1)*99/100], lat[(n-1)/2]
	}
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return res, err
}

// recorded is the coordinator's answer.
type recorded struct {
	Recorded *int `json:"recorded"`
}

// maxReply bounds what is read of a reply.
const maxReply = 64 << 10

// post sends one batch and times it from the request's start to the end
// of the reply.
func post(ctx context.Context, client *http.Client, url string, body []byte, want int, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("post: %w", err)
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, maxReply))
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("read reply: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d: %.200s", resp.StatusCode, reply)
	}
	var r recorded
	if err := gojson.Unmarshal(reply, &r); err != nil || r.Recorded == nil || *r.Recorded != want {
		return 0, fmt.Errorf("reply %.200q: want {\"recorded\": %d}", reply, want)
	}
	return d, nil
}

// NewClient is an HTTP client keeping one idle connection per worker.
func NewClient(concurrency int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = concurrency
	t.MaxIdleConnsPerHost = concurrency
	return &http.Client{Transport: t}
}
