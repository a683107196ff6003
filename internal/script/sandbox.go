package script

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.starlark.net/lib/math"
	starlarktime "go.starlark.net/lib/time"
	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
	"go.starlark.net/syntax"

	starjson "go.starlark.net/lib/json"
)

// SandboxEnv, set to the package's magic value, makes any executable that
// links this package act as a script sandbox: at init it reads one request
// on stdin, runs it under the limits, writes the reply on stdout and exits.
// This is how Run re-uses its own binary (the server, or a test binary) as
// the sandbox without a separate program to install.
const SandboxEnv = "LMCACHE_SCRIPT_SANDBOX"

const sandboxMagic = "v1-starlark"

// SandboxName is a sandbox's argv[0] and process name (what ps, top and
// the kernel's OOM-killer line show): started through /proc/self/exe it
// would otherwise be called "exe". 15 bytes, the kernel's limit.
const SandboxName = "lmcache-sandbox"

// maxRequestBytes bounds what a sandbox reads: the script (1 MiB at most
// through the HTTP API) and the app snapshots.
const maxRequestBytes = 64 << 20

func init() {
	if os.Getenv(SandboxEnv) != sandboxMagic {
		return
	}
	// /proc/self/comm names the whole process (the thread group leader);
	// a failure only leaves the name "exe", so it is not worth a refusal.
	_ = os.WriteFile("/proc/self/comm", []byte(SandboxName), 0)
	os.Exit(sandboxMain(os.Stdin, os.Stdout))
}

// request is what Run sends to the sandbox.
type request struct {
	Filename       string
	Src            string
	AllowedImports []string
	MaxSteps       uint64
	// Timeout is how long the script may run: what is left of the
	// configured deadline after the wait for a slot.
	Timeout time.Duration
	// Limit is the configured deadline, the one the deadline error names.
	Limit       time.Duration
	MaxOutput   int
	MemoryBytes int64
	App         map[string]appMember
}

type appMember struct {
	Func  bool            `json:",omitempty"`
	Value json.RawMessage `json:",omitempty"`
	Err   string          `json:",omitempty"`
}

// response is the sandbox's reply. Kind names the sentinel of Error.
type response struct {
	Text    string
	Printed string
	Error   string `json:",omitempty"`
	Kind    string `json:",omitempty"`
}

// result turns a reply into Run's return values, re-applying the output
// cap (the parent does not trust the child's accounting).
func (r response) result(cfg Config) (Result, error) {
	if r.Error != "" {
		msg := cut(r.Error, cfg.MaxOutput)
		switch r.Kind {
		case "import":
			return Result{Printed: r.Printed}, fmt.Errorf("%w: %s", ErrImportNotAllowed, msg)
		case "output":
			return Result{}, fmt.Errorf("%w (%d bytes)", ErrOutputLimit, cfg.MaxOutput)
		case "deadline":
			return Result{Printed: cut(r.Printed, cfg.MaxOutput)}, fmt.Errorf("%w: %s", ErrDeadline, msg)
		}
		return Result{Printed: cut(r.Printed, cfg.MaxOutput)}, errors.New(msg)
	}
	if len(r.Text)+len(r.Printed) > cfg.MaxOutput {
		return Result{}, fmt.Errorf("%w (%d bytes)", ErrOutputLimit, cfg.MaxOutput)
	}
	return Result{Text: r.Text, Printed: r.Printed}, nil
}

// sandboxMain is the child side. Its exit status is 0 whenever it could
// reply; the Go runtime's fatal errors (out of memory, stack) exit 2 with
// the reason on stderr, which Run maps to ErrMemoryLimit.
func sandboxMain(in io.Reader, out io.Writer) int {
	b, err := io.ReadAll(io.LimitReader(in, maxRequestBytes))
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox: read request:", err)
		return 3
	}
	var req request
	if err := json.Unmarshal(b, &req); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox: decode request:", err)
		return 3
	}
	if err := limitMemory(req.MemoryBytes); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox: memory limit:", err)
		return 3
	}
	resp := execute(req)
	if err := json.NewEncoder(out).Encode(resp); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox: write reply:", err)
		return 3
	}
	return 0
}

// limitMemory caps private writable memory (RLIMIT_DATA: the heap, not
// the runtime's PROT_NONE address reservations, which also keeps the race
// detector working) at what the process holds now plus budget, so an oversized allocation fails (fatally, in this process only)
// instead of growing until the machine swaps. The GC is told the budget
// too, so garbage is collected before the cap is reached, and goroutine
// stacks are capped below it so deep recursion fails the same way.
func limitMemory(budget int64) error {
	vm, err := vmData()
	if err != nil {
		return err
	}
	lim := uint64(vm + budget)
	if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
		return fmt.Errorf("setrlimit: %w", err)
	}
	debug.SetMemoryLimit(budget / 2)
	debug.SetMaxStack(maxStack(budget))
	return nil
}

// maxStackCap bounds a sandbox's goroutine stack whatever its budget: deep
// Starlark recursion should fail as a stack overflow long before a
// large budget's quarter is spent on one stack.
const maxStackCap = 256 << 20

