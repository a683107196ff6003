package coordload

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
)

// The command's modes (--mode).
const (
	// ModeHTTP posts N distinct stores to POST /quota/events and measures
	// throughput and latency (Run).
	ModeHTTP = "http"
	// ModeKafka publishes N distinct stores to a Kafka topic in upstream's
	// record format, as `lmcache server --coordinator-event-transport
	// kafka` does (CacheBatches, PublishKafka).
	ModeKafka = "kafka"
	// ModeFleet plays a fleet of MP servers against one or more
	// coordinators: registration, heartbeats, DELETE /cache/objects for
	// evictions, and store/delete event batches over POST /events or
	// Kafka (Fleet).
	ModeFleet = "fleet"
)

// DefaultTopic is the coordinator's --kafka-topic default.
const DefaultTopic = "lmcache-cache-events"

// Command is one invocation of lmcache-coordload: its mode and settings.
type Command struct {
	Mode string
	// HTTP holds the key space every mode shares (Keys, Batch, Salts,
	// Instances, Bytes, Offset) and the http mode's own settings.
	HTTP Config
	// Brokers and Topic are the Kafka cluster (kafka mode; fleet mode
	// streams through Kafka when Brokers is set).
	Brokers []string
	Topic   string
	// Fleet mode: the coordinators fed (default: the --url one), keys per
	// instance (default Keys/Instances, at least 1), and the fleet's pacing.
	Targets         []string
	KeysPerInstance int
	Window          int
	Pace, Heartbeat time.Duration
	// Hold keeps a fleet registered and serving evictions this long after
	// its stream drained (0: exit once drained).
	Hold time.Duration
}

