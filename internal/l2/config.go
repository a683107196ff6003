package l2

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"

	"github.com/lmcache-go/lmcache/internal/redact"
)

// DefaultAffinityTag is upstream's affinity_tag when the key is absent.
const DefaultAffinityTag = "_default"

// GiB is the unit of every *_gb key upstream (binary gigabytes).
const GiB = 1 << 30

// Spec is one parsed --l2-adapter value. The common keys are decoded here;
// type-specific keys are decoded by the type's Factory.Parse into Options.
type Spec struct {
	// Index is the 1-based position of the flag, as in error messages.
	Index int
	// Type is the registered type name.
	Type string
	// Shared marks a storage domain mounted by several instances.
	Shared bool
	// Eviction is nil when the adapter has no L2 eviction.
	Eviction *EvictionConfig
	// PersistEnabled keeps stored data at shutdown (default true).
	PersistEnabled bool
	// AffinityTag groups adapters for placement (default "_default").
	AffinityTag string
	// Options is the type-specific configuration returned by Factory.Parse.
	Options any
	// UnknownKeys lists keys nobody consumed. Upstream ignores them too, so
	// they only produce a warning; they are kept for /config reporting.
	UnknownKeys []string
}

// EvictionConfig is the optional "eviction" block of an adapter.
type EvictionConfig struct {
	Policy           string  `json:"eviction_policy"`
	TriggerWatermark float64 `json:"trigger_watermark"`
	EvictionRatio    float64 `json:"eviction_ratio"`
}

// Factory builds one adapter type.
type Factory struct {
	// Parse decodes the type-specific keys. It must read every key it
	// understands through f so unknown keys can be reported.
	Parse func(f *Fields) (any, error)
	// Open builds the adapter from a parsed spec.
	Open func(ctx context.Context, spec Spec) (Adapter, error)
}

var (
	registryMu sync.RWMutex
	registry   = map[string]Factory{}
)

// Register makes an adapter type available to ParseSpecs and Open. Adapter
// packages call it from init; it panics on a duplicate name, which is a
// programming error.
func Register(typeName string, f Factory) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[typeName]; dup {
		panic(fmt.Sprintf("l2: adapter type %q registered twice", typeName))
	}
	if f.Parse == nil || f.Open == nil {
		panic(fmt.Sprintf("l2: adapter type %q has an incomplete factory", typeName))
	}
	registry[typeName] = f
}

// RegisteredTypes returns the known type names, sorted.
func RegisteredTypes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func lookupFactory(typeName string) (Factory, bool) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	f, ok := registry[typeName]
	return f, ok
}

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("invalid --l2-adapter")

