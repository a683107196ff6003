package coordinator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lmcache-go/lmcache/internal/httproute"
)

// Body size limits. Event batches and token lists are the large bodies.
const (
	smallBodyLimit  = 1 << 20
	tokenBodyLimit  = 32 << 20 // 1,000,000 token ids of up to 10 digits, plus slack
	eventsBodyLimit = 64 << 20
)

// maxInstanceIDBytes bounds an instance_id (registration, POST
// /quota/events, POST /events). Upstream has none; ids are host or pod
// names (at most 253 bytes) or generated ones, and each is kept per
// registration, per event-gate cursor and per L1 view.
const maxInstanceIDBytes = 256

// tooLong records Pydantic's max_length failure for name when v is longer
// than max bytes, and reports whether it did.
func (f *fields) tooLong(name, v string, max int) bool {
	if len(v) <= max {
		return false
	}
	f.fail(name, "string_too_long", fmt.Sprintf("String should have at most %d bytes", max), v, map[string]any{"max_length": max})
	return true
}

// readBody reads at most limit bytes; an oversized body is 413.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	if err := readInto(&buf, w, r, limit); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// bodyBufs recycles event-batch bodies (about 200 KB each at 1,000 events).
var bodyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readPooledBody is readBody into a pooled buffer. The caller returns it
// with bodyBufs.Put only once nothing derived from it is still referenced.
func readPooledBody(w http.ResponseWriter, r *http.Request, limit int64) (*bytes.Buffer, error) {
	buf := bodyBufs.Get().(*bytes.Buffer)
	buf.Reset()
	if err := readInto(buf, w, r, limit); err != nil {
		return nil, err
	}
	return buf, nil
}

// Body read deadline, as the MP server's: bodyReadTimeout per started
// bodyReadUnit the route allows (the 64 MiB event routes get 2 min), so a
// client trickling a body cannot hold one of httplimit's capped
// connections for ever.
const (
	bodyReadTimeout = 30 * time.Second
	bodyReadUnit    = 16 << 20
)

func readInto(buf *bytes.Buffer, w http.ResponseWriter, r *http.Request, limit int64) error {
	return httproute.ReadBody(buf, w, r, limit, httproute.ScaledDeadline(bodyReadTimeout, bodyReadUnit, limit))
}

// jsonContentType reports whether FastAPI would parse the body as JSON: an
// absent content type is parsed, a non-JSON one is not.
func jsonContentType(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// bodyObject decodes a JSON object body into raw fields, producing FastAPI's
// 422 shapes for a missing, malformed or non-object body.
func bodyObject(w http.ResponseWriter, r *http.Request, limit int64) (*fields, error) {
	b, err := readBody(w, r, limit)
	if err != nil {
		return nil, err
	}
	return parseObject(r, b)
}

func parseObject(r *http.Request, b []byte) (*fields, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, invalid(detailItem{Type: "missing", Loc: []any{"body"}, Msg: "Field required", Input: nil})
	}
	if !jsonContentType(r) {
		return nil, invalid(detailItem{Type: "model_attributes_type", Loc: []any{"body"},
			Msg: "Input should be a valid dictionary or object to extract fields from", Input: string(b)})
	}
	var raw any
	if err := httproute.DecodeJSON(b, &raw); err != nil {
		msg := err.Error()
		if errors.Is(err, httproute.ErrTrailingJSON) {
			msg = "invalid JSON"
		}
		return nil, invalid(detailItem{Type: "json_invalid", Loc: []any{"body", 0}, Msg: "JSON decode error", Input: map[string]any{}, Ctx: map[string]any{"error": msg}})
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, invalid(detailItem{Type: "model_attributes_type", Loc: []any{"body"},
			Msg: "Input should be a valid dictionary or object to extract fields from", Input: raw})
	}
	return &fields{m: m, loc: []any{"body"}}, nil
}

// fields extracts typed values from a decoded JSON object with Pydantic v2
// lax-mode rules, collecting every failure before reporting.
type fields struct {
	m    map[string]any
	loc  []any
	errs []detailItem
}

func (f *fields) at(name string) []any {
	return append(append([]any{}, f.loc...), name)
}

func (f *fields) fail(name, typ, msg string, input any, ctx map[string]any) {
	f.errs = append(f.errs, detailItem{Type: typ, Loc: f.at(name), Msg: msg, Input: input, Ctx: ctx})
}

func (f *fields) missing(name string) {
	f.fail(name, "missing", "Field required", f.m, nil)
}

func (f *fields) err() error {
	if len(f.errs) == 0 {
		return nil
	}
	return invalid(f.errs...)
}

// str reads a string field (ints are not coerced to strings).
func (f *fields) str(name string, required bool, def string) string {
	v, ok := f.m[name]
	if !ok {
		if required {
			f.missing(name)
		}
		return def
	}
	s, ok := v.(string)
	if !ok {
		f.fail(name, "string_type", "Input should be a valid string", v, nil)
		return def
	}
	return s
}

