package fs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/lmcache-go/lmcache/internal/l2"
)

// TypeName is the registered --l2-adapter type.
const TypeName = "fs"

// Config is the fs adapter's JSON configuration (upstream keys).
type Config struct {
	// BasePath is the directory holding one file per object (created).
	BasePath string
	// RelativeTmpDir, when set, is a directory under BasePath where files are
	// written before being renamed into place; otherwise temp files live in
	// BasePath itself under hidden names.
	RelativeTmpDir string
	// ReadAheadSize and UseODirect are accepted for compatibility; reads go
	// straight into the caller's buffer through the page cache.
	ReadAheadSize int64
	UseODirect    bool
	// MaxCapacityBytes bounds usage (0: unbounded, no aggregate eviction).
	MaxCapacityBytes int64
	// RecoverOnStart scans BasePath at start so existing files count.
	RecoverOnStart bool
	// Fsync flushes each file before renaming it into place (lmcache-go
	// extension, default false): durable across power loss, not just crashes.
	Fsync bool
	// PersistEnabled keeps files at Close (common key persist_enabled).
	PersistEnabled bool
	// Logger receives the adapter's warnings (nil: slog.Default()); not
	// a JSON key.
	Logger *slog.Logger
}

func init() {
	l2.Register(TypeName, l2.Factory{
		Parse: func(f *l2.Fields) (any, error) { return ParseConfig(f) },
		Open: func(ctx context.Context, spec l2.Spec) (l2.Adapter, error) {
			cfg := spec.Options.(Config)
			cfg.PersistEnabled = spec.PersistEnabled
			return New(cfg)
		},
	})
}

// ParseConfig decodes the fs keys.
func ParseConfig(f *l2.Fields) (Config, error) {
	var c Config
	var err error
	if c.BasePath, err = f.String("base_path", ""); err != nil {
		return c, err
	}
	if c.BasePath == "" {
		return c, errors.New("base_path is required")
	}
	if c.RelativeTmpDir, err = f.String("relative_tmp_dir", ""); err != nil {
		return c, err
	}
	if c.RelativeTmpDir != "" {
		if filepath.IsAbs(c.RelativeTmpDir) || hasDotDot(c.RelativeTmpDir) {
			return c, fmt.Errorf("relative_tmp_dir must be a relative path without '..', got %q", c.RelativeTmpDir)
		}
	}
	if f.Has("read_ahead_size") {
		if c.ReadAheadSize, err = f.PositiveInt("read_ahead_size", 0); err != nil {
			return c, err
		}
	} else {
		f.Raw("read_ahead_size")
	}
	if c.UseODirect, err = f.Bool("use_odirect", false); err != nil {
		return c, err
	}
	if c.MaxCapacityBytes, err = f.GiBBytes("max_capacity_gb", 0); err != nil {
		return c, err
	}
	if c.RecoverOnStart, err = f.Bool("recover_on_start", true); err != nil {
		return c, err
	}
	if c.Fsync, err = f.Bool("fsync", false); err != nil {
		return c, err
	}
	c.PersistEnabled = true
	return c, nil
}

func hasDotDot(p string) bool {
	for _, part := range strings.Split(filepath.ToSlash(p), "/") {
		if part == ".." {
			return true
		}
	}
	return false
}