// ParseSpecs parses the repeatable --l2-adapter values in order (order is
// the adapter index and the cascade order).
func ParseSpecs(values []string) ([]Spec, error) {
	specs := make([]Spec, 0, len(values))
	for i, v := range values {
		s, err := ParseSpec(i+1, []byte(v))
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	return specs, nil
}

// SpecError is a --l2-adapter value that does not parse. Its Error reads
// like upstream's ("--l2-adapter #<i> ('<type>'): <msg>", after ErrConfig's
// text), and Reason is the same without the flag's name, for a caller that
// names the flag itself (the command line's "--l2-adapter: <reason>").
type SpecError struct {
	Index   int    // 1-based position among the --l2-adapter values
	Type    string // the adapter type, when the value named one
	Msg     string // what is wrong
	BadJSON bool   // the value is not JSON at all
}

// Error is the upstream-style message, prefixed with ErrConfig's text.
func (e *SpecError) Error() string {
	switch {
	case e.BadJSON:
		return fmt.Sprintf("%v: invalid JSON for --l2-adapter #%d: %s", ErrConfig, e.Index, e.Msg)
	case e.Type == "":
		return fmt.Sprintf("%v: --l2-adapter #%d: %s", ErrConfig, e.Index, e.Msg)
	default:
		return fmt.Sprintf("%v: --l2-adapter #%d ('%s'): %s", ErrConfig, e.Index, e.Type, e.Msg)
	}
}

// Reason is the message without the flag's name: "#<i>: invalid JSON:
// <msg>", "#<i>: <msg>" or "#<i> ('<type>'): <msg>".
func (e *SpecError) Reason() string {
	switch {
	case e.BadJSON:
		return fmt.Sprintf("#%d: invalid JSON: %s", e.Index, e.Msg)
	case e.Type == "":
		return fmt.Sprintf("#%d: %s", e.Index, e.Msg)
	default:
		return fmt.Sprintf("#%d ('%s'): %s", e.Index, e.Type, e.Msg)
	}
}

// Unwrap makes every SpecError an ErrConfig.
func (e *SpecError) Unwrap() error { return ErrConfig }

// ParseSpec parses one adapter JSON object; index is 1-based and only used
// in messages. Its errors are *SpecError.
func ParseSpec(index int, data []byte) (Spec, error) {
	spec, err := parseSpec(data)
	if err != nil {
		return Spec{}, &SpecError{Index: index, Type: err.typ, Msg: err.msg, BadJSON: err.badJSON}
	}
	spec.Index = index
	if len(spec.UnknownKeys) > 0 {
		slog.Warn("ignoring unknown --l2-adapter keys", "index", index, "type", spec.Type, "keys", spec.UnknownKeys)
	}
	return spec, nil
}

// ParseNested parses an adapter spec embedded in another one (fault_inject's
// "inner"), with the same common keys. Its Index is 0 until the caller sets
// it; errors read "inner adapter ('<type>'): <msg>".
func ParseNested(raw json.RawMessage) (Spec, error) {
	spec, err := parseSpec(raw)
	if err != nil {
		if err.typ == "" {
			return Spec{}, fmt.Errorf("inner adapter: %s", err.msg)
		}
		return Spec{}, fmt.Errorf("inner adapter ('%s'): %s", err.typ, err.msg)
	}
	return spec, nil
}

// specError is a parse failure before it is given its flag context.
type specError struct {
	badJSON bool
	typ     string // "" when the type is not known yet
	msg     string
}

func parseSpec(data []byte) (Spec, *specError) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return Spec{}, &specError{msg: "expected a JSON object, got " + typeErr.Value}
		}
		return Spec{}, &specError{badJSON: true, msg: err.Error()}
	}
	if obj == nil {
		return Spec{}, &specError{msg: "expected a JSON object, got null"}
	}
	f := NewFields(obj)
	typeName, err := f.String("type", "")
	if err != nil || typeName == "" {
		if _, present := obj["type"]; !present {
			return Spec{}, &specError{msg: "missing 'type' field"}
		}
		return Spec{}, &specError{msg: "'type' must be a non-empty string"}
	}
	fac, ok := lookupFactory(typeName)
	if !ok {
		known := strings.Join(RegisteredTypes(), ", ")
		if known == "" {
			known = "(none)"
		}
		return Spec{}, &specError{msg: fmt.Sprintf("unknown adapter type '%s'. Known: %s", typeName, known)}
	}
	spec, err := parseCommon(f)
	if err == nil {
		spec.Options, err = fac.Parse(f)
	}
	if err != nil {
		return Spec{}, &specError{typ: typeName, msg: err.Error()}
	}
	spec.Type = typeName
	spec.UnknownKeys = f.Unused()
	return spec, nil
}

func parseCommon(f *Fields) (Spec, error) {
	var s Spec
	var err error
	if s.Shared, err = f.Bool("shared", false); err != nil {
		return s, err
	}
	if s.PersistEnabled, err = f.Bool("persist_enabled", true); err != nil {
		return s, err
	}
	if s.AffinityTag, err = f.String("affinity_tag", DefaultAffinityTag); err != nil {
		return s, err
	}
	if s.AffinityTag == "" {
		return s, errors.New("affinity_tag must be a non-empty string")
	}
	if s.Eviction, err = parseEviction(f); err != nil {
		return s, err
	}
	if err := rejectSerde(f); err != nil {
		return s, err
	}
	return s, nil
}

