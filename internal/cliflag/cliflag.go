// Package cliflag is the one flag, environment and config-file layer of
// lmcache's subcommands. `lmcache server`, `lmcache coordinator` and
// `lmcache bench` declare their settings as entries of a Set; Parse
// resolves every entry with one precedence (flag > deprecated flag >
// environment > deprecated environment > config file > default),
// validates the result, and reports any problem as one *Error whose text
// is "--<flag>: <reason>", which the binary prints after
// "lmcache <command>: " before exiting 2. WriteHelp is the one --help
// listing.
//
// Each entry remembers where its value came from (Source, Provenance), so
// GET /config can say so.
package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// ErrInvalid is matched (errors.Is) by every configuration error Parse
// returns.
var ErrInvalid = errors.New("invalid configuration")

// ErrHelp is returned by Parse when -h, -help or --help was given.
var ErrHelp = flag.ErrHelp

// Error is one configuration problem: Subject names what was wrong (a flag
// with its dashes, an environment variable for env-only settings, or empty
// for a stray argument) and Reason says why. Reasons never quote a secret
// entry's value.
type Error struct {
	Subject string
	Reason  string
}

func (e *Error) Error() string {
	if e.Subject == "" {
		return e.Reason
	}
	return e.Subject + ": " + e.Reason
}

// Is makes every *Error match ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Source says which layer supplied an entry's value.
type Source string

// The layers, lowest precedence first.
const (
	FromDefault Source = "default"
	FromFile    Source = "file"
	FromEnv     Source = "env"
	FromFlag    Source = "flag"
)

// Entry is one setting. Name is its flag without dashes (empty for a
// setting only the environment and the config file can set); Env and
// EnvAlt are its environment variable and a deprecated one consulted after
// it; Value holds the setting and parses text into it.
type Entry struct {
	Name   string
	Env    string
	EnvAlt string
	// Key is the setting's name in reports (GET /config); the config file
	// accepts it as well as the flag name in snake_case.
	Key   string
	Group string
	Usage string
	// Default is the default as help prints it.
	Default string
	Value   flag.Value
	// Secret entries never have their value in an error, help or report.
	Secret bool
	// Hidden entries (deprecated aliases) are left out of help and reports.
	Hidden bool
	// Negatable adds --no-<name> for a boolean, as argparse's
	// BooleanOptionalAction.
	Negatable bool
	// Nargs lets a repeatable flag take every following argument up to the
	// next flag, as argparse's nargs="*".
	Nargs bool
	// Validate checks the resolved value; its error becomes the Reason.
	Validate func() error

	aliasOf *Entry
	pending string
	source  Source
	origin  string // "--name", "ENV", "path line N"
}

// Source is the layer that set the entry's value.
func (e *Entry) Source() Source {
	if e.source == "" {
		return FromDefault
	}
	return e.source
}

// Provenance is Source with its detail: "default", "flag:--chunk-size",
// "env:LMCACHE_COORDINATOR_URL" or "file:/etc/lmcache/server.yaml".
func (e *Entry) Provenance() string {
	switch e.Source() {
	case FromFlag:
		return "flag:" + e.origin
	case FromEnv:
		return "env:" + e.origin
	case FromFile:
		path, _, _ := strings.Cut(e.origin, " line ")
		return "file:" + path
	}
	return string(FromDefault)
}

// Subject is how errors name the entry: its flag, else its variable.
func (e *Entry) Subject() string {
	if e.Name != "" {
		return "--" + e.Name
	}
	return e.Env
}

// fileKeys are the entry's keys in a config file: the flag name in
// snake_case, and Key where it differs (an env-only entry has only Key).
func (e *Entry) fileKeys() []string {
	var keys []string
	if e.Name != "" {
		keys = append(keys, normalizeKey(e.Name))
	}
	if e.Key != "" && (len(keys) == 0 || keys[0] != e.Key) {
		keys = append(keys, e.Key)
	}
	return keys
}

func normalizeKey(k string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(k)), "-", "_")
}

// Set is the settings of one subcommand.
type Set struct {
	fs         *flag.FlagSet
	entries    []*Entry
	byName     map[string]*Entry
	byKey      map[string]*Entry
	configFile *Entry
	configEnvs []string
	configPath string
	setErr     *Error // first Value.Set failure during fs.Parse
}

