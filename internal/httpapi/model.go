package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// RegisterModel is the JSON of --register-model: a static layout for a
// model whose KV cache is primed through the bytes-level API rather than
// registered by vLLM.
type RegisterModel struct {
	ModelName  string `json:"model_name"`
	WorldSize  int    `json:"world_size"`
	NumLayers  int    `json:"num_layers"`
	HiddenSize int    `json:"hidden_size"` // KV width per token over all ranks (num_kv_heads * head_dim)
	Dtype      string `json:"dtype"`
	// IsMLA stores one latent tensor per layer instead of K and V, not
	// split across ranks.
	IsMLA bool `json:"is_mla,omitempty"`
	// ObjectBytes overrides the computed per-rank chunk object size.
	ObjectBytes int64 `json:"object_bytes,omitempty"`
}

// ParseRegisterModel parses one --register-model value (strict JSON: unknown
// fields are errors) into the engine layout of (model_name, world_size).
// chunkSize is --chunk-size. A chunk object of one rank holds, per layer, K
// and V (one latent tensor for MLA) of chunkSize tokens of
// hidden_size/world_size elements (the full hidden_size for MLA).
func ParseRegisterModel(s string, chunkSize int) (engine.Layout, error) {
	var m RegisterModel
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return engine.Layout{}, fmt.Errorf("--register-model: %w", err)
	}
	// More alone misses a trailing "]" or "}" (see httproute.DecodeJSON).
	if _, err := dec.Token(); err != io.EOF {
		return engine.Layout{}, fmt.Errorf("--register-model: trailing data after the JSON object")
	}
	if m.ModelName == "" || strings.Contains(m.ModelName, "@") {
		return engine.Layout{}, fmt.Errorf("--register-model: model_name is required and must not contain '@'")
	}
	if m.WorldSize < 1 || m.WorldSize > 255 {
		return engine.Layout{}, fmt.Errorf("--register-model: world_size must be in [1, 255] (got %d)", m.WorldSize)
	}
	if chunkSize < 1 {
		return engine.Layout{}, fmt.Errorf("--register-model: chunk size must be >= 1 (got %d)", chunkSize)
	}
	size := m.ObjectBytes
	if size < 0 {
		return engine.Layout{}, fmt.Errorf("--register-model: object_bytes must be positive (got %d)", size)
	}
	dt := strings.TrimPrefix(strings.ToLower(strings.TrimSpace(m.Dtype)), "torch.")
	elem, dtOK := wire.DtypeSize(dt)
	if size == 0 {
		if m.NumLayers < 1 || m.HiddenSize < 1 {
			return engine.Layout{}, fmt.Errorf("--register-model: num_layers and hidden_size must be >= 1 (or give object_bytes)")
		}
		if !dtOK {
			return engine.Layout{}, fmt.Errorf("--register-model: unknown dtype %q", m.Dtype)
		}
		width := int64(m.HiddenSize)
		if !m.IsMLA {
			if m.HiddenSize%m.WorldSize != 0 {
				return engine.Layout{}, fmt.Errorf("--register-model: hidden_size %d is not divisible by world_size %d", m.HiddenSize, m.WorldSize)
			}
			width /= int64(m.WorldSize)
		}
		size = wire.ChunkObjectBytes(int64(m.NumLayers), int64(chunkSize), width, m.IsMLA, elem)
	}
	return engine.Layout{
		ModelName:   m.ModelName,
		WorldSize:   m.WorldSize,
		ObjectBytes: size,
		Meta: map[string]any{
			"source":               "--register-model",
			"num_layers":           m.NumLayers,
			"hidden_size":          m.HiddenSize,
			"dtype":                m.Dtype,
			"is_mla":               m.IsMLA,
			"cache_size_per_token": size / int64(chunkSize),
		},
	}, nil
}