func parseEviction(f *Fields) (*EvictionConfig, error) {
	sub, err := f.Object("eviction")
	if err != nil || sub == nil {
		return nil, err
	}
	policy, err := sub.String("eviction_policy", "")
	if err != nil || (policy != "LRU" && policy != "IsolatedLRU" && policy != "noop") {
		return nil, fmt.Errorf("eviction.eviction_policy must be 'LRU', 'IsolatedLRU', or 'noop', got %s", sub.rawText("eviction_policy"))
	}
	ec := &EvictionConfig{Policy: policy}
	if ec.TriggerWatermark, err = sub.Float("trigger_watermark", 0.8); err != nil {
		return nil, fmt.Errorf("eviction.%w", err)
	}
	if ec.EvictionRatio, err = sub.Float("eviction_ratio", 0.2); err != nil {
		return nil, fmt.Errorf("eviction.%w", err)
	}
	// Upstream accepts any float here; a watermark above 1 silently never
	// triggers and a ratio outside (0,1] evicts nothing or everything.
	if ec.TriggerWatermark <= 0 || ec.TriggerWatermark > 1 {
		return nil, fmt.Errorf("eviction.trigger_watermark must be in (0, 1], got %v", ec.TriggerWatermark)
	}
	if ec.EvictionRatio <= 0 || ec.EvictionRatio > 1 {
		return nil, fmt.Errorf("eviction.eviction_ratio must be in (0, 1], got %v", ec.EvictionRatio)
	}
	if unknown := sub.Unused(); len(unknown) > 0 {
		return nil, fmt.Errorf("eviction: unknown keys %s", strings.Join(unknown, ", "))
	}
	return ec, nil
}

// rejectSerde refuses the serde block: lmcache-go has no serializers (fp8 is
// a lossy tensor quantization that needs dtype knowledge), and silently
// storing raw bytes would make a bucket shared with a Python fp8 server
// unreadable to both sides.
func rejectSerde(f *Fields) error {
	sub, err := f.Object("serde")
	if err != nil {
		return fmt.Errorf("'serde' must be a dict: %w", err)
	}
	if sub == nil {
		return nil
	}
	typ, err := sub.String("type", "")
	if err != nil || typ == "" {
		return errors.New("'serde' dict must include a 'type' field")
	}
	return fmt.Errorf("serde type '%s' is not supported by lmcache-go (no serde is); remove the \"serde\" key", typ)
}

// Open builds the adapter described by spec through its registered factory.
func Open(ctx context.Context, spec Spec) (Adapter, error) {
	fac, ok := lookupFactory(spec.Type)
	if !ok {
		return nil, fmt.Errorf("%w: unknown adapter type '%s'. Known: %s", ErrConfig, spec.Type, strings.Join(RegisteredTypes(), ", "))
	}
	a, err := fac.Open(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("--l2-adapter #%d ('%s'): %w", spec.Index, spec.Type, err)
	}
	return a, nil
}

