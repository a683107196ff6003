package serverconfig

import (
	"strings"
	"testing"
)

// TestKVEventFlags: --kv-event-log-size defaults to upstream's 32768 and
// accepts 0 (off) but not a negative size; the native publisher flags
// default to vLLM's KVEventsConfig values with the endpoint empty (off),
// and all of them appear in the mp group of /config.
func TestKVEventFlags(t *testing.T) {
	c, err := ParseEnv(nil, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.KVEventLogSize != 32768 || c.KVEventsEndpoint != "" || c.KVEventsReplayEndpoint != "" || c.KVEventsTopic != "" ||
		c.KVEventsBufferSteps != 10000 || c.KVEventsHWM != 100000 || c.KVEventsMaxQueueSize != 100000 {
		t.Fatalf("defaults: log %d endpoint %q replay %q topic %q buffer %d hwm %d queue %d", c.KVEventLogSize, c.KVEventsEndpoint,
			c.KVEventsReplayEndpoint, c.KVEventsTopic, c.KVEventsBufferSteps, c.KVEventsHWM, c.KVEventsMaxQueueSize)
	}
	c, err = ParseEnv(strings.Fields("--kv-event-log-size 0 --kv-events-endpoint tcp://*:5557 --kv-events-replay-endpoint tcp://*:5558 --kv-events-topic kv --kv-events-buffer-steps 5"), env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.KVEventLogSize != 0 || c.KVEventsEndpoint != "tcp://*:5557" || c.KVEventsReplayEndpoint != "tcp://*:5558" || c.KVEventsTopic != "kv" || c.KVEventsBufferSteps != 5 {
		t.Fatalf("parsed: %+v", c)
	}
	if g := c.Groups()[GroupMP]; g["kv_event_log_size"] != 0 || g["kv_events_endpoint"] != "tcp://*:5557" {
		t.Errorf("mp group: kv_event_log_size %v, kv_events_endpoint %v", g["kv_event_log_size"], g["kv_events_endpoint"])
	}
	for _, bad := range [][]string{{"--kv-event-log-size", "-1"}, {"--kv-events-buffer-steps", "0"}, {"--kv-events-max-queue-size", "0"}, {"--kv-events-hwm", "0"}} {
		if _, err := ParseEnv(bad, env(nil), nil); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("%v: err %v, want a refusal naming the flag", bad, err)
		}
	}
}
