package config

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestEventTransportFlags: newer upstream's --event-transport,
// --kafka-bootstrap-servers, --kafka-topic, --kafka-group-id and
// --max-ready-lag and --checkpoint-path/--checkpoint-interval keep upstream's
// defaults, are CLI-only (no env var), and are validated: kafka needs
// bootstrap servers, an unknown transport is refused.
func TestEventTransportFlags(t *testing.T) {
	c, err := Load(nil, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Ingest.EventTransport != "http" || c.Ingest.KafkaBootstrapServers != "" || c.Ingest.KafkaTopic != "lmcache-cache-events" ||
		c.Ingest.KafkaGroupID != "lmcache-coordinator" || c.Ingest.MaxReadyLag != 1000 || c.Ingest.CheckpointPath != "" || c.Ingest.CheckpointInterval != 60 {
		t.Fatalf("defaults %+v", c)
	}
	c, err = Load([]string{"--event-transport", "kafka", "--kafka-bootstrap-servers", " b1:9092, b2:9092 ,",
		"--kafka-topic", "t", "--kafka-group-id", "g", "--max-ready-lag", "0",
		"--checkpoint-path", "/var/lib/c.ckpt", "--checkpoint-interval", "2.5"}, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Ingest.EventTransport != "kafka" || strings.Join(c.Ingest.KafkaBrokers(), "|") != "b1:9092|b2:9092" || c.Ingest.KafkaTopic != "t" ||
		c.Ingest.KafkaGroupID != "g" || c.Ingest.MaxReadyLag != 0 || c.Ingest.CheckpointPath != "/var/lib/c.ckpt" || c.Ingest.CheckpointInterval != 2.5 {
		t.Fatalf("flags %+v", c)
	}
	// No env fallback, as upstream's CLI-only coordinator config.
	c, err = Load(nil, env(map[string]string{EnvPrefix + "EVENT_TRANSPORT": "kafka", EnvPrefix + "KAFKA_TOPIC": "x",
		EnvPrefix + "CHECKPOINT_PATH": "/x"}), &bytes.Buffer{})
	if err != nil || c.Ingest.EventTransport != "http" || c.Ingest.KafkaTopic != "lmcache-cache-events" || c.Ingest.CheckpointPath != "" {
		t.Fatalf("env must not set the transport flags: %+v %v", c, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--event-transport", "kafka"}, "--kafka-bootstrap-servers: bootstrap servers are required with --event-transport kafka"},
		{[]string{"--event-transport", "zmq"}, "--event-transport: must be http or kafka"},
		{[]string{"--kafka-group-id", " "}, "--kafka-group-id: must be non-empty"},
		{[]string{"--max-ready-lag", "-1"}, "--max-ready-lag: must be >= 0"},
		{[]string{"--checkpoint-interval", "-1"}, "--checkpoint-interval: must be >= 0"},
	} {
		_, err := Load(tc.args, env(nil), &bytes.Buffer{})
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want prefix %q", tc.args, err, tc.want)
		}
	}
	var help bytes.Buffer
	if _, err := Load([]string{"--help"}, env(nil), &help); !errors.Is(err, ErrHelp) {
		t.Fatal(err)
	}
	if !strings.Contains(help.String(), "--kafka-group-id string\n      this coordinator's Kafka consumer group (no env var) (default \"lmcache-coordinator\")") {
		t.Errorf("help lacks the kafka-group-id line:\n%s", help.String())
	}
}