// New returns an empty Set for `lmcache <command>`.
func New(command string) *Set {
	fs := flag.NewFlagSet("lmcache "+command, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &Set{fs: fs, byName: map[string]*Entry{}, byKey: map[string]*Entry{}}
}

// Add registers e and returns it, so callers can set Validate afterwards.
func (s *Set) Add(e *Entry) *Entry {
	if e.Default == "" {
		e.Default = e.Value.String()
	}
	if e.Name != "" {
		s.fs.Var(&tracked{s: s, e: e, v: e.Value, name: e.Name}, e.Name, e.Usage)
		s.byName[e.Name] = e
		if e.Negatable {
			s.fs.Var(&tracked{s: s, e: e, v: negated{e.Value}, name: "no-" + e.Name}, "no-"+e.Name, "disable --"+e.Name)
		}
	}
	s.entries = append(s.entries, e)
	if e != s.configFile {
		for _, k := range e.fileKeys() {
			target := e
			if e.aliasOf != nil {
				target = e.aliasOf
			}
			s.byKey[k] = target
		}
	}
	return e
}

// Alias registers --name as a hidden deprecated spelling of --target, and
// env as target's deprecated variable. The alias applies only when the
// target flag was not given.
func (s *Set) Alias(name, target, env string) {
	t := s.byName[target]
	t.EnvAlt = env
	a := &Entry{Name: name, Group: t.Group, Hidden: true, Default: t.Default, aliasOf: t}
	a.Value = &aliasValue{e: a, isBool: isBool(t.Value)}
	s.Add(a)
}

// ConfigFile registers the --name flag that names a YAML config file, also
// read from the first of envs that is set. The file supplies values below
// the environment and above the defaults.
func (s *Set) ConfigFile(name, group, usage string, envs ...string) *Entry {
	var path stringValue
	e := &Entry{Name: name, Group: group, Usage: usage, Value: &path, Default: `""`}
	if len(envs) > 0 {
		e.Env = envs[0]
	}
	s.configFile = e
	s.configEnvs = envs
	return s.Add(e)
}

// ConfigPath is the config file Parse read ("" when none).
func (s *Set) ConfigPath() string { return s.configPath }

// Entries lists every entry in registration order.
func (s *Set) Entries() []*Entry { return s.entries }

// Lookup returns the entry of flag name, or nil.
func (s *Set) Lookup(name string) *Entry { return s.byName[name] }

// HasNegation reports whether e has a --no- form.
func (s *Set) HasNegation(e *Entry) bool { return e.Negatable && e.Name != "" }

// Parse resolves every entry from args, the environment (looked up with
// lookupEnv) and the config file, then validates them all. It returns
// ErrHelp for --help, an *Error for anything invalid, and nil otherwise.
func (s *Set) Parse(args []string, lookupEnv func(string) (string, bool)) error {
	if err := s.parseArgs(args); err != nil {
		return err
	}
	for _, e := range s.entries {
		if e.aliasOf == nil || e.source != FromFlag || e.aliasOf.source == FromFlag {
			continue
		}
		if err := e.aliasOf.Value.Set(e.pending); err != nil {
			return &Error{Subject: "--" + e.Name, Reason: s.reason(e.aliasOf, err)}
		}
		e.aliasOf.source, e.aliasOf.origin = FromFlag, "--"+e.Name
	}
	file, err := s.readConfig(lookupEnv)
	if err != nil {
		return err
	}
	for _, e := range s.entries {
		if e.source == FromFlag || e.aliasOf != nil || e == s.configFile {
			continue
		}
		if err := s.applyEnv(e, lookupEnv); err != nil {
			return err
		}
		if e.source == FromEnv {
			continue
		}
		if fv, ok := file[e]; ok {
			for _, v := range fv.values {
				if err := e.Value.Set(v); err != nil {
					return &Error{Subject: e.Subject(), Reason: fv.where + ": " + s.reason(e, err)}
				}
			}
			e.source, e.origin = FromFile, fv.where
		}
	}
	for _, e := range s.entries {
		if e.Validate == nil {
			continue
		}
		if err := e.Validate(); err != nil {
			reason := s.reason(e, err)
			if e.origin != "" && e.source != FromFlag && e.origin != e.Subject() {
				reason = e.origin + ": " + reason
			}
			return &Error{Subject: e.Subject(), Reason: reason}
		}
	}
	return nil
}

func (s *Set) applyEnv(e *Entry, lookupEnv func(string) (string, bool)) error {
	for _, name := range []string{e.Env, e.EnvAlt} {
		if name == "" {
			continue
		}
		v, ok := lookupEnv(name)
		if !ok {
			continue
		}
		if err := e.Value.Set(v); err != nil {
			reason := s.reason(e, err)
			if e.Subject() != name {
				reason = name + ": " + reason
			}
			return &Error{Subject: e.Subject(), Reason: reason}
		}
		e.source, e.origin = FromEnv, name
		return nil
	}
	return nil
}

// Rule is a Validate error that states a rule and never the value, so
// Parse shows it even for a Secret entry, whose other errors read "invalid
// value" (a parse or range error might quote the secret).
type Rule string

// Error is the rule's text.
func (r Rule) Error() string { return string(r) }

// reason is err's text, or a fixed text for a secret entry (whose value a
// parse error might quote) unless err is a Rule itself: a wrapped one is
// not shown, since the wrapping text could quote the value.
func (s *Set) reason(e *Entry, err error) string {
	if _, rule := err.(Rule); e.Secret && !rule {
		return "invalid value"
	}
	return firstLine(err.Error())
}

func (s *Set) parseArgs(args []string) error {
	s.setErr = nil
	err := s.fs.Parse(s.expandNargs(args))
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		return ErrHelp
	case s.setErr != nil:
		return s.setErr
	default:
		return stdlibError(err)
	}
	if s.fs.NArg() > 0 {
		return &Error{Reason: fmt.Sprintf("unexpected argument %q", s.fs.Arg(0))}
	}
	return nil
}

