package cliflag

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// settings is a small Set with one setting of each kind.
type settings struct {
	set      *Set
	size     int
	ratio    float64
	name     string
	token    string
	lazy     bool
	adapters []string
	mode     string
	interval float64
}

func newSettings() *settings {
	s := &settings{set: New("test"), size: 256, ratio: 0.2, name: "n", lazy: true, mode: "0600", interval: 1}
	s.set.ConfigFile("config-file", "g", "config file", "TEST_CONFIG_FILE")
	s.set.Add(&Entry{Name: "chunk-size", Key: "chunk_size", Env: "TEST_CHUNK_SIZE", Value: Int(&s.size)}).Validate = func() error {
		if s.size < 1 {
			return errors.New("must be >= 1")
		}
		return nil
	}
	s.set.Add(&Entry{Name: "eviction-ratio", Key: "eviction_ratio", Value: Float(&s.ratio)})
	s.set.Add(&Entry{Name: "name", Key: "instance_name", Env: "TEST_NAME", Value: String(&s.name)})
	s.set.Add(&Entry{Name: "auth-token", Env: "TEST_TOKEN", Value: String(&s.token), Secret: true}).Validate = func() error {
		if strings.HasPrefix(s.token, "bad") {
			return errors.New("rejected " + s.token) // a careless rule quoting the value
		}
		return nil
	}
	s.set.Add(&Entry{Name: "lazy", Key: "lazy", Value: Bool(&s.lazy), Negatable: true})
	s.set.Add(&Entry{Name: "adapter", Key: "adapter", Value: List(&s.adapters)})
	s.set.Add(&Entry{Name: "mode", Key: "mode", Value: String(&s.mode)})
	s.set.Add(&Entry{Name: "flush-interval", Key: "flush_interval", Env: "TEST_FLUSH", Value: Float(&s.interval)})
	s.set.Alias("old-flush-interval", "flush-interval", "TEST_OLD_FLUSH")
	return s
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrecedence: flag > env > file > default, per setting, and each
// setting's provenance names the layer that won.
func TestPrecedence(t *testing.T) {
	path := writeFile(t, "chunk_size: 512\nname: from-file\neviction-ratio: 0.5\nmode: 0644\n")
	s := newSettings()
	err := s.set.Parse([]string{"--config-file", path, "--chunk-size", "64"}, env(map[string]string{"TEST_CHUNK_SIZE": "128", "TEST_NAME": "from-env"}))
	if err != nil {
		t.Fatal(err)
	}
	if s.size != 64 || s.name != "from-env" || s.ratio != 0.5 || s.mode != "0644" || s.interval != 1 {
		t.Fatalf("size %d name %q ratio %v mode %q interval %v", s.size, s.name, s.ratio, s.mode, s.interval)
	}
	want := map[string]string{
		"chunk-size": "flag:--chunk-size", "name": "env:TEST_NAME", "eviction-ratio": "file:" + path,
		"mode": "file:" + path, "flush-interval": "default", "config-file": "flag:--config-file",
	}
	for name, w := range want {
		if got := s.set.Lookup(name).Provenance(); got != w {
			t.Errorf("%s: provenance %q, want %q", name, got, w)
		}
	}
	if s.set.ConfigPath() != path {
		t.Errorf("ConfigPath %q", s.set.ConfigPath())
	}

	// Without the flag the variable wins over the file; without both, the file.
	s = newSettings()
	if err := s.set.Parse(nil, env(map[string]string{"TEST_CONFIG_FILE": path, "TEST_CHUNK_SIZE": "128"})); err != nil {
		t.Fatal(err)
	}
	if s.size != 128 || s.name != "from-file" || s.set.Lookup("config-file").Provenance() != "env:TEST_CONFIG_FILE" {
		t.Fatalf("env over file: size %d name %q config %s", s.size, s.name, s.set.Lookup("config-file").Provenance())
	}
	s = newSettings()
	if err := s.set.Parse([]string{"--config-file=" + path}, env(nil)); err != nil {
		t.Fatal(err)
	}
	if s.size != 512 || s.set.Lookup("chunk-size").Source() != FromFile {
		t.Fatalf("file over default: size %d source %s", s.size, s.set.Lookup("chunk-size").Source())
	}
}

// TestDeprecatedAlias: new flag > deprecated flag > env > deprecated env.
func TestDeprecatedAlias(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want float64
		prov string
	}{
		{[]string{"--old-flush-interval", "3"}, map[string]string{"TEST_FLUSH": "9"}, 3, "flag:--old-flush-interval"},
		{[]string{"--old-flush-interval", "3", "--flush-interval", "4"}, nil, 4, "flag:--flush-interval"},
		{nil, map[string]string{"TEST_FLUSH": "9", "TEST_OLD_FLUSH": "8"}, 9, "env:TEST_FLUSH"},
		{nil, map[string]string{"TEST_OLD_FLUSH": "8"}, 8, "env:TEST_OLD_FLUSH"},
	} {
		s := newSettings()
		if err := s.set.Parse(c.args, env(c.env)); err != nil {
			t.Fatal(err)
		}
		if s.interval != c.want || s.set.Lookup("flush-interval").Provenance() != c.prov {
			t.Errorf("%v %v: %v from %s, want %v from %s", c.args, c.env, s.interval, s.set.Lookup("flush-interval").Provenance(), c.want, c.prov)
		}
	}
}