// OpenAll opens every spec in order; on failure the adapters already opened
// are closed.
func OpenAll(ctx context.Context, specs []Spec) ([]Adapter, error) {
	out := make([]Adapter, 0, len(specs))
	for _, s := range specs {
		a, err := Open(ctx, s)
		if err != nil {
			for _, prev := range out {
				_ = prev.Close()
			}
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// Fields gives factories typed, strict access to one adapter JSON object and
// records which keys were read. JSON types are checked exactly (a string is
// never a number), unlike Python's truthiness, so typos fail loudly.
type Fields struct {
	raw  map[string]json.RawMessage
	used map[string]bool
}

// NewFields wraps a decoded JSON object (used by tests and nested specs).
func NewFields(raw map[string]json.RawMessage) *Fields {
	return &Fields{raw: raw, used: map[string]bool{}}
}

// Has reports whether key is present and not null.
func (f *Fields) Has(key string) bool {
	v, ok := f.raw[key]
	return ok && !bytes.Equal(bytes.TrimSpace(v), []byte("null"))
}

// Raw returns the raw JSON of key (nil if absent) and marks it used.
func (f *Fields) Raw(key string) json.RawMessage {
	f.used[key] = true
	if !f.Has(key) {
		return nil
	}
	return f.raw[key]
}

// shown is key's raw value as an error message may quote it: a credential
// (aws_secret_access_key, a token) is shown as redact.Marker, since these
// errors reach the start-up log and the HTTP answers of /reconfigure.
func (f *Fields) shown(key string) string {
	if redact.IsSecretName(key) {
		return redact.Marker
	}
	return string(f.raw[key])
}

func (f *Fields) rawText(key string) string {
	if v, ok := f.raw[key]; ok {
		return string(v)
	}
	return "None"
}

func (f *Fields) decode(key string, dst any) (bool, error) {
	f.used[key] = true
	if !f.Has(key) {
		return false, nil
	}
	dec := json.NewDecoder(bytes.NewReader(f.raw[key]))
	dec.UseNumber()
	if err := dec.Decode(dst); err != nil {
		return true, err
	}
	return true, nil
}

// String reads a string key.
func (f *Fields) String(key, def string) (string, error) {
	var s string
	ok, err := f.decode(key, &s)
	if err != nil {
		return "", fmt.Errorf("%s must be a string, got %s", key, f.shown(key))
	}
	if !ok {
		return def, nil
	}
	return s, nil
}

// Bool reads a boolean key.
func (f *Fields) Bool(key string, def bool) (bool, error) {
	var b bool
	ok, err := f.decode(key, &b)
	if err != nil {
		return false, fmt.Errorf("%s must be a boolean, got %s", key, f.shown(key))
	}
	if !ok {
		return def, nil
	}
	return b, nil
}

// Int reads an integer key (JSON floats with a fraction are rejected).
func (f *Fields) Int(key string, def int64) (int64, error) {
	var n json.Number
	ok, err := f.decode(key, &n)
	if err != nil {
		return 0, fmt.Errorf("%s must be an integer, got %s", key, f.shown(key))
	}
	if !ok {
		return def, nil
	}
	v, err := n.Int64()
	if err != nil {
		return 0, fmt.Errorf("%s must be an integer, got %s", key, n)
	}
	return v, nil
}

// PositiveInt reads an integer key that must be > 0.
func (f *Fields) PositiveInt(key string, def int64) (int64, error) {
	v, err := f.Int(key, def)
	if err != nil {
		return 0, err
	}
	if v <= 0 {
		return 0, fmt.Errorf("%s must be a positive integer, got %d", key, v)
	}
	return v, nil
}

// Float reads a number key.
func (f *Fields) Float(key string, def float64) (float64, error) {
	var n json.Number
	ok, err := f.decode(key, &n)
	if err != nil {
		return 0, fmt.Errorf("%s must be a number, got %s", key, f.shown(key))
	}
	if !ok {
		return def, nil
	}
	v, err := n.Float64()
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s must be a finite number, got %s", key, n)
	}
	return v, nil
}

// GiBBytes reads a non-negative *_gb key and converts it to bytes.
func (f *Fields) GiBBytes(key string, def float64) (int64, error) {
	v, err := f.Float(key, def)
	if err != nil {
		return 0, err
	}
	if v < 0 {
		return 0, fmt.Errorf("%s must be >= 0, got %v", key, v)
	}
	if v*GiB > math.MaxInt64/2 {
		return 0, fmt.Errorf("%s is too large: %v", key, v)
	}
	return int64(v * GiB), nil
}

// Object reads a nested JSON object (nil when absent).
func (f *Fields) Object(key string) (*Fields, error) {
	var m map[string]json.RawMessage
	ok, err := f.decode(key, &m)
	if err != nil {
		return nil, fmt.Errorf("%s must be an object, got %s", key, f.shown(key))
	}
	if !ok {
		return nil, nil
	}
	return NewFields(m), nil
}

// Unused lists keys that no accessor read, sorted.
func (f *Fields) Unused() []string {
	var out []string
	for k := range f.raw {
		if !f.used[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
