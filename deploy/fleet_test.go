package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/lmcache-go/lmcache/internal/kafkaevents"
)

// startFleet starts the coordinator and the server with the manifests'
// arguments (loopback, free ports, a small L1, a filesystem L2 so the L2
// metrics exist) and waits for the manifests' probes to pass.
func startFleet(t *testing.T) fleet {
	t.Helper()
	m := deployManifests(t)
	cPort, hPort, zPort := freePort(t), freePort(t), freePort(t)
	f := fleet{
		serverHTTP: "http://127.0.0.1:" + itoa(hPort),
		serverZMQ:  "tcp://127.0.0.1:" + itoa(zPort),
		coordHTTP:  "http://127.0.0.1:" + itoa(cPort),
		shmName:    "deploytest" + itoa(os.Getpid()),
	}
	cc := m.deployments[0].Spec.Template.Spec.Containers[0]
	coord := start(t, "coordinator", overrideArgs(cc.Args,
		map[string]string{"--host": "127.0.0.1", "--port": itoa(cPort)}, []string{"--host", "--port"})...)
	waitOK(t, coord, f.coordHTTP+cc.ReadinessProbe.HTTPGet.Path)
	waitOK(t, coord, f.coordHTTP+cc.LivenessProbe.HTTPGet.Path)

	sc := m.daemonSets[0].Spec.Template.Spec.Containers[0]
	set := map[string]string{
		"--host": "127.0.0.1", "--port": itoa(zPort), "--http-host": "127.0.0.1", "--http-port": itoa(hPort),
		"--l1-size-gb": "0.25", "--shm-name": f.shmName, "--shm-mode": "0600", "--coordinator-url": f.coordHTTP,
		"--l2-adapter": `{"type":"fs","base_path":"` + t.TempDir() + `"}`,
	}
	srv := start(t, "server", overrideArgs(sc.Args, set,
		[]string{"--host", "--port", "--http-host", "--http-port", "--l1-size-gb", "--shm-name", "--shm-mode", "--coordinator-url", "--l2-adapter"})...)
	waitOK(t, srv, f.serverHTTP+sc.ReadinessProbe.HTTPGet.Path)
	waitOK(t, srv, f.serverHTTP+sc.LivenessProbe.HTTPGet.Path)
	return f
}

// benchArgs is a small `lmcache bench` run against the fleet's server.
func benchArgs(f fleet, extra ...string) []string {
	return append([]string{"bench", "--endpoint", f.serverZMQ, "--shm-dir", "/dev/shm", "--workers", "1", "--requests", "2", "--warmup", "1",
		"--num-layers", "2", "--hidden-dim-size", "64", "--prompt-tokens", "512", "--lookup-tokens", "1024", "--lookup-samples", "5",
		"--ping-clients", "2", "--ping-duration", "200ms", "--baseline-mib", "1"}, extra...)
}

