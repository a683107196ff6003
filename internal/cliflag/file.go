package cliflag

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"gopkg.in/yaml.v3"
)

// MaxConfigFileBytes bounds a config file; a larger one is refused rather
// than read whole.
const MaxConfigFileBytes = 1 << 20

// fileValue is one key of the config file: its values as flag text and
// where it was written ("path line N").
type fileValue struct {
	values []string
	where  string
}

// readConfig finds the config file (its flag, else its variables), reads
// and checks all of it before any value is applied: an unknown or repeated
// key, a malformed document or a value of the wrong shape fails the whole
// file.
func (s *Set) readConfig(lookupEnv func(string) (string, bool)) (map[*Entry]fileValue, error) {
	if s.configFile == nil {
		return nil, nil
	}
	cf := s.configFile
	path := cf.Value.String()
	if cf.source != FromFlag {
		for _, name := range s.configEnvs {
			if v, ok := lookupEnv(name); ok && v != "" {
				path = v
				_ = cf.Value.Set(v)
				cf.source, cf.origin = FromEnv, name
				break
			}
		}
	}
	if path == "" {
		return nil, nil
	}
	s.configPath = path
	fail := func(format string, a ...any) error {
		reason := fmt.Sprintf(format, a...)
		if cf.source == FromEnv {
			reason = cf.origin + ": " + reason
		}
		return &Error{Subject: cf.Subject(), Reason: reason}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fail("%v", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigFileBytes+1))
	if err != nil {
		return nil, fail("read %s: %v", path, err)
	}
	if len(data) > MaxConfigFileBytes {
		return nil, fail("%s: larger than %d bytes", path, MaxConfigFileBytes)
	}
	items, err := parseConfig(path, data)
	if err != nil {
		return nil, fail("%v", err)
	}
	out := map[*Entry]fileValue{}
	seen := map[string]string{}
	for _, it := range items {
		e, ok := s.byKey[normalizeKey(it.key)]
		if !ok {
			return nil, fail("%s: unknown key %q", it.where, it.key)
		}
		if first, dup := seen[e.Subject()]; dup {
			return nil, fail("%s: key %q repeats the setting of %s", it.where, it.key, first)
		}
		seen[e.Subject()] = it.where
		values, err := it.values(isList(e.Value))
		if err != nil {
			return nil, &Error{Subject: e.Subject(), Reason: it.where + ": " + err.Error()}
		}
		out[e] = fileValue{values: values, where: it.where}
	}
	return out, nil
}

// item is one top-level key of a config file, in file order.
type item struct {
	key    string
	where  string // "path line N" (YAML) or "path" (TOML, which reports no key positions)
	values func(list bool) ([]string, error)
}

// parseConfig reads a YAML document, or TOML when the name ends in .toml
// (the format of upstream's --config-file).
func parseConfig(path string, data []byte) ([]item, error) {
	if strings.HasSuffix(strings.ToLower(path), ".toml") {
		return parseTOML(path, data)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlSyntaxError(path, err)
	}
	if len(doc.Content) == 0 { // an empty file sets nothing
		return nil, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s line %d: want a mapping of setting names to values", path, root.Line)
	}
	var items []item
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("%s line %d: a key must be a name", path, k.Line)
		}
		items = append(items, item{key: k.Value, where: fmt.Sprintf("%s line %d", path, k.Line),
			values: func(list bool) ([]string, error) { return nodeValues(v, list) }})
	}
	return items, nil
}

func parseTOML(path string, data []byte) ([]item, error) {
	var doc map[string]any
	md, err := toml.Decode(string(data), &doc)
	if err != nil {
		return nil, tomlSyntaxError(path, err)
	}
	var items []item
	for _, k := range md.Keys() {
		if len(k) != 1 { // keys inside a table belong to its value
			continue
		}
		v := doc[k[0]]
		items = append(items, item{key: k[0], where: path, values: func(list bool) ([]string, error) { return tomlValues(v, list) }})
	}
	return items, nil
}