// TestErrorsHaveOneShape: every failure is one *Error reading
// "--<flag>: <reason>", matched by ErrInvalid, with the layer that gave the
// bad value named inside the reason.
func TestErrorsHaveOneShape(t *testing.T) {
	bad := writeFile(t, "chunk_size: x\n")
	zero := writeFile(t, "# comment\nchunk_size: 0\n")
	unknown := writeFile(t, "chunk_size: 512\nchunk_sise: 1\n")
	dup := writeFile(t, "chunk_size: 1\nchunk-size: 2\n")
	list := writeFile(t, "chunk_size: [1, 2]\n")
	notMap := writeFile(t, "- chunk_size\n")
	broken := writeFile(t, "chunk_size: [1\n")
	missing := filepath.Join(t.TempDir(), "none.yaml")
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--chunk-size", "x"}, nil, `--chunk-size: not an integer (got "x")`},
		{[]string{"--eviction-ratio", "abc"}, nil, `--eviction-ratio: not a number (got "abc")`},
		{[]string{"--lazy=maybe"}, nil, `--lazy: not a boolean (got "maybe")`},
		{[]string{"--chunk-size", "0"}, nil, `--chunk-size: must be >= 1`},
		{nil, map[string]string{"TEST_CHUNK_SIZE": "0"}, `--chunk-size: TEST_CHUNK_SIZE: must be >= 1`},
		{nil, map[string]string{"TEST_CHUNK_SIZE": "y"}, `--chunk-size: TEST_CHUNK_SIZE: not an integer (got "y")`},
		{[]string{"--config-file", bad}, nil, `--chunk-size: ` + bad + ` line 1: not an integer (got "x")`},
		{[]string{"--config-file", zero}, nil, `--chunk-size: ` + zero + ` line 2: must be >= 1`},
		{[]string{"--config-file", unknown}, nil, `--config-file: ` + unknown + ` line 2: unknown key "chunk_sise"`},
		{nil, map[string]string{"TEST_CONFIG_FILE": unknown}, `--config-file: TEST_CONFIG_FILE: ` + unknown + ` line 2: unknown key "chunk_sise"`},
		{[]string{"--config-file", dup}, nil, `--config-file: ` + dup + ` line 2: key "chunk-size" repeats the setting of ` + dup + ` line 1`},
		{[]string{"--config-file", list}, nil, `--chunk-size: ` + list + ` line 1: takes one value, not a list`},
		{[]string{"--config-file", notMap}, nil, `--config-file: ` + notMap + ` line 1: want a mapping of setting names to values`},
		{[]string{"--config-file", broken}, nil, `--config-file: ` + broken + ` line 1: malformed YAML`},
		{[]string{"--config-file", missing}, nil, `--config-file: open ` + missing + `: no such file or directory`},
		{[]string{"--no-such"}, nil, `--no-such: flag provided but not defined`},
		{[]string{"--chunk-size"}, nil, `--chunk-size: flag needs an argument`},
		{[]string{"stray"}, nil, `unexpected argument "stray"`},
		// Go's single-dash spelling is accepted, but errors always name
		// the flag with two dashes, as every other error does.
		{[]string{"-chunk-size", "x"}, nil, `--chunk-size: not an integer (got "x")`},
		{[]string{"-lazy=maybe"}, nil, `--lazy: not a boolean (got "maybe")`},
		{[]string{"-no-such"}, nil, `--no-such: flag provided but not defined`},
		{[]string{"-chunk-size"}, nil, `--chunk-size: flag needs an argument`},
	} {
		s := newSettings()
		err := s.set.Parse(c.args, env(c.env))
		var ce *Error
		if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) || err.Error() != c.want {
			t.Errorf("%v %v:\n got %v\nwant %s", c.args, c.env, err, c.want)
		}
	}
	if err := newSettings().set.Parse([]string{"--help"}, env(nil)); !errors.Is(err, ErrHelp) {
		t.Errorf("--help: %v", err)
	}
}

