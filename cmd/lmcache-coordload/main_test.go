package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/lmcache-go/lmcache/internal/polltest"
	"github.com/lmcache-go/lmcache/internal/proctest"
)

func TestMain(m *testing.M) { proctest.Main(m) }

// tool builds this command into the test's temp dir (the build cache
// makes every build after the first a link).
func tool(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "lmcache-coordload")
	if out, err := exec.Command("go", "build", "-o", path, "github.com/lmcache-go/lmcache/cmd/lmcache-coordload").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return path
}

var client = &http.Client{Timeout: 10 * time.Second}

// coordinator starts `lmcache coordinator` (startup resync off, no
// eviction) with extra flags and waits for /healthz.
func coordinator(t *testing.T, name string, extra ...string) string {
	t.Helper()
	port := proctest.FreePort(t)
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	args := append([]string{"coordinator", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--eviction-check-interval", "0"}, extra...)
	proctest.Start(t, name, []string{"LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC=0"}, args...)
	waitFor(t, name+" /healthz", func() bool {
		resp, err := client.Get(url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return url
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	polltest.Until(t, 60*time.Second, what, cond)
}

// metric is one unlabelled sample of url's /metrics (-1 when absent).
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// run runs the built command and returns its stdout (the report line).
func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("lmcache-coordload %v: %v\nstdout: %s\nstderr: %s", args, err, stdout.String(), stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

// fields parses "k=v k=v" of a report line.
func fields(line string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			out[k] = v
		}
	}
	return out
}

func instances(t *testing.T, url string) int {
	t.Helper()
	resp, err := client.Get(url + "/instances")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Instances []json.RawMessage `json:"instances"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return len(body.Instances)
}

// fleetBytes is what a fleet of keys 0..n-1 stores: key g is base+g bytes.
func fleetBytes(n, base int) int {
	return n*base + n*(n-1)/2
}

// TestFleetModeHTTP: `lmcache-coordload --mode fleet` with 20 simulated
// MP servers against a real coordinator over POST /events: every instance
// registered, every key applied once (tracked keys and bytes exact), and
// the report line says what the fleet stored.
func TestFleetModeHTTP(t *testing.T) {
	url := coordinator(t, "coordinator")
	out := run(t, tool(t), "--mode", "fleet", "--targets", url, "--instances", "20", "--keys-per-instance", "50", "--batch", "10",
		"--salts", "4", "--bytes", "1000", "--heartbeat", "200ms")
	want := map[string]string{"mode": "fleet", "instances": "20", "stored": "1000", "live": "1000", "evicted": "0",
		"live_bytes": strconv.Itoa(fleetBytes(1000, 1000)), "batches": "100", "retries": "0"}
	got := fields(out)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("report %q: %s=%s, want %s", out, k, got[k], v)
		}
	}
	if v := metric(t, url, "lmcache_coordinator_tracked_keys"); v != 1000 {
		t.Errorf("tracked_keys %v, want 1000", v)
	}
	if v := metric(t, url, "lmcache_coordinator_tracked_bytes"); v != float64(fleetBytes(1000, 1000)) {
		t.Errorf("tracked_bytes %v, want %d", v, fleetBytes(1000, 1000))
	}
	if n := instances(t, url); n != 20 {
		t.Errorf("%d instances registered, want 20", n)
	}
}

// TestKafkaModes: a kfake cluster in the test process (the coordinators
// and the tool connect over loopback TCP). --mode kafka publishes 5000
// stores in 50 batches, which a kafka-mode coordinator applies exactly;
// --mode fleet --kafka-brokers streams 20 instances' batches through a
// second topic to a second coordinator, over HTTP only registering.
func TestKafkaModes(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "load-kafka", "load-fleet"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := strings.Join(c.ListenAddrs(), ",")
	kafkaArgs := func(topic string) []string {
		return []string{"--event-transport", "kafka", "--kafka-bootstrap-servers", brokers, "--kafka-topic", topic, "--kafka-group-id", topic}
	}

	bin := tool(t)
	a := coordinator(t, "coordinator-kafka", kafkaArgs("load-kafka")...)
	out := run(t, bin, "--mode", "kafka", "--kafka-brokers", brokers, "--kafka-topic", "load-kafka", "--keys", "5000", "--batch", "100",
		"--instances", "7", "--salts", "5", "--bytes", "1024")
	if got := fields(out); got["mode"] != "kafka" || got["events"] != "5000" || got["batches"] != "50" {
		t.Fatalf("report %q, want 5000 events in 50 batches", out)
	}
	waitFor(t, "5000 keys through Kafka", func() bool {
		return metric(t, a, "lmcache_coordinator_tracked_keys") == 5000 && metric(t, a, "lmcache_coordinator_kafka_lag") == 0
	})
	if v := metric(t, a, "lmcache_coordinator_tracked_bytes"); v != 5000*1024 {
		t.Errorf("tracked_bytes %v, want %d", v, 5000*1024)
	}

	b := coordinator(t, "coordinator-fleet", kafkaArgs("load-fleet")...)
	out = run(t, bin, "--mode", "fleet", "--targets", b, "--kafka-brokers", brokers, "--kafka-topic", "load-fleet", "--instances", "20",
		"--keys-per-instance", "30", "--batch", "10", "--salts", "3", "--bytes", "2000", "--heartbeat", "200ms")
	if got := fields(out); got["stored"] != "600" || got["live"] != "600" || got["batches"] != "60" || got["live_bytes"] != strconv.Itoa(fleetBytes(600, 2000)) {
		t.Fatalf("report %q, want 600 keys in 60 batches", out)
	}
	waitFor(t, "the fleet's 600 keys through Kafka", func() bool {
		return metric(t, b, "lmcache_coordinator_tracked_keys") == 600 && metric(t, b, "lmcache_coordinator_kafka_lag") == 0
	})
	if v := metric(t, b, "lmcache_coordinator_tracked_bytes"); v != float64(fleetBytes(600, 2000)) {
		t.Errorf("tracked_bytes %v, want %d", v, fleetBytes(600, 2000))
	}
	if v := metric(t, b, "lmcache_coordinator_kafka_records_applied_total"); v != 60 {
		t.Errorf("kafka_records_applied_total %v, want 60", v)
	}
	if n := instances(t, b); n != 20 {
		t.Errorf("%d instances registered, want 20", n)
	}
}

// TestBadMode: an unknown mode is a usage error (exit status 2).
func TestBadMode(t *testing.T) {
	cmd := exec.Command(tool(t), "--mode", "grpc")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), `--mode "grpc": want http, kafka or fleet`) {
		t.Fatalf("--mode grpc: %v %s", err, out)
	}
}
