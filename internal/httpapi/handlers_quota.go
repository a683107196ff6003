package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/quota"
)

const gib = float64(1 << 30)

func (s *Server) quotaEngine() (Engine, error) { return s.engineOr("engine not initialized") }

func (s *Server) handleQuotaList(w http.ResponseWriter, _ *http.Request) error {
	e, err := s.quotaEngine()
	if err != nil {
		return err
	}
	users := map[string]QuotaUsage{}
	usage := e.QuotaUsage()
	for salt, limit := range e.Quotas() {
		users[quota.ToPath(salt)] = QuotaUsage{LimitGB: float64(limit) / gib, CurrentUsageGB: float64(usage[salt]) / gib}
	}
	writeJSON(w, http.StatusOK, QuotaListResponse{Users: users})
	return nil
}

func (s *Server) handleQuotaPut(w http.ResponseWriter, r *http.Request) error {
	seg := r.PathValue("cache_salt")
	body, err := s.readBody(w, r, maxSmallBody)
	if err != nil {
		return err
	}
	gb, err := decodeQuotaPut(body)
	if err != nil {
		return err
	}
	// Only a salt a store can carry (objkey's rules, the ones every store
	// and lookup path applies) can ever be charged, so a quota for any
	// other is meaningless; refusing it also bounds what one PUT keeps
	// (the path segment could otherwise be as long as the header limit,
	// and every such quota stays in memory and in GET /quota).
	salt := quota.FromPath(seg)
	if err := objkey.ValidateSalt(salt); err != nil {
		return errf(ErrBadRequest, "%s", objkey.Reason(err))
	}
	e, err := s.quotaEngine()
	if err != nil {
		return err
	}
	bytes := gb * gib
	if bytes >= math.MaxInt64 {
		return errf(ErrBadRequest, "limit_gb must be finite")
	}
	if err := e.SetQuota(salt, int64(bytes)); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, QuotaPutResponse{CacheSalt: seg, LimitGB: gb, Status: "ok"})
	return nil
}

func (s *Server) handleQuotaGet(w http.ResponseWriter, r *http.Request) error {
	seg := r.PathValue("cache_salt")
	e, err := s.quotaEngine()
	if err != nil {
		return err
	}
	salt := quota.FromPath(seg)
	limit, exists := e.Quota(salt)
	writeJSON(w, http.StatusOK, QuotaGetResponse{
		CacheSalt: seg, LimitGB: float64(limit) / gib, CurrentUsageGB: float64(e.QuotaUsage()[salt]) / gib, Exists: exists,
	})
	return nil
}

func (s *Server) handleQuotaDelete(w http.ResponseWriter, r *http.Request) error {
	seg := r.PathValue("cache_salt")
	e, err := s.quotaEngine()
	if err != nil {
		return err
	}
	status := "not_found"
	if e.DeleteQuota(quota.FromPath(seg)) {
		status = "removed"
	}
	writeJSON(w, http.StatusOK, QuotaDeleteResponse{CacheSalt: seg, Status: status})
	return nil
}

func normSeg(s string) string { return strings.ToLower(strings.TrimSpace(s)) }

func (s *Server) handleReconfigureStatus(w http.ResponseWriter, r *http.Request) error {
	backend := normSeg(r.PathValue("backend"))
	if backend == "" {
		return errf(ErrBadRequest, "backend must be non-empty")
	}
	e, err := s.engineOr("engine not initialized")
	if err != nil {
		return err
	}
	adapters := []ReconfigureAdapter{}
	for _, a := range s.backendAdapters(e, backend) {
		st, err := e.ReconfigureStatus(a.Index)
		if err != nil {
			return err
		}
		adapters = append(adapters, ReconfigureAdapter{AdapterIndex: len(adapters), Status: st})
	}
	// An adapter's status and results are its own maps, like /status's
	// storage manager: they leave through redaction too.
	return writeRedactedJSON(w, http.StatusOK, ReconfigureStatusResponse{
		Enabled: len(adapters) > 0, Backend: backend, NumAdapters: len(adapters), Adapters: adapters,
	})
}

// backendAdapters lists the reconfigurable adapters of one backend type, in
// index order; their position is the backend-local adapter_index.
func (s *Server) backendAdapters(e Engine, backend string) []struct{ Index int } {
	var out []struct{ Index int }
	for _, a := range e.Adapters() {
		if a.Reconfigurable && strings.ToLower(a.TypeName) == backend {
			out = append(out, struct{ Index int }{a.Index})
		}
	}
	return out
}

// reconfigureReq is a validated reconfiguration call.
type reconfigureReq struct {
	AdapterIndex int
	Args         map[string]any
}

// DAX operations and their accepted body fields.
var daxFields = map[string]map[string]bool{
	"add":    {"device_path": true, "size": true, "adapter_index": true},
	"remove": {"device_path": true, "mode": true, "force": true, "adapter_index": true},
	"resize": {"device_path": true, "size": true, "mode": true, "force": true, "adapter_index": true},
}

