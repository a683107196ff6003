//go:build !(linux && (amd64 || arm64))

package kvcuda

// CUDA is the driver binding; on this platform there is none.
type CUDA struct{ Driver }

// LoadDriver reports that no CUDA driver binding exists on this platform.
func LoadDriver() (*CUDA, error) { return nil, ErrNoDriver }
