package s3

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/redact"
)

// TypeName is the registered --l2-adapter type.
const TypeName = "s3"

// Config is the s3 adapter's configuration: upstream's keys plus a few
// lmcache-go extensions (retries, breaker, timeouts) that upstream ignores.
type Config struct {
	Endpoint         string // s3_endpoint (required)
	Region           string // s3_region (required)
	NumIOThreads     int    // s3_num_io_threads: concurrent requests (64)
	PreferHTTP2      bool   // s3_prefer_http2 (true; TLS only)
	EnableS3Express  bool   // s3_enable_s3express (accepted, unused: the SDK picks S3 Express auth for "--x-s3" buckets itself)
	DisableTLS       bool   // disable_tls
	AddressingStyle  string // s3_addressing_style: "virtual" (default) or "path"
	Bucket           string // s3_bucket (required with path style)
	CABundle         string // s3_ca_bundle: PEM file
	AccessKeyID      string // aws_access_key_id
	SecretAccessKey  string // aws_secret_access_key
	MaxCapacityBytes int64  // max_capacity_gb (0: unbounded)

	// Extensions.
	MaxAttempts      int           // s3_max_attempts: SDK attempts per request, with backoff (3)
	BreakerThreshold int           // s3_breaker_failures: consecutive failures that open the breaker (3)
	BreakerCooldown  time.Duration // s3_breaker_cooldown_s: open time before a probe (10 s)
	OpTimeout        time.Duration // s3_op_timeout_s: HEAD/DELETE/LIST timeout, as upstream's 30 s wait
	DialTimeout      time.Duration // s3_connect_timeout_s: TCP/TLS connect timeout (5 s)
	// SlowCall is s3_slow_call_s (2 s): a request still running this long
	// (plus 100 ms per MiB of body) counts toward opening the breaker as a
	// failure would, so a stalled S3 opens it without waiting OpTimeout.
	SlowCall time.Duration

	// Now replaces time.Now for the breaker (tests).
	Now func() time.Time
}

func init() {
	l2.Register(TypeName, l2.Factory{
		Parse: func(f *l2.Fields) (any, error) { return ParseConfig(f) },
		Open: func(ctx context.Context, spec l2.Spec) (l2.Adapter, error) {
			return New(ctx, spec.Options.(Config))
		},
	})
}

// Defaults returns a Config with every default filled in.
func Defaults() Config {
	return Config{
		NumIOThreads:     64,
		PreferHTTP2:      true,
		AddressingStyle:  "virtual",
		MaxAttempts:      3,
		BreakerThreshold: 3,
		BreakerCooldown:  10 * time.Second,
		OpTimeout:        30 * time.Second,
		DialTimeout:      5 * time.Second,
		SlowCall:         2 * time.Second,
	}
}

// maxSeconds bounds the seconds keys: about 146 years, half a Duration's
// range.
const maxSeconds = float64(math.MaxInt64/2) / float64(time.Second)

// ParseConfig decodes the s3 keys.
func ParseConfig(f *l2.Fields) (Config, error) {
	c := Defaults()
	var err error
	str := func(key string, dst *string) {
		if err == nil {
			*dst, err = f.String(key, *dst)
		}
	}
	boolean := func(key string, dst *bool) {
		if err == nil {
			*dst, err = f.Bool(key, *dst)
		}
	}
	posInt := func(key string, dst *int) {
		if err == nil {
			var v int64
			v, err = f.PositiveInt(key, int64(*dst))
			*dst = int(v)
		}
	}
	seconds := func(key string, dst *time.Duration) {
		if err == nil {
			var v float64
			v, err = f.Float(key, dst.Seconds())
			if err == nil && v <= 0 {
				err = fmt.Errorf("%s must be > 0, got %v", key, v)
			}
			// Out of a Duration's range the conversion wraps (negative)
			// or rounds to 0, and New would then put the default in its
			// place without a word. maxSeconds leaves room for the
			// per-MiB additions of slowLimit and transferTimeout.
			if err == nil && (v > maxSeconds || time.Duration(v*float64(time.Second)) <= 0) {
				err = fmt.Errorf("%s must be between 1e-9 and %v seconds, got %v", key, maxSeconds, v)
			}
			*dst = time.Duration(v * float64(time.Second))
		}
	}
	str("s3_endpoint", &c.Endpoint)
	str("s3_region", &c.Region)
	posInt("s3_num_io_threads", &c.NumIOThreads)
	boolean("s3_prefer_http2", &c.PreferHTTP2)
	boolean("s3_enable_s3express", &c.EnableS3Express)
	boolean("disable_tls", &c.DisableTLS)
	str("s3_addressing_style", &c.AddressingStyle)
	str("s3_bucket", &c.Bucket)
	str("s3_ca_bundle", &c.CABundle)
	str("aws_access_key_id", &c.AccessKeyID)
	str("aws_secret_access_key", &c.SecretAccessKey)
	posInt("s3_max_attempts", &c.MaxAttempts)
	posInt("s3_breaker_failures", &c.BreakerThreshold)
	seconds("s3_breaker_cooldown_s", &c.BreakerCooldown)
	seconds("s3_op_timeout_s", &c.OpTimeout)
	seconds("s3_connect_timeout_s", &c.DialTimeout)
	seconds("s3_slow_call_s", &c.SlowCall)
	if err != nil {
		return c, err
	}
	if c.MaxCapacityBytes, err = f.GiBBytes("max_capacity_gb", 0); err != nil {
		return c, err
	}
	if _, err := c.resolve(); err != nil {
		return c, err
	}
	return c, nil
}