// toInt applies Pydantic's lax int rules: integral numbers and numeric
// strings are accepted.
func toInt(v any) (int64, string, string) {
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return i, "", ""
		}
		fl, err := strconv.ParseFloat(string(x), 64)
		if err != nil || math.IsInf(fl, 0) || math.Abs(fl) > 9.2e18 {
			return 0, "int_parsing", "Input should be a valid integer, unable to parse number as an integer"
		}
		if fl != math.Trunc(fl) {
			return 0, "int_from_float", "Input should be a valid integer, got a number with a fractional part"
		}
		return int64(fl), "", ""
	case string:
		if i, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64); err == nil {
			return i, "", ""
		}
		return 0, "int_parsing", "Input should be a valid integer, unable to parse string as an integer"
	case bool:
		return 0, "int_type", "Input should be a valid integer"
	}
	return 0, "int_type", "Input should be a valid integer"
}

func (f *fields) integer(name string, required bool, def int64) (int64, bool) {
	v, ok := f.m[name]
	if !ok {
		if required {
			f.missing(name)
		}
		return def, false
	}
	i, typ, msg := toInt(v)
	if typ != "" {
		f.fail(name, typ, msg, v, nil)
		return def, false
	}
	return i, true
}

func (f *fields) intRange(name string, required bool, def, lo, hi int64) int64 {
	i, ok := f.integer(name, required, def)
	if !ok {
		return i
	}
	if i < lo {
		f.fail(name, "greater_than_equal", fmt.Sprintf("Input should be greater than or equal to %d", lo), i, map[string]any{"ge": lo})
		return def
	}
	if i > hi {
		f.fail(name, "less_than_equal", fmt.Sprintf("Input should be less than or equal to %d", hi), i, map[string]any{"le": hi})
		return def
	}
	return i
}

// number reads a float field; present reports whether the key was given,
// null whether it was JSON null (allowed only when nullable). A literal
// past float64's range (1e999) is a field error. POST /events' ts reads
// with number: its fast decoder refuses such a literal too, and the two
// decoders must agree (FuzzCacheEventDecoders).
func (f *fields) number(name string, required, nullable bool) (val float64, present, null bool) {
	return f.float(name, required, nullable, false)
}

// numberOrInf is number, but a literal past float64's range reads as ±inf,
// as Python's json.loads and Pydantic do (the quota limits, where it is
// then the same non-finite limit as "Infinity", a 400, rather than an
// unparsable number, a 422).
func (f *fields) numberOrInf(name string, required, nullable bool) (val float64, present, null bool) {
	return f.float(name, required, nullable, true)
}

// float is number and numberOrInf: rangeAsInf keeps ParseFloat's ±inf for
// an out-of-range literal instead of failing the field.
func (f *fields) float(name string, required, nullable, rangeAsInf bool) (val float64, present, null bool) {
	v, ok := f.m[name]
	if !ok {
		if required {
			f.missing(name)
		}
		return 0, false, false
	}
	if v == nil && nullable {
		return 0, true, true
	}
	var fl float64
	var err error
	switch x := v.(type) {
	case json.Number:
		fl, err = strconv.ParseFloat(string(x), 64)
	case string:
		fl, err = strconv.ParseFloat(strings.TrimSpace(x), 64)
	default:
		err = errors.New("type")
	}
	if rangeAsInf && errors.Is(err, strconv.ErrRange) && math.IsInf(fl, 0) {
		return fl, true, false
	}
	if err != nil {
		f.fail(name, "float_parsing", "Input should be a valid number", v, nil)
		return 0, true, false
	}
	return fl, true, false
}

// tier validates the optional tier enum (body or query).
func tierCheck(v string, loc []any) error {
	switch v {
	case "l2":
		return nil
	case "l1", "all":
		return badRequest("tier '%s' not supported; only 'l2'", v)
	}
	return invalid(detailItem{Type: "enum", Loc: loc, Msg: "Input should be 'l1', 'l2' or 'all'", Input: v, Ctx: map[string]any{"expected": "'l1', 'l2' or 'all'"}})
}

func (f *fields) tier() error {
	v, ok := f.m["tier"]
	if !ok {
		return nil
	}
	s, ok := v.(string)
	if !ok {
		return invalid(detailItem{Type: "enum", Loc: f.at("tier"), Msg: "Input should be 'l1', 'l2' or 'all'", Input: v})
	}
	return tierCheck(s, f.at("tier"))
}

func queryTier(r *http.Request) error {
	q := httproute.Query(r)
	if !q.Has("tier") {
		return nil
	}
	return tierCheck(q.Get("tier"), []any{"query", "tier"})
}

// strMap reads an object of string values.
func (f *fields) strMap(name string) map[string]string {
	out := map[string]string{}
	v, ok := f.m[name]
	if !ok {
		return out
	}
	m, ok := v.(map[string]any)
	if !ok {
		f.fail(name, "dict_type", "Input should be a valid dictionary", v, nil)
		return out
	}
	for k, x := range m {
		s, ok := x.(string)
		if !ok {
			f.errs = append(f.errs, detailItem{Type: "string_type", Loc: append(f.at(name), k), Msg: "Input should be a valid string", Input: x})
			continue
		}
		out[k] = s
	}
	return out
}

// intList reads a list of ints.
func (f *fields) intList(name string) []int64 {
	v, ok := f.m[name]
	if !ok {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		f.fail(name, "list_type", "Input should be a valid list", v, nil)
		return nil
	}
	out := make([]int64, len(l))
	for i, x := range l {
		n, typ, msg := toInt(x)
		if typ != "" {
			f.errs = append(f.errs, detailItem{Type: typ, Loc: append(f.at(name), i), Msg: msg, Input: x})
			if len(f.errs) > 20 {
				return nil
			}
			continue
		}
		out[i] = n
	}
	return out
}
