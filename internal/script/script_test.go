package script

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunLimits(t *testing.T) {
	ctx := context.Background()
	res, err := Run(ctx, Config{AllowedImports: []string{"json"}}, "a.star", `load("json", "json")
print("hi")
result = json.encode([1, 2])`)
	if err != nil || res.Text != "[1,2]" || res.Printed != "hi\n" {
		t.Fatalf("res %+v err %v", res, err)
	}
	if res, _ := Run(ctx, Config{}, "a.star", "x = 1"); res.Text != SuccessMessage {
		t.Fatalf("no result: %q", res.Text)
	}
	if res, _ := Run(ctx, Config{}, "a.star", "result = 42"); res.Text != "42" {
		t.Fatalf("int result: %q", res.Text)
	}
	if _, err := Run(ctx, Config{}, "a.star", `load("json", "json")`); !errors.Is(err, ErrImportNotAllowed) {
		t.Fatalf("disallowed import: %v", err)
	}
	if _, err := Run(ctx, Config{AllowedImports: []string{"os"}}, "a.star", `load("os", "os")`); err == nil || !strings.Contains(err.Error(), "no module named 'os'") {
		t.Fatalf("unknown module: %v", err)
	}
	if _, err := Run(ctx, Config{MaxSteps: 1000}, "a.star", "for i in range(100000):\n  pass"); err == nil || !strings.Contains(err.Error(), "too many steps") {
		t.Fatalf("steps: %v", err)
	}
	if _, err := Run(ctx, Config{MaxSteps: 1 << 40, Timeout: 50 * time.Millisecond}, "a.star", "while True:\n  pass"); !errors.Is(err, ErrDeadline) || !strings.Contains(err.Error(), "script ran past 50ms") {
		t.Fatalf("deadline: %v", err)
	}
	if _, err := Run(ctx, Config{MaxOutput: 10}, "a.star", "for i in range(100):\n  print('xxxxx')"); !errors.Is(err, ErrOutputLimit) {
		t.Fatalf("print cap: %v", err)
	}
	if _, err := Run(ctx, Config{MaxOutput: 10}, "a.star", "result = 'y' * 100"); !errors.Is(err, ErrOutputLimit) {
		t.Fatalf("result cap: %v", err)
	}
	if _, err := Run(ctx, Config{}, "a.star", "result = ("); err == nil {
		t.Fatal("syntax error accepted")
	}
}