// stdlibError rewrites the flag package's own messages ("flag provided but
// not defined: -x") into the one shape.
func stdlibError(err error) error {
	msg := firstLine(err.Error())
	// Bad syntax quotes the whole argument, "=value" included ("---token=x"
	// is one dash too many), so only the part before "=" is named: the
	// value may be a secret, and the subject must be a flag name.
	if arg, ok := strings.CutPrefix(msg, "bad flag syntax: "); ok {
		arg, _, _ = strings.Cut(arg, "=")
		if name := strings.TrimLeft(arg, "-"); name != "" {
			return &Error{Subject: "--" + name, Reason: "bad flag syntax"}
		}
		return &Error{Reason: fmt.Sprintf("bad flag syntax %q", arg)}
	}
	for _, p := range []struct{ prefix, reason string }{
		{"flag provided but not defined: -", "flag provided but not defined"},
		{"flag needs an argument: -", "flag needs an argument"},
	} {
		if name, ok := strings.CutPrefix(msg, p.prefix); ok {
			return &Error{Subject: "--" + strings.TrimLeft(name, "-"), Reason: p.reason}
		}
	}
	return &Error{Reason: msg}
}

// expandNargs rewrites "--f a b --g" into "--f a --f b --g" for nargs flags.
func (s *Set) expandNargs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		name := strings.TrimLeft(a, "-")
		e := s.byName[name]
		if !strings.HasPrefix(a, "-") || strings.Contains(name, "=") || e == nil || !e.Nargs {
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

// tracked is what the flag package holds for an entry: it records that the
// command line set the entry and names the flag in a parse error.
type tracked struct {
	s    *Set
	e    *Entry
	v    flag.Value
	name string
}

func (t *tracked) Set(v string) error {
	if err := t.v.Set(v); err != nil {
		if t.s.setErr == nil {
			t.s.setErr = &Error{Subject: "--" + t.name, Reason: t.s.reason(t.e, err)}
		}
		return err
	}
	t.e.source, t.e.origin = FromFlag, "--"+t.name
	return nil
}

func (t *tracked) String() string {
	if t.v == nil {
		return ""
	}
	return t.v.String()
}

func (t *tracked) IsBoolFlag() bool { return isBool(t.v) }

func isBool(v flag.Value) bool {
	b, ok := v.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// negated is the --no-<name> side of a boolean.
type negated struct{ v flag.Value }

func (n negated) Set(v string) error {
	var on bool
	if err := (&boolValue{p: &on}).Set(v); err != nil {
		return err
	}
	return n.v.Set(fmt.Sprint(!on))
}
func (n negated) String() string   { return "" }
func (n negated) IsBoolFlag() bool { return true }

// aliasValue holds a deprecated flag's text until Parse knows whether the
// replacement flag was given.
type aliasValue struct {
	e      *Entry
	isBool bool
}

func (a *aliasValue) Set(v string) error { a.e.pending = v; return nil }
func (a *aliasValue) String() string {
	if a.e == nil {
		return ""
	}
	return a.e.pending
}
func (a *aliasValue) IsBoolFlag() bool { return a.isBool }

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