// The parsers' own messages quote the text they stopped at (TOML's
// "expected value but found \"s\" instead", "invalid escape in string
// '\\q'", YAML's "unknown anchor 'x' referenced"), and a config file holds
// secrets (coordinator_auth_token, URLs with passwords). So a malformed
// file is reported by position only: the parser's error is neither
// quoted nor wrapped, since the Error built from it is shown to operators.

// tomlSyntaxError names the file, line, column and the last key read
// before the error, from toml.ParseError's fields.
func tomlSyntaxError(path string, err error) error {
	var pe toml.ParseError
	if !errors.As(err, &pe) {
		return fmt.Errorf("%s: malformed TOML", path)
	}
	msg := fmt.Sprintf("%s line %d column %d: malformed TOML", path, pe.Position.Line, pe.Position.Col)
	if pe.LastKey != "" {
		msg += fmt.Sprintf(" (after key %q)", pe.LastKey)
	}
	return errors.New(msg)
}

// yamlLine is the "line N" yaml.v3 puts in a syntax error's text (it
// exposes no position fields, and no column at all).
var yamlLine = regexp.MustCompile(`^yaml: line ([0-9]+): `)

// yamlSyntaxError names the file and, when yaml.v3 reported one, the line.
func yamlSyntaxError(path string, err error) error {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		return fmt.Errorf("%s line %s: malformed YAML", path, m[1])
	}
	return fmt.Errorf("%s: malformed YAML", path)
}

// tomlValues is nodeValues for a decoded TOML value.
func tomlValues(v any, list bool) ([]string, error) {
	switch x := v.(type) {
	case string:
		return []string{x}, nil
	case int64:
		return []string{strconv.FormatInt(x, 10)}, nil
	case float64:
		return []string{strconv.FormatFloat(x, 'g', -1, 64)}, nil
	case bool:
		return []string{strconv.FormatBool(x)}, nil
	case map[string]any:
		b, err := json.Marshal(x)
		if err != nil {
			return nil, fmt.Errorf("encode table as JSON: %w", err)
		}
		return []string{string(b)}, nil
	case []any:
		if !list {
			return nil, errors.New("takes one value, not a list")
		}
		out := []string{}
		for _, e := range x {
			vs, err := tomlValues(e, false)
			if err != nil {
				return nil, err
			}
			out = append(out, vs...)
		}
		if len(out) == 0 {
			out = append(out, "")
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported value of type %T", v)
}

// nodeValues turns a YAML value into flag text. Scalars keep their text as
// written (so 0600 and 00ff stay strings, as on the command line); a
// mapping, which a JSON-valued flag such as --l2-adapter takes, is passed
// as its JSON encoding; a sequence is only for repeatable settings.
func nodeValues(n *yaml.Node, list bool) ([]string, error) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return []string{""}, nil
		}
		return []string{n.Value}, nil
	case yaml.MappingNode:
		js, err := nodeJSON(n)
		if err != nil {
			return nil, err
		}
		return []string{js}, nil
	case yaml.SequenceNode:
		if !list {
			return nil, errors.New("takes one value, not a list")
		}
		out := []string{}
		for _, item := range n.Content {
			vs, err := nodeValues(item, false)
			if err != nil {
				return nil, err
			}
			out = append(out, vs...)
		}
		if len(out) == 0 { // "key: []" is an explicit empty list
			out = append(out, "")
		}
		return out, nil
	}
	return nil, errors.New("unsupported value")
}

func nodeJSON(n *yaml.Node) (string, error) {
	var v any
	if err := n.Decode(&v); err != nil {
		// yaml.v3 quotes the offending value ("invalid map key:
		// []interface {}{\"a\", \"secret\"}"), so its text is not kept.
		return "", errors.New("cannot decode the mapping (a key that is a list or mapping, or a repeated key)")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("a mapping with non-string keys cannot be passed as JSON: %w", err)
	}
	return string(b), nil
}