func TestFromGoIsFrozen(t *testing.T) {
	v, err := FromGo(map[string]any{"a": []any{int64(1), "x", nil, true, 2.5}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Type() != "dict" {
		t.Fatalf("FromGo map = %s", v.Type())
	}
	_, err = Run(context.Background(), Config{App: map[string]any{"d": map[string]any{"a": []any{1, "x"}}}}, "a.star", `app.d["b"] = 1`)
	if err == nil || !strings.Contains(err.Error(), "frozen") {
		t.Fatalf("mutation of host data: %v", err)
	}
	if _, err := FromGo(struct{}{}); err == nil {
		t.Fatal("struct accepted")
	}
}

// TestMemoryLimit: allocations that no step cap sees ([0]*1e9 is one 16 GB
// make inside the interpreter; str() of a list repeating one big string is
// one Go loop) are stopped by the sandbox's memory budget, and the server
// process itself does not grow.
func TestMemoryLimit(t *testing.T) {
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, src := range []string{
		"x = [0] * 1000000000",
		"s = 'a' * 100000000\nl = [s] * 1000\nresult = str(l)",
		"l = [1]\nfor i in range(40):\n    l = l + l",
	} {
		_, err := Run(context.Background(), Config{MemoryBytes: 256 << 20, Timeout: time.Minute}, "m.star", src)
		if !errors.Is(err, ErrMemoryLimit) {
			t.Fatalf("%q: err %v, want ErrMemoryLimit", src, err)
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapSys) - int64(before.HeapSys); grew > 64<<20 {
		t.Fatalf("the calling process's heap grew by %d MiB", grew>>20)
	}
	// A modest allocation still works under the same budget.
	if res, err := Run(context.Background(), Config{MemoryBytes: 256 << 20}, "m.star", "result = len([0] * 1000000)"); err != nil || res.Text != "1000000" {
		t.Fatalf("1e6 list: %+v %v", res, err)
	}
}

// TestErrorTextCapped: a deep-recursion traceback (or any error text) is
// cut to MaxOutput.
func TestErrorTextCapped(t *testing.T) {
	src := "def f(n):\n    return f(n + 1)\nf(0)"
	_, err := Run(context.Background(), Config{MaxOutput: 4096, MaxSteps: 2_000_000, Timeout: time.Minute}, "r.star", src)
	if err == nil {
		t.Fatal("unbounded recursion succeeded")
	}
	if n := len(err.Error()); n > 4096+64 {
		t.Fatalf("error text is %d bytes, cap 4096", n)
	}
}

// TestSandboxEnvironmentIsEmpty: nothing of the server's environment
// reaches the sandbox; the child sees only its marker.
func TestSandboxEnvironmentIsEmpty(t *testing.T) {
	t.Setenv("AWS_SECRET_ACCESS_KEY", "env-marker-7")
	res, err := Run(context.Background(), Config{}, "e.star", "result = 'ok'")
	if err != nil || res.Text != "ok" {
		t.Fatalf("%+v %v", res, err)
	}
	// The child has no os access at all; check the parent side instead.
	req, _ := json.Marshal(request{Src: "x"})
	if strings.Contains(string(req), "env-marker-7") {
		t.Fatal("request carries the environment")
	}
}

// TestErrorKindsFromTypedErrors: the import and deadline kinds come from
// the errors themselves (the denied load's importDenied through
// Starlark's EvalError chain; the timer having fired), not from the
// message: a script whose own failure text reads like either is a plain
// script error, and the real ones are still told apart.
func TestErrorKindsFromTypedErrors(t *testing.T) {
	ctx := context.Background()
	cfg := Config{MaxSteps: 1 << 40, Timeout: 50 * time.Millisecond}
	for _, src := range []string{`fail("script ran past 50ms")`, `fail("Import of 'json' is not allowed")`} {
		_, err := Run(ctx, cfg, "a.star", src)
		if err == nil || errors.Is(err, ErrDeadline) || errors.Is(err, ErrImportNotAllowed) || !strings.Contains(err.Error(), "fail: ") {
			t.Errorf("%s: %v, want a plain script error", src, err)
		}
	}
	if _, err := Run(ctx, cfg, "a.star", "load(\"json\", \"json\")\nwhile True:\n  pass"); !errors.Is(err, ErrImportNotAllowed) || errors.Is(err, ErrDeadline) {
		t.Errorf("denied load: %v, want ErrImportNotAllowed only", err)
	}
	if _, err := Run(ctx, cfg, "a.star", "while True:\n  pass"); !errors.Is(err, ErrDeadline) || errors.Is(err, ErrImportNotAllowed) {
		t.Errorf("endless loop: %v, want ErrDeadline only", err)
	}
}

// TestDefaultLimitsLiterals: the limits a zero Config (what the server
// passes when no --script-* option is set) resolves to, as literals.
func TestDefaultLimitsLiterals(t *testing.T) {
	c := Config{}.withDefaults()
	if c.MaxSteps != 10_000_000 || c.Timeout != 10*time.Second || c.MaxOutput != 1048576 || c.MemoryBytes != 536870912 {
		t.Fatalf("defaults = steps %d, timeout %v, output %d, memory %d", c.MaxSteps, c.Timeout, c.MaxOutput, c.MemoryBytes)
	}
	if MaxConcurrent != 2 || cap(slots) != 2 {
		t.Fatalf("concurrency = %d (slots %d), want 2", MaxConcurrent, cap(slots))
	}
	// The sandbox's stack limit for the default budget, and the parent's
	// kill grace past the deadline.
	if got := maxStack(c.MemoryBytes); got != 134217728 {
		t.Fatalf("default max stack = %d, want 128 MiB (134217728)", got)
	}
	if got := maxStack(4 << 30); got != 268435456 {
		t.Fatalf("max stack for a 4 GiB budget = %d, want the 256 MiB cap", got)
	}
	if killGrace != 2*time.Second {
		t.Fatalf("kill grace = %v, want 2s", killGrace)
	}
	// Explicit values are kept, not replaced by the defaults.
	k := Config{MaxSteps: 5, Timeout: time.Second, MaxOutput: 7, MemoryBytes: 9}.withDefaults()
	if k.MaxSteps != 5 || k.Timeout != time.Second || k.MaxOutput != 7 || k.MemoryBytes != 9 {
		t.Fatalf("explicit = %+v", k)
	}
}

// TestSandboxFailures: a sandbox that cannot start, one that exits 0 with
// a reply that is not JSON, and one that exits non-zero with a reason on
// stderr are each ErrSandbox with what happened, never a script result;
// the next run with the real sandbox works.
func TestSandboxFailures(t *testing.T) {
	dir := t.TempDir()
	program := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "missing")
	cases := []struct {
		name, exe, want string
	}{
		{"cannot start", missing, "script sandbox failed: fork/exec " + missing + ": no such file or directory"},
		{"garbage reply", program("garbage", "cat >/dev/null; echo garbage"), "script sandbox failed: bad reply: invalid character 'g' looking for beginning of value"},
		{"empty reply", program("empty", "cat >/dev/null"), "script sandbox failed: bad reply: unexpected end of JSON input"},
		{"exit with reason", program("exit7", "cat >/dev/null; echo 'sandbox: broken' >&2; echo second line >&2; exit 7"), "script sandbox failed: exit status 7: sandbox: broken"},
		{"exit without reason", program("exit9", "cat >/dev/null; exit 9"), "script sandbox failed: exit status 9"},
	}
	t.Cleanup(func() { sandboxExe = "/proc/self/exe" })
	for _, c := range cases {
		sandboxExe = c.exe
		res, err := Run(context.Background(), Config{}, "f.star", "result = 'ok'")
		if !errors.Is(err, ErrSandbox) || err.Error() != c.want || res != (Result{}) {
			t.Errorf("%s: %+v, %v; want ErrSandbox %q", c.name, res, err, c.want)
		}
	}
	sandboxExe = "/proc/self/exe"
	if res, err := Run(context.Background(), Config{}, "f.star", "result = 'ok'"); err != nil || res.Text != "ok" {
		t.Fatalf("real sandbox after the failures: %+v %v", res, err)
	}
}

// holdSlots replaces the package's slots with a channel made here (inside
// a synctest bubble, so a Run waiting on it is durably blocked and fake
// time can pass) with every slot taken; the old channel comes back at
// cleanup.
func holdSlots(t *testing.T) {
	t.Helper()
	old := slots
	slots = make(chan struct{}, MaxConcurrent)
	t.Cleanup(func() { slots = old })
	for range MaxConcurrent {
		slots <- struct{}{}
	}
}

type runResult struct {
	res Result
	err error
}

func runAsync(ctx context.Context, cfg Config, src string) chan runResult {
	ch := make(chan runResult, 1)
	go func() {
		res, err := Run(ctx, cfg, "w.star", src)
		ch <- runResult{res, err}
	}()
	return ch
}

// TestSlotWaitCountsAgainstDeadline: Timeout covers the whole run. A run
// that waits 4 s (fake time) for a slot under a 10 s deadline gives the
// sandbox the 6 s left, not another 10 s (before: slot wait + Timeout),
// while the deadline error still names the configured 10 s; one that
// finds no slot for the whole 10 s is ErrBusy exactly at the deadline.
func TestSlotWaitCountsAgainstDeadline(t *testing.T) {
	dir := t.TempDir()
	reqFile := filepath.Join(dir, "request.json")
	// The stand-in sandbox records the request it was sent and succeeds.
	exe := filepath.Join(dir, "record")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\ncat >'"+reqFile+"'\necho '{\"Text\":\"ok\"}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sandboxExe = "/proc/self/exe" })
	sandboxExe = exe
	synctest.Test(t, func(t *testing.T) {
		holdSlots(t)
		got := runAsync(context.Background(), Config{Timeout: 10 * time.Second}, "result = 'ok'")
		synctest.Wait() // Run is waiting for a slot
		time.Sleep(4 * time.Second)
		<-slots // one holder finishes
		r := <-got
		if r.err != nil || r.res.Text != "ok" {
			t.Fatalf("run after the wait: %+v %v", r.res, r.err)
		}
		b, err := os.ReadFile(reqFile)
		if err != nil {
			t.Fatal(err)
		}
		var sent struct{ Timeout time.Duration }
		if err := json.Unmarshal(b, &sent); err != nil {
			t.Fatal(err)
		}
		if sent.Timeout != 6*time.Second {
			t.Fatalf("sandbox timeout after a 4s slot wait = %v, want 6s (10s deadline minus the wait)", sent.Timeout)
		}
		if !strings.Contains(string(b), `"Limit":10000000000`) {
			t.Fatalf("request lacks the configured limit (10s) for the deadline message: %s", b)
		}

		// The other slot stays taken, and this one is taken again: no slot
		// for the whole deadline.
		slots <- struct{}{}
		start := time.Now()
		r = <-runAsync(context.Background(), Config{Timeout: 10 * time.Second}, "result = 'ok'")
		if !errors.Is(r.err, ErrBusy) || r.err.Error() != "too many scripts running (limit 2)" || time.Since(start) != 10*time.Second {
			t.Fatalf("no slot: %v after %v, want ErrBusy after 10s", r.err, time.Since(start))
		}
	})
}

// TestCancelledWhileWaitingIsNotBusy: a caller that goes away while every
// slot is taken gets ErrCancelled wrapping its context's error, not
// ErrBusy (before: "too many scripts running", counted as busy although
// nothing was refused), whether it left before calling or while waiting.
func TestCancelledWhileWaitingIsNotBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		holdSlots(t)
		check := func(when string, err error) {
			t.Helper()
			if !errors.Is(err, ErrCancelled) || !errors.Is(err, context.Canceled) || errors.Is(err, ErrBusy) || err.Error() != "script cancelled: context canceled" {
				t.Errorf("%s: %v, want ErrCancelled wrapping context.Canceled, not ErrBusy", when, err)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := Run(ctx, Config{Timeout: 10 * time.Second}, "c.star", "result = 1")
		check("cancelled before the call", err)

		ctx, cancel = context.WithCancel(context.Background())
		got := runAsync(ctx, Config{Timeout: 10 * time.Second}, "result = 1")
		synctest.Wait() // waiting for a slot
		cancel()
		check("cancelled while waiting", (<-got).err)
	})
}
