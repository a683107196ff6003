package dax

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"

	"github.com/lmcache-go/lmcache/internal/l2"
)

// TypeName is the registered --l2-adapter type.
const TypeName = "dax"

// DeviceConfig is one device: a device-DAX character device or a plain file.
type DeviceConfig struct {
	Path      string
	SizeBytes int64
}

// Config is the dax adapter's JSON configuration.
type Config struct {
	SlotBytes        int64          // slot_bytes (required): fixed slot per object
	Devices          []DeviceConfig // devices[] or legacy device_path + max_dax_size_gb
	HotplugEnabled   bool           // hotplug_enabled: allow Add/Remove/Resize
	NumStoreWorkers  int            // accepted; copies run on the caller's goroutine
	NumLookupWorkers int
	NumLoadWorkers   int
}

func init() {
	l2.Register(TypeName, l2.Factory{
		Parse: func(f *l2.Fields) (any, error) { return ParseConfig(f) },
		Open: func(ctx context.Context, spec l2.Spec) (l2.Adapter, error) {
			return New(spec.Options.(Config))
		},
	})
}

// ParseConfig decodes the dax keys.
func ParseConfig(f *l2.Fields) (Config, error) {
	c := Config{NumStoreWorkers: 1, NumLookupWorkers: 1, NumLoadWorkers: min(4, runtime.NumCPU())}
	var err error
	if !f.Has("slot_bytes") {
		f.Raw("slot_bytes")
		return c, errors.New("slot_bytes is required")
	}
	if c.SlotBytes, err = f.PositiveInt("slot_bytes", 0); err != nil {
		return c, err
	}
	if c.HotplugEnabled, err = f.Bool("hotplug_enabled", false); err != nil {
		return c, err
	}
	for key, dst := range map[string]*int{"num_store_workers": &c.NumStoreWorkers, "num_lookup_workers": &c.NumLookupWorkers, "num_load_workers": &c.NumLoadWorkers} {
		v, err := f.PositiveInt(key, int64(*dst))
		if err != nil {
			return c, err
		}
		*dst = int(v)
	}
	legacy := f.Has("device_path") || f.Has("max_dax_size_gb")
	if legacy && f.Has("devices") {
		return c, errors.New("use either devices or device_path/max_dax_size_gb, not both")
	}
	if legacy {
		d, err := parseDevice(f)
		if err != nil {
			return c, err
		}
		c.Devices = []DeviceConfig{d}
	} else if raw := f.Raw("devices"); raw != nil {
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil {
			return c, fmt.Errorf("devices must be a list of {device_path, max_dax_size_gb}: %w", err)
		}
		for i, item := range list {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(item, &m); err != nil || m == nil {
				return c, fmt.Errorf("devices[%d] must be an object", i)
			}
			df := l2.NewFields(m)
			d, err := parseDevice(df)
			if err != nil {
				return c, fmt.Errorf("devices[%d]: %w", i, err)
			}
			if u := df.Unused(); len(u) > 0 {
				return c, fmt.Errorf("devices[%d]: unknown keys %v", i, u)
			}
			c.Devices = append(c.Devices, d)
		}
	} else {
		f.Raw("device_path")
		f.Raw("max_dax_size_gb")
	}
	seen := map[string]bool{}
	for _, d := range c.Devices {
		if d.SizeBytes < c.SlotBytes {
			return c, fmt.Errorf("device %s: max_dax_size_gb (%d bytes) must fit at least one slot of %d bytes", d.Path, d.SizeBytes, c.SlotBytes)
		}
		if seen[d.Path] {
			return c, fmt.Errorf("device %s is listed twice", d.Path)
		}
		seen[d.Path] = true
	}
	if len(c.Devices) == 0 && !c.HotplugEnabled {
		return c, errors.New("at least one device is required unless hotplug_enabled is true")
	}
	return c, nil
}

func parseDevice(f *l2.Fields) (DeviceConfig, error) {
	var d DeviceConfig
	var err error
	if d.Path, err = f.String("device_path", ""); err != nil {
		return d, err
	}
	if d.Path == "" {
		return d, errors.New("device_path is required")
	}
	if !f.Has("max_dax_size_gb") {
		f.Raw("max_dax_size_gb")
		return d, errors.New("max_dax_size_gb is required")
	}
	if d.SizeBytes, err = f.GiBBytes("max_dax_size_gb", 0); err != nil {
		return d, err
	}
	return d, nil
}
