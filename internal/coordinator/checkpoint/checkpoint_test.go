package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestSaveLoadSections: a saved artifact loads back section by section; an
// unknown section is skipped; a reader that leaves bytes unread, a count
// larger than the bytes left and a missing file are reported (the first
// two as ErrCorrupt, the last as not-exist).
func TestSaveLoadSections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.ckpt")
	var e Encoder
	e.Section("future", func(e *Encoder) { e.String("ignored") })
	e.Section("a", func(e *Encoder) { e.Uvarint(3); e.Varint(-7); e.Bool(true); e.Bytes([]byte{1, 2}) })
	if err := Save(path, &e); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Fatalf("leftover temporary files: %v", entries)
	}
	d, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var u uint64
	var v int64
	var b bool
	var raw []byte
	if err := d.Sections(map[string]func(*Decoder){"a": func(d *Decoder) { u, v, b, raw = d.Uvarint(), d.Varint(), d.Bool(), d.Bytes() }}); err != nil {
		t.Fatal(err)
	}
	if u != 3 || v != -7 || !b || len(raw) != 2 || raw[1] != 2 {
		t.Fatalf("read back %d %d %v %v", u, v, b, raw)
	}
	d, _ = Load(path)
	if err := d.Sections(map[string]func(*Decoder){"a": func(d *Decoder) { d.Uvarint() }}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a section read short: %v, want ErrCorrupt", err)
	}
	var big Encoder
	big.Uvarint(1 << 40)
	if n := NewDecoder(big.buf).Count(1); n != 0 {
		t.Errorf("Count of a huge count = %d, want 0 (refused)", n)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}
