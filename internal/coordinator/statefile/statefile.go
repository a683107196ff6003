// Package statefile persists the coordinator's operator-set state (quotas,
// the default limit and pins) so it survives a restart. Writes are atomic:
// a temporary file in the same directory is synced and renamed over the old
// one, so a crash leaves either the old or the new state, never a torn file.
package statefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/lmcache-go/lmcache/internal/atomicfile"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// Version is the file format version.
const Version = 1

// ErrCorrupt wraps every failure to make sense of a file that was read:
// malformed JSON, an unknown version, a value out of range (a negative
// limit, a pin count below 1), or (from callers) an invalid entry.
// A file that cannot be read at all is not corrupt.
var ErrCorrupt = errors.New("corrupt state file")

// Pin is one pinned key and its reference count.
type Pin struct {
	Key   objkey.Encoded `json:"key"`
	Count int32          `json:"count"`
}

// State is the persisted document.
type State struct {
	Version           int              `json:"version"`
	DefaultLimitBytes *int64           `json:"default_limit_bytes"`
	Quotas            map[string]int64 `json:"quotas"`
	Pins              []Pin            `json:"pins"`
}

// Load reads path; a missing file is an empty state, not an error.
func Load(path string) (State, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return State{Version: Version, Quotas: map[string]int64{}}, nil
	}
	if err != nil {
		return State{}, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("%w %s: %w", ErrCorrupt, path, err)
	}
	if s.Version != Version {
		return State{}, fmt.Errorf("%w %s: unsupported version %d", ErrCorrupt, path, s.Version)
	}
	// No API call sets these, so a file holding one was edited or damaged:
	// a negative limit would have every eviction cycle evict its salt, and
	// a pin count below 1 would be dropped without a word.
	if s.DefaultLimitBytes != nil && *s.DefaultLimitBytes < 0 {
		return State{}, fmt.Errorf("%w %s: negative default_limit_bytes %d", ErrCorrupt, path, *s.DefaultLimitBytes)
	}
	for salt, v := range s.Quotas {
		if v < 0 {
			return State{}, fmt.Errorf("%w %s: negative quota %d for salt %q", ErrCorrupt, path, v, salt)
		}
	}
	for i, p := range s.Pins {
		if p.Count < 1 {
			return State{}, fmt.Errorf("%w %s: pin %d: count %d, want at least 1", ErrCorrupt, path, i, p.Count)
		}
	}
	if s.Quotas == nil {
		s.Quotas = map[string]int64{}
	}
	return s, nil
}

// Writer serialises saves; Save snapshots under its lock so the last writer
// always writes the newest state.
type Writer struct {
	mu   sync.Mutex
	path string
}

// NewWriter returns a writer for path.
func NewWriter(path string) *Writer { return &Writer{path: path} }

// Save writes snapshot() atomically.
func (w *Writer) Save(snapshot func() State) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := snapshot()
	s.Version = Version
	b, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return fmt.Errorf("statefile: encode: %w", err)
	}
	// atomicfile.Write names its temporary file after w.path, so the one
	// a crash leaves is removed at the next start
	// (atomicfile.RemoveStaleTemps) without touching another file's.
	if err := atomicfile.Write(w.path, b); err != nil {
		return fmt.Errorf("statefile: save: %w", err)
	}
	return nil
}
