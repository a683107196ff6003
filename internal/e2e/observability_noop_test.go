package e2e

import (
	"net"
	"slices"
	"strings"
	"testing"
)

// TestObservabilityNoOpFlagsChangeNothing runs the real binary twice, once
// with --disable-metrics, --disable-logging, --metrics-sample-rate 0.5 and
// --prometheus-port set and once without, and shows that the flags are
// accepted and change nothing an operator sees: /metrics serves the same
// metric families (more than 20 lmcache ones), the log still has its
// start-up line, and nothing listens on the Prometheus port.
func TestObservabilityNoOpFlagsChangeNothing(t *testing.T) {
	promPort := freePort(t)
	run := func(name string, extra ...string) (base string, srv *proc) {
		httpPort := freePort(t)
		base = "http://127.0.0.1:" + itoa(httpPort)
		args := append([]string{"server", "--http-port", itoa(httpPort), "--port", itoa(freePort(t)), "--l1-size-gb", "0.0625"}, extra...)
		srv = start(t, name, nil, args...)
		waitFor(t, name+" healthcheck", healthy(base+"/healthcheck"))
		return base, srv
	}
	plainBase, _ := run("plain")
	flagsBase, flagged := run("flagged", "--disable-metrics", "--disable-logging", "--metrics-sample-rate", "0.5",
		"--prometheus-port", itoa(promPort))

	families := func(base string) []string {
		var names []string
		for _, line := range strings.Split(metricsText(t, base), "\n") {
			if rest, ok := strings.CutPrefix(line, "# TYPE lmcache_"); ok {
				names = append(names, strings.Fields(rest)[0])
			}
		}
		slices.Sort(names)
		return names
	}
	// Families with labels appear with their first series, which
	// background loops may add at any moment, so the sets are compared
	// until they agree.
	var plain, flags []string
	waitFor(t, "the same metric families with and without the flags", func() bool {
		plain, flags = families(plainBase), families(flagsBase)
		return len(plain) > 20 && slices.Equal(plain, flags)
	})
	if c, err := net.Dial("tcp", "127.0.0.1:"+itoa(promPort)); err == nil {
		c.Close()
		t.Errorf("something listens on --prometheus-port %d", promPort)
	}
	flagged.Stop(t)
	if logs := flagged.Output(t); !strings.Contains(logs, `msg="lmcache server started"`) {
		t.Errorf("--disable-logging silenced the log:\n%s", tail([]byte(logs), 2000))
	}
}
