package bench_test

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkShmFirstWrite measures how much slower the first write into
// fresh shared memory is than later writes on this machine (the effect
// BENCHMARKS.md, data path, discusses): 1 GiB of shmem written in 32 MiB
// copies, first pass versus the third. It reports both rates and their
// ratio.
func BenchmarkShmFirstWrite(b *testing.B) {
	const size, chunk = 1 << 30, 32 << 20
	src := make([]byte, chunk)
	for i := range src {
		src[i] = byte(i*7 + 1)
	}
	for b.Loop() {
		mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
		if err != nil {
			b.Fatal(err)
		}
		rates := make([]float64, 3)
		for pass := range rates {
			t0 := time.Now()
			for off := 0; off < size; off += chunk {
				copy(mem[off:off+chunk], src)
			}
			rates[pass] = size / time.Since(t0).Seconds() / 1e9
		}
		_ = unix.Munmap(mem)
		b.ReportMetric(rates[0], "first-GB/s")
		b.ReportMetric(rates[2], "third-GB/s")
		b.ReportMetric(rates[0]/rates[2], "first/third")
	}
}