// maxStack is the goroutine stack limit a sandbox with the given memory
// budget sets: a quarter of the budget (128 MiB for the 512 MiB default),
// at most maxStackCap, so one runaway recursion cannot take the whole
// budget before the memory limit reports it.
func maxStack(budget int64) int {
	return int(min(budget/4, maxStackCap))
}

// vmData reads this process's VmData (private writable memory, what
// RLIMIT_DATA counts) in bytes.
func vmData() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmData:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				return 0, fmt.Errorf("VmData %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmData in /proc/self/status")
}

// Builtin are the modules a script may load when allowed: load("json", "json").
func Builtin() map[string]starlark.StringDict {
	return map[string]starlark.StringDict{
		"json": {"json": starjson.Module},
		"math": {"math": math.Module},
		"time": {"time": starlarktime.Module},
	}
}

// execute runs one request in this process (the sandbox side).
func execute(req request) response {
	mods := Builtin()
	allowed := map[string]bool{}
	for _, m := range req.AllowedImports {
		allowed[m] = true
	}
	app, err := buildApp(req.App)
	if err != nil {
		return response{Error: err.Error()}
	}
	var out strings.Builder
	overflow := false
	th := &starlark.Thread{Name: "run_script"}
	th.Print = func(t *starlark.Thread, msg string) {
		if out.Len()+len(msg)+1 > req.MaxOutput {
			overflow = true
			t.Cancel(ErrOutputLimit.Error())
			return
		}
		out.WriteString(msg)
		out.WriteByte('\n')
	}
	th.Load = func(_ *starlark.Thread, module string) (starlark.StringDict, error) {
		if !allowed[module] {
			return nil, importDenied(module)
		}
		m, ok := mods[module]
		if !ok {
			return nil, fmt.Errorf("no module named '%s' (available: %s)", module, strings.Join(names(mods), ", "))
		}
		return m, nil
	}
	th.SetMaxExecutionSteps(req.MaxSteps)
	// The timer is the only other goroutine; the process exits right after.
	// Starlark reports a cancellation as a plain error (its text holds the
	// reason), so the timer records that it fired: the kind comes from
	// that, not from matching the message.
	var expired atomic.Bool
	timer := time.AfterFunc(req.Timeout, func() {
		expired.Store(true)
		th.Cancel(fmt.Sprintf("script ran past %v", req.Limit))
	})
	defer timer.Stop()
	opts := &syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true, Recursion: true}
	globals, err := starlark.ExecFileOptions(opts, th, req.Filename, req.Src, starlark.StringDict{"app": app})
	printed := out.String()
	if overflow {
		return response{Error: ErrOutputLimit.Error(), Kind: "output"}
	}
	if err != nil {
		var ee *starlark.EvalError
		msg := err.Error()
		if errors.As(err, &ee) {
			msg = ee.Backtrace()
		}
		kind := ""
		var denied importDenied
		switch {
		// The load error reaches here wrapped (EvalError, then Starlark's
		// "cannot load" error), both unwrapping to importDenied.
		case errors.As(err, &denied):
			kind = "import"
		// A script that failed otherwise just as the timer fired is at
		// its deadline anyway; Thread.Cancel keeps only the first reason,
		// and the output limit (checked above) cancels first when it does.
		case expired.Load():
			kind = "deadline"
		}
		return response{Printed: printed, Error: cut(msg, req.MaxOutput), Kind: kind}
	}
	res := response{Text: SuccessMessage, Printed: printed}
	if v, ok := globals["result"]; ok {
		if s, ok := v.(starlark.String); ok {
			res.Text = s.GoString()
		} else {
			res.Text = v.String()
		}
		if len(res.Text)+len(printed) > req.MaxOutput {
			return response{Error: ErrOutputLimit.Error(), Kind: "output"}
		}
	}
	return res
}

// importDenied is upstream's message for a forbidden import (capitalized
// as upstream prints it).
type importDenied string

func (m importDenied) Error() string { return "Import of '" + string(m) + "' is not allowed" }

// buildApp makes the frozen "app" struct from the snapshots.
func buildApp(members map[string]appMember) (starlark.Value, error) {
	d := starlark.StringDict{}
	for name, m := range members {
		var v any
		if len(m.Value) > 0 {
			dec := json.NewDecoder(strings.NewReader(string(m.Value)))
			dec.UseNumber()
			if err := dec.Decode(&v); err != nil {
				return nil, fmt.Errorf("app.%s: %w", name, err)
			}
		}
		sv, err := FromGo(numbers(v))
		if err != nil {
			return nil, fmt.Errorf("app.%s: %w", name, err)
		}
		if !m.Func {
			d[name] = sv
			continue
		}
		errText := m.Err
		d[name] = starlark.NewBuiltin(name, func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
				return nil, err
			}
			if errText != "" {
				return nil, errors.New(errText)
			}
			return sv, nil
		})
	}
	return starlarkstruct.FromStringDict(starlark.String("app"), d), nil
}

// numbers turns json.Number into int64 or float64 for FromGo.
func numbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case []any:
		for i := range x {
			x[i] = numbers(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = numbers(x[k])
		}
	}
	return v
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
