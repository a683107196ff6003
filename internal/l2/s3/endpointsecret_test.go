package s3_test

import (
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/redact"
)

// TestEndpointErrorsHideCredentials: an s3_endpoint carrying credentials
// ("http://minioadmin:pw@localhost:9000", a common MinIO form) that is
// refused used to be quoted whole in the error, which reaches the start-up
// log: the password with it. The error still names the host. Such
// credentials in an http(s) URL are refused: the SDK does not use them.
func TestEndpointErrorsHideCredentials(t *testing.T) {
	for ep, want := range map[string]string{
		// credentials in an http(s) URL are refused, not dropped (the SDK
		// would sign with the default chain's instead), with or without
		// a bucket in the host
		"http://minioadmin:hunter2@localhost:9000": `s3_endpoint "http://` + redact.Marker + `@localhost:9000" carries credentials, which are not used`,
		"https://AKIAX:hunter2@kv.s3.example":      `s3_endpoint "https://` + redact.Marker + `@kv.s3.example" carries credentials, which are not used`,
		// no scheme: url.Parse reads "minio" as the scheme
		"minio:hunter2@localhost:9000": `s3_endpoint "` + redact.Marker + `@localhost:9000" is not a host`,
		// a bad escape fails url.Parse
		"https://u:hun%zzter2@host": `s3_endpoint "https://` + redact.Marker + `@host" is not a host`,
		"s3://u:hunter2@bucket":     `s3_endpoint "s3://` + redact.Marker + `@bucket" is not a host`,
		// "://" inside the password is not a scheme
		"u:hun://ter2@host": `s3_endpoint "` + redact.Marker + `@host" is not a host`,
	} {
		_, err := l2.ParseSpec(1, []byte(`{"type":"s3","s3_endpoint":"`+ep+`","s3_region":"r"}`))
		if err == nil {
			t.Errorf("%s: accepted", ep)
			continue
		}
		if strings.Contains(err.Error(), "hun") {
			t.Errorf("%s: error leaks the password: %v", ep, err)
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q, want it to hold %q", ep, err, want)
		}
	}
}
