// Package script runs operator scripts for POST /run_script in a Starlark
// sandbox (go.starlark.net). Upstream exec()s Python with restricted builtins,
// which is not a sandbox; here a script has no file, network or process
// access at all, can load only the modules the operator allowed, and is
// bounded by an execution-step limit, a deadline, a memory budget and an
// output cap.
//
// Starlark has no allocation accounting, and one builtin call can allocate
// without bound ([0]*1000000000 is a single 16 GB make inside the
// interpreter, str() of a list holding one big string many times is one
// loop), so no in-process check can stop every blow-up. Every script
// therefore runs in a child process (this same executable, re-run with
// SandboxEnv set) whose private memory is capped with RLIMIT_DATA: a script
// that allocates too much kills only its child, and the server answers 500.
package script

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"

	"go.starlark.net/starlark"
)

// Defaults applied by Run when a Config field is zero.
const (
	DefaultMaxSteps  = 10_000_000
	DefaultTimeout   = 10 * time.Second
	DefaultMaxOutput = 1 << 20
	// DefaultMemoryBytes is the private memory a sandbox may add to what
	// the Go runtime holds at start.
	DefaultMemoryBytes = 512 << 20
	// MaxConcurrent scripts run at once; others wait (within their own
	// deadline) so that N clients cannot claim N memory budgets.
	MaxConcurrent = 2
)

// SuccessMessage is the reply when a script does not assign result.
const SuccessMessage = "Script executed successfully"

// Errors a run can wrap.
var (
	// ErrImportNotAllowed: the script loads a module that is not in the
	// allowed set.
	ErrImportNotAllowed = errors.New("import not allowed")
	// ErrOutputLimit: printed output, the result or an error text exceeds
	// the cap.
	ErrOutputLimit = errors.New("script output limit exceeded")
	// ErrMemoryLimit: the script's process ran out of its memory budget
	// (or stack) and was stopped.
	ErrMemoryLimit = errors.New("script memory limit exceeded")
	// ErrDeadline: the script ran past its wall-clock limit.
	ErrDeadline = errors.New("deadline exceeded")
	// ErrBusy: MaxConcurrent scripts were running for the whole deadline.
	ErrBusy = errors.New("too many scripts running")
	// ErrCancelled: the caller's context ended (the client went away)
	// while the script waited for a slot or ran; it wraps the context's
	// error too. It is not ErrBusy: no slot was refused.
	ErrCancelled = errors.New("script cancelled")
	// ErrSandbox: the sandbox process could not be started or died for
	// another reason.
	ErrSandbox = errors.New("script sandbox failed")
)

// Func is a zero-argument function member of the app value. Its value is
// computed when Run is called (the script runs in another process, so it
// sees a snapshot); Err, when set, is what calling it raises.
type Func struct {
	Value any
	Err   string
}

// Config bounds one run.
type Config struct {
	// AllowedImports names the modules load() may return
	// (--script-allowed-imports) out of Builtin's. Everything else fails.
	AllowedImports []string
	// App are the members of the read-only predeclared "app" value:
	// strings, numbers, JSON-shaped maps and lists (frozen), or Func.
	App map[string]any
	// MaxSteps caps Starlark execution steps.
	MaxSteps uint64
	// Timeout is the wall-clock deadline of the whole run: the wait for
	// a free slot counts against it, and the sandbox gets what is left.
	Timeout time.Duration
	// MaxOutput caps printed bytes plus the result's bytes; error texts
	// (tracebacks) are cut to it as well.
	MaxOutput int
	// MemoryBytes is the sandbox's private-memory budget on top of what
	// the runtime holds at start.
	MemoryBytes int64
}

// Result is one run's outcome.
type Result struct {
	// Text is str(result) when the script assigned result, else SuccessMessage.
	Text string
	// Printed is everything print() wrote.
	Printed string
}

// sandboxExe is the program Run starts as the sandbox: this process's own
// executable through the kernel's /proc/self/exe link, not the path it
// was started from. A binary deleted or replaced on disk while the server
// runs (an upgrade in place, a rollback) then still runs scripts with the
// code that speaks this process's request format, instead of failing to
// start or starting another version. Tests point it elsewhere to make the
// sandbox fail.
var sandboxExe = "/proc/self/exe"

// killGrace is how long after its deadline the parent kills a sandbox
// that has not stopped itself: the child cancels its own thread at the
// deadline, so the grace only matters for a builtin that never yields,
// and it leaves the child time to write its deadline reply.
const killGrace = 2 * time.Second

// slots bounds concurrent sandboxes (package-wide: the budget is the
// machine's memory, not one server's).
var slots = make(chan struct{}, MaxConcurrent)