// TestBadFileAppliesNothing: a file with an unknown key sets none of its
// other keys (the whole file is checked before any value is applied).
func TestBadFileAppliesNothing(t *testing.T) {
	path := writeFile(t, "chunk_size: 512\nname: x\nbogus: 1\n")
	s := newSettings()
	if err := s.set.Parse([]string{"--config-file", path}, env(nil)); err == nil {
		t.Fatal("want an error")
	}
	if s.size != 256 || s.name != "n" {
		t.Errorf("applied before the file was checked: size %d name %q", s.size, s.name)
	}
}

// TestSecretNeverInErrors: a secret's value is not quoted in any error,
// whether its rule quotes it or the file gives it a bad shape.
func TestSecretNeverInErrors(t *testing.T) {
	const tok = "bad-secret-value-42"
	list := writeFile(t, "auth_token: ["+tok+"]\n")
	for _, c := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"--auth-token", tok}, nil},
		{nil, map[string]string{"TEST_TOKEN": tok}},
		{[]string{"--config-file", writeFile(t, "auth_token: "+tok+"\n")}, nil},
		{[]string{"--config-file", list}, nil},
	} {
		err := newSettings().set.Parse(c.args, env(c.env))
		if err == nil || strings.Contains(err.Error(), tok) || !strings.HasPrefix(err.Error(), "--auth-token: ") {
			t.Errorf("%v %v: %v", c.args, c.env, err)
		}
	}
}

// TestFileValueShapes: scalars keep their text (0644 stays a string, not
// 420), booleans, sequences for repeatable settings, mappings as JSON,
// null as empty, an empty list as an explicit empty list.
func TestFileValueShapes(t *testing.T) {
	path := writeFile(t, `mode: 0644
lazy: false
adapter:
  - {"type": "fs", "base_path": "/tmp/x"}
  - type: s3
    bucket: b
name:
`)
	s := newSettings()
	if err := s.set.Parse([]string{"--config-file", path}, env(nil)); err != nil {
		t.Fatal(err)
	}
	want := []string{`{"base_path":"/tmp/x","type":"fs"}`, `{"bucket":"b","type":"s3"}`}
	if s.mode != "0644" || s.lazy || s.name != "" || !reflect.DeepEqual(s.adapters, want) {
		t.Fatalf("mode %q lazy %v name %q adapters %q", s.mode, s.lazy, s.name, s.adapters)
	}
	s = newSettings()
	if err := s.set.Parse([]string{"--config-file", writeFile(t, "adapter: []\n")}, env(nil)); err != nil {
		t.Fatal(err)
	}
	if s.adapters == nil || len(s.adapters) != 0 {
		t.Fatalf("adapters %#v, want an explicit empty list", s.adapters)
	}
	// A flag replaces the file's list rather than adding to it.
	s = newSettings()
	if err := s.set.Parse([]string{"--config-file", path, "--adapter", `{"type":"x"}`}, env(nil)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s.adapters, []string{`{"type":"x"}`}) {
		t.Fatalf("adapters %q", s.adapters)
	}
	// An empty file sets nothing.
	s = newSettings()
	if err := s.set.Parse([]string{"--config-file", writeFile(t, "")}, env(nil)); err != nil || s.size != 256 {
		t.Fatalf("empty file: %v size %d", err, s.size)
	}
}

func TestConfigFileTooLarge(t *testing.T) {
	path := writeFile(t, "name: "+strings.Repeat("x", MaxConfigFileBytes)+"\n")
	err := newSettings().set.Parse([]string{"--config-file", path}, env(nil))
	if err == nil || err.Error() != "--config-file: "+path+": larger than 1048576 bytes" {
		t.Fatalf("err %v", err)
	}
}

