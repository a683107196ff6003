package serverconfig

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

// ErrInvalid marks a flag or environment value that breaks a rule; the
// binary prints it as one line and exits 2.
var ErrInvalid = errors.New("invalid configuration")

// entry is one configurable field: its flag, optional environment fallback,
// the config group /config reports it under, and its rule.
type entry struct {
	name     string // flag name without dashes
	key      string // field name in GET /config (upstream dataclass field)
	group    string
	env      string // optional environment fallback
	envAlt   string // deprecated environment fallback, consulted after env
	aliasOf  *entry // for a deprecated flag: the entry it sets
	pending  *string
	usage    string
	value    flag.Value
	def      string // default as printed by --help
	set      bool   // given on the command line
	hidden   bool   // deprecated alias, not listed by --help
	validate func() error
	report   func() any // value as GET /config shows it
}

// registry wraps a stdlib FlagSet with env fallbacks, validation and a
// --help that prints every default.
type registry struct {
	fs      *flag.FlagSet
	entries []*entry
	byName  map[string]*entry
	nargs   map[string]bool // flags that take several space-separated values
}

func newRegistry(name string) *registry {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &registry{fs: fs, byName: map[string]*entry{}, nargs: map[string]bool{}}
}

func (r *registry) add(e *entry) *entry {
	if e.def == "" {
		e.def = e.value.String()
	}
	r.fs.Var(e.value, e.name, e.usage)
	r.entries = append(r.entries, e)
	r.byName[e.name] = e
	return e
}

func (r *registry) str(p *string, name, key, group, env, def, usage string) *entry {
	*p = def
	return r.add(&entry{name: name, key: key, group: group, env: env, usage: usage, value: (*stringValue)(p), def: strconv.Quote(def), report: func() any { return *p }})
}

func (r *registry) intv(p *int, name, key, group, env string, def int, usage string) *entry {
	*p = def
	return r.add(&entry{name: name, key: key, group: group, env: env, usage: usage, value: (*intValue)(p), report: func() any { return *p }})
}

func (r *registry) float(p *float64, name, key, group, env string, def float64, usage string) *entry {
	*p = def
	return r.add(&entry{name: name, key: key, group: group, env: env, usage: usage, value: (*floatValue)(p), report: func() any { return *p }})
}

// Redacted is what GET /config shows for a secret flag that is set.
const Redacted = "***REDACTED***"

// secret registers a string flag whose value never leaves the process:
// --help prints "" as its default (never the environment's value) and
// GET /config reports Redacted when it is set, "" when it is not.
func (r *registry) secret(p *string, name, key, group, env, usage string) *entry {
	*p = ""
	return r.add(&entry{name: name, key: key, group: group, env: env, usage: usage, value: (*stringValue)(p), def: `""`, report: func() any {
		if *p == "" {
			return ""
		}
		return Redacted
	}})
}

// boolPair registers --name and --no-name, as Python's BooleanOptionalAction.
func (r *registry) boolPair(p *bool, name, key, group, env string, def bool, usage string) *entry {
	*p = def
	e := r.add(&entry{name: name, key: key, group: group, env: env, usage: usage, value: (*boolValue)(p), report: func() any { return *p }})
	r.fs.Var(negBool{p, e}, "no-"+name, "disable --"+name)
	return e
}

// boolFlag registers a store_true flag.
func (r *registry) boolFlag(p *bool, name, key, group, env, usage string) *entry {
	*p = false
	return r.add(&entry{name: name, key: key, group: group, env: env, usage: usage, value: (*boolValue)(p), report: func() any { return *p }})
}

// list registers a repeatable flag; with nargs it also takes every following
// argument up to the next flag, as argparse's nargs="*".
func (r *registry) list(p *[]string, name, key, group, usage string, nargs bool) *entry {
	*p = nil
	r.nargs[name] = nargs
	return r.add(&entry{name: name, key: key, group: group, usage: usage, value: (*listValue)(p), def: "[]", report: func() any {
		if *p == nil {
			return []string{}
		}
		return *p
	}})
}