// decodeReconfigure validates a reconfigure body. DAX bodies are strict
// (extra keys, missing or mistyped fields are 422; a bad size is 400); other
// backends forward every field but adapter_index verbatim.
func decodeReconfigure(backend, op string, body []byte) (reconfigureReq, error) {
	obj := map[string]any{}
	if len(bytes.TrimSpace(body)) > 0 {
		var raw any
		if err := httproute.DecodeJSON(body, &raw); err != nil {
			return reconfigureReq{}, invalid("json_invalid", "JSON decode error", "body")
		}
		m, ok := raw.(map[string]any)
		if !ok {
			return reconfigureReq{}, invalid("dict_type", "Input should be a valid dictionary", "body")
		}
		obj = m
	}
	idx := 0
	if v, ok := obj["adapter_index"]; ok {
		n, ok := jsonInt(v)
		if !ok {
			return reconfigureReq{}, invalid("int_type", "Input should be a valid integer", "body", "adapter_index")
		}
		idx = int(n)
		delete(obj, "adapter_index")
	}
	if backend != "dax" {
		return reconfigureReq{AdapterIndex: idx, Args: obj}, nil
	}
	fields, ok := daxFields[op]
	if !ok {
		return reconfigureReq{}, errf(ErrBadRequest, "unsupported dax reconfigure operation: %s", op)
	}
	for k := range obj {
		if !fields[k] {
			return reconfigureReq{}, invalid("extra_forbidden", "Extra inputs are not permitted", "body", k)
		}
	}
	args := map[string]any{}
	path, ok := obj["device_path"]
	if !ok {
		return reconfigureReq{}, missing("body", "device_path")
	}
	ps, ok := path.(string)
	if !ok {
		return reconfigureReq{}, invalid("string_type", "Input should be a valid string", "body", "device_path")
	}
	args["device_path"] = ps
	if fields["size"] {
		v, ok := obj["size"]
		if !ok {
			return reconfigureReq{}, missing("body", "size")
		}
		n, err := parseSize(v)
		if err != nil {
			return reconfigureReq{}, err
		}
		args["size_bytes"] = n
	}
	if fields["mode"] {
		mode := "migrate"
		if v, ok := obj["mode"]; ok {
			ms, ok := v.(string)
			allowed := op == "remove" && (ms == "migrate" || ms == "evict" || ms == "drain") ||
				op == "resize" && (ms == "migrate" || ms == "evict")
			if !ok || !allowed {
				return reconfigureReq{}, invalid("enum", "Input should be one of the supported modes", "body", "mode")
			}
			mode = ms
		}
		args["mode"] = mode
		force := false
		if v, ok := obj["force"]; ok {
			b, ok := v.(bool)
			if !ok {
				return reconfigureReq{}, invalid("bool_type", "Input should be a valid boolean", "body", "force")
			}
			force = b
		}
		args["force"] = force
	}
	return reconfigureReq{AdapterIndex: idx, Args: args}, nil
}

func jsonInt(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok || strings.ContainsAny(n.String(), ".eE") {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}

const sizeErrMsg = "size must be a positive integer byte count or a string like '100GiB'"

// parseSize accepts a JSON integer byte count or a string with a base-1024
// unit suffix ("100GiB", "1.5g"); booleans and floats are 422, anything
// that does not resolve to a positive byte count is 400.
func parseSize(v any) (int64, error) {
	switch x := v.(type) {
	case json.Number:
		n, ok := jsonInt(x)
		if !ok {
			return 0, invalid("int_type", "Input should be a valid integer or string", "body", "size")
		}
		if n <= 0 {
			return 0, errf(ErrBadRequest, sizeErrMsg)
		}
		return n, nil
	case string:
		return ParseSizeString(x)
	}
	return 0, invalid("int_type", "Input should be a valid integer or string", "body", "size")
}

// ParseSizeString parses "100GiB"-style sizes: digits or digits.digits, then
// an optional case-insensitive unit among b, k/kb/kib, m/mb/mib, g/gb/gib,
// t/tb/tib, all base 1024. The result must be positive.
func ParseSizeString(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if len(t) == 0 || len(t) > 64 {
		return 0, errf(ErrBadRequest, sizeErrMsg)
	}
	i := len(t)
	for i > 0 && (t[i-1] >= 'a' && t[i-1] <= 'z' || t[i-1] >= 'A' && t[i-1] <= 'Z') {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToLower(t[i:])
	mult, ok := sizeUnits[unit]
	if !ok || !validDecimal(num) {
		return 0, errf(ErrBadRequest, sizeErrMsg)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, errf(ErrBadRequest, sizeErrMsg)
	}
	b := f * mult
	if b >= math.MaxInt64 || int64(b) <= 0 {
		return 0, errf(ErrBadRequest, sizeErrMsg)
	}
	return int64(b), nil
}

func validDecimal(s string) bool {
	intPart, frac, hasDot := strings.Cut(s, ".")
	digits := func(p string) bool {
		if p == "" {
			return false
		}
		for _, c := range p {
			if c < '0' || c > '9' {
				return false
			}
		}
		return true
	}
	if !digits(intPart) {
		return false
	}
	return !hasDot || digits(frac)
}

func (s *Server) handleReconfigure(w http.ResponseWriter, r *http.Request) error {
	backend, op := normSeg(r.PathValue("backend")), normSeg(r.PathValue("operation"))
	if backend == "" || op == "" {
		return errf(ErrBadRequest, "backend and operation must be non-empty")
	}
	body, err := s.readBody(w, r, maxSmallBody)
	if err != nil {
		return err
	}
	req, err := decodeReconfigure(backend, op, body)
	if err != nil {
		return err
	}
	e, err := s.engineOr("engine not initialized")
	if err != nil {
		return err
	}
	ads := s.backendAdapters(e, backend)
	if req.AdapterIndex < 0 || req.AdapterIndex >= len(ads) {
		return errf(ErrNotFound, "%s adapter not found", backend)
	}
	res, err := e.Reconfigure(r.Context(), ads[req.AdapterIndex].Index, op, req.Args)
	if err != nil {
		return fmt.Errorf("%s %s: %w", backend, op, err)
	}
	return writeRedactedJSON(w, http.StatusOK, newReconfigureResponse(res, req.AdapterIndex))
}
