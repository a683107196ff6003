// Package redact hides credentials in configuration before it leaves the
// process: HTTP responses (/config, /env, /status, script app.config()),
// startup logs and error messages. One definition of "secret-looking" is
// shared by the MP server and the coordinator so the two never disagree.
//
// A value is hidden when its name looks secret (IsSecretName). Values that
// are themselves JSON documents (the --l2-adapter flag is a JSON string
// inside the config) are parsed and redacted inside, so a secret nested in
// a string is caught too.
package redact

import (
	"bytes"
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
)

// Marker replaces every redacted value.
const Marker = "***REDACTED***"

// secretParts are substrings that mark a credential wherever they appear
// in a normalized name (lower case, "-" as "_"). The list is deliberately
// broad: a false positive hides a harmless value, a false negative leaks a
// key. "key" alone is too broad (cache keys, key counts), so only the
// credential forms of it are listed.
var secretParts = []string{
	"secret", "passw", "passphrase", "credential", "private_key", "privatekey",
	"api_key", "apikey", "access_key", "accesskey", "key_id", "cookie",
	"signature", "bearer", "authorization", "sessiontoken",
}

// secretWord matches a whole "_"-separated word that marks a credential:
// "token" (auth_token, HF_TOKEN) but not "tokens" (max_tokens) or
// "tokenizer", and "auth" (LMCACHE_AUTH) but not "author".
var secretWord = regexp.MustCompile(`(^|_)(token|auth|pat|jwt|sas|otp)($|_)|[a-z]token($|_)`)

// tokenIDs are names about model tokens (token ids, counts, per-token
// sizes such as /status's cache_size_per_token), not credentials.
var tokenIDs = regexp.MustCompile(`(^|_)token_(ids?|count|len|offset)($|_)|(^|_)per_token($|_)`)

// IsSecretName reports whether a field, flag or variable with this name
// should have its value hidden.
func IsSecretName(name string) bool {
	n := strings.ToLower(strings.TrimLeft(name, "-"))
	n = strings.ReplaceAll(n, "-", "_")
	if tokenIDs.MatchString(n) {
		return false
	}
	for _, p := range secretParts {
		if strings.Contains(n, p) {
			return true
		}
	}
	return secretWord.MatchString(n)
}

// Value returns a redacted deep copy of a JSON-shaped value (maps with
// string keys, slices, scalars; other types are returned as they are). The
// input is never modified.
func Value(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			if IsSecretName(k) && e != nil && e != "" {
				out[k] = Marker
				continue
			}
			out[k] = Value(e)
		}
		return out
	case map[string]map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = Value(e)
		}
		return out
	case map[string]string:
		out := make(map[string]any, len(x))
		for k, e := range x {
			if IsSecretName(k) && e != "" {
				out[k] = Marker
				continue
			}
			out[k] = String(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = Value(e)
		}
		return out
	case []string:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = String(e)
		}
		return out
	case string:
		return String(x)
	}
	return v
}

// String redacts a string that may hold a JSON document (an --l2-adapter
// value) or a URL with a password (postgres://user:pw@host); any other
// string is returned unchanged.
func String(s string) string {
	if strings.Contains(s, "://") && strings.Contains(s, "@") {
		if u, err := url.Parse(strings.TrimSpace(s)); err == nil && u.User != nil {
			if _, has := u.User.Password(); has {
				// url.URL would percent-escape the marker's "*"s, so a
				// placeholder password is swapped for it in the text.
				u.User = url.UserPassword(u.User.Username(), "x")
				return strings.Replace(u.String(), ":x@", ":"+Marker+"@", 1)
			}
		}
	}
	t := strings.TrimSpace(s)
	if len(t) < 2 || (t[0] != '{' && t[0] != '[') {
		return s
	}
	out := JSON([]byte(t))
	if bytes.Equal(out, []byte(t)) {
		return s
	}
	return string(out)
}

// JSON redacts a JSON document. Input that is not valid JSON cannot be
// inspected field by field, so it is replaced by Marker whole rather than
// risk passing a secret through.
func JSON(b []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return []byte(`"` + Marker + `"`)
	}
	if !hasSecret(v) {
		return b
	}
	out, err := json.Marshal(Value(v))
	if err != nil {
		return []byte(`"` + Marker + `"`)
	}
	return out
}

// hasSecret reports whether Value would change v, so JSON can return
// untouched documents byte for byte.
func hasSecret(v any) bool {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if IsSecretName(k) && e != nil && e != "" || hasSecret(e) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if hasSecret(e) {
				return true
			}
		}
	case string:
		return String(x) != x
	}
	return false
}

// Env redacts an environment list ("NAME=value" entries, as os.Environ
// returns): values of secret-looking names become Marker, and JSON values
// are redacted inside.
func Env(environ []string) []string {
	out := make([]string, len(environ))
	for i, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			out[i] = kv
		case IsSecretName(k) && v != "":
			out[i] = k + "=" + Marker
		default:
			out[i] = k + "=" + String(v)
		}
	}
	return out
}

// Args redacts a command line: the value of a secret-looking flag
// (--http-auth-token X or --http-auth-token=X) becomes Marker, and JSON
// flag values (--l2-adapter '{...}') are redacted inside.
func Args(args []string) []string {
	out := make([]string, len(args))
	hideNext := false
	for i, a := range args {
		switch {
		case hideNext:
			out[i] = Marker
			hideNext = false
		case strings.HasPrefix(a, "-"):
			name, val, hasVal := strings.Cut(a, "=")
			switch {
			case !IsSecretName(name):
				if hasVal {
					out[i] = name + "=" + String(val)
				} else {
					out[i] = a
				}
			case hasVal:
				out[i] = name + "=" + Marker
			default:
				out[i] = a
				hideNext = true
			}
		default:
			out[i] = String(a)
		}
	}
	return out
}

// Secrets hides known secret values (an auth token, a key read from a
// file) wherever they appear in s, for text that has no field names to go
// by (error messages, script output). Empty and very short values are
// ignored: replacing every "a" would garble the text and protect nothing.
func Secrets(s string, secrets ...string) string {
	for _, sec := range secrets {
		if len(sec) >= 4 {
			s = strings.ReplaceAll(s, sec, Marker)
		}
	}
	return s
}

// Collect returns the values Value would hide in v (secret-named fields,
// also inside JSON strings), so free text built from the same data (an
// error message, script output) can be scrubbed with Secrets.
func Collect(v any) []string {
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if s, ok := e.(string); ok && IsSecretName(k) && s != "" {
					out = append(out, s)
					continue
				}
				walk(e)
			}
		case map[string]map[string]any:
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		case []string:
			for _, e := range x {
				walk(e)
			}
		case string:
			t := strings.TrimSpace(x)
			if len(t) >= 2 && (t[0] == '{' || t[0] == '[') {
				dec := json.NewDecoder(strings.NewReader(t))
				dec.UseNumber()
				var doc any
				if dec.Decode(&doc) == nil {
					walk(doc)
				}
			}
		}
	}
	walk(v)
	return out
}