// alias registers a hidden deprecated flag for target, and env as the
// target's deprecated environment fallback.
func (r *registry) alias(name, target, env string) {
	t := r.byName[target]
	t.envAlt = env
	pending := new(string)
	_, isBool := t.value.(*boolValue)
	r.add(&entry{name: name, group: t.group, hidden: true, aliasOf: t, pending: pending, def: t.def,
		value: &aliasValue{p: pending, isBool: isBool}, report: func() any { return nil }})
}

type aliasValue struct {
	p      *string
	isBool bool
}

func (a *aliasValue) Set(v string) error { *a.p = v; return nil }
func (a *aliasValue) String() string {
	if a.p == nil {
		return ""
	}
	return *a.p
}
func (a *aliasValue) IsBoolFlag() bool { return a.isBool }

// parse applies defaults < environment < command line, then validates.
func (r *registry) parse(args []string, lookupEnv func(string) (string, bool)) error {
	args = r.expandNargs(args)
	if err := r.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if r.fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", ErrInvalid, r.fs.Arg(0))
	}
	r.fs.Visit(func(f *flag.Flag) {
		name := strings.TrimPrefix(f.Name, "no-")
		if e, ok := r.byName[name]; ok {
			e.set = true
		}
	})
	// A deprecated flag applies only when its replacement was not given.
	for _, e := range r.entries {
		if e.aliasOf == nil || !e.set || e.aliasOf.set {
			continue
		}
		if err := e.aliasOf.value.Set(*e.pending); err != nil {
			return fmt.Errorf("%w: --%s: %v", ErrInvalid, e.name, err)
		}
		e.aliasOf.set = true
	}
	for _, e := range r.entries {
		if e.set || e.aliasOf != nil {
			continue
		}
		for _, name := range []string{e.env, e.envAlt} {
			if name == "" {
				continue
			}
			v, ok := lookupEnv(name)
			if !ok {
				continue
			}
			if err := e.value.Set(v); err != nil {
				return fmt.Errorf("%w: environment variable %s=%q: %v", ErrInvalid, name, v, err)
			}
			break
		}
	}
	for _, e := range r.entries {
		if e.validate == nil {
			continue
		}
		if err := e.validate(); err != nil {
			src := "--" + e.name
			if !e.set && e.env != "" {
				if _, ok := lookupEnv(e.env); ok {
					src = e.env
				}
			}
			return fmt.Errorf("%w: %s: %v", ErrInvalid, src, err)
		}
	}
	return nil
}

// expandNargs rewrites "--f a b --g" into "--f a --f b --g" for nargs flags.
func (r *registry) expandNargs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		name := strings.TrimLeft(a, "-")
		if !strings.HasPrefix(a, "-") || strings.Contains(name, "=") || !r.nargs[name] {
			out = append(out, a)
			continue
		}
		n := 0
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			out = append(out, "--"+name, args[i+1])
			i++
			n++
		}
		if n == 0 { // "--f" with no values: an explicit empty list
			out = append(out, "--"+name+"=")
		}
	}
	return out
}

// printHelp lists every non-hidden flag with its default and env variable.
func (r *registry) printHelp(w io.Writer, title string) {
	fmt.Fprintf(w, "%s\n\nFlags:\n", title)
	es := append([]*entry(nil), r.entries...)
	sort.SliceStable(es, func(i, j int) bool { return es[i].group < es[j].group })
	group := ""
	for _, e := range es {
		if e.hidden {
			continue
		}
		if e.group != group {
			group = e.group
			fmt.Fprintf(w, "\n  [%s]\n", group)
		}
		line := "  --" + e.name
		if _, ok := e.value.(*boolValue); ok {
			if _, pair := r.byName[e.name]; pair && r.fs.Lookup("no-"+e.name) != nil {
				line += " / --no-" + e.name
			}
		}
		fmt.Fprintf(w, "%s\n      %s (default %s", line, e.usage, e.def)
		if e.env != "" {
			fmt.Fprintf(w, "; env %s", e.env)
		}
		fmt.Fprintln(w, ")")
	}
}

