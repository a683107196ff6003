package serverconfig

import (
	"errors"
	"strings"
	"testing"
)

// TestCoordinatorEventEndpointFlag: default auto, env fallback, flag wins,
// shown in /config, anything else refused naming the flag.
func TestCoordinatorEventEndpointFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "auto"},
		{nil, map[string]string{"LMCACHE_COORDINATOR_EVENT_ENDPOINT": "quota-events"}, "quota-events"},
		{[]string{"--coordinator-event-endpoint", "events"}, map[string]string{"LMCACHE_COORDINATOR_EVENT_ENDPOINT": "quota-events"}, "events"},
	} {
		c, err := ParseEnv(tc.args, env(tc.env), nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.CoordinatorEventEndpoint != tc.want || c.Groups()[GroupCoordinator]["coordinator_event_endpoint"] != tc.want {
			t.Errorf("%v %v: got %q (/config %v), want %q", tc.args, tc.env, c.CoordinatorEventEndpoint, c.Groups()[GroupCoordinator]["coordinator_event_endpoint"], tc.want)
		}
	}
	_, err := ParseEnv([]string{"--coordinator-event-endpoint", "kafka"}, env(nil), nil)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `--coordinator-event-endpoint: must be one of auto, events, quota-events (got "kafka")`) {
		t.Fatalf("bad value: %v", err)
	}
}
