package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/httpapi"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

func marker(t *testing.T, what string) string {
	t.Helper()
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return what + "-marker-" + hex.EncodeToString(b)
}

// TestSecuritySecretsNeverLeave plants secret markers in the S3 adapter
// JSON (aws_secret_access_key, served by a real versitygw that accepts it),
// in the environment (AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
// LMCACHE_HTTP_AUTH_TOKEN) and in a flag (--http-auth-token), runs the real
// binary at DEBUG, calls every GET route of the route table with the
// right token and /run_script with app.config(), app.status() and
// app.adapters(), and checks that no marker appears in any response body
// or any line the server logged.
func TestSecuritySecretsNeverLeave(t *testing.T) {
	s3 := s3test.Versity(t)
	flagTok := marker(t, "flagtoken")
	envTok := marker(t, "envtoken")
	envAWS := marker(t, "envaws")
	envSess := marker(t, "envsession")
	secrets := []string{s3.SecretKey, flagTok, envTok, envAWS, envSess}
	adapter, _ := json.Marshal(map[string]any{
		"type": "s3", "s3_endpoint": s3.Endpoint, "s3_region": s3test.Region, "disable_tls": true,
		"s3_addressing_style": "path", "s3_bucket": s3.Bucket,
		"aws_access_key_id": s3.AccessKey, "aws_secret_access_key": s3.SecretKey,
	})
	httpPort := freePort(t)
	base := "http://127.0.0.1:" + itoa(httpPort)
	srv := start(t, "server", []string{"AWS_SECRET_ACCESS_KEY=" + envAWS, "AWS_SESSION_TOKEN=" + envSess, "LMCACHE_HTTP_AUTH_TOKEN=" + envTok},
		"server", "--http-port", itoa(httpPort), "--port", itoa(freePort(t)), "--l1-size-gb", "0.0625",
		"--http-auth-token", flagTok, "--l2-adapter", string(adapter), "--run-script-api-enabled", "--log-level", "DEBUG")
	waitFor(t, "healthcheck", healthy(base+"/healthcheck"))
	auth := "Bearer " + flagTok

	var bodies []string
	get := func(path string) (int, string) {
		req, err := http.NewRequest("GET", base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", auth)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		bodies = append(bodies, path+"\n"+string(b))
		return resp.StatusCode, string(b)
	}
	gets := 0
	for _, r := range httpapi.Routes() {
		if r.Method != "GET" {
			continue
		}
		path := strings.NewReplacer("{request_id}", "x", "{cache_salt}", "alice", "{backend}", "s3", "{thread_name}", "x").Replace(r.Path)
		switch r.Path {
		case "/debug/pprof/profile", "/debug/pprof/trace":
			path += "?seconds=1"
		}
		if code, body := get(path); code == http.StatusUnauthorized || code >= 500 && code != http.StatusServiceUnavailable {
			t.Errorf("GET %s: %d %.300s", path, code, body)
		}
		gets++
	}
	// The routes where the secrets would be, read in their verbose forms.
	for _, p := range []string{"/debug/pprof/goroutine?debug=2", "/loglevel", "/env", "/config"} {
		get(p)
	}
	if gets < 20 {
		t.Fatalf("only %d GET routes walked", gets)
	}
	// The config is there, only redacted: the bucket shows, the key does not.
	if _, cfg := get("/config"); !strings.Contains(cfg, s3.Bucket) || !strings.Contains(cfg, httpapi.Redacted) {
		t.Fatalf("/config = %.2000s", cfg)
	}

	code, out := postScript(t, base, auth, "c = str(app.config())\nprint(c)\nprint(str(app.adapters()))\nresult = c + str(app.status())\n")
	if code != 200 || !strings.Contains(out, s3.Bucket) {
		t.Fatalf("run_script: %d %.500s", code, out)
	}
	bodies = append(bodies, "/run_script\n"+out)

	srv.Stop(t)
	logs := srv.Output(t)
	if !strings.Contains(logs, "run_script output") || !strings.Contains(logs, "lmcache server configuration") || !strings.Contains(logs, s3.Bucket) {
		t.Fatalf("DEBUG log lacks the script output or the configuration line:\n%s", tail([]byte(logs), 3000))
	}
	for _, sec := range secrets {
		for _, b := range bodies {
			if strings.Contains(b, sec) {
				path, _, _ := strings.Cut(b, "\n")
				t.Errorf("%s leaks a secret marker", path)
			}
		}
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, sec) {
				t.Errorf("log line leaks a secret marker: %.300s", strings.ReplaceAll(line, sec, "<MARKER>"))
			}
		}
	}
}
