package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/script"
)

// TestPeriodicActiveOnly: active_only keeps running loops that ticked (or
// are still within init wait) in the last 3 intervals; a running loop past
// that and a loop that is not running are left out, while running_only
// keeps both running ones.
func TestPeriodicActiveOnly(t *testing.T) {
	e := start(t, envOpts{})
	now := time.Now()
	var clockMu sync.Mutex
	e.loops.SetClock(func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now })
	block := make(chan struct{})
	blocked := func(context.Context) (periodic.Summary, error) { <-block; return periodic.Summary{}, nil }
	stale := e.loops.Register("stale-loop", periodic.Medium, time.Second, 0, blocked)
	warming := e.loops.Register("warming-loop", periodic.Medium, time.Second, time.Hour, blocked)
	e.loops.Register("stopped-loop", periodic.Low, time.Second, 0, blocked)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, l := range []*periodic.Loop{stale, warming} {
		wg.Add(1)
		go func() { defer wg.Done(); l.Run(ctx) }()
	}
	defer func() { cancel(); close(block); wg.Wait() }()
	waitFor(t, "both loops running", func() bool {
		a, _ := e.loops.Get("stale-loop")
		b, _ := e.loops.Get("warming-loop")
		return a.IsRunning && b.IsRunning
	})
	clockMu.Lock()
	now = now.Add(10 * time.Second) // past 3 intervals, well within warming's init wait
	clockMu.Unlock()
	names := func(q string) []string {
		m := e.expect(200, "GET", "/periodic-threads"+q, nil).json(t)
		var out []string
		for _, th := range m["threads"].([]any) {
			out = append(out, th.(map[string]any)["name"].(string))
		}
		if m["summary"].(map[string]any)["total_count"] != float64(3) {
			t.Fatalf("%s: summary = %v", q, m["summary"])
		}
		return out
	}
	if got := names("?active_only=true"); len(got) != 1 || got[0] != "warming-loop" {
		t.Fatalf("active_only = %v", got)
	}
	if got := strings.Join(names("?running_only=true"), ","); got != "stale-loop,warming-loop" && got != "warming-loop,stale-loop" {
		t.Fatalf("running_only = %v", got)
	}
	if got := names("?active_only=false"); len(got) != 3 {
		t.Fatalf("active_only=false = %v", got)
	}
	if got := names("?active_only=true&level=low"); len(got) != 0 {
		t.Fatalf("active_only with level low = %v", got)
	}
}

// TestEnvJSONValuesRedactedInside: a non-secret variable holding JSON has
// its secret-looking members redacted, the other members kept.
func TestEnvJSONValuesRedactedInside(t *testing.T) {
	environ := func() []string {
		return []string{`LMCACHE_L2_ADAPTER={"type":"s3","bucket":"b1","aws_secret_access_key":"s3cr3t-v4lue","nested":{"password":"pw-inner"}}`}
	}
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.Environ = environ }})
	r := e.expect(200, "GET", "/env", nil)
	if strings.Contains(string(r.body), "s3cr3t-v4lue") || strings.Contains(string(r.body), "pw-inner") {
		t.Fatalf("secret inside JSON leaked: %s", r.body)
	}
	v, _ := r.json(t)["LMCACHE_L2_ADAPTER"].(string)
	var inner map[string]any
	if err := json.Unmarshal([]byte(v), &inner); err != nil {
		t.Fatalf("value %q is no longer JSON: %v", v, err)
	}
	if inner["type"] != "s3" || inner["bucket"] != "b1" || inner["aws_secret_access_key"] != httpapi.Redacted ||
		inner["nested"].(map[string]any)["password"] != httpapi.Redacted {
		t.Fatalf("inner = %v", inner)
	}
}

// scriptPost sends a script to e with ctx (nil: background).
func scriptPost(t *testing.T, ctx context.Context, e *env, src string) (int, string, error) {
	form, ct := scriptForm(t, "script", src)
	req, err := http.NewRequestWithContext(ctx, "POST", e.base+"/run_script", strings.NewReader(string(form)))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", ct)
	res, err := e.hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// TestRunScriptFailureReasons: deadline, output_limit, busy and error are
// counted under their reason, and POST /metrics/reset leaves the counter.
func TestRunScriptFailureReasons(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.RunScriptEnabled = true
		o.ScriptMaxSteps = 1 << 40
		o.ScriptTimeout = 300 * time.Millisecond
		o.ScriptMaxOutput = 10
	}})
	for src, want := range map[string]string{
		"while True:\n  pass": "Error executing script: deadline exceeded: ", // the rest is capped at 10 bytes
		"result = 'y' * 100":  "Error executing script: script output limit exceeded (10 bytes)",
		"result = 1 // 0":     "",
	} {
		code, body, err := scriptPost(t, context.Background(), e, src)
		if err != nil || code != 500 || !strings.HasPrefix(body, want) || !strings.HasPrefix(body, "Error executing script: ") {
			t.Errorf("%q: %d %q %v, want 500 %q", src, code, body, err, want)
		}
	}

	// busy: a second server (timeout 1 min) holds both sandbox slots with
	// scripts that never end; this server's short-deadline script then
	// waits its whole deadline for a slot. Until the holders have their
	// slots, the probe simply succeeds, so poll it.
	holder := start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.RunScriptEnabled = true
		o.ScriptMaxSteps = 1 << 40
		o.ScriptTimeout = time.Minute
	}})
	hctx, hcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := scriptPost(t, hctx, holder, "while True:\n  pass")
			if !errors.Is(err, context.Canceled) {
				t.Errorf("holder: %v, want cancelled", err)
			}
		}()
	}
	var busy string
	waitFor(t, "a script refused as busy", func() bool {
		code, body, err := scriptPost(t, context.Background(), e, "result = 1")
		if err != nil || (code != 200 && code != 500) {
			t.Fatalf("probe: %d %q %v", code, body, err)
		}
		busy = body
		return code == 500
	})
	hcancel()
	wg.Wait()
	if busy != "Error executing script: too many scripts running (limit 2)" {
		t.Fatalf("busy body = %q", busy)
	}
	// The holders' clients went away while their scripts ran: cancelled,
	// not busy and not a script error.
	waitFor(t, "the holders counted cancelled", func() bool {
		return strings.Contains(string(holder.expect(200, "GET", "/metrics", nil).body), `lmcache_mp_run_script_failures_total{reason="cancelled"} 2`)
	})
	if m := string(holder.expect(200, "GET", "/metrics", nil).body); strings.Contains(m, `reason="error"`) || strings.Contains(m, `reason="busy"`) {
		t.Fatalf("holder counted its cancelled runs under another reason:\n%s", m)
	}

	e.expect(200, "POST", "/metrics/reset", nil)
	metrics := string(e.expect(200, "GET", "/metrics", nil).body)
	for _, want := range []string{
		`lmcache_mp_run_script_failures_total{reason="deadline"} 1`,
		`lmcache_mp_run_script_failures_total{reason="output_limit"} 1`,
		`lmcache_mp_run_script_failures_total{reason="error"} 1`,
		`lmcache_mp_run_script_failures_total{reason="busy"} 1`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics after reset lacks %s", want)
		}
	}
}