// Run executes src in a sandbox process. Errors (syntax, runtime, limits,
// forbidden loads) are returned wrapped; the caller maps them to 500
// "Error executing script: …".
func Run(ctx context.Context, cfg Config, filename, src string) (Result, error) {
	cfg = cfg.withDefaults()
	// The deadline starts now and covers the slot wait as well as the
	// sandbox, so a request never takes longer than Timeout (plus the
	// kill grace) however long it queued.
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	req := request{
		Filename: filename, Src: src, AllowedImports: cfg.AllowedImports,
		MaxSteps: cfg.MaxSteps, Limit: cfg.Timeout, MaxOutput: cfg.MaxOutput, MemoryBytes: cfg.MemoryBytes,
		App: map[string]appMember{},
	}
	for name, v := range cfg.App {
		switch x := v.(type) {
		case Func:
			b, err := json.Marshal(x.Value)
			if err != nil {
				return Result{}, fmt.Errorf("app.%s: %w", name, err)
			}
			req.App[name] = appMember{Func: true, Value: b, Err: x.Err}
		default:
			b, err := json.Marshal(x)
			if err != nil {
				return Result{}, fmt.Errorf("app.%s: %w", name, err)
			}
			req.App[name] = appMember{Value: b}
		}
	}
	select {
	case slots <- struct{}{}:
		defer func() { <-slots }()
	case <-ctx.Done():
		return Result{}, refused(parent)
	}
	// A slot freed just as the deadline passed: nothing is left to run in.
	if ctx.Err() != nil {
		return Result{}, refused(parent)
	}
	// The child stops itself at the deadline (thread.Cancel) after what is
	// left of Timeout; the parent kills it a little later in case it
	// cannot (a builtin looping). A client that goes away (parent
	// cancelled) kills it at once.
	req.Timeout = time.Until(deadline)
	body, err := json.Marshal(req)
	if err != nil {
		return Result{}, fmt.Errorf("%w: encode request: %v", ErrSandbox, err)
	}
	kctx, kcancel := context.WithDeadline(parent, deadline.Add(killGrace))
	defer kcancel()
	cmd := exec.CommandContext(kctx, sandboxExe)
	cmd.Args = []string{SandboxName}
	// Nothing of the server's environment (credentials) reaches the child.
	cmd.Env = []string{SandboxEnv + "=" + sandboxMagic}
	cmd.Stdin = bytes.NewReader(body)
	stdout := &capped{max: 6*cfg.MaxOutput + 64<<10}
	stderr := &capped{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = time.Second
	runErr := cmd.Run()
	if stdout.over {
		return Result{}, fmt.Errorf("%w (%d bytes)", ErrOutputLimit, cfg.MaxOutput)
	}
	var resp response
	if runErr == nil {
		if err := json.Unmarshal(stdout.buf.Bytes(), &resp); err != nil {
			return Result{}, fmt.Errorf("%w: bad reply: %v", ErrSandbox, err)
		}
		return resp.result(cfg)
	}
	errText := stderr.buf.String()
	switch {
	case parent.Err() != nil:
		return Result{}, fmt.Errorf("%w: %w", ErrCancelled, parent.Err())
	case kctx.Err() != nil:
		return Result{}, fmt.Errorf("%w: script ran past %v", ErrDeadline, cfg.Timeout)
	case outOfMemory(errText, cmd.ProcessState, cfg.MemoryBytes):
		return Result{}, fmt.Errorf("%w (%d MiB)", ErrMemoryLimit, cfg.MemoryBytes>>20)
	}
	if first, _, _ := strings.Cut(strings.TrimSpace(errText), "\n"); first != "" {
		return Result{}, fmt.Errorf("%w: %v: %s", ErrSandbox, runErr, cut(first, 200))
	}
	return Result{}, fmt.Errorf("%w: %v", ErrSandbox, runErr)
}

// refused is why Run got no slot: the caller went away (ErrCancelled),
// else every slot stayed in use for the whole deadline (ErrBusy).
func refused(parent context.Context) error {
	if err := parent.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrCancelled, err)
	}
	return fmt.Errorf("%w (limit %d)", ErrBusy, MaxConcurrent)
}

// outOfMemory reports whether a sandbox died of its memory limit: the Go
// runtime (or the race detector) says so, the stack limit was hit, or it
// crashed with a fault after growing to a large part of the budget (Go's
// GC can fault instead of reporting when an allocation of its own fails
// under the limit).
func outOfMemory(stderr string, ps *os.ProcessState, budget int64) bool {
	for _, s := range []string{"out of memory", "cannot allocate memory", "failed to allocate", "stack exceeds", "stack overflow"} {
		if strings.Contains(stderr, s) {
			return true
		}
	}
	if !strings.Contains(stderr, "SIGSEGV") || ps == nil {
		return false
	}
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	return ok && ru.Maxrss<<10 >= budget/4 // Maxrss is in KiB
}

func (c Config) withDefaults() Config {
	if c.MaxSteps == 0 {
		c.MaxSteps = DefaultMaxSteps
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxOutput <= 0 {
		c.MaxOutput = DefaultMaxOutput
	}
	if c.MemoryBytes <= 0 {
		c.MemoryBytes = DefaultMemoryBytes
	}
	return c
}

// capped is a bounded write buffer; past max it drops bytes and
// remembers that it did.
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); len(p) > room {
		c.over = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return c.buf.Write(p)
}

// cut shortens s to at most n bytes.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "… (truncated)"
}

func names(m map[string]starlark.StringDict) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
