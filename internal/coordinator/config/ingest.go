package config

import (
	"net/url"
	"strings"
)

// Event transports (--event-transport).
const (
	TransportHTTP  = "http"
	TransportKafka = "kafka"
)

// Ingest is newer upstream's event transport and checkpoint settings. Like
// its coordinator config these are CLI-only (no environment variables).
type Ingest struct {
	// EventTransport is "http" (POST /events) or "kafka" (a consumer of
	// KafkaTopic; POST /events then answers 404).
	EventTransport string
	// KafkaBootstrapServers is a comma-separated broker list (kafka only).
	KafkaBootstrapServers string
	// KafkaTopic is the cache-event topic the MP servers produce to.
	KafkaTopic string
	// KafkaGroupID is this coordinator's consumer group.
	KafkaGroupID string
	// MaxReadyLag is the stream lag (records) at or below which a kafka
	// coordinator starts its eviction and resync loops.
	MaxReadyLag int
	// CheckpointPath, when set, is where derived state (the ledger's keys,
	// sizes and LRU order, the gate's cursors, the stream position) is
	// checkpointed and restored from.
	CheckpointPath string
	// CheckpointInterval is the seconds between checkpoints (0: only at a
	// clean stop).
	CheckpointInterval float64
}

// DefaultKafkaGroupID is --kafka-group-id's default, upstream's.
const DefaultKafkaGroupID = "lmcache-coordinator"

// KafkaGroup is the consumer group a coordinator whose HA id is haID joins
// (haID "" outside HA mode). Normally that is KafkaGroupID. In HA mode
// every coordinator must read every record, so each needs its own group:
// sharing one, they would split the partitions and every ledger would be
// partial without anything saying so. There a group left at
// DefaultKafkaGroupID becomes DefaultKafkaGroupID + "-" + the host[:port]
// of haID (its advertised URL), which names this coordinator and stays the
// same across its restarts, so its committed offsets keep applying. A
// group set to anything else is the operator's and is kept.
func (c Config) KafkaGroup(haID string) string {
	g := c.Ingest.KafkaGroupID
	if !c.HA.Enabled() || haID == "" || g != DefaultKafkaGroupID {
		return g
	}
	name := haID
	if u, err := url.Parse(haID); err == nil && u.Host != "" {
		name = u.Host
	}
	return DefaultKafkaGroupID + "-" + name
}

// DefaultIngest is HTTP ingest without checkpoints, with upstream's Kafka
// defaults.
func DefaultIngest() Ingest {
	return Ingest{EventTransport: TransportHTTP, KafkaTopic: "lmcache-cache-events", KafkaGroupID: DefaultKafkaGroupID,
		MaxReadyLag: 1000, CheckpointInterval: 60}
}

// Kafka reports whether events arrive through Kafka.
func (in Ingest) Kafka() bool { return in.EventTransport == TransportKafka }

// KafkaBrokers splits KafkaBootstrapServers into broker addresses.
func (in Ingest) KafkaBrokers() []string {
	var out []string
	for _, b := range strings.Split(in.KafkaBootstrapServers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

func nonBlank(v string) string {
	if strings.TrimSpace(v) == "" {
		return "must be non-empty"
	}
	return ""
}

// ingestFields are the transport and checkpoint rows of the settings table.
func ingestFields() []field {
	return []field{
		{flag: "event-transport", noEnv: true, kind: "string", usage: "how MP servers' cache events arrive: http (POST /events) or kafka (consumed from --kafka-topic; POST /events answers 404)", s: func(c *Config) *string { return &c.Ingest.EventTransport },
			check: func(c Config) string {
				if c.Ingest.EventTransport != TransportHTTP && c.Ingest.EventTransport != TransportKafka {
					return "must be http or kafka"
				}
				return ""
			}},
		{flag: "kafka-bootstrap-servers", noEnv: true, kind: "string", usage: "comma-separated Kafka brokers (required with --event-transport kafka)", s: func(c *Config) *string { return &c.Ingest.KafkaBootstrapServers },
			check: func(c Config) string {
				if c.Ingest.Kafka() && len(c.Ingest.KafkaBrokers()) == 0 {
					return "bootstrap servers are required with --event-transport kafka"
				}
				return ""
			}},
		{flag: "kafka-topic", noEnv: true, kind: "string", usage: "Kafka topic of the MP servers' cache events", s: func(c *Config) *string { return &c.Ingest.KafkaTopic },
			check: func(c Config) string { return nonBlank(c.Ingest.KafkaTopic) }},
		{flag: "kafka-group-id", noEnv: true, kind: "string", usage: "this coordinator's Kafka consumer group (with --ha-etcd-endpoints the default becomes lmcache-coordinator-<host:port of the advertised URL>, one group per coordinator)", s: func(c *Config) *string { return &c.Ingest.KafkaGroupID },
			check: func(c Config) string { return nonBlank(c.Ingest.KafkaGroupID) }},
		{flag: "max-ready-lag", noEnv: true, kind: "int", usage: "kafka only: records of stream lag at or below which the eviction and resync loops start", i: func(c *Config) *int { return &c.Ingest.MaxReadyLag },
			check: func(c Config) string { return minInt(c.Ingest.MaxReadyLag, 0) }},
		{flag: "checkpoint-path", noEnv: true, kind: "string", usage: "checkpoint derived state (ledger keys, sizes, LRU order, event-gate cursors, Kafka stream position) to this file and restore it at startup (empty: none)", s: func(c *Config) *string { return &c.Ingest.CheckpointPath }},
		{flag: "checkpoint-interval", noEnv: true, kind: "float", usage: "seconds between checkpoints (0: only at a clean stop)", f: func(c *Config) *float64 { return &c.Ingest.CheckpointInterval },
			check: func(c Config) string { return ge0(c.Ingest.CheckpointInterval) }},
	}
}
