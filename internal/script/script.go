// Package script runs operator scripts for POST /run_script in a Starlark
// sandbox (go.starlark.net). Upstream exec()s Python with restricted builtins,
// which is not a sandbox; here a script has no file, network or process
// access at all, can load only the modules the operator allowed, and is
// bounded by an execution-step limit, a deadline and an output cap.
package script

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.starlark.net/lib/json"
	"go.starlark.net/lib/math"
	starlarktime "go.starlark.net/lib/time"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// Defaults applied by Run when a Config field is zero.
const (
	DefaultMaxSteps  = 10_000_000
	DefaultTimeout   = 10 * time.Second
	DefaultMaxOutput = 1 << 20
)

// SuccessMessage is the reply when a script does not assign result.
const SuccessMessage = "Script executed successfully"

// ErrImportNotAllowed is returned when a script loads a module that is not
// in the allowed set.
var ErrImportNotAllowed = errors.New("import not allowed")

// ErrOutputLimit is returned when printed output or the result exceeds the cap.
var ErrOutputLimit = errors.New("script output limit exceeded")

// Builtin are the modules a script may load when allowed: load("json", "json").
func Builtin() map[string]starlark.StringDict {
	return map[string]starlark.StringDict{
		"json": {"json": json.Module},
		"math": {"math": math.Module},
		"time": {"time": starlarktime.Module},
	}
}

// Config bounds one run.
type Config struct {
	// AllowedImports names the modules load() may return
	// (--script-allowed-imports). Everything else fails.
	AllowedImports []string
	// Modules are the loadable modules by name; nil means Builtin().
	Modules map[string]starlark.StringDict
	// Globals are predeclared names (for example the read-only "app" the
	// HTTP layer injects).
	Globals starlark.StringDict
	// MaxSteps caps Starlark execution steps.
	MaxSteps uint64
	// Timeout is the wall-clock deadline.
	Timeout time.Duration
	// MaxOutput caps printed bytes plus the result's bytes.
	MaxOutput int
}

// Result is one run's outcome.
type Result struct {
	// Text is str(result) when the script assigned result, else SuccessMessage.
	Text string
	// Printed is everything print() wrote.
	Printed string
}

// Run executes src. Errors (syntax, runtime, limits, forbidden loads) are
// returned wrapped; the caller maps them to 500 "Error executing script: …".
func Run(ctx context.Context, cfg Config, filename, src string) (Result, error) {
	if cfg.MaxSteps == 0 {
		cfg.MaxSteps = DefaultMaxSteps
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = DefaultMaxOutput
	}
	mods := cfg.Modules
	if mods == nil {
		mods = Builtin()
	}
	allowed := map[string]bool{}
	for _, m := range cfg.AllowedImports {
		allowed[m] = true
	}
	var out strings.Builder
	overflow := false
	th := &starlark.Thread{Name: "run_script"}
	th.Print = func(t *starlark.Thread, msg string) {
		if out.Len()+len(msg)+1 > cfg.MaxOutput {
			overflow = true
			t.Cancel(ErrOutputLimit.Error())
			return
		}
		out.WriteString(msg)
		out.WriteByte('\n')
	}
	th.Load = func(_ *starlark.Thread, module string) (starlark.StringDict, error) {
		if !allowed[module] {
			return nil, fmt.Errorf("%w: Import of '%s' is not allowed", ErrImportNotAllowed, module)
		}
		m, ok := mods[module]
		if !ok {
			return nil, fmt.Errorf("no module named '%s' (available: %s)", module, strings.Join(names(mods), ", "))
		}
		return m, nil
	}
	th.SetMaxExecutionSteps(cfg.MaxSteps)

	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	done := make(chan struct{})
	watcherDone := make(chan struct{})
	// The watcher is owned by Run: it exits when the script finishes or the
	// deadline passes, and Run waits for it before returning.
	go func() {
		defer close(watcherDone)
		select {
		case <-ctx.Done():
			th.Cancel("deadline exceeded: " + ctx.Err().Error())
		case <-done:
		}
	}()
	opts := &syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true, Recursion: true}
	globals, err := starlark.ExecFileOptions(opts, th, filename, src, cfg.Globals)
	close(done)
	<-watcherDone
	if overflow {
		return Result{Printed: out.String()}, fmt.Errorf("%w (%d bytes)", ErrOutputLimit, cfg.MaxOutput)
	}
	if err != nil {
		var ee *starlark.EvalError
		if errors.As(err, &ee) {
			return Result{Printed: out.String()}, &backtraceError{bt: ee.Backtrace(), err: ee}
		}
		return Result{Printed: out.String()}, err
	}
	res := Result{Text: SuccessMessage, Printed: out.String()}
	if v, ok := globals["result"]; ok {
		if s, ok := v.(starlark.String); ok {
			res.Text = s.GoString()
		} else {
			res.Text = v.String()
		}
		if len(res.Text)+out.Len() > cfg.MaxOutput {
			return Result{Printed: out.String()}, fmt.Errorf("%w (%d bytes)", ErrOutputLimit, cfg.MaxOutput)
		}
	}
	return res, nil
}

// backtraceError reports a Starlark backtrace while keeping the cause
// reachable for errors.Is.
type backtraceError struct {
	bt  string
	err error
}

func (e *backtraceError) Error() string { return e.bt }
func (e *backtraceError) Unwrap() error { return e.err }

func names(m map[string]starlark.StringDict) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// FromGo converts JSON-shaped Go values (maps, slices, strings, numbers,
// bools, nil) to frozen Starlark values so host data can be exposed to
// scripts read-only.
func FromGo(v any) (starlark.Value, error) {
	switch x := v.(type) {
	case nil:
		return starlark.None, nil
	case bool:
		return starlark.Bool(x), nil
	case string:
		return starlark.String(x), nil
	case int:
		return starlark.MakeInt(x), nil
	case int64:
		return starlark.MakeInt64(x), nil
	case uint64:
		return starlark.MakeUint64(x), nil
	case float64:
		return starlark.Float(x), nil
	case []any:
		l := make([]starlark.Value, 0, len(x))
		for _, e := range x {
			sv, err := FromGo(e)
			if err != nil {
				return nil, err
			}
			l = append(l, sv)
		}
		list := starlark.NewList(l)
		list.Freeze()
		return list, nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := starlark.NewDict(len(x))
		for _, k := range keys {
			sv, err := FromGo(x[k])
			if err != nil {
				return nil, err
			}
			if err := d.SetKey(starlark.String(k), sv); err != nil {
				return nil, err
			}
		}
		d.Freeze()
		return d, nil
	}
	return nil, fmt.Errorf("cannot convert %T to a Starlark value", v)
}