// ParseCommand reads a Command from command-line arguments.
func ParseCommand(args []string, out io.Writer) (Command, error) {
	c := Command{Mode: ModeHTTP, HTTP: DefaultConfig(), Topic: DefaultTopic, Window: 4, Heartbeat: time.Second}
	fs := flag.NewFlagSet("lmcache-coordload", flag.ContinueOnError)
	fs.SetOutput(out)
	registerHTTPFlags(fs, &c.HTTP)
	var brokers, targets string
	fs.StringVar(&c.Mode, "mode", c.Mode, "http: POST /quota/events throughput; kafka: publish the stores to a topic; fleet: simulated MP servers (register, heartbeat, serve evictions, stream events)")
	fs.StringVar(&brokers, "kafka-brokers", "", "comma-separated Kafka bootstrap servers (kafka mode; fleet mode streams through Kafka when set)")
	fs.StringVar(&c.Topic, "kafka-topic", c.Topic, "Kafka topic (the coordinator's --kafka-topic)")
	fs.StringVar(&targets, "targets", "", "fleet mode: comma-separated coordinator base URLs (default: --url)")
	fs.IntVar(&c.KeysPerInstance, "keys-per-instance", 0, "fleet mode: distinct keys each instance stores (default: --keys / --instances); key g is --bytes + g bytes")
	fs.IntVar(&c.Window, "window", c.Window, "fleet mode: batches an instance may run ahead of its slowest coordinator")
	fs.DurationVar(&c.Pace, "pace", 0, "fleet mode: least time between one instance's store batches (0: as fast as taken)")
	fs.DurationVar(&c.Heartbeat, "heartbeat", c.Heartbeat, "fleet mode: registration and heartbeat interval")
	fs.DurationVar(&c.Hold, "hold", 0, "fleet mode: keep serving evictions this long after the stream drained")
	if err := fs.Parse(args); err != nil {
		return Command{}, err
	}
	if fs.NArg() > 0 {
		return Command{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	c.Brokers = splitList(brokers)
	c.Targets = splitList(targets)
	if len(c.Targets) == 0 {
		c.Targets = []string{c.HTTP.URL}
	}
	if c.KeysPerInstance == 0 {
		c.KeysPerInstance = max(1, c.HTTP.Keys/c.HTTP.Instances)
	}
	return c, c.Validate()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Validate checks the mode and its settings.
func (c Command) Validate() error {
	if err := c.HTTP.Validate(); err != nil {
		return err
	}
	switch c.Mode {
	case ModeHTTP:
		return nil
	case ModeKafka:
		return c.kafkaConfig().Validate()
	case ModeFleet:
		for _, t := range c.Targets {
			if !strings.HasPrefix(t, "http://") && !strings.HasPrefix(t, "https://") {
				return fmt.Errorf("--targets %q: want http:// or https://", t)
			}
		}
		switch {
		case c.KeysPerInstance < 1:
			return errors.New("--keys-per-instance must be at least 1")
		case c.Window < 1:
			return errors.New("--window must be at least 1")
		case c.Pace < 0 || c.Hold < 0:
			return errors.New("--pace and --hold must not be negative")
		case c.Heartbeat <= 0:
			return errors.New("--heartbeat must be positive")
		case len(c.Brokers) > 0 && c.Topic == "":
			return errors.New("--kafka-topic must not be empty")
		}
		return nil
	}
	return fmt.Errorf("--mode %q: want http, kafka or fleet", c.Mode)
}

func (c Command) kafkaConfig() KafkaConfig {
	h := c.HTTP
	return KafkaConfig{Brokers: c.Brokers, Topic: c.Topic, Keys: h.Keys, Batch: h.Batch, Salts: h.Salts, Instances: h.Instances, Bytes: h.Bytes, Offset: h.Offset}
}

// KafkaResult is what a kafka-mode run published.
type KafkaResult struct {
	Events, Batches int
	Elapsed         time.Duration
}

// String is the one-line report.
func (r KafkaResult) String() string {
	return fmt.Sprintf("mode=kafka events=%d batches=%d elapsed=%.2fs events/s=%.0f", r.Events, r.Batches, r.Elapsed.Seconds(), float64(r.Events)/r.Elapsed.Seconds())
}

// RunKafka publishes the command's stores (kafka mode) and waits for every
// record's acknowledgement.
func RunKafka(ctx context.Context, c Command) (KafkaResult, error) {
	cfg := c.kafkaConfig()
	if err := cfg.Validate(); err != nil {
		return KafkaResult{}, err
	}
	batches := CacheBatches(cfg)
	d, err := PublishKafka(ctx, cfg, batches)
	return KafkaResult{Events: cfg.Keys, Batches: len(batches), Elapsed: d}, err
}

// FleetResult is what a fleet-mode run did.
type FleetResult struct {
	Instances int
	// Stored keys; Live of them still stored at the end (the rest were
	// evicted by a coordinator through DELETE /cache/objects).
	Stored, Live int
	// Batches is the event batches streamed (stores and deletes), Retries
	// the POST /events sent again (HTTP).
	Batches, Retries int64
	// LiveBytes is the bytes still stored.
	LiveBytes int64
	Elapsed   time.Duration
}

// String is the one-line report.
func (r FleetResult) String() string {
	return fmt.Sprintf("mode=fleet instances=%d stored=%d live=%d evicted=%d live_bytes=%d batches=%d retries=%d elapsed=%.2fs",
		r.Instances, r.Stored, r.Live, r.Stored-r.Live, r.LiveBytes, r.Batches, r.Retries, r.Elapsed.Seconds())
}

// fleetPoll is how often RunFleet checks whether the stream drained.
const fleetPoll = 50 * time.Millisecond

// RunFleet runs a fleet (fleet mode) until every key is stored and every
// batch reached every target (over Kafka: acknowledged by the brokers),
// then for Hold more, serving evictions meanwhile.
func RunFleet(ctx context.Context, c Command) (FleetResult, error) {
	if err := c.Validate(); err != nil {
		return FleetResult{}, err
	}
	h := c.HTTP
	cfg := FleetConfig{Targets: c.Targets, Instances: h.Instances, KeysPerInstance: c.KeysPerInstance, Batch: h.Batch, Salts: h.Salts,
		Bytes: h.Bytes, Window: c.Window, Pace: c.Pace, Heartbeat: c.Heartbeat, Timeout: h.Timeout}
	var sink *kafkaevents.Sink
	if len(c.Brokers) > 0 {
		var err error
		sink, err = kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: c.Brokers, Topic: c.Topic, DeliveryTimeout: time.Minute})
		if err != nil {
			return FleetResult{}, fmt.Errorf("fleet: %w", err)
		}
		defer sink.Close()
		cfg.Sink = sink
	}
	began := time.Now()
	f, err := StartFleet(ctx, cfg)
	if err != nil {
		return FleetResult{}, err
	}
	res := FleetResult{Instances: h.Instances}
	wait := func(d time.Duration, done func() bool) error {
		t := time.NewTicker(fleetPoll)
		defer t.Stop()
		var until <-chan time.Time
		if d > 0 {
			until = time.After(d)
		}
		for done == nil || !done() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-until:
				return nil
			case <-t.C:
			}
			if err := f.PublishErr(); err != nil {
				return err
			}
		}
		return nil
	}
	// Done when every key was produced and every batch reached every
	// target, and every instance is registered with every target (the
	// registrations run beside the stream, which can finish first).
	err = wait(0, func() bool {
		_, all := f.Produced()
		for _, t := range c.Targets {
			all = all && f.Caught(t) && f.Registered(t) == h.Instances
		}
		return all
	})
	if err == nil && sink != nil {
		err = sink.Flush(ctx)
	}
	if err == nil && c.Hold > 0 {
		err = wait(c.Hold, nil)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && sink != nil {
		// Deletes queued by evictions during Hold.
		err = sink.Flush(context.Background())
	}
	if err == nil {
		err = f.PublishErr()
	}
	res.Elapsed = time.Since(began)
	res.Stored, _ = f.Produced()
	for _, s := range f.Seqs() {
		res.Batches += s
	}
	for _, t := range c.Targets {
		res.Retries += f.Retries(t)
	}
	for _, size := range f.LiveKeys() {
		res.Live++
		res.LiveBytes += size
	}
	return res, err
}
