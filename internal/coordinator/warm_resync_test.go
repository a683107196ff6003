package coordinator_test

import (
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// lruVictims sets salt's limit to 0 (with an eviction ratio of 1 every
// key of the salt is a victim), runs one cycle and returns the DELETE's
// keys in the order sent: the salt's whole LRU order, oldest first.
func lruVictims(t *testing.T, c *coord, mp *mpServer, salt string) string {
	t.Helper()
	before := len(mp.deleteBatches())
	c.must("PUT", "/quota/"+salt, map[string]any{"limit_gb": 0}, 200)
	c.cycle()
	batches := mp.deleteBatches()
	if len(batches) != before+1 {
		t.Fatalf("%d DELETE requests after the cycle, want %d", len(batches), before+1)
	}
	return strings.Join(hexes(batches[before]), ",")
}

// TestWarmRestartKeepsLRUOrderWithResyncOn: a coordinator restarted on its
// checkpoint with HTTP ingest and the startup resync left on (the default)
// merges the MP server's listing into the restored ledger: a key the
// checkpoint lacks (its store event acknowledged after the last checkpoint
// and lost with the process) is added, at the MRU end with its listed
// size, while the restored keys keep the LRU order (the eviction victims,
// oldest first), sizes and usage they had before the restart, although the
// MP server lists them in another order with other sizes. The resync is
// not counted as skipped. The same listing on a cold start (no checkpoint)
// is resynced and becomes the LRU order, so the warm result is not an
// accident of the listing.
func TestWarmRestartKeepsLRUOrderWithResyncOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "coord.ckpt")
	ckpt := func(p string) func(*config.Config) {
		return func(cfg *config.Config) {
			cfg.Ingest.CheckpointPath, cfg.Ingest.CheckpointInterval = p, 0
			cfg.EvictionRatio = 1
		}
	}
	a := startCoord(t, ckpt(path))
	a.events(rev("store", "01", "a", mib), rev("store", "02", "a", 2*mib), rev("store", "03", "a", mib),
		rev("store", "04", "a", mib), rev("store", "05", "a", mib), rev("store", "b1", "b", mib))
	a.events(rev("lookup", "02", "a", 0), rev("lookup", "04", "a", 0))
	mpA := newMP(t)
	mpA.register(a, "mp-1")
	const order = "a/01,a/03,a/05,a/02,a/04"
	if got := lruVictims(t, a, mpA, "a"); got != order {
		t.Fatalf("LRU order before the restart %s, want %s", got, order)
	}
	a.stop()
	if err := a.wait(); err != nil {
		t.Fatal(err)
	}

	// The MP server lists salt a newest-first with other sizes: a resync
	// would make this the LRU order and 5 × 7 bytes the usage.
	listing := []mpPage{{entries: []any{entry("04", "a", 7), entry("02", "a", 7), entry("05", "a", 7),
		entry("03", "a", 7), entry("01", "a", 7)}}}
	resyncOn := func(p string) func(*config.Config) {
		return func(cfg *config.Config) {
			ckpt(p)(cfg)
			cfg.EnableStartupResync = config.Default().EnableStartupResync
			cfg.ResyncPollInterval, cfg.ResyncMaxWait = 0.01, 10
		}
	}
	if !config.Default().EnableStartupResync {
		t.Fatal("ENABLE_STARTUP_RESYNC is expected on by default")
	}

	b := startCoord(t, resyncOn(path))
	mpB := newMP(t)
	// 06 was stored after the checkpoint: the ledger has not heard of it.
	mpB.pages = []mpPage{{entries: append([]any{entry("06", "a", 9)}, listing[0].entries...)}}
	mpB.register(b, "mp-1")
	metric(t, b, "lmcache_coordinator_checkpoint_restored_keys 6")
	waitFor(t, "the merging resync", func() bool {
		_, raw := b.do("GET", "/metrics", nil)
		return strings.Contains(string(raw), "lmcache_coordinator_resync_pages_total 1\n")
	})
	waitFor(t, "the resync loop to end", func() bool {
		_, raw := b.do("GET", "/periodic-threads/coordinator-startup-resync", nil)
		return strings.Contains(string(raw), "finished: 1 keys")
	})
	metric(t, b, "lmcache_coordinator_resync_keys_total 1")
	metric(t, b, "lmcache_coordinator_startup_resync_skipped_total 0")
	if !b.logs.Has(`msg="startup resync merging into the ledger restored from a checkpoint`) {
		t.Errorf("no log line about the merging resync:\n%s", b.logs.String())
	}
	if got := b.usageBytes("a"); got != 6*mib+9 {
		t.Errorf("salt a usage after the warm restart %d, want %d (restored sizes and the added key)", got, 6*mib+9)
	}
	if got := lruVictims(t, b, mpB, "a"); got != order+",a/06" {
		t.Errorf("LRU order after the warm restart %s, want %s,a/06 (before the restart, then the added key)", got, order)
	}
	if got := lruVictims(t, b, mpB, "b"); got != "b/b1" {
		t.Errorf("salt b after the warm restart %s, want b/b1", got)
	}

	// Control: cold (no checkpoint yet), the same listing is resynced.
	c := startCoord(t, resyncOn(filepath.Join(t.TempDir(), "cold.ckpt")))
	mpC := newMP(t)
	mpC.pages = listing
	mpC.register(c, "mp-1")
	waitFor(t, "the cold resync", func() bool {
		_, raw := c.do("GET", "/metrics", nil)
		return strings.Contains(string(raw), "lmcache_coordinator_resync_keys_total 5\n")
	})
	metric(t, c, "lmcache_coordinator_startup_resync_skipped_total 0")
	if got := c.usageBytes("a"); got != 35 {
		t.Errorf("salt a usage after the cold resync %d, want 35", got)
	}
	if got := lruVictims(t, c, mpC, "a"); got != "a/04,a/02,a/05,a/03,a/01" {
		t.Errorf("LRU order after the cold resync %s, want the listing order", got)
	}
}

