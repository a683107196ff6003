package config

import (
	"bytes"
	"slices"
	"testing"
)

// TestHAFlags: the HA settings off by default, from flags over env vars,
// and each invalid value refused with a one-line error naming its flag.
func TestHAFlags(t *testing.T) {
	c, err := Load(nil, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.HA.Enabled() || c.HA.LeaseTTL != 5 || c.HA.EtcdPrefix != "/lmcache/coordinator/" || c.HA.AdvertiseURL != "" {
		t.Fatalf("defaults: %+v", c.HA)
	}
	e := map[string]string{EnvPrefix + "HA_ETCD_ENDPOINTS": "http://e1:2379", EnvPrefix + "HA_LEASE_TTL": "7",
		EnvPrefix + "HA_ADVERTISE_URL": "http://env:1", EnvPrefix + "HA_ETCD_PREFIX": "/env/"}
	c, err = Load(nil, env(e), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (HA{EtcdEndpoints: "http://e1:2379", LeaseTTL: 7, AdvertiseURL: "http://env:1", EtcdPrefix: "/env/"}); c.HA != want {
		t.Fatalf("env: %+v, want %+v", c.HA, want)
	}
	c, err = Load([]string{"--ha-etcd-endpoints", " http://a:2379, http://b:2379 ", "--ha-lease-ttl", "3",
		"--ha-advertise-url", "https://coord-0.svc:9300/", "--ha-etcd-prefix", "/x/y/"}, env(e), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.HA.Enabled() || c.HA.LeaseTTL != 3 || c.HA.AdvertiseURL != "https://coord-0.svc:9300/" || c.HA.EtcdPrefix != "/x/y/" {
		t.Fatalf("flags: %+v", c.HA)
	}
	if got := c.HA.Endpoints(); !slices.Equal(got, []string{"http://a:2379", "http://b:2379"}) {
		t.Fatalf("endpoints %q", got)
	}
	for _, bad := range []struct {
		args       []string
		name, rule string
	}{
		{[]string{"--ha-etcd-endpoints", "http://a:2379,,http://b:2379"}, "--ha-etcd-endpoints", "empty element"},
		{[]string{"--ha-lease-ttl", "1"}, "--ha-lease-ttl", "between 2 and 3600"},
		{[]string{"--ha-advertise-url", "coord:9300"}, "--ha-advertise-url", "http:// or https://"},
		{[]string{"--ha-advertise-url", "http://c:9300/api"}, "--ha-advertise-url", "without path"},
		{[]string{"--ha-etcd-prefix", "lmcache"}, "--ha-etcd-prefix", "start and end with /"},
	} {
		_, err := Load(bad.args, env(nil), &bytes.Buffer{})
		checkErr(t, err, bad.name, bad.rule)
	}
}
