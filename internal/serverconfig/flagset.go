package serverconfig

import (
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/lmcache-go/lmcache/internal/cliflag"
	"github.com/lmcache-go/lmcache/internal/l1"
)

// ErrInvalid marks a flag, environment or config-file value that breaks a
// rule; the binary prints it as one line and exits 2.
var ErrInvalid = cliflag.ErrInvalid

// registry is serverconfig's view of a cliflag.Set: the Set parses, and
// registry keeps how GET /config reports each entry.
type registry struct {
	set     *cliflag.Set
	reports map[*cliflag.Entry]func() any // value as GET /config shows it
}

func newRegistry(name string) *registry {
	return &registry{set: cliflag.New(name), reports: map[*cliflag.Entry]func() any{}}
}

func (r *registry) add(e *cliflag.Entry, report func() any) *cliflag.Entry {
	r.set.Add(e)
	r.reports[e] = report
	return e
}

func (r *registry) str(p *string, name, key, group, env, def, usage string) *cliflag.Entry {
	*p = def
	return r.add(&cliflag.Entry{Name: name, Key: key, Group: group, Env: env, Usage: usage, Value: cliflag.String(p), Default: strconv.Quote(def)}, func() any { return *p })
}

func (r *registry) intv(p *int, name, key, group, env string, def int, usage string) *cliflag.Entry {
	*p = def
	return r.add(&cliflag.Entry{Name: name, Key: key, Group: group, Env: env, Usage: usage, Value: cliflag.Int(p)}, func() any { return *p })
}

func (r *registry) float(p *float64, name, key, group, env string, def float64, usage string) *cliflag.Entry {
	*p = def
	return r.add(&cliflag.Entry{Name: name, Key: key, Group: group, Env: env, Usage: usage, Value: cliflag.Float(p)}, func() any { return *p })
}

// Redacted is what GET /config shows for a secret flag that is set.
const Redacted = "***REDACTED***"

// secret registers a string flag whose value never leaves the process:
// --help prints "" as its default (never the environment's value), errors
// never quote it, and GET /config reports Redacted when it is set, ""
// when it is not (or nothing, for an empty key).
func (r *registry) secret(p *string, name, key, group, env, usage string) *cliflag.Entry {
	*p = ""
	return r.add(&cliflag.Entry{Name: name, Key: key, Group: group, Env: env, Usage: usage, Value: cliflag.String(p), Default: `""`, Secret: true}, func() any {
		if *p == "" {
			return ""
		}
		return Redacted
	})
}

// boolPair registers --name and --no-name, as Python's BooleanOptionalAction.
func (r *registry) boolPair(p *bool, name, key, group, env string, def bool, usage string) *cliflag.Entry {
	*p = def
	return r.add(&cliflag.Entry{Name: name, Key: key, Group: group, Env: env, Usage: usage, Value: cliflag.Bool(p), Negatable: true}, func() any { return *p })
}

// boolFlag registers a store_true flag.
func (r *registry) boolFlag(p *bool, name, key, group, env, usage string) *cliflag.Entry {
	*p = false
	return r.add(&cliflag.Entry{Name: name, Key: key, Group: group, Env: env, Usage: usage, Value: cliflag.Bool(p)}, func() any { return *p })
}

// truthyFlag registers a switch whose environment variable takes
// upstream's truth test (cliflag.Truthy): only 1, true and yes are on.
func (r *registry) truthyFlag(p *bool, name, key, group, env, usage string) *cliflag.Entry {
	*p = false
	return r.add(&cliflag.Entry{Name: name, Key: key, Group: group, Env: env, Usage: usage, Value: cliflag.Truthy(p)}, func() any { return *p })
}

// list registers a repeatable flag; with nargs it also takes every following
// argument up to the next flag, as argparse's nargs="*".
func (r *registry) list(p *[]string, name, key, group, usage string, nargs bool) *cliflag.Entry {
	*p = nil
	return r.add(&cliflag.Entry{Name: name, Key: key, Group: group, Usage: usage, Value: cliflag.List(p), Default: "[]", Nargs: nargs}, func() any {
		if *p == nil {
			return []string{}
		}
		return *p
	})
}

// alias registers a hidden deprecated flag for target, and env as the
// target's deprecated environment fallback.
func (r *registry) alias(name, target, env string) { r.set.Alias(name, target, env) }

// parse applies defaults < config file < environment < command line, then
// validates.
func (r *registry) parse(args []string, lookupEnv func(string) (string, bool)) error {
	return r.set.Parse(args, lookupEnv)
}

// printHelp is the title, then the flag layer's settings list.
func (r *registry) printHelp(w io.Writer, title string) {
	fmt.Fprintf(w, "%s\n\n", title)
	r.set.WriteHelp(w)
}

// groups is GET /config's view; sources says, key for key, where each
// value came from (cliflag.Entry.Provenance).
func (r *registry) groups() (values map[string]map[string]any, sources map[string]map[string]string) {
	values, sources = map[string]map[string]any{}, map[string]map[string]string{}
	for _, e := range r.set.Entries() {
		if e.Hidden || e.Key == "" {
			continue
		}
		report := r.reports[e]
		if report == nil {
			continue
		}
		if values[e.Group] == nil {
			values[e.Group] = map[string]any{}
			sources[e.Group] = map[string]string{}
		}
		values[e.Group][e.Key] = report()
		sources[e.Group][e.Key] = e.Provenance()
	}
	return values, sources
}

