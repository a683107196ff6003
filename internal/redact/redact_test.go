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

// TestURLPasswordReservedChars: a password with a character url.Parse
// rejects or reads as a delimiter ("#", "/", "?", a space, a bad "%"
// escape) is hidden all the same; the old code parsed the URL, got an
// error or no userinfo, and returned the whole text.
func TestURLPasswordReservedChars(t *testing.T) {
	cases := map[string]string{
		"redis://:ab#cd@cache:6379/0":      "redis://:" + redact.Marker + "@cache:6379/0",
		"redis://:12#cd@cache:6379/0":      "redis://:" + redact.Marker + "@cache:6379/0",
		"postgres://app:pa/ss@db:5432/x":   "postgres://app:" + redact.Marker + "@db:5432/x",
		"postgres://app:p?w@db/x":          "postgres://app:" + redact.Marker + "@db/x",
		"postgres://app:p w@db/x":          "postgres://app:" + redact.Marker + "@db/x",
		"postgres://app:p%zz@db/x":         "postgres://app:" + redact.Marker + "@db/x",
		"http://user:p@ss#1@coord:9000/":   "http://user:" + redact.Marker + "@coord:9000/",
		"  redis://:ab#cd@cache:6379/0":    "  redis://:" + redact.Marker + "@cache:6379/0",
		"https://host/users/a@b.example/x": "https://host/users/a@b.example/x",
		// The documented false positive: a port and an "@" later in the
		// path read as userinfo, so "9000/a" is hidden (nothing leaks).
		"http://h:9000/a@b":                  "http://h:" + redact.Marker + "@b",
		"not a url: a:b@c, see http://x/y z": "not a url: a:b@c, see http://x/y z",
	}
	for in, want := range cases {
		if got := redact.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
	env := redact.Env([]string{"LMCACHE_COORDINATOR_URL=http://u:hun#ter2@coord:9000"})
	if want := "LMCACHE_COORDINATOR_URL=http://u:" + redact.Marker + "@coord:9000"; env[0] != want {
		t.Errorf("Env = %q, want %q", env[0], want)
	}
}

// TestURLQuerySecrets: credentials carried in a URL's query (a DSN's
// password=, a presigned S3 URL's X-Amz-Signature, an Azure SAS sig=)
// are hidden, and the other parameters kept as written. A secret value
// runs to the next "&" or ";", a "#" included: a password may hold one.
func TestURLQuerySecrets(t *testing.T) {
	cases := map[string]string{
		"postgres://db:5432/x?sslmode=off&password=hunter2":                    "postgres://db:5432/x?sslmode=off&password=" + redact.Marker,
		"redis://cache:6379/0?Password=pw1&db=0":                               "redis://cache:6379/0?Password=" + redact.Marker + "&db=0",
		"https://b.s3.example/k?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=abc": "https://b.s3.example/k?X-Amz-Credential=" + redact.Marker + "&X-Amz-Signature=" + redact.Marker,
		"https://acct.blob.example/c?sv=2024-01-01&sig=s1gn%3D&se=2030":        "https://acct.blob.example/c?sv=2024-01-01&sig=" + redact.Marker + "&se=2030",
		"https://host/p?api_key=k1#frag":                                       "https://host/p?api_key=" + redact.Marker,
		"http://host:9000/bucket?max_tokens=5&token=":                          "http://host:9000/bucket?max_tokens=5&token=",
	}
	for in, want := range cases {
		if got := redact.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCollectMatchesValue: Collect returns what Value hides, so an error
// message quoting the same configuration (a URL that failed validation, a
// number-valued password in adapter JSON, a nested credentials object) is
// scrubbed too. The old Collect returned none of these.
func TestCollectMatchesValue(t *testing.T) {
	cfg := map[string]map[string]any{
		"coordinator": {"coordinator_url": "ftp://u:pw-in-url@coord:9000"},
		"storage_manager": {"l2_adapter": []string{
			`{"type":"redis","url":"redis://cache/0?password=pw-in-query","password":12345678,"credentials":{"user":"bob-user","pass":"nested-pw"}}`,
		}},
		"http": {"env": map[string]string{"DB_PASSWORD": "env-pw"}},
	}
	got := strings.Join(redact.Collect(cfg), ",")
	for _, want := range []string{"pw-in-url", "pw-in-query", "12345678", "bob-user", "nested-pw", "env-pw"} {
		if !strings.Contains(","+got+",", ","+want+",") {
			t.Errorf("Collect = %q, missing %q", got, want)
		}
	}
	msg := `coordinator url "ftp://u:pw-in-url@coord:9000": want http(s)://host[:port]`
	if got := redact.Secrets(msg, redact.Collect(cfg)...); got != `coordinator url "ftp://u:`+redact.Marker+`@coord:9000": want http(s)://host[:port]` {
		t.Errorf("Secrets = %q", got)
	}
}

// TestSecretsOverlapping: when one secret contains another, the longer is
// replaced whole; the old code replaced in argument order and left the
// longer one's tail ("1234xyz") in the text.
func TestSecretsOverlapping(t *testing.T) {
	if got := redact.Secrets("token abcd1234xyz", "abcd", "abcd1234xyz"); got != "token "+redact.Marker {
		t.Fatalf("Secrets = %q", got)
	}
}

// TestCollectDecodedURLSecret: a percent-escaped URL credential is
// collected as written and decoded, so an error quoting either is scrubbed.
func TestCollectDecodedURLSecret(t *testing.T) {
	got := redact.Collect([]string{"https://b.s3.example/k?X-Amz-Signature=ab%2Fcd+ef"})
	if strings.Join(got, ",") != "ab%2Fcd+ef,ab/cd+ef,ab/cd ef" {
		t.Fatalf("Collect = %q", got)
	}
}

// FuzzString: String never panics, and redacting twice changes nothing
// more (the marker holds no "@", "&" or ";" that would move a boundary).
func FuzzString(f *testing.F) {
	for _, s := range []string{"redis://:ab#cd@cache:6379/0", "http://u:p@ss#1@h/?password=x&y=1", "postgres://db/x?sslmode=off;password=p#q", "s3://b", `{"url":"redis://:p@h"}`, " x://@?&;="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		once := redact.String(s)
		if twice := redact.String(once); twice != once {
			t.Fatalf("String(%q) = %q, again %q", s, once, twice)
		}
	})
}

// TestURLUserOnlyCredential: a userinfo with no password (a GitHub-style
// token or an API key passed as the user, "TOKEN:" with an empty password
// too) is hidden whole, scheme, host and path kept; a user with a
// password stays visible, and an "@" in the path or query is not
// userinfo. The old code hid only passwords and returned these URLs
// unchanged.
func TestURLUserOnlyCredential(t *testing.T) {
	cases := map[string]string{
		"https://ghp_tok3n@github.com/org/repo.git": "https://" + redact.Marker + "@github.com/org/repo.git",
		"https://ghp_tok3n:@github.com/org/repo":    "https://" + redact.Marker + ":@github.com/org/repo",
		"http://apik3y@coord:9000/?x=1":             "http://" + redact.Marker + "@coord:9000/?x=1",
		"  redis://s3cr3t@cache:6379/0":             "  redis://" + redact.Marker + "@cache:6379/0",
		"postgres://app:hunter2@db/x":               "postgres://app:" + redact.Marker + "@db/x",
		"https://host/users/a@b.example/x":          "https://host/users/a@b.example/x",
		"https://host?mail=a@b.example":             "https://host?mail=a@b.example",
		"https://host#a@b":                          "https://host#a@b",
		"redis://@cache:6379/0":                     "redis://@cache:6379/0",
		"redis://:@cache:6379/0":                    "redis://:@cache:6379/0",
	}
	for in, want := range cases {
		if got := redact.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
	// Collected as written and decoded, so an error quoting it is scrubbed.
	secrets := redact.Collect(map[string]any{"remote": "https://ghp%2Ftok@github.com/x"})
	if got := redact.Secrets("clone ghp%2Ftok / ghp/tok failed", secrets...); got != "clone "+redact.Marker+" / "+redact.Marker+" failed" {
		t.Errorf("Secrets with Collect %q = %q", secrets, got)
	}
}

// TestURLQueryKey: a query parameter named exactly "key" (any case) is an
// API key and is hidden; names that merely contain "key" and are not one
// of IsSecretName's credential forms (keys, key_count, monkey) stay
// visible, and api_key / access_key / key_id are hidden as before. The
// old code passed ?key= through.
func TestURLQueryKey(t *testing.T) {
	cases := map[string]string{
		"https://maps.example/api?key=AIzaS3cret&q=x":          "https://maps.example/api?key=" + redact.Marker + "&q=x",
		"https://h/p?KEY=k1":                                   "https://h/p?KEY=" + redact.Marker,
		"https://h/p?Key=k1;x=2":                               "https://h/p?Key=" + redact.Marker + ";x=2",
		"https://h/p?k%65y=k1":                                 "https://h/p?k%65y=" + redact.Marker,
		"https://h/p?keys=a,b&key_count=2&monkey=m&cachekey=c": "https://h/p?keys=a,b&key_count=2&monkey=m&cachekey=c",
		"https://h/p?apikey=a&api-key=b&access_key=c&key_id=d": "https://h/p?apikey=" + redact.Marker + "&api-key=" + redact.Marker + "&access_key=" + redact.Marker + "&key_id=" + redact.Marker,
	}
	for in, want := range cases {
		if got := redact.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
	// Only in a URL's query: a configuration field named "key" (an object
	// or cache key) is not a credential.
	if redact.IsSecretName("key") {
		t.Error(`IsSecretName("key") = true, want false`)
	}
}

// TestEndpointHidesUserinfo: an address setting's userinfo is hidden with
// or without a scheme, whole when the password holds reserved characters,
// and a "scheme" that is really part of the password is not kept.
func TestEndpointHidesUserinfo(t *testing.T) {
	for in, want := range map[string]string{
		"http://minio:hunter2@localhost:9000": "http://" + redact.Marker + "@localhost:9000",
		"minio:hunter2@localhost:9000":        redact.Marker + "@localhost:9000",
		"https://tok3n@s3.example":            "https://" + redact.Marker + "@s3.example",
		"http://u:p#w/x@h:1":                  "http://" + redact.Marker + "@h:1",
		"user:p://w@host":                     redact.Marker + "@host",
		"http://localhost:9000":               "http://localhost:9000",
		"s3.us-east-1.amazonaws.com":          "s3.us-east-1.amazonaws.com",
	} {
		if got := redact.Endpoint(in); got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", in, got, want)
		}
	}
}
