package ledger

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// distinctKey is the i-th of a stream of distinct keys with 32-byte hashes,
// spread over 4 models and the given salts, as an MP fleet would report them.
func distinctKey(i int, salts []string) Key {
	var k Key
	binary.LittleEndian.PutUint64(k.hash[0:], uint64(i)*0x9E3779B97F4A7C15)
	binary.LittleEndian.PutUint64(k.hash[8:], uint64(i))
	binary.LittleEndian.PutUint64(k.hash[16:], ^uint64(i))
	binary.LittleEndian.PutUint64(k.hash[24:], uint64(i)*31)
	k.hlen = 32
	k.Model = benchModels[i%len(benchModels)]
	k.Salt = salts[i%len(salts)]
	k.Rank = 16777472
	return k
}

// threadCPU is the calling thread's CPU time.
func threadCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// growthMark changes whenever a batch allocates the next index or starts
// migrating into it.
func growthMark(l *Ledger) int { return len(l.index) + len(l.next) }

var benchModels = []string{"Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B", "mistralai/Mistral-7B", "google/gemma-2-9b"}

// saltNames is tenant-00000, tenant-00001, ... (n names).
func saltNames(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("tenant-%05d", i)
	}
	return s
}

// BenchmarkGrowthPause stores N distinct keys in 1,000-event batches (100
// salts) into an empty ledger and times every Apply, isolating the ledger's
// own pauses (the index doublings) from HTTP: max_batch_ms is the slowest
// batch in wall time, max_cpu_ms and p99_cpu_ms the slowest and 99th
// percentile in the benchmark thread's CPU time (the goroutine is locked
// to its thread), which leaves out the time a shared machine's scheduler
// takes the thread away but keeps page faults and GC assists (and, on a
// VM, host stalls the guest cannot see). growth_cpu_ms is the slowest of
// the batches that started a growth step (growthMark changed), which is
// where a one-shot doubling pauses, page_cpu_ms the slowest of the other
// batches that allocated a 65,536-entry page, and other_cpu_ms the slowest
// of the rest (the noise floor of the machine); over_10ms counts batches above
// 10 ms of CPU; faults/batch and max_faults are the minor page faults the
// thread took inside Apply, on average and in the worst batch. reserve=on
// runs Refill on its own goroutine as the coordinator's loop does;
// reserve=off leaves every allocation to the ingest path. Run with
// -benchtime 1x.
func BenchmarkGrowthPause(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000, 20_000_000} {
		for _, reserve := range []bool{false, true} {
			name := fmt.Sprintf("keys=%d/reserve=off", n)
			if reserve {
				name = fmt.Sprintf("keys=%d/reserve=on", n)
			}
			b.Run(name, func(b *testing.B) { growthPause(b, n, reserve) })
		}
	}
}

// threadMinorFaults is the calling thread's minor page-fault count.
func threadMinorFaults(b *testing.B) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Minflt
}

func growthPause(b *testing.B, n int, reserve bool) {
	const batch = 1000
	events, salts := make([]Event, batch), saltNames(100)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for it := 0; it < b.N; it++ {
		b.StopTimer()
		l := New()
		stop := func() {}
		if reserve {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				for ctx.Err() == nil {
					l.WaitNeed(ctx, time.Second)
					l.Refill(ctx)
				}
			}()
			stop = func() { cancel(); <-done }
		}
		lat := make([]time.Duration, 0, n/batch)
		cpu := make([]time.Duration, 0, n/batch)
		var growthCPU, pageCPU, otherCPU time.Duration
		var faults, maxFaults int64
		over := 0
		b.StartTimer()
		start := time.Now()
		for base := 0; base < n; base += batch {
			for j := range events {
				events[j] = Event{Op: OpStore, Key: distinctKey(base+j, salts), Bytes: 2 << 20}
			}
			mark, pages := growthMark(l), len(l.pages)
			f0, c0, t0 := threadMinorFaults(b), threadCPU(b), time.Now()
			l.Apply(events)
			d := threadCPU(b) - c0
			f := threadMinorFaults(b) - f0
			lat = append(lat, time.Since(t0))
			cpu = append(cpu, d)
			faults += f
			maxFaults = max(maxFaults, f)
			switch {
			case growthMark(l) != mark:
				growthCPU = max(growthCPU, d)
			case len(l.pages) != pages:
				pageCPU = max(pageCPU, d)
			default:
				otherCPU = max(otherCPU, d)
			}
			if d > 10*time.Millisecond {
				over++
			}
		}
		el := time.Since(start)
		b.StopTimer()
		stop()
		slices.Sort(lat)
		slices.Sort(cpu)
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max_batch_ms")
		b.ReportMetric(float64(cpu[len(cpu)-1].Microseconds())/1000, "max_cpu_ms")
		b.ReportMetric(float64(cpu[len(cpu)*99/100].Microseconds())/1000, "p99_cpu_ms")
		b.ReportMetric(float64(growthCPU.Microseconds())/1000, "growth_cpu_ms")
		b.ReportMetric(float64(pageCPU.Microseconds())/1000, "page_cpu_ms")
		b.ReportMetric(float64(otherCPU.Microseconds())/1000, "other_cpu_ms")
		b.ReportMetric(float64(over), "over_10ms")
		b.ReportMetric(float64(faults)/float64(len(cpu)), "faults/batch")
		b.ReportMetric(float64(maxFaults), "max_faults")
		b.ReportMetric(float64(n)/el.Seconds(), "keys/s")
		r := l.Reserve()
		b.ReportMetric(float64(r.ColdPages), "cold_pages")
		b.ReportMetric(float64(r.ColdTables), "cold_tables")
		b.StartTimer()
	}
}