// TestRunScriptServerDefaults: a server with no --script-* limits set
// runs scripts under script's defaults: a 1 MiB (1048576-byte) output cap.
func TestRunScriptServerDefaults(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) { o.RunScriptEnabled = true }})
	code, body, err := scriptPost(t, context.Background(), e, "result = 'y' * 1048577")
	if err != nil || code != 500 || body != "Error executing script: script output limit exceeded (1048576 bytes)" {
		t.Fatalf("over the cap: %d %q %v", code, body, err)
	}
	code, body, err = scriptPost(t, context.Background(), e, "result = 'y' * 1000")
	if err != nil || code != 200 || body != strings.Repeat("y", 1000) {
		t.Fatalf("under the cap: %d %d bytes %v", code, len(body), err)
	}
}

// sandboxChildren lists the pids of this process's children that run as a
// script sandbox (LMCACHE_SCRIPT_SANDBOX in their environment), read from
// /proc through prometheus/procfs.
func sandboxChildren(t *testing.T) []int {
	t.Helper()
	procs, err := procfs.AllProcs()
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil || st.PPID != os.Getpid() {
			continue // exited meanwhile, or not ours
		}
		env, err := p.Environ()
		if err == nil && slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, script.SandboxEnv+"=") }) {
			out = append(out, p.PID)
		}
	}
	return out
}

// TestRunScriptSandboxKilled: a sandbox killed from outside while it runs
// (what the kernel's OOM killer or an operator's kill does) is a sandbox
// failure: 500 "Error executing script: script sandbox failed: signal:
// killed", counted in lmcache_mp_run_script_failures_total{reason="sandbox"};
// the server keeps serving scripts afterwards.
func TestRunScriptSandboxKilled(t *testing.T) {
	e := start(t, envOpts{mutate: func(o *httpapi.Options) {
		o.RunScriptEnabled = true
		o.ScriptMaxSteps = 1 << 40
		o.ScriptTimeout = time.Minute
	}})
	type reply struct {
		code int
		body string
		err  error
	}
	done := make(chan reply, 1)
	go func() {
		code, body, err := scriptPost(t, context.Background(), e, "while True:\n  pass")
		done <- reply{code, body, err}
	}()
	var pids []int
	waitFor(t, "the sandbox child running the script", func() bool {
		pids = sandboxChildren(t)
		return len(pids) == 1
	})
	// The child is named for what it is (it runs as /proc/self/exe,
	// which would make it "exe" in ps and in the OOM killer's line): its
	// argv[0] from the start, its process name once its init has run.
	child, err := procfs.NewProc(pids[0])
	if err != nil {
		t.Fatal(err)
	}
	if cmdline, err := child.CmdLine(); err != nil || !slices.Equal(cmdline, []string{script.SandboxName}) {
		t.Errorf("sandbox cmdline %q (%v), want [%q]", cmdline, err, script.SandboxName)
	}
	waitFor(t, "the sandbox process named "+script.SandboxName, func() bool {
		comm, err := child.Comm()
		return err == nil && comm == script.SandboxName
	})
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if want := "Error executing script: script sandbox failed: signal: killed"; r.err != nil || r.code != 500 || !strings.HasPrefix(r.body, want) {
		t.Fatalf("killed sandbox: %d %q %v, want 500 %q", r.code, r.body, r.err, want)
	}
	metrics := string(e.expect(200, "GET", "/metrics", nil).body)
	if want := `lmcache_mp_run_script_failures_total{reason="sandbox"} 1`; !strings.Contains(metrics, want+"\n") {
		t.Errorf("/metrics lacks %s", want)
	}
	if code, body, err := scriptPost(t, context.Background(), e, "result = 6 * 7"); err != nil || code != 200 || body != "42" {
		t.Fatalf("script after the kill: %d %q %v", code, body, err)
	}
}
