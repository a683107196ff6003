//go:build !(linux && (amd64 || arm64))

package gpucheck

// OpenCUDA reports that this platform has no CUDA driver binding.
func OpenCUDA(int) (Device, error) { return nil, ErrNoGPU }
