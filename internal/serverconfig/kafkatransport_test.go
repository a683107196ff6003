package serverconfig

import (
	"errors"
	"strings"
	"testing"
)

// TestCoordinatorKafkaTransportFlags: upstream's defaults, flags set the
// values, no env fallback, and a transport other than http or kafka is
// refused naming the flag.
func TestCoordinatorKafkaTransportFlags(t *testing.T) {
	c, err := ParseEnv(nil, env(map[string]string{"LMCACHE_COORDINATOR_EVENT_TRANSPORT": "kafka"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.CoordinatorEventTransport != "http" || c.CoordinatorKafkaBootstrapServers != "" ||
		c.CoordinatorKafkaTopic != "lmcache-cache-events" || c.CoordinatorKafkaDeliveryTimeout != 300 {
		t.Fatalf("defaults: %q %q %q %v", c.CoordinatorEventTransport, c.CoordinatorKafkaBootstrapServers, c.CoordinatorKafkaTopic, c.CoordinatorKafkaDeliveryTimeout)
	}
	c, err = ParseEnv([]string{"--coordinator-event-transport", "kafka", "--coordinator-kafka-bootstrap-servers", "a:9092,b:9092",
		"--coordinator-kafka-topic", "t1", "--coordinator-kafka-delivery-timeout", "2.5"}, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.CoordinatorEventTransport != "kafka" || c.CoordinatorKafkaBootstrapServers != "a:9092,b:9092" ||
		c.CoordinatorKafkaTopic != "t1" || c.CoordinatorKafkaDeliveryTimeout != 2.5 {
		t.Fatalf("flags: %q %q %q %v", c.CoordinatorEventTransport, c.CoordinatorKafkaBootstrapServers, c.CoordinatorKafkaTopic, c.CoordinatorKafkaDeliveryTimeout)
	}
	_, err = ParseEnv([]string{"--coordinator-event-transport", "zmq"}, env(nil), nil)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--coordinator-event-transport") {
		t.Fatalf("bad value: %v", err)
	}
}
