package cliflag

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigSyntaxErrorQuotesNoValue: a malformed config file is reported
// by file, line, column and key, never by the text the parser stopped at,
// since that text may be a secret (the parsers quote it: TOML's "expected
// value but found \"truehunter2…\"", YAML's "unknown anchor 'hunter2…'").
func TestConfigSyntaxErrorQuotesNoValue(t *testing.T) {
	const secret = "hunter2s3cr3t"
	dir := t.TempDir()
	for i, c := range []struct {
		name, body string
		secret     string
		want       string // after "<subject>: <path>"
	}{
		{"a.toml", "chunk_size = 1\nauth_token = true" + secret + "\n", secret,
			` line 2 column 14: malformed TOML (after key "auth_token")`},
		{"b.toml", "chunk_size = 1\n\nauth_token = 0123456789\n", "0123456789",
			` line 3 column 14: malformed TOML (after key "auth_token")`},
		{"c.toml", "name = 99999999999999999999" + "\n", "99999999999999999999",
			` line 1 column 8: malformed TOML (after key "name")`},
		{"d.toml", "name = \"https://u:" + secret + "@h/\\q\"\n", secret,
			` line 1 column 9: malformed TOML (after key "name")`},
		// yaml.v3 gives this error no position at all.
		{"e.yaml", "chunk_size: 1\nauth_token: *" + secret + "\n", secret,
			`: malformed YAML`},
		{"f.yaml", "chunk_size: 1\nname: \"https://u:" + secret + "@h/\\q\"\n", secret,
			` line 2: malformed YAML`},
		{"g.yaml", "adapter:\n  ? [fs, " + secret + "]\n  : 1\n", secret,
			` line 1: cannot decode the mapping (a key that is a list or mapping, or a repeated key)`},
	} {
		path := filepath.Join(dir, c.name)
		if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		subject := "--config-file: "
		if c.name == "g.yaml" {
			subject = "--adapter: "
		}
		err := newSettings().set.Parse([]string{"--config-file", path}, env(nil))
		if err == nil {
			t.Errorf("%d %s: no error", i, c.name)
			continue
		}
		if strings.Contains(err.Error(), c.secret) {
			t.Errorf("%d %s: error quotes the value: %v", i, c.name, err)
		}
		if want := subject + path + c.want; err.Error() != want {
			t.Errorf("%d %s:\n got %v\nwant %s", i, c.name, err, want)
		}
	}
}