// Rules shared by several flags.

func positiveFinite(p *float64) func() error {
	return func() error {
		if math.IsNaN(*p) || math.IsInf(*p, 0) || *p <= 0 {
			return fmt.Errorf("must be finite and > 0 (got %v)", *p)
		}
		return nil
	}
}

// maxSeconds is the longest time.Duration, in seconds (about 292 years):
// the server turns every seconds flag into a time.Duration, and a longer
// value does not convert (on amd64 it becomes math.MinInt64, a negative
// duration: a session TTL of 1e10 s expired every session at once).
const maxSeconds = float64(math.MaxInt64) / 1e9

// seconds is the rule of a flag the server turns into a time.Duration:
// finite, at least one nanosecond (a shorter one truncates to 0, which
// the consumers read as "use the default" or "none") and at most
// maxSeconds; zero too when allowZero (where 0 means "none").
func seconds(p *float64, allowZero bool) func() error {
	return func() error {
		v := *p
		switch {
		case v == 0 && allowZero:
			return nil
		case math.IsNaN(v) || math.IsInf(v, 0) || v <= 0:
			if allowZero {
				return fmt.Errorf("must be finite and >= 0 (got %v)", v)
			}
			return fmt.Errorf("must be finite and > 0 (got %v)", v)
		// The same product the server converts (v * float64(time.Second)).
		case v*float64(time.Second) < 1 || v*float64(time.Second) >= float64(math.MaxInt64):
			return fmt.Errorf("must be between 1e-09 and %.4g seconds, a time.Duration (got %v)", maxSeconds, v)
		}
		return nil
	}
}

// maxGB is the largest GiB count whose byte count fits an int64: the
// server sizes the pool with int64(gb * 2^30), and a larger value does not
// convert (--l1-init-size-gb 1e10 became math.MinInt64 bytes, which the
// cap at --l1-size-gb kept as a negative initial size).
const maxGB = float64(math.MaxInt64) / GiB

// sizeGB is the rule of a GiB flag: finite, > 0 and at most maxGB.
func sizeGB(p *float64) func() error {
	return func() error {
		if err := positiveFinite(p)(); err != nil {
			return err
		}
		// The same product the server converts (int64(gb * GiB)).
		if *p*GiB >= float64(math.MaxInt64) {
			return fmt.Errorf("must be < %.0f GiB, an int64 byte count (got %v)", maxGB, *p)
		}
		return nil
	}
}

// durationInt is the rule of an integer flag counted in unit (the server
// multiplies it into a time.Duration): at least 0, and small enough that
// the product does not overflow (it wrapped to a negative or an arbitrary
// duration).
func durationInt(p *int, unit time.Duration, unitName string) func() error {
	return func() error {
		if err := cliflag.AtLeast(*p, 0); err != nil {
			return err
		}
		if limit := int64(math.MaxInt64 / unit); int64(*p) > limit {
			return fmt.Errorf("must be <= %d %s, a time.Duration (got %d)", limit, unitName, *p)
		}
		return nil
	}
}

// MaxPreallocated bounds the flags whose value the server allocates up
// front (the KV event log's ring, the KV event publisher's queue): 2^22
// entries is far past any default, and a larger value panicked or
// exhausted memory at start instead of being a flag error.
const MaxPreallocated = 1 << 22

// inRangeInt is an integer flag's closed range: atLeast's rule and text
// below it, and an upper bound where the server's arithmetic on the value
// (retries + 1, megabytes << 20) would overflow past hi.
func inRangeInt(p *int, lo, hi int) func() error {
	return func() error {
		if err := cliflag.AtLeast(*p, lo); err != nil {
			return err
		}
		if *p > hi {
			return fmt.Errorf("must be <= %d (got %d)", hi, *p)
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

// atLeast is cliflag's lower bound, which `lmcache bench` shares.
func atLeast(p *int, min int) func() error {
	return func() error { return cliflag.AtLeast(*p, min) }
}

// port is cliflag's port rule, which the coordinator's --port shares.
func port(p *int) func() error {
	return func() error { return cliflag.Port(*p) }
}

// shmNameMax is NAME_MAX: the pool is one file in /dev/shm, and its name
// (with l1.ShmPrefix) must fit one directory entry.
const shmNameMax = 255

// checkShmName is --shm-name's rule, checked at flag time so that a bad
// name is one flag error rather than a failed create once the engine
// starts. The engine strips leading slashes and adds l1.ShmPrefix
// (l1.NormalizeShmName); what is left must be one path component.
func checkShmName(name string) error {
	if name == "" {
		return nil // the documented "private memory"
	}
	full := l1.NormalizeShmName(name)
	switch {
	case full == "":
		return fmt.Errorf("must name a shared-memory segment, not only slashes (got %q)", name)
	case strings.ContainsRune(full, '/'):
		return fmt.Errorf("must be one name without \"/\" (a leading one is dropped) (got %q)", name)
	case strings.ContainsRune(full, 0):
		return fmt.Errorf("must not contain a NUL byte (got %q)", name)
	case len(full) > shmNameMax:
		return fmt.Errorf("must be at most %d bytes with the %s prefix (got %d)", shmNameMax, l1.ShmPrefix, len(full))
	}
	return nil
}

// osLookupEnv is the default environment source.
var osLookupEnv = os.LookupEnv