// TestNonHAServesAsBeforeHA: without --ha-etcd-endpoints GET /readyz is
// not a route (404 {"detail":"Not Found"}, as any unknown path, and absent
// from /openapi.json), none of the HA metrics (leader, standby redirects,
// intent store, dispatch fence revision) is exported, no HA loop runs,
// and intent writes are served directly (200, no redirect).
func TestNonHAServesAsBeforeHA(t *testing.T) {
	c := startCoord(t, nil)
	code, raw := c.do("GET", "/readyz", nil)
	if code != 404 || string(raw) != `{"detail":"Not Found"}` {
		t.Fatalf("GET /readyz without HA: %d %s, want 404 {\"detail\":\"Not Found\"}", code, raw)
	}
	if code, raw := c.do("GET", "/no-such-route", nil); code != 404 || string(raw) != `{"detail":"Not Found"}` {
		t.Fatalf("an unknown path: %d %s (the /readyz answer must be the same)", code, raw)
	}
	_, doc := c.do("GET", "/openapi.json", nil)
	var spec struct {
		Paths map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(doc, &spec); err != nil || len(spec.Paths) == 0 {
		t.Fatalf("openapi.json: %v", err)
	}
	if _, ok := spec.Paths["/readyz"]; ok {
		t.Errorf("/openapi.json lists /readyz without HA")
	}
	_, m := c.do("GET", "/metrics", nil)
	for _, line := range strings.Split(string(m), "\n") {
		name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(line, "# HELP "), "# TYPE "), " ")
		name, _, _ = strings.Cut(name, "{")
		for _, ha := range []string{"lmcache_coordinator_leader", "lmcache_coordinator_leader_revision", "lmcache_coordinator_leader_transitions_total",
			"lmcache_coordinator_leader_elections_total", "lmcache_coordinator_leader_lost_total", "lmcache_coordinator_standby_redirects_total",
			"lmcache_coordinator_intent_store_errors_total", "lmcache_coordinator_intent_changes_applied_total",
			"lmcache_coordinator_eviction_dispatch_fence_revision"} {
			if name == ha {
				t.Errorf("HA metric exported without HA: %s", line)
			}
		}
	}
	for _, loop := range []string{"coordinator-ha-election", "coordinator-ha-intent-mirror"} {
		if code, _ := c.do("GET", "/periodic-threads/"+loop, nil); code != 404 {
			t.Errorf("%s without HA: %d, want 404", loop, code)
		}
	}
	if code, hdr, raw := c.doAuth("PUT", "/quota/t1", map[string]any{"limit_gb": 1}, ""); code != 200 || hdr.Get("Location") != "" {
		t.Fatalf("PUT /quota/t1 without HA: %d %v %s", code, hdr, raw)
	}
}

