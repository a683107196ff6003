package cliflag

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Value types shared by the subcommands. Parsing follows Python's argparse
// conversions closely enough that upstream command lines keep working, and
// every value-type error reads the same in both subcommands.

// String returns a Value that stores text in *p.
func String(p *string) flag.Value { return (*stringValue)(p) }

// Int returns a Value that parses a decimal integer into *p.
func Int(p *int) flag.Value { return (*intValue)(p) }

// Float returns a Value that parses a number into *p.
func Float(p *float64) flag.Value { return (*floatValue)(p) }

// Bool returns a boolean Value: a bare flag is true, and text may be
// 1/true/yes/on or 0/false/no/off (any case); anything else is refused.
func Bool(p *bool) flag.Value { return &boolValue{p: p} }

// Truthy returns a boolean Value with upstream's environment truth test
// for the settings it reads with `value.lower() in ("1", "true", "yes")`:
// those values are true and every other one, "on" and "" included, is
// false and never an error. As a flag it is a plain switch.
func Truthy(p *bool) flag.Value { return &boolValue{p: p, truthy: true} }

// List returns a repeatable Value that appends to *p; an explicit empty
// value ("--f=") makes the list empty rather than absent.
func List(p *[]string) flag.Value { return (*listValue)(p) }

// Duration returns a Value that parses Go duration text ("3s", "500ms")
// into *p, as the flag package's Duration did for `lmcache bench`.
func Duration(p *time.Duration) flag.Value { return (*durationValue)(p) }

// PortRule is the one reason every subcommand gives for a port outside
// 0-65535, so `lmcache server --port` and `lmcache coordinator --port`
// cannot drift apart again.
const PortRule = "must be a port number 0-65535"

// Port is the port check of every subcommand: nil for 0-65535 (0 asks the
// kernel for a free port), else PortRule with the value.
func Port(n int) error {
	if n < 0 || n > 65535 {
		return fmt.Errorf("%s (got %d)", PortRule, n)
	}
	return nil
}

// AtLeast is the lower-bound check of every subcommand's integer
// settings: nil when n >= min, else the one reason text with the value.
func AtLeast(n, min int) error {
	if n < min {
		return fmt.Errorf("must be >= %d (got %d)", min, n)
	}
	return nil
}

type stringValue string

func (s *stringValue) Set(v string) error { *s = stringValue(v); return nil }
func (s *stringValue) String() string     { return string(*s) }

type intValue int

func (i *intValue) Set(v string) error {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("not an integer (got %q)", v)
	}
	*i = intValue(n)
	return nil
}
func (i *intValue) String() string { return strconv.Itoa(int(*i)) }

type floatValue float64

func (f *floatValue) Set(v string) error {
	n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil {
		return fmt.Errorf("not a number (got %q)", v)
	}
	*f = floatValue(n)
	return nil
}
func (f *floatValue) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 64) }

type durationValue time.Duration

func (d *durationValue) Set(v string) error {
	n, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("not a duration such as 3s or 500ms (got %q)", v)
	}
	*d = durationValue(n)
	return nil
}
func (d *durationValue) String() string { return time.Duration(*d).String() }

// boolValue is both boolean Values: Bool's strict switch and, with
// truthy set, Truthy's upstream truth test. One type keeps the flag
// behaviour (a bare flag is true) and the text form identical for both.
type boolValue struct {
	p *bool
	// truthy takes 1/true/yes (any case) as true and every other text as
	// false, never an error, as upstream's `value.lower() in (...)` does.
	truthy bool
}

func (b *boolValue) Set(v string) error {
	t := strings.ToLower(strings.TrimSpace(v))
	if b.truthy {
		*b.p = t == "1" || t == "true" || t == "yes"
		return nil
	}
	switch t {
	case "1", "true", "yes", "on", "":
		*b.p = true
	case "0", "false", "no", "off":
		*b.p = false
	default:
		return fmt.Errorf("not a boolean (got %q)", v)
	}
	return nil
}

// String is nil-safe: the flag package may call it on a zero Value.
func (b *boolValue) String() string {
	if b.p == nil {
		return "false"
	}
	return strconv.FormatBool(*b.p)
}
func (b *boolValue) IsBoolFlag() bool { return true }

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

// isList reports whether v takes several values (a config-file sequence).
func isList(v flag.Value) bool {
	_, ok := v.(*listValue)
	return ok
}
