package config

import (
	"bytes"
	"errors"
	"os"
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
	if !strings.Contains(help.String(), "  --kafka-group-id\n      this coordinator's Kafka consumer group (with --ha-etcd-endpoints the default becomes lmcache-coordinator-<host:port of the advertised URL>, one group per coordinator) (default \"lmcache-coordinator\")\n") {
		t.Errorf("help lacks the kafka-group-id line:\n%s", help.String())
	}
}

// TestKafkaGroupPerCoordinatorInHA: with --ha-etcd-endpoints a
// --kafka-group-id left at its default (or set to it) becomes one group per
// coordinator, named after its advertised URL's host:port, so each
// coordinator reads every partition; the same coordinator restarted gets
// the same group (its commits stay valid); an explicit other group and
// every non-HA coordinator keep the configured one.
func TestKafkaGroupPerCoordinatorInHA(t *testing.T) {
	kafka := []string{"--event-transport", "kafka", "--kafka-bootstrap-servers", "k:9092"}
	load := func(args ...string) (Config, string) {
		t.Helper()
		c, err := Load(append(append([]string(nil), kafka...), args...), env(nil), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		id := ""
		if c.HA.Enabled() {
			if id, err = c.HA.ID(c.Port); err != nil {
				t.Fatal(err)
			}
		}
		return c, c.KafkaGroup(id)
	}
	ha := []string{"--ha-etcd-endpoints", "http://e1:2379"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "lmcache-coordinator"},
		{[]string{"--kafka-group-id", "g"}, "g"},
		{append(ha[:2:2], "--ha-advertise-url", "http://coord-0.lmcache-coordinator:9300"), "lmcache-coordinator-coord-0.lmcache-coordinator:9300"},
		{append(ha[:2:2], "--ha-advertise-url", "https://coord-1.lmcache-coordinator:9300/"), "lmcache-coordinator-coord-1.lmcache-coordinator:9300"},
		{append(ha[:2:2], "--ha-advertise-url", "http://[fd00::7]:9300", "--kafka-group-id", "lmcache-coordinator"), "lmcache-coordinator-[fd00::7]:9300"},
		{append(ha[:2:2], "--ha-advertise-url", "http://coord-0.lmcache-coordinator:9300", "--kafka-group-id", "coord-0-group"), "coord-0-group"},
	} {
		if _, got := load(tc.args...); got != tc.want {
			t.Errorf("%q: group %q, want %q", tc.args, got, tc.want)
		}
	}
	// Without --ha-advertise-url the id is http://<hostname>:<port>.
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	c, got := load(append(ha[:2:2], "--port", "9311")...)
	if id, _ := c.HA.ID(c.Port); id != "http://"+host+":9311" || got != "lmcache-coordinator-"+host+":9311" {
		t.Errorf("hostname default: id %q group %q, want http://%s:9311 and lmcache-coordinator-%s:9311", id, got, host, host)
	}
	// A restart of the same coordinator joins the same group.
	_, again := load(append(ha[:2:2], "--port", "9311")...)
	if again != got {
		t.Errorf("restart: group %q, first run %q", again, got)
	}
}