// target is where requests go after resolving the endpoint forms.
type target struct {
	baseURL   string // "" means the SDK's regional AWS endpoint
	bucket    string
	pathStyle bool
}

// resolve turns upstream's endpoint forms into an SDK endpoint and bucket:
//
//	virtual: "s3://<bucket>.<host>", "<bucket>.<host>" (the Host header is
//	         the endpoint verbatim, as upstream), "s3://<bucket>" (AWS), or
//	         any host plus s3_bucket;
//	path:    service host ("host:port", optional http(s):// scheme) plus
//	         s3_bucket.
//
// An explicit http:// or https:// scheme wins over disable_tls.
func (c Config) resolve() (target, error) {
	if c.Endpoint == "" {
		return target{}, errors.New("s3_endpoint is required")
	}
	if c.Region == "" {
		return target{}, errors.New("s3_region is required")
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		// Upstream silently falls back to the default chain here.
		return target{}, errors.New("aws_access_key_id and aws_secret_access_key must be set together")
	}
	scheme := "https"
	if c.DisableTLS {
		scheme = "http"
	}
	host := strings.TrimPrefix(c.Endpoint, "s3://")
	if u, err := url.Parse(host); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		if u.User != nil {
			// The SDK never sends URL credentials: taken silently, the
			// adapter would sign as whatever the default chain finds.
			return target{}, fmt.Errorf("s3_endpoint %q carries credentials, which are not used; set aws_access_key_id and aws_secret_access_key (or the AWS environment variables) instead", redact.Endpoint(c.Endpoint))
		}
		scheme, host = u.Scheme, u.Host
	}
	host = strings.TrimSuffix(host, "/")
	if host == "" || strings.ContainsAny(host, "/?#@ ") {
		return target{}, fmt.Errorf("s3_endpoint %q is not a host or s3://bucket form", redact.Endpoint(c.Endpoint))
	}
	switch c.AddressingStyle {
	case "path":
		if c.Bucket == "" {
			return target{}, errors.New("s3_bucket is required with s3_addressing_style \"path\"")
		}
		return target{baseURL: scheme + "://" + host, bucket: c.Bucket, pathStyle: true}, nil
	case "virtual", "":
	default:
		return target{}, fmt.Errorf("s3_addressing_style must be \"virtual\" or \"path\", got %q", c.AddressingStyle)
	}
	if c.Bucket != "" {
		if host == c.Bucket {
			return target{bucket: c.Bucket}, nil
		}
		return target{baseURL: scheme + "://" + strings.TrimPrefix(host, c.Bucket+"."), bucket: c.Bucket}, nil
	}
	bucket, service, found := strings.Cut(host, ".")
	if !found {
		if strings.Contains(host, ":") {
			return target{}, fmt.Errorf("s3_endpoint %q names no bucket; use \"<bucket>.<host>\" or s3_addressing_style \"path\" with s3_bucket", redact.Endpoint(c.Endpoint))
		}
		return target{bucket: host}, nil // s3://<bucket> on AWS
	}
	return target{baseURL: scheme + "://" + service, bucket: bucket}, nil
}