// TestTOMLFile: a name ending in .toml is read as TOML (upstream's
// --config-file format) with the same keys, precedence and checks; TOML
// reports no key positions, so errors name the file only.
func TestTOMLFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mp.toml")
	body := "chunk-size = 512\neviction_ratio = 0.5\nmode = \"0644\"\nlazy = false\nadapter = [{type = \"fs\", base_path = \"/x\"}, \"{}\"]\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newSettings()
	if err := s.set.Parse(nil, env(map[string]string{"TEST_CONFIG_FILE": path, "TEST_NAME": "env"})); err != nil {
		t.Fatal(err)
	}
	if s.size != 512 || s.ratio != 0.5 || s.mode != "0644" || s.lazy || s.name != "env" ||
		!reflect.DeepEqual(s.adapters, []string{`{"base_path":"/x","type":"fs"}`, "{}"}) {
		t.Fatalf("size %d ratio %v mode %q lazy %v name %q adapters %q", s.size, s.ratio, s.mode, s.lazy, s.name, s.adapters)
	}
	if got := s.set.Lookup("chunk-size").Provenance(); got != "file:"+path {
		t.Errorf("provenance %q", got)
	}
	for body, want := range map[string]string{
		"chunk_size = 1\nnull_block_id = 0\n": `--config-file: ` + path + `: unknown key "null_block_id"`,
		"chunk_size = \"x\"\n":                `--chunk-size: ` + path + `: not an integer (got "x")`,
		"chunk_size = [1]\n":                  `--chunk-size: ` + path + `: takes one value, not a list`,
	} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		err := newSettings().set.Parse([]string{"--config-file", path}, env(nil))
		if err == nil || err.Error() != want {
			t.Errorf("%q:\n got %v\nwant %s", body, err, want)
		}
	}
	if err := os.WriteFile(path, []byte("chunk_size = \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := newSettings().set.Parse([]string{"--config-file", path}, env(nil))
	if err == nil || err.Error() != "--config-file: "+path+` line 1 column 14: malformed TOML (after key "chunk_size")` {
		t.Errorf("broken TOML: %v", err)
	}
}

// TestSingleDashAccepted: "-chunk-size 512" sets the flag as "--chunk-size
// 512" does (Go's flag convention), and the provenance keeps the spelling
// the flag layer names it by.
func TestSingleDashAccepted(t *testing.T) {
	s := newSettings()
	if err := s.set.Parse([]string{"-chunk-size", "512"}, env(nil)); err != nil {
		t.Fatal(err)
	}
	if s.size != 512 || s.set.Lookup("chunk-size").Provenance() != "flag:--chunk-size" {
		t.Errorf("size %d, provenance %q", s.size, s.set.Lookup("chunk-size").Provenance())
	}
}

// TestDuration: Duration parses Go duration text, prints it back the same
// way, and refuses anything else with one reason.
func TestDuration(t *testing.T) {
	d := 3 * time.Second
	s := New("test")
	s.Add(&Entry{Name: "timeout", Value: Duration(&d)})
	if e := s.Lookup("timeout"); e.Default != "3s" {
		t.Errorf("default shown as %q, want 3s", e.Default)
	}
	if err := s.Parse([]string{"--timeout", "1m30s"}, env(nil)); err != nil || d != 90*time.Second {
		t.Fatalf("1m30s: %v %v", d, err)
	}
	s = New("test")
	s.Add(&Entry{Name: "timeout", Value: Duration(&d)})
	err := s.Parse([]string{"--timeout", "5"}, env(nil))
	if err == nil || err.Error() != `--timeout: not a duration such as 3s or 500ms (got "5")` {
		t.Errorf("5: %v", err)
	}
}

// TestAtLeast: the shared lower bound names the bound and the value.
func TestAtLeast(t *testing.T) {
	if err := AtLeast(1, 1); err != nil {
		t.Errorf("AtLeast(1, 1) = %v", err)
	}
	if err := AtLeast(-1, 0); err == nil || err.Error() != "must be >= 0 (got -1)" {
		t.Errorf("AtLeast(-1, 0) = %v", err)
	}
}

// TestPort: the one port rule accepts 0 and 65535 and names the range and
// the value otherwise.
func TestPort(t *testing.T) {
	for _, n := range []int{0, 1, 5555, 65535} {
		if err := Port(n); err != nil {
			t.Errorf("Port(%d) = %v", n, err)
		}
	}
	for n, want := range map[int]string{-1: "must be a port number 0-65535 (got -1)", 65536: "must be a port number 0-65535 (got 65536)"} {
		if err := Port(n); err == nil || err.Error() != want {
			t.Errorf("Port(%d) = %v, want %q", n, err, want)
		}
	}
}

// TestWriteHelp: the one --help shape of every subcommand, byte for byte:
// groups sorted by name (entries in the order added), the --no- form of a
// negatable flag, the env variable beside the default, hidden entries left
// out, a secret's default (never its value), and the environment-only
// settings last.
func TestWriteHelp(t *testing.T) {
	var port int
	var lazy bool
	var tok, name, only string
	s := New("demo")
	s.Add(&Entry{Name: "port", Group: "mp", Usage: "listen port", Value: Int(&port), Default: "5555", Env: "DEMO_PORT"})
	s.Add(&Entry{Name: "lazy", Group: "l1", Usage: "lazy pool", Value: Bool(&lazy), Default: "true", Negatable: true})
	s.Add(&Entry{Name: "token", Group: "mp", Usage: "bearer token", Value: String(&tok), Default: `""`, Env: "DEMO_TOKEN", Secret: true})
	s.Add(&Entry{Name: "old-port", Group: "mp", Usage: "deprecated", Value: Int(&port), Default: "5555", Hidden: true})
	s.Add(&Entry{Env: "DEMO_ONLY", Usage: "set only in the environment", Value: String(&only), Default: `"x"`})
	s.Add(&Entry{Env: "DEMO_BARE", Value: String(&name), Default: "1"})
	if err := s.Parse([]string{"--token", "s3cret"}, func(string) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	s.WriteHelp(&b)
	want := `Flags:

  [l1]
  --lazy / --no-lazy
      lazy pool (default true)

  [mp]
  --port
      listen port (default 5555; env DEMO_PORT)
  --token
      bearer token (default ""; env DEMO_TOKEN)

Environment only:
  DEMO_ONLY
      set only in the environment (default "x")
  DEMO_BARE (default 1)
`
	if got := b.String(); got != want {
		t.Fatalf("help:\n%s\nwant:\n%s", got, want)
	}
}

// TestSecretRuleShown: a secret entry's Validate error reads "invalid
// value" (it might quote the secret) unless it is a Rule itself, which
// states the rule without the value and is shown as it is; a wrapped Rule
// is not, since its wrapping text may quote the value.
func TestSecretRuleShown(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%q is too short", "tok-s3cret"), "--token: invalid value"},
		{Rule("needs --other"), "--token: needs --other"},
		{fmt.Errorf("%s: %w", "tok-s3cret", Rule("needs --other")), "--token: invalid value"},
	} {
		var tok string
		s := New("demo")
		s.Add(&Entry{Name: "token", Value: String(&tok), Default: `""`, Secret: true}).Validate = func() error { return tc.err }
		err := s.Parse([]string{"--token", "tok-s3cret"}, func(string) (string, bool) { return "", false })
		if err == nil || err.Error() != tc.want {
			t.Errorf("Validate %v: Parse = %v, want %s", tc.err, err, tc.want)
		}
	}
}

// TestBadFlagSyntaxNamesTheFlagOnly: an argument the flag package calls
// bad syntax (three dashes, or "-=…") is reported in the one shape with
// the flag name cut at "=", so the value written after it (a secret
// typed with one dash too many) never reaches the error line.
func TestBadFlagSyntaxNamesTheFlagOnly(t *testing.T) {
	for _, c := range []struct{ arg, want string }{
		{"---auth-token=tok-s3cret", "--auth-token: bad flag syntax"},
		{"---chunk-size", "--chunk-size: bad flag syntax"},
		{"-=tok-s3cret", `bad flag syntax "-"`},
		{"--=tok-s3cret", `bad flag syntax "--"`},
	} {
		err := newSettings().set.Parse([]string{c.arg}, env(nil))
		var ce *Error
		if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) || err.Error() != c.want {
			t.Errorf("%q:\n got %v\nwant %s", c.arg, err, c.want)
		}
	}
}
