package coordinator

import (
	"math"
	"net/http"
	"sort"

	"github.com/lmcache-go/lmcache/internal/coordinator/quota"
)

// maxQuotas bounds the quota table for client requests (quota.MaxQuotas,
// the MP server's bound); a variable so tests can lower it.
var maxQuotas = quota.MaxQuotas

// tooManyQuotas counts and builds the refusal of a new salt at the bound:
// 400 like the MP server's, as the spec's PUT /quota/{cache_salt} lists 400
// for a request refused for its value (422 is field validation, which the
// body passed).
func (s *Server) tooManyQuotas(held int) error {
	s.metrics.quotasRefused.Inc()
	return withMsg(ErrBadRequest, "too many quotas: at most %d cache_salt limits may be registered and %d are; delete unused ones first (updating a registered salt's limit still works)", maxQuotas, held)
}

// warnQuotasOverBound logs once, at WARN, when the quota table holds more
// than maxQuotas entries after a restore (the state file, or the intent
// mirrored from etcd), as one written by a version with a larger bound or
// none does. Every entry is kept (each was accepted once) and new salts are
// refused until the table is below the bound; the line repeats only if the
// table goes over again after being within it.
func (s *Server) warnQuotasOverBound(source string) {
	if n, first := s.quotas.OverBound(maxQuotas); first {
		s.log.Warn("quota table is over its bound: every entry kept, new cache_salts are refused until it is below the bound; delete unused quotas",
			"from", source, "quotas", n, "max_quotas", maxQuotas)
	}
}

// pathSalt maps the _default sentinel to the empty salt.
func pathSalt(r *http.Request) string {
	s := r.PathValue("cache_salt")
	if s == "_default" {
		return ""
	}
	return s
}

// positiveZero turns -0.0 into 0.0 so neither a reply nor a log line shows
// "-0" for a limit of zero.
func positiveZero(v float64) float64 {
	if v == 0 {
		return 0
	}
	return v
}

// limitGB validates a GiB limit: negative is a field error (422, as
// upstream's Pydantic ge=0), non-finite is 400 (upstream crashes with 500).
func limitGB(f *fields, name string, v float64) (int64, error) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, badRequest("invalid quota limit: %s must be finite", name)
	}
	if v < 0 {
		return 0, invalid(detailItem{Type: "greater_than_equal", Loc: f.at(name), Msg: "Input should be greater than or equal to 0", Input: v, Ctx: map[string]any{"ge": 0}})
	}
	b, err := quota.BytesFromGB(v)
	if err != nil {
		return 0, badRequest("invalid quota limit: %s is too large", name)
	}
	return b, nil
}

func (s *Server) handlePutQuotaConfig(w http.ResponseWriter, r *http.Request) error {
	f, err := bodyObject(w, r, smallBodyLimit)
	if err != nil {
		return err
	}
	v, present, null := f.numberOrInf("default_limit_gb", false, true)
	if err := f.err(); err != nil {
		return err
	}
	if err := f.tier(); err != nil {
		return err
	}
	// A missing field means null, as upstream (the field defaults to None):
	// PUT {} re-exempts unquota'd salts.
	if !present || null {
		if err := s.setDefaultLimit(r.Context(), nil); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, DefaultLimitResponse{})
		return nil
	}
	b, err := limitGB(f, "default_limit_gb", v)
	if err != nil {
		return err
	}
	v = positiveZero(v)
	if err := s.setDefaultLimit(r.Context(), &b); err != nil {
		return err
	}
	s.log.Info("default quota limit set", "default_limit_gb", v)
	g := pyFloat(v)
	writeJSON(w, http.StatusOK, DefaultLimitResponse{DefaultLimitGB: &g})
	return nil
}

func (s *Server) handleGetQuotaConfig(w http.ResponseWriter, r *http.Request) error {
	if err := queryTier(r); err != nil {
		return err
	}
	var out *pyFloat
	if d := s.quotas.Default(); d != nil {
		g := pyFloat(quota.GB(*d))
		out = &g
	}
	writeJSON(w, http.StatusOK, DefaultLimitResponse{DefaultLimitGB: out})
	return nil
}

func (s *Server) handlePutQuota(w http.ResponseWriter, r *http.Request) error {
	salt := pathSalt(r)
	f, err := bodyObject(w, r, smallBodyLimit)
	if err != nil {
		return err
	}
	v, _, _ := f.numberOrInf("limit_gb", true, false)
	if err := f.err(); err != nil {
		return err
	}
	if err := f.tier(); err != nil {
		return err
	}
	b, err := limitGB(f, "limit_gb", v)
	if err != nil {
		return err
	}
	v = positiveZero(v)
	if err := s.setQuota(r.Context(), salt, b); err != nil {
		return err
	}
	s.log.Info("quota set", "cache_salt", salt, "limit_gb", v)
	writeJSON(w, http.StatusOK, QuotaResponse{CacheSalt: salt, LimitGB: pyFloat(v), Status: "ok"})
	return nil
}

func (s *Server) handleDeleteQuota(w http.ResponseWriter, r *http.Request) error {
	salt := pathSalt(r)
	if err := queryTier(r); err != nil {
		return err
	}
	status := "not_found"
	removed, err := s.deleteQuota(r.Context(), salt)
	if err != nil {
		return err
	}
	if removed {
		status = "removed"
		s.log.Info("quota removed", "cache_salt", salt)
	}
	writeJSON(w, http.StatusOK, QuotaResponse{CacheSalt: salt, LimitGB: pyFloat(0), Status: status})
	return nil
}

type saltStatus struct {
	CacheSalt    string  `json:"cache_salt"`
	QuotaLimitGB pyFloat `json:"quota_limit_gb"`
	QuotaExists  bool    `json:"quota_exists"`
	UsageGB      pyFloat `json:"usage_gb"`
}

func (s *Server) status(salt string, usage int64) saltStatus {
	lim, ok := s.quotas.Get(salt)
	return saltStatus{CacheSalt: salt, QuotaLimitGB: pyFloat(quota.GB(lim)), QuotaExists: ok, UsageGB: pyFloat(quota.GB(usage))}
}

func (s *Server) handleGetQuota(w http.ResponseWriter, r *http.Request) error {
	salt := pathSalt(r)
	if err := queryTier(r); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.status(salt, s.ledger.SaltUsage(salt)))
	return nil
}

func (s *Server) handleListQuota(w http.ResponseWriter, r *http.Request) error {
	if err := queryTier(r); err != nil {
		return err
	}
	usage, total := s.ledger.Usage()
	names := map[string]struct{}{}
	for k := range usage {
		names[k] = struct{}{}
	}
	for _, k := range s.quotas.Salts() {
		names[k] = struct{}{}
	}
	sorted := make([]string, 0, len(names))
	for k := range names {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	rows := make([]saltStatus, 0, len(sorted))
	for _, k := range sorted {
		rows = append(rows, s.status(k, usage[k]))
	}
	writeJSON(w, http.StatusOK, UsageResponse{TotalGB: pyFloat(quota.GB(total)), ByCacheSalt: rows})
	return nil
}
