package objkey

import (
	"fmt"
	"strconv"
	"strings"
)

const (
	nameSep       = "@"
	fsSlash       = "-SEP-"
	fsExt         = ".data"
	minNameFields = 4
	maxNameFields = 5
)

// S3Name is the object name upstream's S3 adapter uses:
// model@%08x(kv_rank)@%x(group)@hex(hash)[@salt]. The model name is kept
// verbatim, slashes included.
func (k Key) S3Name() string {
	return k.joinFields(k.ModelName, pyHex(k.KVRank, 8, false))
}

// ParseS3Name decodes an S3 object name. A name that is not ours (other tools
// may share the bucket) returns an error wrapping ErrInvalid; listings skip it.
func ParseS3Name(name string) (Key, error) {
	return parseFields(name, name, false)
}

// FSName is the file name upstream's FS adapter uses: slashes in the model
// become "-SEP-", kv_rank is formatted as Python's '%#010x', and ".data" ends it.
func (k Key) FSName() string {
	return k.joinFields(strings.ReplaceAll(k.ModelName, "/", fsSlash), pyHex(k.KVRank, 10, true)) + fsExt
}

// joinFields is the layout both codecs share once model and kv_rank are
// formatted: model@rank@group@hash[@salt].
func (k Key) joinFields(model, rank string) string {
	var b strings.Builder
	b.WriteString(model)
	b.WriteString(nameSep)
	b.WriteString(rank)
	b.WriteString(nameSep)
	b.WriteString(pyHex(k.ObjectGroupID, 0, false))
	b.WriteString(nameSep)
	b.WriteString(k.HashHex())
	if k.CacheSalt != "" {
		b.WriteString(nameSep)
		b.WriteString(k.CacheSalt)
	}
	return b.String()
}

// ParseFSName decodes a file name written by FSName (or by upstream).
func ParseFSName(name string) (Key, error) {
	stem, ok := strings.CutSuffix(name, fsExt)
	if !ok {
		return Key{}, invalidf("%q does not end in %s", name, fsExt)
	}
	return parseFields(name, stem, true)
}

func parseFields(name, stem string, fs bool) (Key, error) {
	parts := strings.Split(stem, nameSep)
	if len(parts) < minNameFields || len(parts) > maxNameFields {
		return Key{}, invalidf("%q has %d '@' fields, want 4 or 5", name, len(parts))
	}
	model := parts[0]
	if fs {
		model = strings.ReplaceAll(model, fsSlash, "/")
	}
	rank, err := pyParseHex(parts[1])
	if err != nil {
		return Key{}, invalidf("%q kv_rank: %v", name, err)
	}
	group, err := pyParseHex(parts[2])
	if err != nil {
		return Key{}, invalidf("%q object_group_id: %v", name, err)
	}
	hash, err := FromHex(parts[3])
	if err != nil {
		return Key{}, fmt.Errorf("%q chunk hash: %w", name, err)
	}
	salt := ""
	if len(parts) == maxNameFields {
		salt = parts[4]
	}
	return New(hash, model, rank, group, salt)
}

// pyHex formats v as Python's format(v, 'x') with zero padding to width and
// an optional '#' (0x) prefix; the sign comes first and counts toward width,
// as in Python.
func pyHex(v int64, width int, prefix bool) string {
	neg := v < 0
	var digits string
	if neg {
		digits = strconv.FormatUint(uint64(-v), 16) // -MinInt64 wraps to itself as uint64, which is correct
	} else {
		digits = strconv.FormatInt(v, 16)
	}
	head := ""
	if neg {
		head = "-"
	}
	if prefix {
		head += "0x"
	}
	if pad := width - len(head) - len(digits); pad > 0 {
		digits = strings.Repeat("0", pad) + digits
	}
	return head + digits
}

// pyParseHex parses like Python's int(s, 16): surrounding whitespace, an
// optional sign, an optional 0x prefix, and single underscores between digits.
func pyParseHex(s string) (int64, error) {
	t := strings.Trim(s, " \t\n\r\v\f")
	neg := false
	if t != "" && (t[0] == '+' || t[0] == '-') {
		neg = t[0] == '-'
		t = t[1:]
	}
	if len(t) >= 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X') {
		t = t[2:]
		t = strings.TrimPrefix(t, "_")
	}
	if t == "" || t[0] == '_' || t[len(t)-1] == '_' || strings.Contains(t, "__") {
		return 0, fmt.Errorf("invalid literal for int() with base 16: %q", s)
	}
	t = strings.ReplaceAll(t, "_", "")
	u, err := strconv.ParseUint(t, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid literal for int() with base 16: %q", s)
	}
	if neg {
		if u > 1<<63 {
			return 0, fmt.Errorf("out of range: %q", s)
		}
		return -int64(u), nil
	}
	if u > 1<<63-1 {
		return 0, fmt.Errorf("out of range: %q", s)
	}
	return int64(u), nil
}
