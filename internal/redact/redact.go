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
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"unicode"
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
// "sig" is an Azure SAS URL's signature parameter.
var secretWord = regexp.MustCompile(`(^|_)(token|auth|pat|jwt|sas|sig|otp)($|_)|[a-z]token($|_)`)

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
// value) or a URL with credentials (postgres://user:pw@host, a query's
// password= or X-Amz-Signature=); any other string is returned unchanged.
func String(s string) string {
	if spans := urlSecretSpans(s); spans != nil {
		// Back to front, so the earlier offsets stay valid.
		for i := len(spans) - 1; i >= 0; i-- {
			s = s[:spans[i][0]] + Marker + s[spans[i][1]:]
		}
		return s
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

// urlSecretSpans returns the byte ranges of s, in order, that hold a URL's
// credentials: the userinfo password (or, with no password, the user name:
// "https://TOKEN@host" carries a token there; "user:pw@" keeps the user
// visible) and the values of secret-named query parameters. s counts as a
// URL when, leading space aside, it starts with a scheme and "://". nil
// means nothing to hide.
//
// The search is textual, not url.Parse: a password holding a character
// that URL syntax reserves ("#", "/", "?", "@", a space, a bad "%" escape)
// makes url.Parse fail or read the password as a port, path or fragment,
// and a redactor that trusts the parse then passes the password through.
// So the userinfo ends at the last "@" (as url.Parse and Python's urllib
// split it) unless the text before the first ":" (the whole text before the
// "@" when it has no ":") already holds "/", "?" or "#" (then the "@" is in
// the path or query, and there is no userinfo).
// The price is a false positive on a URL with a port and an "@" later
// (http://h:9000/a@b hides "9000/a"), which hides nothing secret.
func urlSecretSpans(s string) [][2]int {
	lead := len(s) - len(strings.TrimLeftFunc(s, unicode.IsSpace))
	sep := strings.Index(s[lead:], "://")
	if sep < 0 || !isScheme(s[lead:lead+sep]) {
		return nil
	}
	start := lead + sep + len("://")
	rest := s[start:]
	var spans [][2]int
	queryFrom := start
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		userinfo := rest[:at]
		colon := strings.IndexByte(userinfo, ':')
		switch {
		case colon >= 0 && !strings.ContainsAny(userinfo[:colon], "/?#"):
			if colon+1 < at {
				spans = append(spans, [2]int{start + colon + 1, start + at})
			} else if colon > 0 {
				// "TOKEN:@host": no password, so the user is the credential.
				spans = append(spans, [2]int{start, start + colon})
			}
			queryFrom = start + at + 1
		case colon < 0 && at > 0 && !strings.ContainsAny(userinfo, "/?#"):
			// A user name alone ("https://ghp_x@github.com/", an API key
			// passed as the user) is most often a token, not a name.
			spans = append(spans, [2]int{start, start + at})
			queryFrom = start + at + 1
		}
	}
	q := strings.IndexByte(s[queryFrom:], '?')
	if q < 0 {
		return spans
	}
	// The query runs to the end of s, "#" included: a secret value with a
	// "#" in it must not end at the "#" and leave its tail as a fragment.
	pos := queryFrom + q + 1
	for pos <= len(s) {
		end := len(s)
		if i := strings.IndexAny(s[pos:], "&;"); i >= 0 {
			end = pos + i
		}
		pair := s[pos:end]
		if eq := strings.IndexByte(pair, '='); eq >= 0 && eq+1 < len(pair) {
			key := pair[:eq]
			if k, err := url.QueryUnescape(key); err == nil {
				key = k
			}
			if IsSecretName(key) || isSecretQueryName(key) {
				spans = append(spans, [2]int{pos + eq + 1, end})
			}
		}
		pos = end + 1
	}
	return spans
}

// isSecretQueryName reports whether a query parameter is a credential
// though IsSecretName, which also judges configuration fields, passes it:
// "key" alone is an API key in a URL (Google's ?key=, many REST APIs) but
// a cache or object key in configuration. Matched exactly, ignoring case,
// so "keys", "key_count" or "monkey" are not hidden; the credential forms
// that contain it (api_key, access_key, key_id, ...) are IsSecretName's
// substrings already.
func isSecretQueryName(name string) bool {
	return strings.EqualFold(name, "key")
}

// isScheme reports whether s is a URL scheme (RFC 3986: a letter, then
// letters, digits, "+", "-" or "."), so free text and JSON that merely
// contain "://" are not taken for a URL.
func isScheme(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return true
}

// Endpoint is a host or URL setting (an S3 endpoint, a broker address) as
// an error may quote it: any userinfo, with or without a scheme
// ("minio:pw@host:9000", "http://minio:pw@host:9000"), is replaced by
// Marker, user name included. Unlike String it needs no scheme to know the
// text is an address, and it hides everything before the last "@" (a
// password holding "#", "/" or a bad "%" escape is hidden whole). A scheme
// is kept only when it is one: in "user:p://w@host" the "p://w" is the
// password's.
func Endpoint(ep string) string {
	at := strings.LastIndexByte(ep, '@')
	if at < 0 {
		return ep
	}
	scheme := ""
	if i := strings.Index(ep, "://"); i > 0 && i < at && isScheme(ep[:i]) {
		scheme = ep[:i+3]
	}
	return scheme + Marker + ep[at:]
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
// Longer values are replaced first, so a secret that contains another is
// hidden whole rather than leaving its remainder after the shorter one's
// Marker.
func Secrets(s string, secrets ...string) string {
	ordered := make([]string, 0, len(secrets))
	for _, sec := range secrets {
		if len(sec) >= 4 {
			ordered = append(ordered, sec)
		}
	}
	sort.SliceStable(ordered, func(i, j int) bool { return len(ordered[i]) > len(ordered[j]) })
	for _, sec := range ordered {
		s = strings.ReplaceAll(s, sec, Marker)
	}
	return s
}

// Collect returns the values Value would hide in v (secret-named fields
// whatever their type, also inside JSON strings, and URL credentials), so
// free text built from the same data (an error message quoting a URL that
// failed validation, script output) can be scrubbed with Secrets. A URL
// credential is returned both as written and percent-decoded, since error
// texts quote either.
func Collect(v any) []string {
	var out []string
	// hidden collects every scalar under a secret-named key: Value hides
	// the whole subtree, so any of it may be a credential.
	var hidden func(any)
	hidden = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for _, e := range x {
				hidden(e)
			}
		case []any:
			for _, e := range x {
				hidden(e)
			}
		case []string:
			out = append(out, x...)
		case map[string]string:
			for _, e := range x {
				out = append(out, e)
			}
		case string:
			out = append(out, x)
		case json.Number:
			out = append(out, x.String())
		case int, int32, int64, uint, uint32, uint64, float32, float64:
			out = append(out, fmt.Sprint(x))
		}
	}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if IsSecretName(k) && e != nil && e != "" {
					hidden(e)
					continue
				}
				walk(e)
			}
		case map[string]map[string]any:
			for _, e := range x {
				walk(e)
			}
		case map[string]string:
			for k, e := range x {
				if IsSecretName(k) && e != "" {
					out = append(out, e)
					continue
				}
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
			if spans := urlSecretSpans(x); spans != nil {
				for _, sp := range spans {
					raw := x[sp[0]:sp[1]]
					out = append(out, raw)
					// Userinfo decodes as a path ("+" stays), a query
					// value as a form ("+" is a space); both are kept.
					for _, unescape := range []func(string) (string, error){url.PathUnescape, url.QueryUnescape} {
						if dec, err := unescape(raw); err == nil && dec != raw {
							out = append(out, dec)
						}
					}
				}
				return
			}
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
