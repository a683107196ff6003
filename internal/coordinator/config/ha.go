package config

import (
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// HA configures active/standby coordinators on etcd. Ours: upstream's
// coordinator is a single process. With EtcdEndpoints empty (the default)
// none of it applies and the coordinator runs exactly as without it.
type HA struct {
	// EtcdEndpoints is the comma-separated etcd client URLs; non-empty
	// turns HA on.
	EtcdEndpoints string
	// LeaseTTL is the leadership lease TTL in whole seconds: a leader that
	// dies is replaced about this long after its last renewal.
	LeaseTTL int
	// AdvertiseURL is the base URL clients reach this coordinator at; it
	// is the election value, so standbys redirect intent writes to it.
	// Empty: http://<hostname>:<port>.
	AdvertiseURL string
	// EtcdPrefix roots every key the coordinators keep in etcd: the
	// election under <prefix>leader, intent under <prefix>intent/.
	EtcdPrefix string
}

// Defaults of the HA settings.
const (
	DefaultHALeaseTTL   = 5
	DefaultHAEtcdPrefix = "/lmcache/coordinator/"
	// MinHALeaseTTL is the shortest lease accepted: etcd needs about 1.5
	// election timeouts of slack, and renewals are sent three times per
	// two thirds of the TTL.
	MinHALeaseTTL = 2
)

// DefaultHA is HA off with the documented defaults.
func DefaultHA() HA {
	return HA{LeaseTTL: DefaultHALeaseTTL, EtcdPrefix: DefaultHAEtcdPrefix}
}

// Enabled reports whether HA mode is on.
func (h HA) Enabled() bool { return strings.TrimSpace(h.EtcdEndpoints) != "" }

// Endpoints splits EtcdEndpoints (validated by Load: no empty element).
func (h HA) Endpoints() []string {
	var out []string
	for _, ep := range strings.Split(h.EtcdEndpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			out = append(out, ep)
		}
	}
	return out
}

// ID is this coordinator's identity in HA mode (the election value and the
// URL standbys redirect to): AdvertiseURL without a trailing slash, or
// http://<hostname>:<port> when it is empty. It is stable across restarts
// of the same coordinator as long as its advertised URL (or hostname and
// port, as a StatefulSet pod keeps them) is.
func (h HA) ID(port int) (string, error) {
	if id := strings.TrimSuffix(h.AdvertiseURL, "/"); id != "" {
		return id, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("--ha-advertise-url unset and no hostname: %w", err)
	}
	return "http://" + host + ":" + strconv.Itoa(port), nil
}

// haFields are the HA rows of the settings table.
func haFields() []field {
	return []field{
		{flag: "ha-etcd-endpoints", env: "HA_ETCD_ENDPOINTS", kind: "string", usage: "comma-separated etcd client URLs; set, coordinators elect one leader (active/standby) and keep quotas, the default limit and pins in etcd (empty: single coordinator)",
			s: func(c *Config) *string { return &c.HA.EtcdEndpoints }, check: func(c Config) string {
				if !c.HA.Enabled() {
					return ""
				}
				for _, ep := range strings.Split(c.HA.EtcdEndpoints, ",") {
					if strings.TrimSpace(ep) == "" {
						return "must not have an empty element"
					}
				}
				return ""
			}},
		{flag: "ha-lease-ttl", env: "HA_LEASE_TTL", kind: "int", usage: "seconds of the leadership lease: a dead leader is replaced about this long after its last renewal",
			i: func(c *Config) *int { return &c.HA.LeaseTTL }, check: func(c Config) string { return rangeInt(c.HA.LeaseTTL, MinHALeaseTTL, 3600) }},
		{flag: "ha-advertise-url", env: "HA_ADVERTISE_URL", kind: "string", usage: "base URL clients reach this coordinator at; standbys redirect intent writes to the leader's (empty: http://<hostname>:<port>)",
			s: func(c *Config) *string { return &c.HA.AdvertiseURL }, check: func(c Config) string { return checkAdvertise(c.HA.AdvertiseURL) }},
		{flag: "ha-etcd-prefix", env: "HA_ETCD_PREFIX", kind: "string", usage: "etcd key prefix of the election (<prefix>leader) and the intent (<prefix>intent/)",
			s: func(c *Config) *string { return &c.HA.EtcdPrefix }, check: func(c Config) string {
				if !strings.HasPrefix(c.HA.EtcdPrefix, "/") || !strings.HasSuffix(c.HA.EtcdPrefix, "/") {
					return "must start and end with /"
				}
				return ""
			}},
	}
}

func checkAdvertise(s string) string {
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || strings.TrimSuffix(u.Path, "/") != "" {
		return "must be an http:// or https:// base URL without path or query (got " + strconv.Quote(s) + ")"
	}
	return ""
}
