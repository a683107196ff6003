package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/lmcache-go/lmcache/internal/s3test"
)

// chromiumPath is Debian's chromium (scripts/install-deps.sh test).
const chromiumPath = "/usr/bin/chromium"

// browser starts headless Chromium for the test; it is stopped, and its
// goroutines end, at cleanup.
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("chromium is missing (install it with scripts/install-deps.sh test): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath), chromedp.NoSandbox,
		chromedp.Headless, chromedp.DisableGPU, chromedp.WindowSize(1400, 1100))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	if err := chromedp.Run(ctx); err != nil {
		cancelCtx()
		cancelAlloc()
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancelCtx()
		cancelAlloc()
	})
	return ctx
}

// eval runs a JavaScript expression in the page, bounded by a deadline.
func eval(t *testing.T, ctx context.Context, expr string, out any) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Run(c, chromedp.Evaluate(expr, out)); err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
}

func browse(t *testing.T, ctx context.Context, actions ...chromedp.Action) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Run(c, actions...); err != nil {
		t.Fatal(err)
	}
}

// screenshot keeps a full-page PNG as a test artefact (never in git).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("LMCACHE_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	var png []byte
	browse(t, ctx, chromedp.FullScreenshot(&png, 100))
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", p, len(png))
}

// metricSum adds every sample of one metric family in a /metrics page.
func metricSum(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, m := range regexp.MustCompile(`(?m)^`+name+`(?:\{[^}]*\})? (\S+)$`).FindAllSubmatch(b, -1) {
		v, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

// eventually polls until the page and the routes agree; the last
// difference is the failure message.
func eventually(t *testing.T, what string, diff func() string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		d := diff()
		if d == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestWebConsoleFleet loads /ui of a real coordinator with two real servers
// (s1 on an fs adapter, s2 on an S3 one) and some traffic in headless
// Chromium: the coordinator's fleet and quota tables and its usage chart
// show what GET /instances, GET /quota and /metrics say, with "not
// reported" for the L1 of our servers (they post no tier "l1" facts) and
// the figures of a third instance that posted some; a server's console
// asks for the bearer token, shows the 401 until it has it, then shows
// /status and /metrics figures, its models, breaker states and
// periodic-thread health.
func TestWebConsoleFleet(t *testing.T) {
	ctx := browser(t)
	const coordTok, srvTok = "coord-console-tok", "srv-console-tok"
	layout := fmt.Sprintf(`{"model_name":%q,"world_size":1,"num_layers":2,"hidden_size":64,"dtype":"float16","object_bytes":%d}`, model, objectBytes)
	coordURL := "http://127.0.0.1:" + itoa(freePort(t))
	start(t, "coordinator", nil, "coordinator", "--host", "127.0.0.1", "--port", coordURL[len("http://127.0.0.1:"):],
		"--auth-token", coordTok, "--eviction-check-interval", "0.5", "--health-check-interval", "1", "--chunk-size", itoa(chunkSize),
		"--trigger-watermark", "0.8", "--mp-auth-token", srvTok,
		// The L1-facts instance below sends no heartbeats: keep it listed.
		"--instance-timeout", "600")
	waitFor(t, "coordinator healthz", healthy(coordURL+"/healthz"))
	servers := map[string]string{}
	for _, id := range []string{"s1", "s2"} {
		port := freePort(t)
		adapter := fmt.Sprintf(`{"type":"fs","base_path":%q}`, t.TempDir())
		if id == "s2" { // an adapter with a circuit breaker
			s3 := s3test.Fake(t)
			b, _ := json.Marshal(map[string]any{
				"type": "s3", "s3_endpoint": s3.Endpoint, "s3_region": s3test.Region, "disable_tls": true,
				"s3_addressing_style": "path", "s3_bucket": s3.Bucket,
				"aws_access_key_id": s3.AccessKey, "aws_secret_access_key": s3.SecretKey})
			adapter = string(b)
		}
		start(t, id, nil, "server", "--instance-id", id, "--http-port", itoa(port), "--port", itoa(freePort(t)),
			"--http-auth-token", srvTok, "--l1-size-gb", "0.0625", "--chunk-size", itoa(chunkSize), "--l2-adapter", adapter,
			"--register-model", layout, "--coordinator-url", coordURL, "--coordinator-auth-token", coordTok,
			// Heartbeats every 3 s: the page and the route then agree on
			// the last one for most of each interval.
			"--coordinator-advertise-ip", "127.0.0.1", "--coordinator-heartbeat-interval", "3",
			"--coordinator-event-reporting", "--coordinator-event-flush-interval", "0.2")
		servers[id] = "http://127.0.0.1:" + itoa(port)
		waitFor(t, id+" healthcheck", healthy(servers[id]+"/healthcheck"))
	}
	var fleet struct {
		Instances []struct {
			InstanceID  string `json:"instance_id"`
			L1UsedBytes int64  `json:"l1_used_bytes"`
		} `json:"instances"`
	}
	waitFor(t, "both servers registered", func() bool {
		call(t, "GET", coordURL+"/instances", nil, nil, &fleet)
		return len(fleet.Instances) == 2
	})
	postL1Facts(t, coordURL, coordTok)

	// Traffic: two prompts stored on s1, one looked up; a quota for the salt.
	auth := map[string]string{"Authorization": "Bearer " + srvTok}
	for i, p := range [][]int64{tokens(0), tokens(1000)} {
		hdr := map[string]string{"X-LMCache-Model": model, "X-LMCache-Tokens": tokenHeader(p), "X-LMCache-Cache-Salt": salt, "Authorization": auth["Authorization"]}
		if code, _ := call(t, "POST", servers["s1"]+"/api/kv/store", bytes.Repeat([]byte{byte(i + 1)}, 8*objectBytes), hdr, nil); code != http.StatusOK {
			t.Fatalf("store prompt %d: %d", i, code)
		}
	}
	if code, _ := call(t, "POST", servers["s1"]+"/api/kv/lookup", map[string]any{"model_name": model, "tokens": tokens(0), "cache_salt": salt}, auth, nil); code != http.StatusOK {
		t.Fatalf("lookup: %d", code)
	}
	if code, _ := call(t, "PUT", coordURL+"/quota/"+salt, map[string]any{"limit_gb": 0.5}, map[string]string{"Authorization": "Bearer " + coordTok}, nil); code != http.StatusOK {
		t.Fatalf("PUT quota: %d", code)
	}
	waitFor(t, "coordinator usage of 16 objects", func() bool {
		var q quotaView
		call(t, "GET", coordURL+"/quota/"+salt, nil, nil, &q)
		return gbToBytes(q.UsageGB) == 16*objectBytes
	})

	t.Run("coordinator", func(t *testing.T) {
		browse(t, ctx, chromedp.Navigate(coordURL+"/ui?interval=300"), chromedp.WaitVisible("#fleet-table"))
		consoleFleetL1(t, ctx, coordURL)
		eventually(t, "quota row equals GET /quota", func() string {
			var q struct {
				ByCacheSalt []struct {
					CacheSalt    string  `json:"cache_salt"`
					QuotaLimitGB float64 `json:"quota_limit_gb"`
					UsageGB      float64 `json:"usage_gb"`
				} `json:"by_cache_salt"`
			}
			call(t, "GET", coordURL+"/quota", nil, nil, &q)
			var got []float64
			eval(t, ctx, `[...document.querySelectorAll('#quota-table tr[data-id="`+salt+`"] td[data-k]')].filter(td => td.dataset.k.endsWith('_gb')).map(td => Number(td.dataset.value))`, &got)
			for _, s := range q.ByCacheSalt {
				if s.CacheSalt == salt && len(got) == 2 && got[0] == s.QuotaLimitGB && got[1] == s.UsageGB && s.QuotaLimitGB == 0.5 && gbToBytes(s.UsageGB) == 16*objectBytes {
					return ""
				}
			}
			return fmt.Sprintf("page %v, route %+v", got, q)
		})
		eventually(t, "usage chart's last point equals tracked_bytes", func() string {
			want := metricSum(t, coordURL, "lmcache_coordinator_tracked_bytes")
			var got float64
			eval(t, ctx, `lmcacheConsole.charts.usage.data[1].at(-1)`, &got)
			if got != want || want != 16*objectBytes {
				return fmt.Sprintf("chart %v, metric %v", got, want)
			}
			return ""
		})
		var charts int
		eval(t, ctx, `document.querySelectorAll('.uplot canvas').length`, &charts)
		if charts != 2 {
			t.Errorf("%d charts drawn, want 2", charts)
		}
		consoleFleetFigures(t, ctx, coordURL, coordTok, "")
		var rid string
		t.Run("prefetch", func(t *testing.T) {
			rid = consolePrefetchInFlight(t, ctx, coordURL, coordTok)
		})
		screenshot(t, ctx, "console-coordinator")
		// With the token typed in, the page sends it and shows the same.
		browse(t, ctx, chromedp.SendKeys("#token", coordTok), chromedp.Click("#auth button"))
		consoleFleetFigures(t, ctx, coordURL, coordTok, "token set")
		if rid != "" {
			consolePrefetchDone(t, ctx, coordURL, coordTok, rid)
		}
		screenshot(t, ctx, "console-coordinator-token")
	})

	t.Run("server", func(t *testing.T) {
		s1 := servers["s1"]
		browse(t, ctx, chromedp.Navigate(s1+"/ui?interval=300"), chromedp.WaitVisible("#engine"))
		eventually(t, "the page reports the missing token", func() string {
			var got struct {
				State  string `json:"state"`
				Status string `json:"status"`
				Stored bool   `json:"stored"`
			}
			eval(t, ctx, `({state: document.getElementById('auth-state').textContent, status: lmcacheConsole.errors['/status'] || '', stored: sessionStorage.getItem('lmcache-token') !== null})`, &got)
			if got.State != "token needed" || got.Status != "401: enter the bearer token above" || got.Stored {
				return fmt.Sprintf("%+v", got)
			}
			return ""
		})
		browse(t, ctx, chromedp.SendKeys("#token", srvTok), chromedp.Click("#auth button"))
		eventually(t, "engine figures equal GET /status and /metrics", func() string {
			var st struct {
				StorageManager struct {
					L1 struct {
						Used int64 `json:"memory_used_bytes"`
					} `json:"l1_manager"`
				} `json:"storage_manager"`
			}
			call(t, "GET", s1+"/status", nil, auth, &st)
			writes := metricSum(t, s1, "lmcache_mp_l1_write_chunks_total")
			hits := metricSum(t, s1, "lmcache_mp_lookup_hit_tokens_total")
			var got struct {
				Used, Writes, Hits float64
				State              string
			}
			eval(t, ctx, `(() => { const v = k => Number(document.querySelector('[data-k='+k+']')?.dataset.value);
				return {Used: v('l1_used_bytes'), Writes: v('l1_write_chunks_total'), Hits: v('lookup_hit_tokens_total'), State: document.getElementById('auth-state').textContent}; })()`, &got)
			if got.Used != float64(st.StorageManager.L1.Used) || got.Used != 16*objectBytes || got.Writes != writes || writes != 16 || got.Hits != hits || hits != 8*chunkSize || got.State != "token set" {
				return fmt.Sprintf("page %+v; status l1 %d, writes %v, hits %v", got, st.StorageManager.L1.Used, writes, hits)
			}
			return ""
		})
		var points int
		eval(t, ctx, `lmcacheConsole.charts.throughput.data[0].length`, &points)
		if points < 2 {
			t.Errorf("throughput chart has %d points", points)
		}
		consoleServerFigures(t, ctx, s1, auth, "")
		screenshot(t, ctx, "console-server")
		// s2's S3 adapter has a circuit breaker; its page (another origin:
		// the token is asked for again) shows its state.
		browse(t, ctx, chromedp.Navigate(servers["s2"]+"/ui?interval=300"), chromedp.WaitVisible("#engine"),
			chromedp.SendKeys("#token", srvTok), chromedp.Click("#auth button"))
		consoleServerFigures(t, ctx, servers["s2"], auth, "closed")
		screenshot(t, ctx, "console-server-s3")
	})
}
