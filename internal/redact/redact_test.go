package redact_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/redact"
)

func TestIsSecretName(t *testing.T) {
	secret := []string{
		"aws_secret_access_key", "aws_access_key_id", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
		"session_token", "sessionToken", "http_auth_token", "--http-auth-token", "LMCACHE_HTTP_AUTH_TOKEN",
		"password", "DB_PASSWORD", "api_key", "OPENAI_API_KEY", "HF_TOKEN", "GITHUB_TOKEN", "private_key",
		"s3_credentials", "Authorization", "cookie", "client_secret", "azure_sas",
	}
	for _, n := range secret {
		if !redact.IsSecretName(n) {
			t.Errorf("IsSecretName(%q) = false, want true", n)
		}
	}
	plain := []string{
		"chunk_size", "max_tokens", "token_ids", "cache_size_per_token", "bytes_per_token", "token_offset", "num_tokens", "hash_algorithm", "active_sessions",
		"session_ttl_seconds", "l2_adapter", "bucket", "endpoint_url", "keys", "key_count", "tokenizer", "author", "HOME",
	}
	for _, n := range plain {
		if redact.IsSecretName(n) {
			t.Errorf("IsSecretName(%q) = true, want false", n)
		}
	}
}

func TestValueNestedJSONString(t *testing.T) {
	adapter := `{"type":"s3","bucket":"b","aws_access_key_id":"AKIAXXX","aws_secret_access_key":"s3cr3t-marker","nested":{"session_token":"tok-marker"}}`
	cfg := map[string]map[string]any{
		"mp":              {"http_auth_token": "t0ken-marker", "chunk_size": 256, "l2_adapter": []any{adapter}},
		"storage_manager": {"l2_adapter_json": adapter},
	}
	got := redact.Value(cfg)
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, marker := range []string{"AKIAXXX", "s3cr3t-marker", "tok-marker", "t0ken-marker"} {
		if strings.Contains(s, marker) {
			t.Fatalf("%q survives redaction: %s", marker, s)
		}
	}
	for _, keep := range []string{`"chunk_size":256`, `\"bucket\":\"b\"`, `\"type\":\"s3\"`} {
		if !strings.Contains(s, keep) {
			t.Fatalf("%s lost: %s", keep, s)
		}
	}
	// The input is untouched.
	if cfg["mp"]["http_auth_token"] != "t0ken-marker" {
		t.Fatalf("input modified: %v", cfg["mp"])
	}
}

func TestJSON(t *testing.T) {
	if got := string(redact.JSON([]byte(`{"a": 1, "b": [2]}`))); got != `{"a": 1, "b": [2]}` {
		t.Fatalf("clean document changed: %s", got)
	}
	if got := string(redact.JSON([]byte(`[{"password":"p"},{"x":"y"}]`))); got != `[{"password":"`+redact.Marker+`"},{"x":"y"}]` {
		t.Fatalf("JSON = %s", got)
	}
	if got := string(redact.JSON([]byte(`{"password":`))); got != `"`+redact.Marker+`"` {
		t.Fatalf("invalid JSON = %s", got)
	}
}

func TestEnvAndArgs(t *testing.T) {
	env := redact.Env([]string{"HOME=/root", "AWS_SECRET_ACCESS_KEY=k", "LMCACHE_L2_ADAPTER={\"password\":\"p\",\"type\":\"fs\"}", "EMPTY_TOKEN=", "NOEQUALS"})
	want := []string{"HOME=/root", "AWS_SECRET_ACCESS_KEY=" + redact.Marker, `LMCACHE_L2_ADAPTER={"password":"` + redact.Marker + `","type":"fs"}`, "EMPTY_TOKEN=", "NOEQUALS"}
	if strings.Join(env, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Env = %q, want %q", env, want)
	}
	args := redact.Args([]string{"server", "--http-auth-token", "t", "--chunk-size=256", "--http-auth-token=u", "--l2-adapter", `{"aws_secret_access_key":"s"}`})
	wantArgs := []string{"server", "--http-auth-token", redact.Marker, "--chunk-size=256", "--http-auth-token=" + redact.Marker, "--l2-adapter", `{"aws_secret_access_key":"` + redact.Marker + `"}`}
	if strings.Join(args, " ") != strings.Join(wantArgs, " ") {
		t.Fatalf("Args = %q, want %q", args, wantArgs)
	}
}

func TestSecrets(t *testing.T) {
	if got := redact.Secrets("bad token abcd1234 here", "abcd1234", "", "x"); got != "bad token "+redact.Marker+" here" {
		t.Fatalf("Secrets = %q", got)
	}
}

func TestCollect(t *testing.T) {
	cfg := map[string]map[string]any{"mp": {"http_auth_token": "tok1", "l2_adapter": []any{`{"aws_secret_access_key":"sec2","bucket":"b"}`}, "chunk_size": 256}}
	got := redact.Collect(cfg)
	if strings.Join(got, ",") != "tok1,sec2" && strings.Join(got, ",") != "sec2,tok1" {
		t.Fatalf("Collect = %q", got)
	}
	if msg := redact.Secrets("open s3: key sec2 rejected (token tok1)", got...); strings.Contains(msg, "sec2") || strings.Contains(msg, "tok1") {
		t.Fatalf("Secrets left a value: %s", msg)
	}
}

func TestURLPassword(t *testing.T) {
	if got := redact.String("postgres://app:hunter2@db:5432/x?sslmode=off"); got != "postgres://app:"+redact.Marker+"@db:5432/x?sslmode=off" {
		t.Fatalf("String(url) = %q", got)
	}
	if got := redact.String("http://host:9000/bucket"); got != "http://host:9000/bucket" {
		t.Fatalf("plain URL changed: %q", got)
	}
	env := redact.Env([]string{"DATABASE_URL=redis://:pw1@cache:6379/0"})
	if strings.Contains(env[0], "pw1") {
		t.Fatalf("Env = %q", env)
	}
}