// TestFleetFromManifests runs the binaries the way the manifests do and
// checks, against them: build identity, `lmcache bench` (summary, report,
// progress only on a terminal), and that the dashboard and the alert rules
// name only metrics the binaries export.
func TestFleetFromManifests(t *testing.T) {
	f := startFleet(t)
	// A default limit far above what the bench stores gives every salt an
	// eviction threshold (lmcache_coordinator_salt_eviction_threshold_bytes,
	// LMCacheSaltAboveEvictionWatermark's) without evicting anything.
	req, err := http.NewRequest("PUT", f.coordHTTP+"/quota/config", strings.NewReader(`{"default_limit_gb": 1024}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /quota/config = %d", resp.StatusCode)
	}

	t.Run("BuildIdentity", func(t *testing.T) {
		_, rev := lmcacheBin(t)
		out, _, err := runBin(t, "version")
		if err != nil || !strings.Contains(out, rev) || strings.Contains(out, "NA") {
			t.Errorf("lmcache version = %q (%v), want the HEAD revision %s", out, err, rev)
		}
		var commit, version string
		for path, into := range map[string]*string{"/commit_id": &commit, "/version": &version} {
			code, body := get(t, f.serverHTTP+path)
			if err := json.Unmarshal(body, into); code != 200 || err != nil {
				t.Fatalf("GET %s = %d %s (%v)", path, code, body, err)
			}
		}
		if commit != rev || version != strings.TrimSpace(out) {
			t.Errorf("/commit_id = %q, /version = %q; want %q and %q", commit, version, rev, strings.TrimSpace(out))
		}
	})

	t.Run("BenchPipedWithReport", func(t *testing.T) {
		report := filepath.Join(t.TempDir(), "bench.svg")
		stdout, stderr, err := runBin(t, benchArgs(f, "--progress", "1ms", "--report", report)...)
		if err != nil {
			t.Fatalf("bench: %v\n%s\n%s", err, stdout, stderr)
		}
		if strings.Contains(stderr, "bench:") || strings.Contains(stderr, "\x1b[K") {
			t.Errorf("progress written to a pipe:\n%q", stderr)
		}
		for _, re := range []string{`(?m)^phase +rate +vs memcpy +server share +volume +p50 +p99 +notes$`,
			`(?m)^store +\d+\.\d\d GB/s +\d+\.\d\d +\d+\.\d% +0\.00 GiB +\S+ +\S+ +0 refusals`,
			`(?m)^retrieve +\d+\.\d\d GB/s`, `(?m)^lookup 512 tokens .* hit ratio 1\.000$`, `(?m)^lookup 1024 tokens .* 5 samples .* 2 chunks hit$`,
			`(?m)^PING +\d+/s .* 2 clients$`} {
			if !regexp.MustCompile(re).MatchString(stdout) {
				t.Errorf("summary lacks %s:\n%s", re, stdout)
			}
		}
		svg, err := os.ReadFile(report)
		if err != nil {
			t.Fatal(err)
		}
		texts := svgTexts(t, svg)
		for _, s := range []string{"store GB/s", "retrieve GB/s", "lookup p50 ms", "lookup p99 ms", "store p50 ms", "retrieve p50 ms"} {
			if !slices.Contains(texts, s) {
				t.Errorf("report lacks the series %q; texts %q", s, texts)
			}
		}
	})

	t.Run("BenchUnderTerminal", func(t *testing.T) {
		bin, _ := lmcacheBin(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, benchArgs(f, "--progress", "1ms")...)
		tty, err := pty.Start(cmd)
		if err != nil {
			t.Fatalf("pty.Start: %v", err)
		}
		defer tty.Close()
		var out bytes.Buffer
		_, copyErr := io.Copy(&out, tty) // ends with EIO once the child is gone
		if err := cmd.Wait(); err != nil {
			t.Fatalf("bench under a terminal: %v\n%s", err, out.String())
		}
		if copyErr != nil && !errors.Is(copyErr, syscall.EIO) {
			t.Fatal(copyErr)
		}
		progress := regexp.MustCompile(`\r\x1b\[Kbench: +\d+\.\ds stored \d+\.\d\d GiB, retrieved\+verified \d+\.\d\d GiB, lookups \d+, store refusals 0`)
		if !progress.Match(out.Bytes()) || !strings.Contains(out.String(), "phase") {
			t.Errorf("no progress line or summary on the terminal:\n%q", out.String())
		}
	})

	// The data path has run (bench above), so the lookup, L1 and L2
	// families have samples; Go client vectors appear only once used. The
	// coordinator's per-salt usage appears once the server's L2 store
	// events (flushed every second) have arrived, with its eviction
	// threshold (the default limit set above).
	coordNames := metricNames(t, f.coordHTTP+"/metrics")
	for deadline := time.Now().Add(time.Minute); !coordNames["lmcache_coordinator_salt_usage_bytes"] || !coordNames["lmcache_coordinator_salt_eviction_threshold_bytes"]; {
		if time.Now().After(deadline) {
			t.Fatalf("the coordinator exports no per-salt usage a minute after the bench: %v", coordNames)
		}
		time.Sleep(100 * time.Millisecond)
		coordNames = metricNames(t, f.coordHTTP+"/metrics")
	}
	serverNames := metricNames(t, f.serverHTTP+"/metrics")

	// The bench's lookups (ZMQ LOOKUP) are each observed once in the
	// lookup latency histogram, the metric LMCacheLookupLatencyHigh uses;
	// both periodic-loop gauges list the services' loops, all healthy.
	t.Run("AlertMetricsHaveSamples", func(t *testing.T) {
		server := metricValues(t, f.serverHTTP+"/metrics")
		lookups, observed := server["lmcache_mp_lookups_requests_total"], server["lmcache_mp_lookup_duration_seconds_count"]
		t.Logf("lookups %v, observed %v, lookup seconds sum %v", lookups, observed, server["lmcache_mp_lookup_duration_seconds_sum"])
		if lookups < 6 || observed != lookups {
			t.Errorf("lookups %v, lookup_duration_seconds_count %v; want equal, at least the bench's 6", lookups, observed)
		}
		if v, ok := server["lmcache_mp_l2_breaker_state"]; !ok || v != 0 {
			t.Errorf("lmcache_mp_l2_breaker_state (fs adapter) = %v (present %v), want 0", v, ok)
		}
		coord := metricValues(t, f.coordHTTP+"/metrics")
		for name, vals := range map[string]map[string]float64{"lmcache_mp_periodic_thread_healthy": server, "lmcache_coordinator_periodic_thread_healthy": coord} {
			if vals[name+"#series"] < 2 || vals[name] != vals[name+"#series"] {
				t.Errorf("%s: %v loops, %v healthy; want every one of at least 2", name, vals[name+"#series"], vals[name])
			}
		}
	})
	exported := map[string]bool{}
	for n := range serverNames {
		exported[n] = true
	}
	for n := range coordNames {
		exported[n] = true
	}
	// This fleet's coordinator ingests over HTTP; the Kafka consumer's
	// series (--event-transport kafka) are named by the collectors it
	// would register.
	for n := range kafkaConsumerNames(t) {
		exported[n] = true
	}

	t.Run("DashboardMetricsExist", func(t *testing.T) {
		exprs := dashboardExprs(t, "grafana/lmcache-go.json")
		used := checkNames(t, "dashboard", exprs, exported)
		var server, coord bool
		for n := range used {
			server = server || serverNames[n]
			coord = coord || coordNames[n]
		}
		if !server || !coord {
			t.Errorf("dashboard covers server %v coordinator %v; want both", server, coord)
		}
		var missing []string
		for n := range exported {
			base := strings.TrimSuffix(strings.TrimSuffix(n, "_count"), "_sum")
			if strings.HasPrefix(n, "lmcache_") && !used[n] && !used[n+"_bucket"] && !used[base+"_bucket"] {
				missing = append(missing, n)
			}
		}
		sort.Strings(missing)
		t.Logf("exported lmcache metrics not on the dashboard: %v", missing)
	})

	t.Run("AlertMetricsExist", func(t *testing.T) {
		var rules struct {
			Groups []struct {
				Name  string
				Rules []struct{ Alert, Expr string }
			}
		}
		raw, err := os.ReadFile("prometheus/lmcache-alerts.yml")
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(raw, &rules); err != nil {
			t.Fatal(err)
		}
		var exprs []string
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				exprs = append(exprs, r.Expr)
			}
		}
		if len(exprs) < 8 {
			t.Fatalf("%d alert rules", len(exprs))
		}
		exported["up"] = true // Prometheus' own per-target series
		checkNames(t, "alert rules", exprs, exported)
	})
}

// metricRef matches the metric names an expression uses: ours all start
// with lmcache_, and `up` is Prometheus' own.
var metricRef = regexp.MustCompile(`\b(lmcache_[a-z0-9_]+|up)\b`)

// checkNames fails for every metric an expression names that no binary
// exports, and returns the names used.
func checkNames(t *testing.T, what string, exprs []string, exported map[string]bool) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricRef.FindAllString(e, -1) {
			used[m] = true
			if !exported[m] {
				t.Errorf("%s: %q names %s, which neither binary exports", what, e, m)
			}
		}
	}
	if len(used) == 0 {
		t.Errorf("%s: no metric names found", what)
	}
	return used
}

// dashboardExprs parses the Grafana dashboard and returns every query
// (panel targets and template variables), checking the fields Grafana
// needs to import it.
func dashboardExprs(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	}
	type panel struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		Targets []target `json:"targets"`
	}
	var d struct {
		Title         string  `json:"title"`
		UID           string  `json:"uid"`
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion < 30 || len(d.Panels) == 0 {
		t.Fatalf("%s: title %q uid %q schemaVersion %d, %d panels", path, d.Title, d.UID, d.SchemaVersion, len(d.Panels))
	}
	var exprs []string
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("panel %q: id %d missing or repeated", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %+v, %d targets", p.Title, p.Datasource, len(p.Targets))
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" {
				t.Errorf("panel %q: target %+v", p.Title, tg)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok && v.Type == "query" {
			s, _ := q["query"].(string)
			exprs = append(exprs, s)
		}
	}
	return exprs
}

// svgTexts parses an SVG and returns its text nodes.
func svgTexts(t *testing.T, svg []byte) []string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	var texts []string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return texts
		}
		if err != nil {
			t.Fatalf("report is not valid XML: %v", err)
		}
		if cd, ok := tok.(xml.CharData); ok {
			if s := strings.TrimSpace(string(cd)); s != "" {
				texts = append(texts, s)
			}
		}
	}
}

// kafkaConsumerNames are the metric names of the Kafka consumer's
// collectors, gathered without connecting to a broker.
func kafkaConsumerNames(t *testing.T) map[string]bool {
	t.Helper()
	src, err := kafkaevents.NewSource(kafkaevents.SourceConfig{Brokers: []string{"127.0.0.1:1"}},
		kafkaevents.ApplierFunc(func(context.Context, kafkaevents.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(src.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	if !names["lmcache_coordinator_kafka_partitions_assigned"] || !names["lmcache_coordinator_kafka_topic_partitions"] {
		t.Fatalf("the Kafka consumer's collectors lack the partition gauges: %v", names)
	}
	return names
}