// TestHAKafkaGroupPerCoordinator: in HA mode with --event-transport kafka
// and --kafka-group-id left at its default, each coordinator's source
// joins its own group named after its advertised host:port (logged), so
// two coordinators never split the partitions; without HA, and with an
// explicit group, the configured group is used.
func TestHAKafkaGroupPerCoordinator(t *testing.T) {
	deadAddr := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	etcd, broker := "http://"+deadAddr(), deadAddr()
	kafka := func(cfg *config.Config) {
		cfg.Ingest.EventTransport, cfg.Ingest.KafkaBootstrapServers = config.TransportKafka, broker
	}
	one, two := startHA(t, []string{etcd}, kafka), startHA(t, []string{etcd}, kafka)
	for _, c := range []*coord{one, two} {
		want := "lmcache-coordinator-" + strings.TrimPrefix(c.base, "http://")
		if got := c.srv.KafkaGroupID(); got != want {
			t.Errorf("%s: group %q, want %q", c.base, got, want)
		}
		if !c.logs.Has("group_id=" + want) {
			t.Errorf("%s: no log line naming group %s:\n%s", c.base, want, c.logs.String())
		}
	}
	if one.srv.KafkaGroupID() == two.srv.KafkaGroupID() {
		t.Fatalf("two HA coordinators share group %q", one.srv.KafkaGroupID())
	}
	explicit := startHA(t, []string{etcd}, func(cfg *config.Config) { kafka(cfg); cfg.Ingest.KafkaGroupID = "coord-x" })
	if got := explicit.srv.KafkaGroupID(); got != "coord-x" {
		t.Errorf("explicit group in HA mode: %q, want coord-x", got)
	}
	single := startCoord(t, kafka)
	if got := single.srv.KafkaGroupID(); got != "lmcache-coordinator" {
		t.Errorf("group without HA: %q, want lmcache-coordinator", got)
	}
}

// TestWarmRestartOnKafkaStillSkipsResync: with Kafka ingest a restored
// checkpoint still skips the startup resync (the stream is read from the
// checkpoint's position, so nothing acknowledged is lost): no resync
// thread, the skip counted, the restored keys kept.
func TestWarmRestartOnKafkaStillSkipsResync(t *testing.T) {
	path, _ := checkpointFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	broker := ln.Addr().String()
	ln.Close()
	c := startCoord(t, func(cfg *config.Config) {
		cfg.Ingest.CheckpointPath, cfg.Ingest.CheckpointInterval = path, 0
		cfg.Ingest.EventTransport, cfg.Ingest.KafkaBootstrapServers = config.TransportKafka, broker
		cfg.EnableStartupResync = true
		cfg.ResyncPollInterval, cfg.ResyncMaxWait = 0.01, 10
	})
	if code, raw := c.do("GET", "/periodic-threads/coordinator-startup-resync", nil); code != 404 {
		t.Fatalf("resync thread after a warm restart on kafka: %d %s", code, raw)
	}
	metric(t, c, "lmcache_coordinator_startup_resync_skipped_total 1")
	metric(t, c, "lmcache_coordinator_checkpoint_restored_keys 3")
	if !c.logs.Has(`msg="startup resync skipped: the ledger was restored from a checkpoint`) {
		t.Errorf("no log line about the skipped resync:\n%s", c.logs.String())
	}
}