func (r *registry) groups() map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, e := range r.entries {
		if e.hidden || e.key == "" {
			continue
		}
		g := out[e.group]
		if g == nil {
			g = map[string]any{}
			out[e.group] = g
		}
		g[e.key] = e.report()
	}
	return out
}

// Value types. Parsing follows Python's argparse conversions closely enough
// that upstream command lines keep working.

type stringValue string

func (s *stringValue) Set(v string) error { *s = stringValue(v); return nil }
func (s *stringValue) String() string     { return string(*s) }

type intValue int

func (i *intValue) Set(v string) error {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("invalid int value %q", v)
	}
	*i = intValue(n)
	return nil
}
func (i *intValue) String() string { return strconv.Itoa(int(*i)) }

type floatValue float64

func (f *floatValue) Set(v string) error {
	n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil {
		return fmt.Errorf("invalid float value %q", v)
	}
	*f = floatValue(n)
	return nil
}
func (f *floatValue) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 64) }

type boolValue bool

// Set accepts Python-style truthy strings for environment variables.
func (b *boolValue) Set(v string) error {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on", "":
		*b = true
	case "0", "false", "no", "off":
		*b = false
	default:
		return fmt.Errorf("invalid boolean value %q", v)
	}
	return nil
}
func (b *boolValue) String() string   { return strconv.FormatBool(bool(*b)) }
func (b *boolValue) IsBoolFlag() bool { return true }

type negBool struct {
	p *bool
	e *entry
}

func (n negBool) Set(v string) error {
	var b boolValue
	if err := b.Set(v); err != nil {
		return err
	}
	*n.p = !bool(b)
	return nil
}
func (n negBool) String() string {
	if n.p == nil {
		return "false"
	}
	return strconv.FormatBool(!*n.p)
}
func (n negBool) IsBoolFlag() bool { return true }

type listValue []string

func (l *listValue) Set(v string) error {
	if v == "" {
		if *l == nil {
			*l = []string{}
		}
		return nil
	}
	*l = append(*l, v)
	return nil
}
func (l *listValue) String() string { return fmt.Sprint([]string(*l)) }

// Rules shared by several flags.

func positiveFinite(p *float64) func() error {
	return func() error {
		if math.IsNaN(*p) || math.IsInf(*p, 0) || *p <= 0 {
			return fmt.Errorf("must be finite and > 0 (got %v)", *p)
		}
		return nil
	}
}

func inRange(p *float64, lo, hi float64, loOpen bool) func() error {
	return func() error {
		ok := *p <= hi && (*p > lo || (!loOpen && *p == lo))
		if !ok {
			op := "<="
			if loOpen {
				op = "<"
			}
			return fmt.Errorf("must satisfy %v %s x <= %v (got %v)", lo, op, hi, *p)
		}
		return nil
	}
}

func oneOf(p *string, allowed ...string) func() error {
	return func() error {
		for _, a := range allowed {
			if *p == a {
				return nil
			}
		}
		return fmt.Errorf("must be one of %s (got %q)", strings.Join(allowed, ", "), *p)
	}
}

func atLeast(p *int, min int) func() error {
	return func() error {
		if *p < min {
			return fmt.Errorf("must be >= %d (got %d)", min, *p)
		}
		return nil
	}
}

func port(p *int) func() error {
	return func() error {
		if *p < 0 || *p > 65535 {
			return fmt.Errorf("must be a port number 0-65535 (got %d)", *p)
		}
		return nil
	}
}

// osLookupEnv is the default environment source.
var osLookupEnv = os.LookupEnv
