package coordload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A request that takes 250 ms on a loaded 2-core machine may be the
// coordinator working or the coordinator (or this client) waiting for a
// CPU. Linux counts the second per thread: the run-queue wait, the second
// field of /proc/PID/task/TID/schedstat. A waitSampler reads it for both
// processes every sampleEvery, so each slow request can be split into
// "time the server was runnable but not running" and the rest.

// sampleEvery is the waitSampler's period: short next to the slow
// requests it explains (tens of ms and up), long enough that reading a
// dozen small /proc files each time costs little CPU.
const sampleEvery = 5 * time.Millisecond

// schedWait is the total CPU time and run-queue wait of pid's threads so
// far (schedstat's first two fields). Threads that exited are no longer
// counted, so the totals can step down; the sampler's deltas clamp at
// zero.
func schedWait(pid int) (cpu, wait time.Duration, err error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("schedstat of pid %d: %w", pid, err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			cpu += time.Duration(ns)
		}
		if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			wait += time.Duration(ns)
		}
	}
	return cpu, wait, nil
}

// waitSample is both processes' run-queue wait at one instant.
type waitSample struct {
	at                        time.Duration // since the run's start
	serverCPU, server, client time.Duration
}

// waitSampler records waitSamples until its context ends.
type waitSampler struct {
	mu      sync.Mutex
	samples []waitSample
}

// run samples every sampleEvery until ctx ends; it returns the first
// error reading the server's counters (a wrong --server-pid).
func (s *waitSampler) run(ctx context.Context, start time.Time, serverPID int) error {
	self := os.Getpid()
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		scpu, sv, err := schedWait(serverPID)
		if err != nil {
			return err
		}
		_, cl, _ := schedWait(self)
		s.mu.Lock()
		s.samples = append(s.samples, waitSample{at: time.Since(start), serverCPU: scpu, server: sv, client: cl})
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// between is how much each process waited for a CPU, and how much CPU the
// server used, from `from` to `to` (since the run's start), from the
// samples around them.
func (s *waitSampler) between(from, to time.Duration) (serverCPU, server, client time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := func(t time.Duration) waitSample {
		i := sort.Search(len(s.samples), func(i int) bool { return s.samples[i].at >= t })
		if i == len(s.samples) {
			i--
		}
		return s.samples[i]
	}
	if len(s.samples) == 0 {
		return 0, 0, 0
	}
	a, b := at(from), at(to)
	return max(b.serverCPU-a.serverCPU, 0), max(b.server-a.server, 0), max(b.client-a.client, 0)
}
